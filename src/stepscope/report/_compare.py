"""The compare page's sections (`stepscope report BASE --compare TEST`), filled from a Diff: the step time and the
steps it was compared over, the profiled window's phases with their intervals, the findings that changed (whole
messages), the kernels and ops. Formatting only."""

from __future__ import annotations

from typing import Any

from stepscope.analysis.diff.compare import PHASE_LABELS
from stepscope.report import _charts as charts
from stepscope.report._diff_text import (
    change_text,
    fast_change_text,
    finding_head,
    quartiles_text,
    sample_text,
    signed_ms,
)
from stepscope.report._page import (
    Cell,
    Charts,
    Section,
    Table,
    int_cell,
    ms_cell,
    name_cell,
    pct_cell,
    us_cell,
)
from stepscope.units import fmt_ms, fmt_us


def compare_header(diff: Any) -> list[tuple[str, str]]:
    st = diff.step_time
    return [
        ("base", diff.base.path),
        ("test", diff.test.path),
        ("median step", f"{fmt_ms(st.base.median_ms)} -> {fmt_ms(st.test.median_ms)}"),
        ("change", change_text(st.delta_ms, st.low_ms, st.high_ms, st.change_pct)),
    ]


def compare_sections(diff: Any, pc: Charts) -> list[Section]:
    return [_step_time(diff), _phases(diff, pc), _findings(diff), _changes(diff)]


def _step_time(diff: Any) -> Section:
    st = diff.step_time
    s = Section("step-time", "Step time")
    s.paragraphs.append(
        "The change is the Hodges-Lehmann shift (the median of every difference between a test step and a base "
        "step) with its 95% interval; it is significant when the interval excludes zero."
    )
    s.tables.append(
        Table(
            "step-time-table",
            [
                ("run", False),
                ("median", True),
                ("quartiles", False),
                ("fast (p10)", True),
                ("steps compared", False),
            ],
            [
                [
                    Cell(side),
                    ms_cell(x.median_ms),
                    Cell(quartiles_text(x)),
                    ms_cell(x.fast_ms),
                    Cell(sample_text(x)),
                ]
                for side, x in (("base", st.base), ("test", st.test))
            ],
            filter=False,
        )
    )
    s.paragraphs.append("Change: " + change_text(st.delta_ms, st.low_ms, st.high_ms, st.change_pct) + ".")
    if st.fast_delta_ms is not None and st.fast_low_ms is not None:
        s.paragraphs.append(
            "Fast steps (10th percentile): "
            + fast_change_text(st)
            + ". A slower code path slows every step, the fast ones too; a busier machine slows more of them."
        )
    if st.note:
        s.paragraphs.append(st.note[0].upper() + st.note[1:] + ".")
    return s


def _phases(diff: Any, pc: Charts) -> Section:
    phases = Section("phases", "Profiled window: phases per step")
    phases.paragraphs.append(
        "The median per step over every rank's profiled steps in each run, and the change with its 95% interval "
        "(too few: the runs' steps cannot bound it; record more active steps)."
    )
    values = []
    for p in diff.phases:
        label = PHASE_LABELS.get(p.name, p.name)
        if p.base_ms is not None:
            values.append({"phase": label, "run": "base", "ms": round(p.base_ms, 4)})
        if p.test_ms is not None:
            values.append({"phase": label, "run": "test", "ms": round(p.test_ms, 4)})
    spec = charts.horizontal_bars(values, label="phase", value="ms", value_title="per step (ms)", color="run")
    if spec is not None:
        spec["encoding"]["yOffset"] = {"field": "run"}
        spec["encoding"]["y"]["sort"] = None
    pc.add(phases, spec, "Each phase per step (median), base and test.")
    phases.tables.append(
        Table(
            "phase-table",
            [
                ("phase", False),
                ("base", True),
                ("test", True),
                ("change", True),
                ("%", True),
                ("95% interval", False),
                ("significant", False),
            ],
            [
                [
                    Cell(PHASE_LABELS.get(p.name, p.name)),
                    ms_cell(p.base_ms),
                    ms_cell(p.test_ms),
                    ms_cell(p.delta_ms),
                    pct_cell(p.change_pct),
                    Cell(
                        f"{signed_ms(p.low_ms)} to {signed_ms(p.high_ms)}"
                        if p.low_ms is not None and p.high_ms is not None
                        else "too few"
                    ),
                    Cell("yes" if p.significant else "no"),
                ]
                for p in diff.phases
            ],
            filter=False,
        )
    )
    return phases


def _findings(diff: Any) -> Section:
    found = Section("findings-diff", "Findings that appeared, disappeared or changed")
    if not diff.findings:
        found.empty = "the same findings at the same severity and price in both runs"
        return found
    found.tables.append(
        Table(
            "finding-changes",
            [("finding", False), ("what changed", False), ("base", True), ("test", True), ("message", False)],
            [
                [
                    Cell(f.id),
                    Cell(finding_head(f)),
                    ms_cell(f.base_cost_ms),
                    ms_cell(f.test_cost_ms),
                    # the whole message: it is the advice, never shortened like a name
                    Cell(f.message),
                ]
                for f in diff.findings
            ],
        )
    )
    return found


def _changes(diff: Any) -> Section:
    tables = Section("changes", "Kernels and ops that changed")
    tables.paragraphs.append(
        f"Totals per profiled step. A change under {fmt_us(diff.min_change_us)} per step (50 us or 1% of the base "
        "run's profiled step) is listed last and not flagged: the window has too few steps to test each name."
    )
    for tid, title, deltas in (("kernel-deltas", "kernel", diff.kernels), ("op-deltas", "op", diff.ops)):
        if not deltas:
            continue
        tables.tables.append(
            Table(
                tid,
                [
                    (title, False),
                    ("status", False),
                    ("base calls", True),
                    ("test calls", True),
                    ("base total", True),
                    ("test total", True),
                    ("change per step", True),
                    ("mean ratio", True),
                    ("above threshold", False),
                ],
                [
                    [
                        name_cell(d.name),
                        Cell(d.status),
                        int_cell(d.base_count),
                        int_cell(d.test_count),
                        us_cell(d.base_total_us),
                        us_cell(d.test_total_us),
                        us_cell(d.delta_per_step_us),
                        Cell("-" if d.mean_ratio is None else f"{d.mean_ratio:.2f}x", d.mean_ratio or -1.0),
                        Cell("yes" if d.above_threshold else "no"),
                    ]
                    # the changes above the threshold first, each group by size
                    for d in sorted(deltas, key=lambda d: not d.above_threshold)[:300]
                ],
            )
        )
        below = sum(not d.above_threshold for d in deltas)
        if below:
            tables.paragraphs.append(
                f"{below} of the {len(deltas)} {title}s listed changed by less than the threshold: "
                "'above threshold' says which."
            )
    if not tables.tables:
        tables.empty = "no kernel or op changed"
    return tables
