"""Thin adapters over the performance monitor where users train: command-line flags for a script's own parser
(`args`); the HF Trainer and Lightning callbacks and `stepscope run` build on the same monitor."""
