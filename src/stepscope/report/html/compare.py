"""The compare page's sections (`stepscope report BASE --compare TEST`), filled from a Diff: the step time and the
steps it was compared over, the profiled window's phases with their intervals, the findings that changed (whole
messages), the kernels and ops. Formatting only."""

from __future__ import annotations

from typing import Any

from stepscope.analysis.diff.compare import PHASE_LABELS
from stepscope.report import columns as col
from stepscope.report._diff_tables import phase_table, step_time_table
from stepscope.report._diff_text import change_text, fast_change_text, finding_head
from stepscope.report.html import charts
from stepscope.report.model import Charts, Section, table
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
    s.tables.append(step_time_table(st))
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
    phases.tables.append(phase_table(diff))
    return phases


def _findings(diff: Any) -> Section:
    found = Section("findings-diff", "Findings that appeared, disappeared or changed")
    if not diff.findings:
        found.empty = "the same findings at the same severity and price in both runs"
        return found
    found.tables.append(
        table(
            "finding-changes",
            [col.FINDING, col.WHAT_CHANGED, col.BASE_MS, col.TEST_MS, col.MESSAGE],
            # the whole message: it is the advice, never shortened like a name
            ([f.id, finding_head(f), f.base_cost_ms, f.test_cost_ms, f.message] for f in diff.findings),
        )
    )
    return found


def _changes(diff: Any) -> Section:
    tables = Section("changes", "Kernels and ops that changed")
    tables.paragraphs.append(
        f"Totals per profiled step. A change under {fmt_us(diff.min_change_us)} per step (50 us or 1% of the base "
        "run's profiled step) is listed last and not flagged: the window has too few steps to test each name."
    )
    for tid, name_column, deltas in (
        ("kernel-deltas", col.KERNEL, diff.kernels),
        ("op-deltas", col.OP, diff.ops),
    ):
        if not deltas:
            continue
        tables.tables.append(
            table(
                tid,
                [
                    name_column,
                    col.STATUS,
                    col.BASE_CALLS,
                    col.TEST_CALLS,
                    col.BASE_TOTAL,
                    col.TEST_TOTAL,
                    col.CHANGE_PER_STEP,
                    col.MEAN_RATIO,
                    col.ABOVE_THRESHOLD,
                ],
                (
                    [
                        d.name,
                        d.status,
                        d.base_count,
                        d.test_count,
                        d.base_total_us,
                        d.test_total_us,
                        d.delta_per_step_us,
                        d.mean_ratio,
                        d.above_threshold,
                    ]
                    # the changes above the threshold first, each group by size
                    for d in sorted(deltas, key=lambda d: not d.above_threshold)[:300]
                ),
            )
        )
        below = sum(not d.above_threshold for d in deltas)
        if below:
            tables.paragraphs.append(
                f"{below} of the {len(deltas)} {name_column.label}s listed changed by less than the threshold: "
                "'above threshold' says which."
            )
    if not tables.tables:
        tables.empty = "no kernel or op changed"
    return tables
