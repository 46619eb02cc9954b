"""Render a `stepscope.analysis.diff.compare.Diff` (formatting only): the step time and the steps it was compared over,
the profiled window's phases per step with their intervals, the findings that came, went or changed, the gates,
the flagged mean changes, then the largest kernel and op changes per step."""

from __future__ import annotations

from collections.abc import Iterator

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.padding import Padding
from rich.text import Text

from stepscope.analysis.diff.compare import Delta, Diff, Gate
from stepscope.analysis.diff.steps import StepComparison
from stepscope.report import columns as col
from stepscope.report._diff_tables import phase_table, signed_pct_cell, step_time_table
from stepscope.report._diff_text import change_text, fast_change_text, finding_head, sample_text
from stepscope.report.model import Cell, Column, Table, table
from stepscope.report.terminal import fit_table, fmt_ms, fmt_us, plain


class DiffReport:
    def __init__(self, diff: Diff, top: int = 10, *, wide: bool = False) -> None:
        self.diff = diff
        self.top = top
        self.wide = wide

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        d = self.diff
        yield Text(f"base  {plain(d.base.path)}\ntest  {plain(d.test.path)}", style="bold")
        yield from step_time_lines(d.step_time)
        if d.phases:
            yield Text("")
            yield _phases(d)
        else:
            yield Text("no profiler steps in either run: per-step phases unavailable")
        yield from _findings(d)
        if d.gates:
            yield Text("")
            yield fit_table(_gate_table(d))
            for g in d.gates:
                yield Padding(Text(plain(f"{g.expression}: {g.reason}"), style="dim"), (0, 0, 0, 2))
        flagged = [x for x in d.kernels if x.flagged] + [x for x in d.ops if x.flagged]
        if flagged:
            yield Text("")
            title = f"Mean duration changed {d.factor:g}x or more"
            yield fit_table(_flagged_table(flagged[: self.top], title), wide=self.wide)
        recounted = [x for x in d.kernels if x.delta_count]
        if recounted:
            yield Text("")
            yield fit_table(_recounted_table(recounted[: self.top]), wide=self.wide)
        yield Text("")
        yield Text(
            f"Kernels and ops: totals per profiled step; changes under {fmt_us(d.min_change_us)} per step are not "
            "listed",
            style="dim",
        )
        yield from _changes("Kernels", col.KERNEL, d.kernels, self.top, self.wide)
        yield from _changes("CPU ops (self time)", col.OP, d.ops, self.top, self.wide)


def step_time_lines(st: StepComparison) -> Iterator[RenderableType]:
    """The step time: which steps, the medians with their quartiles, the change and its interval."""
    yield Text("")
    yield fit_table(step_time_table(st, compared=False, title="Step time"))
    base, test = sample_text(st.base), sample_text(st.test)
    if base == test:
        yield Text(plain(f"compared: {base} in each run"))
    else:
        yield Text(plain(f"compared: base {base}; test {test}"))
    yield Text(plain(f"change {change_text(st.delta_ms, st.low_ms, st.high_ms, st.change_pct)}"))
    if st.fast_delta_ms is not None and st.fast_low_ms is not None:
        yield Text(plain(f"fast steps {fast_change_text(st)}"), style="dim")
    if st.note:
        yield Text(plain(st.note), style="dim")


def _phases(d: Diff) -> RenderableType:
    counts = sorted({(p.base_values, p.test_values) for p in d.phases if p.name == "profiled_step"})
    over = f" over {counts[0][0]} and {counts[0][1]} rank-steps" if counts else ""
    title = f"Profiled window per step (medians{over}; ~: the 95% interval of the change holds 0; too few: no interval)"
    return fit_table(phase_table(d, compact=True, title=title))


def _findings(d: Diff) -> Iterator[RenderableType]:
    if not d.findings:
        yield Text("")
        yield Text("Findings: the same in both runs")
        return
    yield Text("")
    yield Text("Findings that changed", style="bold")
    for f in d.findings:
        yield Text(plain("  " + finding_head(f)))
        if f.status != "disappeared":
            yield Padding(Text(plain(f.message), style="dim"), (0, 0, 0, 4))


def _changes(
    title: str, name_column: Column, deltas: list[Delta], top: int, wide: bool
) -> Iterator[RenderableType]:
    shown = [x for x in deltas if x.above_threshold][:top]
    hidden = sum(1 for x in deltas if not x.above_threshold)
    yield Text("")
    if not shown:
        yield Text(f"{title}: no change above the threshold" + (f" ({hidden} below it)" if hidden else ""))
        return
    heading = f"{title}: {len(shown)} largest changes per step" + (
        f" ({hidden} more below the threshold)" if hidden else ""
    )
    yield fit_table(
        table(
            "changes",
            [name_column, col.CALLS_CHANGE, col.BASE_TOTAL, col.TEST_TOTAL, col.CHANGE_PER_STEP],
            (
                [
                    x.name,
                    _count(x),
                    x.base_total_us if x.base_count else None,
                    x.test_total_us if x.test_count else None,
                    _signed(x, mark=True),
                ]
                for x in shown
            ),
            title=heading,
        ),
        wide=wide,
    )


def _gate_table(d: Diff) -> Table:
    return table(
        "gates",
        [col.GATE, col.BASE_MS, col.TEST_MS, col.CHANGE_PCT, col.RESULT],
        (
            [
                g.expression,
                _gate_value(g.metric, g.base),
                _gate_value(g.metric, g.test),
                signed_pct_cell(g.change_pct),
                _gate_result(g),
            ]
            for g in d.gates
        ),
        title="Gates (--fail-on)",
    )


def _flagged_table(flagged: list[Delta], title: str) -> Table:
    return table(
        "flagged",
        [col.NAME, col.BASE_MEAN, col.TEST_MEAN, col.MEAN_RATIO, col.CHANGE_PER_STEP],
        ([x.name, x.base_mean_us, x.test_mean_us, x.mean_ratio, _signed(x)] for x in flagged),
        title=title,
    )


def _recounted_table(recounted: list[Delta]) -> Table:
    return table(
        "recounted",
        [col.KERNEL, col.BASE_CALLS, col.TEST_CALLS, col.CHANGE_IN_CALLS],
        ([x.name, x.base_count, x.test_count, Cell(f"{x.delta_count:+d}", x.delta_count)] for x in recounted),
        title="Kernels launched a different number of times (new, gone or recounted)",
    )


def _gate_result(g: Gate) -> str:
    """'BREACHED', 'BREACHED rank 1', 'UNDECIDED' or 'ok'."""
    where = f" rank {g.rank}" if g.rank is not None else ""
    if g.outcome == "breach":
        return "BREACHED" + where
    return "UNDECIDED" + where if g.outcome == "undecided" else "ok"


def _gate_value(metric: str, value: float | None) -> Cell:
    """A gate's value: a count of findings, or a time."""
    if value is None:
        return Cell("-", -1.0)
    return Cell(f"{value:.0f}" if metric == "new_high" else fmt_ms(value), value)


def _count(x: Delta) -> str:
    if x.status == "added":
        return f"new {x.test_count}"
    if x.status == "removed":
        return f"gone {x.base_count}"
    return str(x.base_count) if x.base_count == x.test_count else f"{x.base_count}->{x.test_count}"


def _signed(x: Delta, *, mark: bool = False) -> Cell:
    """The change per step with its sign; `mark`: '!' before a flagged one (its mean moved by the factor or
    more)."""
    us = x.delta_per_step_us
    text = ("+" if us > 0 else "") + fmt_us(us) if us else "0"
    return Cell(("! " if mark and x.flagged else "") + text, us)
