"""The exception root. Only the CLI turns these into messages and exit codes."""

from __future__ import annotations

from pathlib import Path


class StepscopeError(Exception):
    """Base of every error stepscope raises on purpose; `exit_code` is what the CLI exits with."""

    exit_code = 2


class InputError(StepscopeError):
    """A file or folder given to stepscope cannot be used: names the path and the problem in one line."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class ConfigError(StepscopeError, ValueError):
    """An option has a value stepscope cannot use; the message names the option."""
