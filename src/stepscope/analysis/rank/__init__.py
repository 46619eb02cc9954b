"""Analyses of one rank: steps, kernels, top ops (summary), time breakdown, idle causes, overlap, collectives."""
