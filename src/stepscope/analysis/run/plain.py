"""Which steps of a run are plain: those stepscope left alone, whose wall time is what the job costs without it
(analyze's step times and trend, diff's plain steps): outside the profiler's windows, neither the first step
(start-up) nor one that counted FLOPs or logged collectives, nor one that ran beside a window's end work (the
manifest's `beside_steps`), where enough remain without those."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from stepscope.analysis.run._trend import MIN_TREND_STEPS
from stepscope.runfolder import ArtifactKind, Manifest
from stepscope.runfolder.payloads import StepMetrics


def is_plain_step(line: StepMetrics) -> bool:
    """A step stepscope left alone (see StepTimes): its wall time is what the job costs without stepscope."""
    return line.phase == "none" and line.step > 0 and line.flops is None and line.collectives is None


# plain steps that leaving out those beside a window's end work must leave (enough for every statistic of them)
MIN_PLAIN_KEPT = MIN_TREND_STEPS


class StepRanges:
    """A set of steps held as merged [first, last] ranges (a manifest may name ranges of any length)."""

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        merged: list[list[int]] = []
        for first, last in sorted((a, b) for a, b in ranges if a <= b):
            if merged and first <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([first, last])
        self._firsts = [a for a, _ in merged]
        self._lasts = [b for _, b in merged]

    def __contains__(self, step: object) -> bool:
        if not isinstance(step, int):
            return False
        at = bisect.bisect_right(self._firsts, step) - 1
        return at >= 0 and step <= self._lasts[at]

    def __bool__(self) -> bool:
        return bool(self._firsts)


def window_work_steps(manifest: Manifest) -> StepRanges:
    """The steps that ran while some rank's window end work used the CPU (the manifest's `beside_steps` of each
    trace). Ranks of one job wait for each other, so one rank's work slows every rank's steps: the steps are the
    job's, not a rank's."""
    return StepRanges(r for a in manifest.of_kind(ArtifactKind.TRACE) for r in a.beside_steps or ())


def plain_lines_of(
    lines: list[StepMetrics], busy: StepRanges, minimum: int = MIN_PLAIN_KEPT
) -> tuple[list[StepMetrics], int, str | None]:
    """The plain steps of `lines` (sorted as given) without those in `busy`, unless fewer than `minimum` would
    remain; how many were left out; a note when they were kept instead or left out."""
    plain = [m for m in lines if is_plain_step(m)]
    kept = [m for m in plain if m.step not in busy]
    left_out = len(plain) - len(kept)
    if not left_out:
        return plain, 0, None
    if len(kept) < minimum:
        return (
            plain,
            0,
            (
                f"{left_out} of the {len(plain)} plain steps ran beside a window's end work (its trace's gzip and "
                "summary) and are counted, since too few would remain without them: they may be slower than the job "
                "alone"
            ),
        )
    return (
        kept,
        left_out,
        (
            f"{left_out} steps that ran beside a window's end work (its trace's gzip and summary) are left out of the "
            f"plain steps; {len(kept)} remain"
        ),
    )
