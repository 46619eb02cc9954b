"""The profiler's own cost, as a run folder shows it: the analysed (profiled) steps against the plain steps of
metrics.jsonl (those stepscope left alone, plain.is_plain_step). Where the profiled steps are much slower, the
profiler's overhead is in every figure of the trace: ops and Python are slowed more than long kernels or sleeps,
so phase shares and findings describe a step the job does not run without the profiler."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stepscope.analysis.run.folder import StepTimes
from stepscope.analysis.stats import median
from stepscope.units import fmt_ms, fmt_ranks

# the analysed steps' median at least this many times the plain steps' median: a notice
PROFILED_SLOWDOWN_MIN = 1.25
# plain steps needed for their median to stand for the job (fewer: no comparison)
MIN_PLAIN_STEPS = 3


def profiler_overhead_notice(
    profiled_ms: Mapping[int, Sequence[float]], step_times: Sequence[StepTimes]
) -> str | None:
    """A notice naming the ranks whose analysed steps (`profiled_ms`: per rank, each analysed step's wall time)
    take PROFILED_SLOWDOWN_MIN times their plain steps or more, with the figures of the rank slowed most; None
    where no rank is."""
    slowed: list[tuple[float, int, float, int, float, int]] = []  # ratio, rank, profiled, n, plain, n
    for times in step_times:
        steps = profiled_ms.get(times.rank, ())
        if (
            not steps
            or times.median_ms is None
            or times.plain_steps < MIN_PLAIN_STEPS
            or times.median_ms <= 0
        ):
            continue
        profiled = median(list(steps))
        ratio = profiled / times.median_ms
        if ratio >= PROFILED_SLOWDOWN_MIN:
            slowed.append((ratio, times.rank, profiled, len(steps), times.median_ms, times.plain_steps))
    if not slowed:
        return None
    ratio, rank, profiled, n, plain, n_plain = max(slowed, key=lambda s: (s[0], -s[1]))
    ranks = sorted(s[1] for s in slowed)
    who = f"rank {rank}" if len(ranks) == 1 else f"ranks {fmt_ranks(ranks)} (the most: rank {rank})"
    return (
        f"profiled steps {ratio:.1f}x the plain steps': on {who} the analysed steps take {fmt_ms(profiled)} "
        f"(median of {n}) against {fmt_ms(plain)} (median of {n_plain} steps without the profiler, "
        "metrics.jsonl): phase shares and findings are distorted by the profiler's overhead, which slows ops and "
        "Python more than long kernels or waits; weigh them against the plain step"
    )
