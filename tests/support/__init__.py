"""Helpers several test modules share (no test module imports another): synthetic traces, jobs run in other
processes, and readers of what stepscope writes."""
