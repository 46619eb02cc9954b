"""What changed between two runs: step times, phases, kernels, ops, findings, and regression gates."""
