"""Analyses across ranks: matching collectives, stragglers, per-rank analysis in processes, and the merged trace."""
