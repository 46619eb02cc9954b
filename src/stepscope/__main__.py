"""`python -m stepscope ...`: the same command as `stepscope ...` (for environments without the script)."""

from stepscope.cli import run

run()
