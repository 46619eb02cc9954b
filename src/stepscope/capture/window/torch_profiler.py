"""What a window asks of torch's profiler outside its schedule: the options that skip torch's own Python
post-processing (`trace_only_options`), the export of a window (`export_plain_trace`), whether another profiler
already records in this process, and switching one off without an export."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from stepscope.capture.window.window_end import export_problem


def disable_profiler_quietly() -> None:
    """Switch torch's profiler off, discarding what it recorded (no export)."""
    import torch

    with contextlib.suppress(Exception):
        if torch._C._autograd._profiler_enabled():
            torch.autograd._disable_profiler()


def another_profiler_records() -> bool:
    import torch

    return bool(torch._C._autograd._profiler_enabled())


def export_plain_trace(prof: Any, plain: Path) -> str | None:
    """torch's export of the window to `plain` (JSON); why the file is not a whole trace, or None.

    kineto writes through `<plain>.tmp` and renames it; a failed write (a full disk, a file-size limit) is only
    logged, and leaves that temp file, which can hold all the free space: it is removed on every way out."""
    kineto_temp = plain.with_name(plain.name + ".tmp")
    try:
        prof.export_chrome_trace(str(plain))
    finally:
        with contextlib.suppress(OSError):
            kineto_temp.unlink()
    try:
        return export_problem(plain)
    except FileNotFoundError:
        return "torch wrote no file"


def trace_only_options(with_stack: bool) -> dict[str, Any]:
    """`experimental_config` with `trace_only=True` where this torch has it and the options allow it (not with
    `with_stack`, whose frames torch builds in that post-processing): at stop, torch then skips building its
    Python `FunctionEvent`s, which stepscope never reads (it reads the exported trace), and the stop of a window
    of 125,000 events takes 254 ms instead of 350 ms (measured here); the exported trace is the same."""
    if with_stack:
        return {}
    try:
        from torch._C._profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(trace_only=True)}
    except Exception:  # (an older torch: no such option; the default post-processing)
        return {}
