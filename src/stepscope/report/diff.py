"""Render a `stepscope.analysis.diff.compare.Diff` (formatting only): the step time and the steps it was compared over,
the profiled window's phases per step with their intervals, the findings that came, went or changed, the gates,
the flagged mean changes, then the largest kernel and op changes per step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.padding import Padding
from rich.text import Text

from stepscope.analysis.diff.compare import PHASE_LABELS, Delta, Diff
from stepscope.analysis.diff.steps import StepComparison
from stepscope.report._diff_text import (
    change_text,
    fast_change_text,
    finding_head,
    quartiles_text,
    sample_text,
    signed_ms,
)
from stepscope.report.terminal import fmt_ms, fmt_us, make_table, plain


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
            yield make_table(
                "Gates (--fail-on)",
                ["gate", "base", "test", "change", "result"],
                [
                    [
                        g.expression,
                        _gate_value(g.metric, g.base),
                        _gate_value(g.metric, g.test),
                        f"{g.change_pct:+.1f}%" if g.change_pct is not None else "-",
                        "BREACHED" if g.breached else ("not checked" if _unchecked(g.reason) else "ok"),
                    ]
                    for g in d.gates
                ],
            )
            for g in d.gates:
                yield Padding(Text(plain(f"{g.expression}: {g.reason}"), style="dim"), (0, 0, 0, 2))
        flagged = [x for x in d.kernels if x.flagged] + [x for x in d.ops if x.flagged]
        if flagged:
            yield Text("")
            yield make_table(
                f"Mean duration changed {d.factor:g}x or more",
                ["name", "mean base", "mean test", "ratio", "per step"],
                [
                    [x.name, fmt_us(x.base_mean_us), fmt_us(x.test_mean_us), _x(x.mean_ratio), _signed(x)]
                    for x in flagged[: self.top]
                ],
                wide=self.wide,
            )
        recounted = [x for x in d.kernels if x.delta_count]
        if recounted:
            yield Text("")
            yield make_table(
                "Kernels launched a different number of times (new, gone or recounted)",
                ["kernel", "base", "test", "change"],
                [
                    [x.name, str(x.base_count), str(x.test_count), f"{x.delta_count:+d}"]
                    for x in recounted[: self.top]
                ],
                wide=self.wide,
            )
        yield Text("")
        yield Text(
            f"Kernels and ops: totals per profiled step; changes under {fmt_us(d.min_change_us)} per step are not "
            "listed",
            style="dim",
        )
        yield from _changes("Kernels", d.kernels, self.top, self.wide)
        yield from _changes("CPU ops (self time)", d.ops, self.top, self.wide)


def step_time_lines(st: StepComparison) -> Iterator[RenderableType]:
    """The step time: which steps, the medians with their quartiles, the change and its interval."""
    yield Text("")
    yield make_table(
        "Step time",
        ["run", "median", "quartiles", "fast (p10)"],
        [
            [side, fmt_ms(s.median_ms), quartiles_text(s), fmt_ms(s.fast_ms)]
            for side, s in (("base", st.base), ("test", st.test))
        ],
        numeric_from=1,
    )
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
    rows: list[list[Any]] = []
    for p in d.phases:
        change = "-" if p.delta_ms is None else signed_ms(p.delta_ms)
        pct = f"{p.change_pct:+.1f}%" if p.change_pct is not None else "-"
        interval = (
            f"{signed_ms(p.low_ms)} to {signed_ms(p.high_ms)}"
            if p.low_ms is not None and p.high_ms is not None
            else "too few"
        )
        rows.append(
            [
                PHASE_LABELS.get(p.name, p.name),
                fmt_ms(p.base_ms),
                fmt_ms(p.test_ms),
                change,
                pct,
                interval,
                "" if p.significant else "~",
            ]
        )
    counts = sorted({(p.base_values, p.test_values) for p in d.phases if p.name == "profiled_step"})
    over = f" over {counts[0][0]} and {counts[0][1]} rank-steps" if counts else ""
    return make_table(
        f"Profiled window per step (medians{over}; ~: the 95% interval of the change holds 0)",
        ["phase", "base", "test", "change", "%", "95% interval", "~"],
        rows,
    )


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


def _changes(title: str, deltas: list[Delta], top: int, wide: bool) -> Iterator[RenderableType]:
    shown = [x for x in deltas if x.above_threshold][:top]
    hidden = sum(1 for x in deltas if not x.above_threshold)
    yield Text("")
    if not shown:
        yield Text(f"{title}: no change above the threshold" + (f" ({hidden} below it)" if hidden else ""))
        return
    yield make_table(
        f"{title}: {len(shown)} largest changes per step"
        + (f" ({hidden} more below the threshold)" if hidden else ""),
        ["name", "count", "base", "test", "per step"],
        [
            [
                x.name,
                _count(x),
                fmt_us(x.base_total_us if x.base_count else None),
                fmt_us(x.test_total_us if x.test_count else None),
                ("! " if x.flagged else "") + _signed(x),
            ]
            for x in shown
        ],
        wide=wide,
    )


def _unchecked(reason: str) -> bool:
    return reason.endswith("not checked")


def _gate_value(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if metric == "new_high" else fmt_ms(value)


def _count(x: Delta) -> str:
    if x.status == "added":
        return f"new {x.test_count}"
    if x.status == "removed":
        return f"gone {x.base_count}"
    return str(x.base_count) if x.base_count == x.test_count else f"{x.base_count}->{x.test_count}"


def _signed(x: Delta) -> str:
    us = x.delta_per_step_us
    return ("+" if us > 0 else "") + fmt_us(us) if us else "0"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"
