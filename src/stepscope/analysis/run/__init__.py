"""The run folder read whole: config, manifest, metrics, per-window summaries and the step-time trend."""
