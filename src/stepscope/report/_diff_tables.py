"""The tables of a Diff that the terminal (`stepscope diff`, report/terminal/diff.py) and the compare page
(report/html/compare.py) both show, built once. The terminal signs its changes (+1.20 ms); the page sorts by them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepscope.analysis.diff.compare import PHASE_LABELS
from stepscope.report import columns as col
from stepscope.report._diff_text import quartiles_text, sample_text, signed_ms
from stepscope.report.model import Cell, Table, table

if TYPE_CHECKING:
    from stepscope.analysis.diff.compare import Diff
    from stepscope.analysis.diff.phases import Phase, RankPhase
    from stepscope.analysis.diff.steps import StepComparison


def step_time_table(st: StepComparison, *, compared: bool = True, title: str = "") -> Table:
    """Each run's median step, its quartiles and its fast steps; with `compared`, which steps (the terminal says
    it in a line below)."""
    return table(
        "step-time-table",
        [col.RUN, col.MEDIAN_MS, col.QUARTILES, col.FAST_P10_MS, *([col.STEPS_COMPARED] if compared else [])],
        (
            [side, x.median_ms, quartiles_text(x), x.fast_ms, *([sample_text(x)] if compared else [])]
            for side, x in (("base", st.base), ("test", st.test))
        ),
        filter=False,
        title=title,
    )


RANK_ROWS = 4  # under a phase whose ranks disagree: the ranks with the largest changes


def phase_table(diff: Diff, *, compact: bool = False, title: str = "") -> Table:
    """The profiled window's phases per step in each run, the change with its 95% interval and whether it is
    significant; under a phase whose ranks' changes disagree (Phase.ranks_agree), a row for each of the ranks
    that changed most, as the pooled row does not speak for them. `compact` (the terminal): the changes signed
    (+1.20 ms, +5.1%), and a '~' where the interval holds 0 instead of the page's yes / no (a column of 11
    characters would not leave the table room at 80)."""

    def row(label: str, p: Phase | RankPhase, pct: float | None) -> list[Any]:
        return [
            label,
            p.base_ms,
            p.test_ms,
            signed_ms_cell(p.delta_ms) if compact else p.delta_ms,
            signed_pct_cell(pct) if compact else pct,
            f"{signed_ms(p.low_ms)} to {signed_ms(p.high_ms)}"
            if p.low_ms is not None and p.high_ms is not None
            else "too few",
            ("" if p.significant or p.low_ms is None else "~") if compact else p.significant,
        ]

    rows = []
    for p in diff.phases:
        rows.append(row(PHASE_LABELS.get(p.name, p.name), p, p.change_pct))
        if p.ranks_agree is False:
            ranked = sorted(p.by_rank, key=lambda r: -abs(r.delta_ms or 0.0))
            for r in ranked[:RANK_ROWS]:
                pct = (
                    round(100.0 * r.delta_ms / r.base_ms, 2) if r.delta_ms is not None and r.base_ms else None
                )
                rows.append(row(f"  rank {r.rank}", r, pct))
            if len(ranked) > RANK_ROWS:
                rows.append([f"  {len(ranked) - RANK_ROWS} more ranks", None, None, "", "", "", ""])
    return table(
        "phase-table",
        [
            col.PHASE,
            col.BASE_MS,
            col.TEST_MS,
            col.CHANGE_MS,
            col.CHANGE_PCT,
            col.INTERVAL_95,
            col.HOLDS_ZERO if compact else col.SIGNIFICANT,
        ],
        rows,
        filter=False,
        title=title,
    )


def signed_ms_cell(ms: float | None) -> Cell:
    return Cell("-" if ms is None else signed_ms(ms), -1.0 if ms is None else ms)


def signed_pct_cell(pct: float | None) -> Cell:
    """'+5.1%'; from +1000% on, the ratio ('80x' for +7900%): a column of '+71377.5%' would not fit at 80."""
    if pct is None:
        return Cell("-", -1.0)
    return Cell(f"{1 + pct / 100:.0f}x" if pct >= 1000 else f"{pct:+.1f}%", pct)
