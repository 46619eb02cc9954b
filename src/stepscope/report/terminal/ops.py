"""Render `stepscope ops` (analysis/ops: each op against its device's roofline) in the terminal, per rank."""

from __future__ import annotations

from collections.abc import Iterator

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.text import Text

from stepscope.analysis.ops import OpsResult, RankOps
from stepscope.report.tables import (
    coverage_text,
    module_table,
    op_stacks_table,
    ops_table,
    roof_text,
    saving_text,
)
from stepscope.report.terminal import fit_table, fmt_us, plain

MODULE_DEPTH = 3  # module tree levels the terminal shows (--json: all)


class OpsReport:
    """Per rank: the device and its roof, time per family, the op groups' table, then the findings."""

    def __init__(self, result: OpsResult, *, top: int, wide: bool = False, depth: int = MODULE_DEPTH) -> None:
        self.depth = depth
        self.result = result
        self.top = top
        self.wide = wide

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for i, rank in enumerate(self.result.ranks):
            if i:
                yield Text("")
            yield from _rank(rank, self.top, self.wide, self.depth)


def _rank(r: RankOps, top: int, wide: bool, depth: int) -> Iterator[RenderableType]:
    yield Text(f"rank {r.rank}  {plain(r.path)}", style="bold")
    roof = r.roofline
    yield Text(f"device {plain(r.device or 'CPU')} · {roof_text(roof)}")
    yield Text(f"roof: {plain(roof.source)}", style="dim")
    kind = "device time" if r.time_kind == "device" else "wall time"
    families = " · ".join(f"{name} {fmt_us(us)}" for name, us in r.families.items())
    yield Text(f"counted ops' {kind} {fmt_us(r.op_time_us)}{coverage_text(r)}: {families or 'none'}")
    for note in r.notes:
        if not note.startswith("no roof:"):  # (said on the roof's line)
            yield Text(f"note: {plain(note)}", style="yellow")
    if r.groups:
        yield fit_table(ops_table(r, top=top, title="Ops against the roofline", terminal=True), wide=wide)
    for f in r.findings:
        yield Text("")
        yield Text(f"finding: {plain(f.message)}", style="bold")
        yield Text(f"  do: {plain(f.action)}")
        yield Text(f"  saves: {plain(saving_text(f))}")
        yield Text(f"  priced: {plain(f.how_priced)}", style="dim")
    if r.stacks:
        yield Text("")
        yield fit_table(op_stacks_table(r, title="Where the costliest ops were issued"), wide=wide)
    if r.modules:
        yield Text("")
        yield fit_table(module_table(r, depth=depth, title="Time by module"), wide=wide)
