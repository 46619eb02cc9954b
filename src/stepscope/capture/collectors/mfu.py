"""Throughput and MFU from a FLOP count and step wall times: pure arithmetic, no torch, unit-testable.

    achieved TFLOP/s = FLOPs of one step / median wall time of the undisturbed steps / 1e12
    MFU              = achieved TFLOP/s / peak dense TFLOP/s of the device for the step's number format

The counted step itself is slowed by FlopCounterMode, traced steps by the profiler, and the step after either
pays for what they left: none of them is timed (the FLOP collector says which steps are undisturbed). A median
of a handful of steps swings with whatever else the machine does, so there is no figure from fewer than
MIN_TIMED_STEPS of them.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from stepscope.devices import Peak
from stepscope.units import fmt_tflops

FORMULA = "MFU = achieved TFLOP/s / peak TFLOP/s; achieved = counted FLOPs per step / median step time"
# Fewer undisturbed steps than this give no figure: a median of two steps, one of them right after the counted
# step, set 7.6-8.6 ms for a 1.5 ms step (docs/flops.md has the measurements).
MIN_TIMED_STEPS = 5
# A middle half of the steps wider than this ratio (3rd quartile / 1st) is not the job's own jitter: something
# else took the machine during many steps (a step's own variation stays within ~1.2x, measured on the CPU).
WIDE_SPREAD = 1.5
# Steps at two speeds: the sorted times split by a gap wider than this (relative) and wider than either side's
# own spread, with at least a quarter of the steps on each side. An H200 running eight 8192^3 bf16 products per
# step took 11.2 ms for its first steps and 12.5-12.9 ms from about the eighth (its clocks fall under full load):
# the median of nine steps fell on either side, and three identical runs gave 698, 749 and 782 TFLOP/s.
TWO_SPEEDS_GAP = 0.05


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
    q1_step_s: float  # the middle half of the timed steps lies between these two
    q3_step_s: float
    # (steps, median step s) of the faster and the slower speed where the steps ran at two (two_speeds)
    speeds: tuple[tuple[int, float], tuple[int, float]] | None = None

    def lines(self) -> list[str]:
        """The human-readable report: the figure with the spread of the steps it comes from, and next to an
        MFU the formula and the peak used."""
        out = [
            f"achieved {fmt_tflops(self.tflops)} = {self.flops:,} FLOPs / {self.median_step_s * 1e3:.3f} ms "
            f"(median of {self.steps_timed} undisturbed steps; the middle half took "
            f"{self.q1_step_s * 1e3:.3f}-{self.q3_step_s * 1e3:.3f} ms)"
        ]
        if self.spread_note is not None:
            out.append(self.spread_note)
        if self.mfu is not None and self.peak is not None:
            out.append(f"MFU {100 * self.mfu:.2f}% ({FORMULA}; peak {self.peak.describe()})")
        elif self.no_mfu_reason:
            out.append(self.no_mfu_reason)
        return out

    @property
    def spread_note(self) -> str | None:
        """A warning when the steps' times spread too widely for their median to be the job's own speed, or
        when they ran at two speeds, so that the median is one of them by chance."""
        if self.q3_step_s <= WIDE_SPREAD * self.q1_step_s:
            if self.speeds is None:
                return None
            (fast_n, fast_s), (slow_n, slow_s) = self.speeds
            return (
                f"the steps ran at two speeds ({fast_n} near {fast_s * 1e3:.3f} ms, {slow_n} near "
                f"{slow_s * 1e3:.3f} ms: a GPU whose clocks fall under load, or work that comes and goes): the "
                "median falls on one side or the other, so an identical run can give the other figure; "
                f"{fmt_tflops(achieved_tflops(self.flops, fast_s))} at the faster speed, "
                f"{fmt_tflops(achieved_tflops(self.flops, slow_s))} at the slower"
            )
        return (
            f"the steps' times vary widely (the middle half took {self.q1_step_s * 1e3:.3f}-"
            f"{self.q3_step_s * 1e3:.3f} ms): something besides the training slowed many of them (another process "
            "on this machine?), so an identical run can give another figure; at the first quartile's time it "
            f"would be {fmt_tflops(achieved_tflops(self.flops, self.q1_step_s))}"
        )

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


def two_speeds(times: list[float]) -> tuple[tuple[int, float], tuple[int, float]] | None:
    """(steps, median) of the faster and of the slower speed where the sorted times split in two
    (TWO_SPEEDS_GAP), else None."""
    ordered = sorted(times)
    n = len(ordered)
    least = max(2, -(-n // 4))  # at least a quarter of the steps (and two) on each side
    best: tuple[float, int] | None = None
    for i in range(least, n - least + 1):  # split: ordered[:i] | ordered[i:]
        low, high = ordered[:i], ordered[i:]
        if low[0] <= 0:
            return None
        gap = high[0] / low[-1] - 1
        within = max(low[-1] / low[0], high[-1] / high[0]) - 1
        if gap > TWO_SPEEDS_GAP and gap > within and (best is None or gap > best[0]):
            best = (gap, i)
    if best is None:
        return None
    i = best[1]
    return (i, statistics.median(ordered[:i])), (n - i, statistics.median(ordered[i:]))


def throughput(
    flops: int, step_seconds: Iterable[float], peak: Peak | None, no_mfu_reason: str | None = None
) -> Throughput | None:
    """The throughput report from the wall times of undisturbed steps; None without any timed step."""
    times = [t for t in step_seconds if t > 0]
    if not times or flops <= 0:
        return None
    median = statistics.median(times)
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else (median,) * 3
    achieved = achieved_tflops(flops, median)
    return Throughput(
        flops=flops,
        median_step_s=median,
        steps_timed=len(times),
        tflops=achieved,
        mfu=mfu(achieved, peak.tflops) if peak is not None else None,
        peak=peak,
        no_mfu_reason=None if peak is not None else no_mfu_reason,
        q1_step_s=q1,
        q3_step_s=q3,
        speeds=two_speeds(times),
    )


def too_few_steps(timed: int) -> str:
    """Why there is no TFLOP/s figure when fewer than MIN_TIMED_STEPS steps were undisturbed."""
    return (
        f"no TFLOP/s: {timed} undisturbed step{'s' if timed != 1 else ''}, fewer than the {MIN_TIMED_STEPS} "
        "a median needs on a busy machine (undisturbed: outside the windows, neither the first, counted or "
        "comm-logged step nor the step after one of them or after a window); run more steps"
    )


def override_peak(peak_tflops: float, device: str, dtype: str | None) -> Peak:
    """The peak a user passed with the `peak_tflops` option."""
    return Peak(tflops=peak_tflops, device=device, dtype=dtype, source="peak_tflops option")
