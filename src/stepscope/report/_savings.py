"""What fixing each finding saves, and what the findings priced by replay save together: the lines the terminal
and the page both show (analysis/findings/replayed.py computes them)."""

from __future__ import annotations

from collections.abc import Sequence

from stepscope.analysis.analyze import RankAnalysis
from stepscope.analysis.findings import Finding
from stepscope.units import fmt_ms

# a combined saving within this share of the savings added up is their sum
SAME_PCT = 1.0


def saving_text(f: Finding) -> str:
    """`saves 1.2 ms per step (replay)`; "" for a finding without a price."""
    if f.saving_ms_per_step is None:
        return ""
    return f"saves {fmt_ms(f.saving_ms_per_step)} per step ({f.saving_from})"


def combined_lines(ranks: Sequence[RankAnalysis]) -> list[str]:
    """Per rank with findings priced by replay: their savings added up against all of them removed at once."""
    out = []
    for r in ranks:
        s = r.replay_savings
        if s is None:
            continue
        n = len(s.findings)
        if n == 1:
            out.append(
                f"rank {r.rank}: 1 finding priced by replay ({s.findings[0]}), saving {fmt_ms(s.sum_ms_per_step)} per step"
            )
            continue
        near = max(0.001, SAME_PCT / 100 * s.sum_ms_per_step)  # the replay's rounding, not an overlap
        if s.combined_ms_per_step < s.sum_ms_per_step - near:
            overlap = "they name the same time"
        elif s.combined_ms_per_step > s.sum_ms_per_step + near:
            overlap = "removing one exposes the work of others"
        else:
            overlap = "no time counted twice"
        out.append(
            f"rank {r.rank}: the {n} findings priced by replay ({', '.join(s.findings)}) save "
            f"{fmt_ms(s.combined_ms_per_step)} per step removed together, {fmt_ms(s.sum_ms_per_step)} added up "
            f"({overlap})"
        )
    return out
