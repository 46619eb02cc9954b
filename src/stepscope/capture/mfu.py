"""Throughput and MFU from a FLOP count and step wall times: pure arithmetic, no torch, unit-testable.

    achieved TFLOP/s = FLOPs of one step / median wall time of the uninstrumented steps / 1e12
    MFU              = achieved TFLOP/s / peak dense TFLOP/s of the device for the step's number format

The counted step itself is slowed by FlopCounterMode, traced steps by the profiler: neither is timed.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from stepscope.capture.peaks import Peak

FORMULA = "MFU = achieved TFLOP/s / peak TFLOP/s; achieved = counted FLOPs per step / median step time"
MIN_TIMED_STEPS = 3  # untimed figures from fewer steps than this wait for more


@dataclass(frozen=True)
class Throughput:
    """Achieved TFLOP/s of one rank and, when a peak is known, its MFU."""

    flops: int
    median_step_s: float
    steps_timed: int
    tflops: float
    mfu: float | None
    peak: Peak | None
    no_mfu_reason: str | None

    def lines(self) -> list[str]:
        """The human-readable report: the figure, and next to an MFU the formula and the peak used."""
        out = [
            f"achieved {self.tflops:.4g} TFLOP/s = {self.flops:,} FLOPs / {self.median_step_s * 1e3:.3f} ms "
            f"(median of {self.steps_timed} uninstrumented steps)"
        ]
        if self.mfu is not None and self.peak is not None:
            out.append(f"MFU {100 * self.mfu:.2f}% ({FORMULA}; peak {self.peak.describe()})")
        elif self.no_mfu_reason:
            out.append(self.no_mfu_reason)
        return out

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["formula"] = FORMULA
        return data


def achieved_tflops(flops: int, seconds: float) -> float:
    """FLOPs done in `seconds`, in TFLOP/s."""
    if seconds <= 0:
        raise ValueError(f"step time must be > 0 (got {seconds})")
    return flops / seconds / 1e12


def mfu(tflops: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved over peak (a fraction, 0.5 = 50%)."""
    if peak_tflops <= 0:
        raise ValueError(f"peak TFLOP/s must be > 0 (got {peak_tflops})")
    return tflops / peak_tflops


def throughput(
    flops: int, step_seconds: Iterable[float], peak: Peak | None, no_mfu_reason: str | None = None
) -> Throughput | None:
    """The throughput report from the wall times of uninstrumented steps; None without any timed step."""
    times = [t for t in step_seconds if t > 0]
    if not times or flops <= 0:
        return None
    median = statistics.median(times)
    achieved = achieved_tflops(flops, median)
    return Throughput(
        flops=flops,
        median_step_s=median,
        steps_timed=len(times),
        tflops=achieved,
        mfu=mfu(achieved, peak.tflops) if peak is not None else None,
        peak=peak,
        no_mfu_reason=None if peak is not None else no_mfu_reason,
    )


def override_peak(peak_tflops: float, device: str, dtype: str | None) -> Peak:
    """The peak a user passed with the `peak_tflops` option."""
    return Peak(tflops=peak_tflops, device=device, dtype=dtype, source="peak_tflops option")
