"""Render a `stepscope.analysis.diff.Diff` as rich tables (formatting only)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from stepscope.analysis.diff import Delta, Diff
from stepscope.report.terminal import fmt_pct, fmt_us, kernel_label, make_table, plain, shorten

NUMBERS_WIDTH = 62
MIN_NAME_WIDTH = 18


class DiffReport:
    """Run totals side by side, then flagged kernels, then the largest kernel and op changes."""

    def __init__(self, diff: Diff, top: int = 10) -> None:
        self.diff = diff
        self.top = top

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        d = self.diff
        width = max(MIN_NAME_WIDTH, options.max_width - NUMBERS_WIDTH)
        yield Text(f"base  {plain(d.base.path)}\ntest  {plain(d.test.path)}", style="bold")
        yield _totals(d)
        flagged = [k for k in d.kernels if k.flagged] + [o for o in d.ops if o.flagged]
        if flagged:
            yield Text("")
            yield Text(f"Mean duration changed {d.factor:g}x or more:", style="bold red")
            for x in flagged[: self.top]:
                yield Text(
                    f"  {plain(x.name)}: {fmt_us(x.base_mean_us)} -> "
                    f"{fmt_us(x.test_mean_us)} ({x.mean_ratio:g}x, {x.test_count} calls)"
                )
        for title, rows in (
            ("Kernels that appeared or disappeared", _gone_or_new(d.kernels)),
            ("CPU ops that appeared or disappeared", _gone_or_new(d.ops)),
        ):
            if rows:
                yield Text("")
                yield Text(title, style="bold")
                for x in rows[: self.top]:
                    where = "only in test" if x.status == "added" else "only in base"
                    yield Text(f"  {where} ({x.base_count or x.test_count}x): {plain(x.name)}")
        recounted = [x for x in d.kernels if x.status == "changed" and x.delta_count]
        if recounted:
            yield Text("")
            yield Text("Kernels launched a different number of times", style="bold")
            for x in recounted[: self.top]:
                yield Text(f"  {x.base_count} -> {x.test_count} ({x.delta_count:+d}): {plain(x.name)}")
        yield from _changes("Kernels", d.kernels, self.top, width, kernel=True)
        yield from _changes("CPU ops (self time)", d.ops, self.top, width, kernel=False)


def _totals(d: Diff) -> Table:
    b, t = d.base, d.test
    rows: list[list[Any]] = [
        ["profiler steps", b.steps, t.steps, _signed(t.steps - b.steps), ""],
        [
            "mean step time",
            fmt_us(b.step_mean_us),
            fmt_us(t.step_mean_us),
            _signed_us(d.step_delta_us),
            _x(d.step_ratio),
        ],
        [
            "GPU busy (union)",
            fmt_us(b.gpu_busy_us),
            fmt_us(t.gpu_busy_us),
            _signed_us(t.gpu_busy_us - b.gpu_busy_us),
            _x(_ratio(t.gpu_busy_us, b.gpu_busy_us)),
        ],
        ["GPU busy % of span", fmt_pct(b.gpu_busy_pct), fmt_pct(t.gpu_busy_pct), "", ""],
        [
            "kernel time (sum)",
            fmt_us(b.kernel_total_us),
            fmt_us(t.kernel_total_us),
            _signed_us(t.kernel_total_us - b.kernel_total_us),
            _x(_ratio(t.kernel_total_us, b.kernel_total_us)),
        ],
        [
            "CPU ops self time",
            fmt_us(b.cpu_self_us),
            fmt_us(t.cpu_self_us),
            _signed_us(t.cpu_self_us - b.cpu_self_us),
            _x(_ratio(t.cpu_self_us, b.cpu_self_us)),
        ],
    ]
    return make_table(None, ["", "Base", "Test", "Change", "Ratio"], rows)


def _changes(
    title: str, deltas: list[Delta], top: int, width: int, *, kernel: bool
) -> Iterator[RenderableType]:
    if not deltas:
        yield Text("")
        yield Text(f"{title}: no change")
        return
    label = kernel_label if kernel else shorten
    yield Text("")
    yield make_table(
        f"{title}: {min(top, len(deltas))} largest changes of {len(deltas)}",
        ["Name", "Count", "Total base", "Total test", "Change", "Mean ratio"],
        (
            [
                label(x.name, width),
                _count(x),
                fmt_us(x.base_total_us if x.base_count else None),
                fmt_us(x.test_total_us if x.test_count else None),
                _signed_us(x.delta_total_us),
                ("! " if x.flagged else "") + _x(x.mean_ratio),
            ]
            for x in deltas[:top]
        ),
    )


def _gone_or_new(deltas: list[Delta]) -> list[Delta]:
    return [x for x in deltas if x.status != "changed"]


def _count(x: Delta) -> str:
    return str(x.base_count) if x.base_count == x.test_count else f"{x.base_count} -> {x.test_count}"


def _signed(n: int) -> str:
    return f"{n:+d}" if n else "0"


def _signed_us(us: float | None) -> str:
    if us is None:
        return "-"
    return ("+" if us > 0 else "") + fmt_us(us) if us else "0"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _ratio(new: float, old: float) -> float | None:
    return new / old if old else None
