"""Render a `stepscope.analysis.diff.Diff` (formatting only): the step and its phases per step, the findings
that came and went, the gates, the flagged mean changes, then the largest kernel and op changes per step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.padding import Padding
from rich.text import Text

from stepscope.analysis.diff import PHASE_LABELS, Delta, Diff
from stepscope.report.terminal import fmt_ms, fmt_us, make_table, plain


class DiffReport:
    def __init__(self, diff: Diff, top: int = 10, *, wide: bool = False) -> None:
        self.diff = diff
        self.top = top
        self.wide = wide

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        d = self.diff
        yield Text(f"base  {plain(d.base.path)}\ntest  {plain(d.test.path)}", style="bold")
        yield Text(
            f"changes under {fmt_us(d.noise_floor_us)} per step are noise and not flagged", style="dim"
        )
        if d.phases:
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
                        "BREACHED" if g.breached else ("not checked" if g.test is None else "ok"),
                    ]
                    for g in d.gates
                ],
            )
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
        yield from _changes("Kernels", d.kernels, self.top, self.wide)
        yield from _changes("CPU ops (self time)", d.ops, self.top, self.wide)


def _phases(d: Diff) -> RenderableType:
    rows: list[list[Any]] = []
    for p in d.phases:
        change = "-"
        if p.delta_ms is not None:
            change = ("+" if p.delta_ms > 0 else "") + fmt_ms(p.delta_ms) if p.delta_ms else "0"
        pct = f"{p.change_pct:+.1f}%" if p.change_pct is not None else "-"
        rows.append(
            [
                PHASE_LABELS.get(p.name, p.name),
                fmt_ms(p.base_ms),
                fmt_ms(p.test_ms),
                change,
                pct,
                "" if p.significant else "~",  # under the noise floor
            ]
        )
    return make_table(
        "Per step (mean over ranks and steps; ~: under the noise floor)",
        ["phase", "base", "test", "change", "%", "noise"],
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
        where = "" if f.rank is None else f" rank {f.rank}"
        if f.status == "appeared":
            price = f", {fmt_ms(f.test_cost_ms)} per step" if f.test_cost_ms is not None else ""
            head = f"  new{where} {f.severity.upper()} {f.id}{price}"
        elif f.status == "disappeared":
            price = f", was {fmt_ms(f.base_cost_ms)} per step" if f.base_cost_ms is not None else ""
            head = f"  gone{where} {f.severity.upper()} {f.id}{price}"
        else:
            head = f"  changed{where} {f.id}: {fmt_ms(f.base_cost_ms)} -> {fmt_ms(f.test_cost_ms)} per step"
        yield Text(plain(head))
        if f.status != "disappeared":
            yield Padding(Text(plain(f.message), style="dim"), (0, 0, 0, 4))


def _changes(title: str, deltas: list[Delta], top: int, wide: bool) -> Iterator[RenderableType]:
    shown = [x for x in deltas if x.significant][:top]
    hidden = sum(1 for x in deltas if not x.significant)
    yield Text("")
    if not shown:
        yield Text(f"{title}: no change above the noise floor" + (f" ({hidden} below it)" if hidden else ""))
        return
    yield make_table(
        f"{title}: {len(shown)} largest changes per step"
        + (f" ({hidden} more below the noise floor)" if hidden else ""),
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
