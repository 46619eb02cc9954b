"""The report's "Ops against the roofline" section (stepscope ops): per rank, the op groups on the device's
roofline chart, the table, the findings, the stacks of the costliest ops and time by module."""

from __future__ import annotations

from typing import Any

from stepscope.analysis.ops import RankOps
from stepscope.report.data import ReportData
from stepscope.report.html import charts
from stepscope.report.model import MAX_TABLE_RANKS, SECTION_TITLES, Charts, Section
from stepscope.report.tables import (
    coverage_text,
    module_table,
    op_stacks_table,
    ops_table,
    roof_text,
    saving_text,
)
from stepscope.units import fmt_us

TOP_GROUPS = 30  # table rows per rank (the chart has every group with FLOPs)
MODULE_DEPTH = 3
MIN_SHARE = (
    0.001  # op groups under this share of the time are left off the chart (a scalar's add stretched it)
)


def roofline(data: ReportData, pc: Charts) -> Section:
    s = Section("roofline", SECTION_TITLES["roofline"])
    if data.ops is None:
        s.empty = (
            "this run was recorded without record_shapes=True, which gives each op's FLOPs and bytes"
            if data.run is not None
            else "stepscope report --roofline adds this section for traces with recorded shapes (record_shapes=True)"
        )
        return s
    ranks = data.ops.ranks[:MAX_TABLE_RANKS]
    if len(data.ops.ranks) > len(ranks):
        s.paragraphs.append(
            f"The first {len(ranks)} of {len(data.ops.ranks)} ranks; `stepscope ops` gives all."
        )
    for rank in ranks:
        _rank(s, pc, rank, len(ranks) > 1)
    return s


def _rank(s: Section, pc: Charts, r: RankOps, multi: bool) -> None:
    who = f"rank {r.rank}: " if multi else ""
    roof = r.roofline
    s.facts.append((f"{who}device", f"{r.device or 'CPU'} · {roof_text(roof)}"))
    s.facts.append((f"{who}roof", roof.source))
    families = ", ".join(f"{name} {fmt_us(us)}" for name, us in r.families.items())
    kind = "device time" if r.time_kind == "device" else "wall time"
    s.facts.append(
        (f"{who}counted ops' {kind}", f"{fmt_us(r.op_time_us)}{coverage_text(r)}: {families or 'none'}")
    )
    s.items.extend(f"{who}{n}" for n in r.notes if not n.startswith("no roof:"))
    pc.add(
        s,
        charts.roofline(_points(r), _roofs(r)),
        f"{who}each op group (an op with one set of input shapes) at its FLOPs per byte and achieved TFLOP/s, "
        "a point's size its time"
        + ("; dashed: the device's roof per number format" if _roofs(r) else " (no roof: none is known)")
        + f". Copies and embeddings count no FLOPs, and groups under {100 * MIN_SHARE:g}% of the time are not "
        "drawn.",
    )
    if r.groups:
        s.tables.append(ops_table(r, top=TOP_GROUPS, title=f"{who}ops against the roofline"))
    for f in r.findings:
        s.paragraphs.append(
            f"{who}{f.message}. Do: {f.action}. Saves {saving_text(f)}. Priced: {f.how_priced}."
        )
    if r.stacks:
        s.tables.append(op_stacks_table(r, title=f"{who}where the costliest ops were issued"))
    if r.modules:
        s.tables.append(module_table(r, depth=MODULE_DEPTH, title=f"{who}time by module"))


def _points(r: RankOps) -> list[dict[str, Any]]:
    return [
        {
            "op": g.name,
            "shapes": g.shapes,
            "family": g.family,
            "ms": round(g.time_us / 1e3, 4),
            "TFLOP/s": g.tflops,
            "FLOP/byte": g.intensity,
            "of roof": "-" if g.efficiency is None else f"{100 * g.efficiency:.0f}%",
        }
        for g in r.groups
        if g.tflops and g.intensity and g.share >= MIN_SHARE
    ]


def _roofs(r: RankOps) -> list[dict[str, Any]]:
    """Each number format's roof as a line over the groups' range of intensity (and its ridge)."""
    roof = r.roofline
    intensities = [g.intensity for g in r.groups if g.intensity]
    if roof.tbps is None or not roof.peak_tflops or not intensities:
        return []
    low, high = min(intensities) / 2, max(intensities) * 2
    used = {g.dtype for g in r.groups if g.dtype}
    formats = {f: p for f, p in roof.peak_tflops.items() if f in used or f == "*"} or dict(
        list(roof.peak_tflops.items())[:1]
    )
    out = []
    for fmt, peak in formats.items():
        ridge = peak / roof.tbps
        name = "every format" if fmt == "*" else fmt
        xs = sorted({low, high, *([ridge] if low < ridge < high else [])})
        for i, x in enumerate(xs):
            point = {"roof": name, "FLOP/byte": x, "TFLOP/s": min(peak, roof.tbps * x)}
            if i == len(xs) - 1:
                point["label"] = f"{name} {peak:g}"
            out.append(point)
    return out
