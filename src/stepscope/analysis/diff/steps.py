"""The step time of two runs compared over every step that can tell it: `compare_step_times`.

Run folders compare their *plain* steps (metrics.jsonl: the steps the profiler and the counters left alone, as
`analyze`'s step times define them, `run.plain`), one value per step: the mean wall time over the ranks that
recorded it. A side without MIN_PLAIN_STEPS of them (a trace, a short run) makes both sides compare their profiled
steps instead (the traces' ProfilerStep spans, one value per rank and step), and a note says so. The change is the
Hodges-Lehmann shift with its 95% interval (analysis/_shift.py): significant when the interval excludes zero.

The fast steps (the 10th percentile, FAST_QUANTILE) are compared too, with their own interval: a slower code path
slows every step, the fastest ones too, while a busier machine (other processes taking the CPU) slows more of
the steps and leaves the fastest nearly as they were. The gates (diff_gates.py) ask both to move.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from stepscope.analysis.analyze import AnalysisResult
from stepscope.analysis.diff._shift import quantile_shift, shift
from stepscope.analysis.run.folder import Run
from stepscope.analysis.run.plain import StepRanges, plain_lines_of, window_work_steps
from stepscope.analysis.stats import median, quantile
from stepscope.runfolder.payloads import StepMetrics

MIN_PLAIN_STEPS = 8  # per run, to compare plain steps rather than the profiled window
FAST_QUANTILE = 0.1  # the fast steps: the 10th percentile of the step times


class StepSample(msgspec.Struct):
    """The step times of one run that were compared."""

    source: str  # "plain" (metrics.jsonl, steps stepscope left alone) or "profiled" (the traces' steps)
    ranks: list[int]  # the ranks whose steps were compared
    steps: list[int]  # the step numbers compared, ascending
    values: int  # step times compared: one per step (plain), one per rank and step (profiled)
    median_ms: float | None
    q1_ms: float | None  # first and third quartiles: the spread
    q3_ms: float | None
    fast_ms: float | None  # the 10th percentile: the fast steps


class StepComparison(msgspec.Struct):
    """test - base step time: the Hodges-Lehmann shift and its 95% interval (null bounds: too few steps)."""

    base: StepSample
    test: StepSample
    delta_ms: float | None
    low_ms: float | None
    high_ms: float | None
    change_pct: float | None  # delta_ms of the base median
    significant: bool  # the interval excludes zero
    note: str | None  # why the profiled steps were compared, or why no interval
    fast_delta_ms: float | None = None  # test - base of the fast steps (10th percentile) ...
    fast_low_ms: float | None = None  # ... with a 95% interval (null under 20 step times a side)
    fast_high_ms: float | None = None
    base_sample: list[float] = []  # the step times, where too few bound an interval (the gates' exact test)
    test_sample: list[float] = []


def compare_step_times(
    base: AnalysisResult, test: AnalysisResult, base_run: Run | None = None, test_run: Run | None = None
) -> StepComparison:
    """Compare the plain steps of both runs where both have MIN_PLAIN_STEPS, else their profiled steps."""
    note = None
    base_plain = plain_step_times(base_run) if base_run is not None else None
    test_plain = plain_step_times(test_run) if test_run is not None else None
    if _enough(base_plain) and _enough(test_plain):
        assert base_plain is not None and test_plain is not None
        b, t = base_plain, test_plain
    else:
        note = _why_profiled(base_plain, test_plain)
        b, t = profiled_step_times(base), profiled_step_times(test)
    s = shift(b[2], t[2])
    if s.estimate is not None and s.low is None:
        note = (note + "; " if note else "") + (
            f"{s.base_n} and {s.test_n} step times are too few to bound the change at 95%"
        )
    base_median = median(b[2]) if b[2] else None
    fast = quantile_shift(b[2], t[2], FAST_QUANTILE)
    return StepComparison(
        base=_sample(*b),
        test=_sample(*t),
        delta_ms=_ms(s.estimate),
        low_ms=_ms(s.low),
        high_ms=_ms(s.high),
        change_pct=round(100.0 * s.estimate / base_median, 2)
        if s.estimate is not None and base_median
        else None,
        significant=s.significant,
        note=note,
        fast_delta_ms=_ms(fast.estimate),
        fast_low_ms=_ms(fast.low),
        fast_high_ms=_ms(fast.high),
        base_sample=[round(v, 4) for v in b[2]] if s.estimate is not None and s.low is None else [],
        test_sample=[round(v, 4) for v in t[2]] if s.estimate is not None and s.low is None else [],
    )


_Times = tuple[str, list[int], list[float], list[int]]  # source, steps, step times (ms), ranks


def plain_step_times(run: Run) -> _Times:
    """One value per plain step: the mean wall time of that step over the ranks that recorded it plain (the
    steps beside a window's end work left out where MIN_PLAIN_STEPS remain: run.plain)."""
    by_rank: dict[int, list[StepMetrics]] = {}
    for line in run.metrics:
        by_rank.setdefault(line.rank, []).append(line)
    manifest = getattr(run, "manifest", None)
    busy = window_work_steps(manifest) if manifest is not None else StepRanges()
    by_step: dict[int, list[float]] = {}
    ranks: set[int] = set()
    for rank, lines in by_rank.items():
        for line in plain_lines_of(sorted(lines, key=lambda m: m.step), busy, MIN_PLAIN_STEPS)[0]:
            by_step.setdefault(line.step, []).append(line.wall_ms)
            ranks.add(rank)
    steps = sorted(by_step)
    return "plain", steps, [sum(by_step[s]) / len(by_step[s]) for s in steps], sorted(ranks)


def profiled_step_times(result: AnalysisResult) -> _Times:
    """One value per rank and profiled step (the ProfilerStep spans of the traces)."""
    rows = [(r.rank, s.step, s.dur_us / 1e3) for r in result.ranks for s in r.steps]
    return (
        "profiled",
        sorted({step for _, step, _ in rows}),
        [ms for _, _, ms in rows],
        sorted({rank for rank, _, _ in rows}),
    )


def step_ranges(steps: Sequence[int]) -> str:
    """[1, 2, 3, 4, 10, 11, 12] -> '1-4, 10-12'."""
    out: list[str] = []
    run_start = prev = None
    for s in sorted(steps):
        if prev is not None and s == prev + 1:
            prev = s
            continue
        if run_start is not None:
            out.append(_range(run_start, prev))
        run_start = prev = s
    if run_start is not None:
        out.append(_range(run_start, prev))
    return ", ".join(out)


def _range(first: int, last: int | None) -> str:
    return str(first) if last is None or last == first else f"{first}-{last}"


def _why_profiled(base: _Times | None, test: _Times | None) -> str:
    if base is None and test is None:
        why = "neither run is a run folder with a metrics.jsonl"
    elif base is None or test is None:
        why = f"the {'base' if base is None else 'test'} run is not a run folder with a metrics.jsonl"
    else:
        why = (
            f"the runs have {len(base[2])} and {len(test[2])} plain steps in metrics.jsonl ({MIN_PLAIN_STEPS} "
            "needed on each side)"
        )
    return f"{why}: the profiled steps are compared, and the profiler slows them"


def _enough(times: _Times | None) -> bool:
    return times is not None and len(times[2]) >= MIN_PLAIN_STEPS


def _sample(source: str, steps: list[int], values: list[float], ranks: list[int]) -> StepSample:
    return StepSample(
        source=source,
        ranks=ranks,
        steps=steps,
        values=len(values),
        median_ms=_ms(median(values)) if values else None,
        q1_ms=_ms(quantile(values, 0.25)) if values else None,
        q3_ms=_ms(quantile(values, 0.75)) if values else None,
        fast_ms=_ms(quantile(values, FAST_QUANTILE)) if values else None,
    )


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
