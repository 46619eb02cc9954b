"""Nsight Systems support: cudaProfilerStart/Stop around active windows and an NVTX range per active step,
so that `nsys profile --capture-range=cudaProfilerApi` records exactly the windows stepscope records."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from stepscope.capture.collector import NEVER, Collector
from stepscope.capture.console import StepscopeWarning, warn_user


class NsightCollector(Collector):
    name = "nsight"

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.cuda = False
        self._in_window = False
        self._range_open = False

    def start(self) -> None:
        import torch

        self.cuda = torch.cuda.is_available()
        if not self.cuda:
            warn_user(
                "stepscope: nsight=True needs CUDA (NVTX and cudaProfilerStart/Stop); this CPU run ignores it",
                StepscopeWarning,
            )

    def before_step(self, step: int) -> None:
        if not self.cuda or not self.ctx.schedule.is_active(step):
            return
        import torch

        if not self._in_window:
            torch.cuda.profiler.start()
            self._in_window = True
        torch.cuda.nvtx.range_push(f"stepscope step {step}")
        self._range_open = True

    def next_busy(self, step: int) -> int:
        if not self.cuda:
            return NEVER
        return step if self._in_window else self.ctx.schedule.next_traced_step(step)

    def after_step(self, step: int, wall_ms: float) -> None:
        if not self._range_open:
            return
        import torch

        torch.cuda.nvtx.range_pop()
        self._range_open = False
        if not self.ctx.schedule.is_active(step + 1):
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            self._in_window = False

    def close(self) -> None:
        if self._in_window:
            import torch

            if self._range_open:
                torch.cuda.nvtx.range_pop()
            torch.cuda.profiler.stop()
            self._in_window = False


@contextlib.contextmanager
def nvtx_region(name: str) -> Iterator[None]:
    """A monitor region under nsight=True: torch.profiler's range and an NVTX range of the same name."""
    import torch
    from torch.profiler import record_function

    with record_function(name):
        torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()
