"""Offline trace analysis. Never imports torch or stepscope.capture; analyzers return plain results."""
