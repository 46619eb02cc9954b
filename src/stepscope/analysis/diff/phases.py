"""The profiled window's phases of two runs compared (for compare.py): one value per rank and profiled step, pooled
and rank by rank, with whether the ranks' changes agree (see Phase)."""

from __future__ import annotations

import msgspec

from stepscope.analysis.analyze import AnalysisResult
from stepscope.analysis.diff._shift import shift
from stepscope.analysis.stats import median

# The phases of the profiled window, in print order; its step first.
PHASES = (
    "profiled_step",
    "data_loader",
    "forward",
    "backward",
    "optimizer",
    "communication",
    "gpu_idle",
    "other",
)


class RankPhase(msgspec.Struct):
    """One phase of one rank present in both runs, compared over that rank's own profiled steps."""

    rank: int
    base_ms: float | None
    test_ms: float | None
    delta_ms: float | None
    low_ms: float | None
    high_ms: float | None
    significant: bool
    base_values: int
    test_values: int
    # the values themselves where too few bound an interval (the gates' exact test reads them); else empty
    base_sample: list[float] = []
    test_sample: list[float] = []


class Phase(msgspec.Struct):
    """One phase of the profiled window: the median ms per step in each run (null where a run does not show it)
    and the change, test - base, with its 95% interval (null bounds: too few values), over every rank's steps
    pooled; `by_rank` compares each rank present in both runs on its own, and `ranks_agree` says whether their
    changes are compatible (some change lies in every rank's interval): the pooled row speaks for the ranks only
    then."""

    name: str  # one of PHASES
    base_ms: float | None
    test_ms: float | None
    delta_ms: float | None  # the Hodges-Lehmann shift
    low_ms: float | None
    high_ms: float | None
    change_pct: float | None  # of the base value
    significant: bool
    base_values: int  # values compared: one per rank and profiled step (per rank for CPU collectives)
    test_values: int
    base_sample: list[float] = []  # as RankPhase's
    test_sample: list[float] = []
    by_rank: list[RankPhase] = []  # with more than one rank in both runs
    ranks_agree: bool | None = None  # null: one rank, or none in both runs


_PhaseValues = dict[str, dict[int, list[float]]]  # phase -> rank -> ms per step, one per profiled step


def _phase_values(result: AnalysisResult) -> _PhaseValues:
    """Every phase's ms per step by rank, one value per profiled step that shows the phase."""
    out: _PhaseValues = {name: {} for name in PHASES}
    for r in result.ranks:
        for s in r.steps:
            named = (s.dataloader_us, s.forward_us, s.backward_us, s.optimizer_us)
            values = {
                "profiled_step": s.dur_us,
                "data_loader": s.dataloader_us,
                "forward": s.forward_us,
                "backward": s.backward_us,
                "optimizer": s.optimizer_us,
                "communication": s.comm_us,
                "gpu_idle": s.dur_us * (1 - s.gpu_busy_pct / 100) if s.gpu_busy_pct is not None else None,
                "other": max(s.dur_us - sum(v or 0.0 for v in named), 0.0),
            }
            for name, us in values.items():
                if us is not None:
                    out[name].setdefault(r.rank, []).append(us / 1e3)
    if not out["communication"]:
        # CPU backends: the collectives' time per step, one value per rank (the per-rank collectives table)
        out["communication"] = {
            r.rank: [sum(c.time_ms or 0.0 for c in r.collectives) / r.window.steps]
            for r in result.ranks
            if r.collectives and r.window.steps
        }
    if not any(v for name, v in out.items() if name not in ("profiled_step", "other")):
        # no phase at all: "other" would only repeat the step
        out["other"] = {}
    return out


def phase_changes(base: AnalysisResult, test: AnalysisResult) -> list[Phase]:
    """Every phase either run shows, in PHASES order: pooled over the ranks, and by rank."""
    b, t = _phase_values(base), _phase_values(test)
    out = []
    for name in PHASES:
        if not b[name] and not t[name]:
            continue
        bv = [v for values in b[name].values() for v in values]
        tv = [v for values in t[name].values() for v in values]
        pooled = _compared(bv, tv)
        bm, tm, delta = pooled.base_ms, pooled.test_ms, pooled.delta_ms
        shared = sorted(b[name].keys() & t[name].keys())
        by_rank = (
            [_compared(b[name][rank], t[name][rank], rank) for rank in shared]
            if len(shared) > 1 or len(b[name]) > 1 or len(t[name]) > 1
            else []
        )
        out.append(
            Phase(
                name,
                bm,
                tm,
                delta,
                pooled.low_ms,
                pooled.high_ms,
                round(100.0 * delta / bm, 2) if delta is not None and bm else None,
                pooled.significant,
                len(bv),
                len(tv),
                pooled.base_sample,
                pooled.test_sample,
                by_rank,
                _agree(by_rank) if len(by_rank) > 1 else None,
            )
        )
    return out


def _compared(bv: list[float], tv: list[float], rank: int = -1) -> RankPhase:
    """One phase's values of two runs compared (`rank`: whose; -1 for the pooled ranks)."""
    s = shift(bv, tv)
    few = s.estimate is not None and s.low is None
    return RankPhase(
        rank,
        round(median(bv), 4) if bv else None,
        round(median(tv), 4) if tv else None,
        _round(s.estimate),
        _round(s.low),
        _round(s.high),
        s.significant,
        len(bv),
        len(tv),
        [round(v, 4) for v in bv] if few else [],
        [round(v, 4) for v in tv] if few else [],
    )


def _agree(by_rank: list[RankPhase]) -> bool:
    """Whether some change lies within every rank's interval (its 95% interval, or where too few values bound
    one, the whole range of its test - base differences: wider than any interval, so that few values never make
    ranks disagree by chance)."""
    lows, highs = [], []
    for r in by_rank:
        if r.low_ms is not None and r.high_ms is not None:
            lows.append(r.low_ms)
            highs.append(r.high_ms)
        elif r.base_sample and r.test_sample:
            lows.append(min(r.test_sample) - max(r.base_sample))
            highs.append(max(r.test_sample) - min(r.base_sample))
    return not lows or max(lows) <= min(highs)


def _round(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 4)
