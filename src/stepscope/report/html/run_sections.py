"""The report's sections of a run folder's own records (FLOPs, the memory log and files, system samples): what
capture wrote beside the traces, as model Sections. Formatting only."""

from __future__ import annotations

import heapq
from collections import Counter
from typing import TYPE_CHECKING, Any

from stepscope.report import columns as col
from stepscope.report.data import ReportData
from stepscope.report.html import charts
from stepscope.report.model import SECTION_TITLES, Charts, Section, table
from stepscope.report.tables import anomaly_table
from stepscope.runfolder.payloads import (
    FLOPS_BACKWARD,
    FLOPS_OUTSIDE_MODEL,
    FLOPS_OUTSIDE_MODULES,
    FlopsReport,
)
from stepscope.units import fmt_bytes, fmt_flops, fmt_tflops

if TYPE_CHECKING:
    from stepscope.analysis.run import RunFacts

# the FLOPs table's modules, the costliest (a page of every module of a huge model is MBs)
MAX_MODULE_ROWS = 2000


def _section(sid: str) -> Section:
    return Section(sid, SECTION_TITLES[sid])


# ------------------------------------------------------------------------------------------------ FLOPs
def anomalies(run: RunFacts) -> Section:
    """The windows a watching run opened by itself, first on the page: what the watch saw, what slowed the
    steps, each rank's share, how it was checked."""
    from stepscope.analysis.run.anomaly import work_line

    s = _section("anomalies")
    s.paragraphs.append(
        "The watch (watch=True) opened these windows when steps turned slower than the job's own noise allows; "
        "each is compared with a plain window of the run, both profiled."
    )
    for window in run.anomalies:
        asked = "" if window.asked_by is None else f"rank {window.asked_by}'s watch saw: "
        s.paragraphs.append(f"Steps {window.first}-{window.last} ({asked}{window.why}). {window.message}.")
        s.paragraphs.append(f"Checked: {window.check}.")
        if window.ranks:
            s.tables.append(anomaly_table(window))
        if line := work_line(window):
            s.paragraphs.append(line[0].upper() + line[1:] + ".")
        s.items.extend(window.notes)
    return s


def flops(data: ReportData, pc: Charts) -> Section:
    s = _section("flops")
    run = data.analysis.run
    if run is None:
        s.empty = "FLOPs are counted during capture (flop_counter_step); this report is of traces alone"
        return s
    if not run.flops:
        s.empty = run.flops_note or "no FLOP count in this run"
        return s
    for f in run.flops:
        s.facts.append((f"rank {f.rank}: FLOPs of step {f.step}", fmt_flops(f.total_flops)))
        s.facts.append(
            (
                f"rank {f.rank}: throughput",
                (fmt_tflops(f.tflops) if f.tflops is not None else "-")
                + (f", MFU {100 * f.mfu:.1f}% of {f.peak}" if f.mfu is not None else "")
                + (f" ({f.reason})" if f.reason else "")
                + (f"; {f.spread_note}" if f.spread_note else ""),
            )
        )
    report = data.run.flops[0] if data.run is not None and data.run.flops else None
    if report is not None:
        _flops_per_module(s, pc, report)
    return s


def _flops_per_module(s: Section, pc: Charts, report: FlopsReport) -> None:
    # the shallowest level with more than one module (below a model that wraps everything)
    at_depth = Counter(m.depth for m in report.modules)
    depths = sorted(at_depth)
    level = next((d for d in depths if at_depth[d] > 1), depths[0] if depths else 0)
    modules = sorted((m for m in report.modules if m.depth == level), key=lambda m: -m.flops)[:25]
    forward = report.backward_flops is not None  # (reports before stepscope.flops/3 charged the backward too)
    pc.add(
        s,
        charts.horizontal_bars(
            [
                {
                    "module": f"{m.label or '(model)'} ({m.type})" if m.type else m.label or "(model)",
                    "GFLOP": float(f"{m.flops / 1e9:.4g}"),
                }
                for m in modules
            ],
            label="module",
            value="GFLOP",
            value_title=f"GFLOP in step {report.step} (rank {report.rank})",
        ),
        "Forward FLOPs per module at the first level that splits the model (the backward is charged to no module)."
        if forward
        else "FLOPs per module at the first level that splits the model (forward + backward of the counted step).",
    )
    total = report.total_flops

    def row(name: str, type_: str | None, depth: int | None, flops: int) -> list[Any]:
        return [name, type_ or None, depth, flops, 100 * flops / total if total else None]

    # the costliest MAX_MODULE_ROWS modules, in the report's (tree) order
    shown = report.modules
    if len(shown) > MAX_MODULE_ROWS:
        kept = {id(m) for m in heapq.nlargest(MAX_MODULE_ROWS, shown, key=lambda m: m.flops)}
        shown = [m for m in shown if id(m) in kept]
    rows = [row(m.label or "(model)", m.type, m.depth, m.flops) for m in shown]
    if report.forward_outside_flops > 0:
        outside = FLOPS_OUTSIDE_MODEL if report.model is not None else FLOPS_OUTSIDE_MODULES
        rows.append(row(outside, None, None, report.forward_outside_flops))
    if report.backward_flops:
        rows.append(row(FLOPS_BACKWARD, None, None, report.backward_flops))
    s.tables.append(
        table(
            "flops-modules",
            [col.MODULE, col.MODULE_TYPE, col.DEPTH, col.FLOPS, col.SHARE],
            rows,
            caption=(
                "Forward FLOPs of every module that did any, its children's included; the backward in one "
                "row, charged to no module (docs/flops.md says why)."
                if forward
                else "Every module FlopCounterMode saw, nested by depth (forward + backward)."
            )
            + (
                f" The {MAX_MODULE_ROWS:,} costliest of {len(report.modules):,} modules are shown."
                if len(shown) < len(report.modules)
                else ""
            ),
        )
    )


# ------------------------------------------------------------------------------------------------ memory
def memory(data: ReportData, pc: Charts) -> Section:
    s = _section("memory")
    series = data.run
    if series is None:
        s.empty = "memory is recorded during capture (memory_log_every, memory_timeline, memory_snapshot)"
        return s
    for m in data.analysis.run.memory if data.analysis.run else []:
        s.facts.append((f"rank {m.rank}: peak RSS", fmt_bytes(m.peak_rss_bytes)))
        if m.peak_cuda_allocated_bytes is not None:
            s.facts.append((f"rank {m.rank}: peak CUDA allocated", fmt_bytes(m.peak_cuda_allocated_bytes)))
    values = []
    for p in series.memory:
        values.append({"step": p.step, "series": f"rank {p.rank} RSS", "value": _mib(p.rss_bytes)})
        if p.cuda_allocated_bytes is not None:
            values.append(
                {
                    "step": p.step,
                    "series": f"rank {p.rank} CUDA allocated",
                    "value": _mib(p.cuda_allocated_bytes),
                }
            )
        if p.cuda_peak_allocated_bytes is not None:
            values.append(
                {
                    "step": p.step,
                    "series": f"rank {p.rank} CUDA peak since last row",
                    "value": _mib(p.cuda_peak_allocated_bytes),
                }
            )
    pc.add(
        s,
        charts.lines(values, x="step", x_title="step", y_title="MiB"),
        "The memory log: process RSS and CUDA memory after each logged step.",
    )
    rows = []
    for mf in series.memory_files:
        if mf.report is None:
            s.items.append(f"{mf.path}: {mf.error}")
            continue
        for dev in mf.report.devices:
            rows.append(
                [
                    mf.kind,
                    mf.rank,
                    mf.step,
                    None if dev.device < 0 else dev.device,
                    dev.peak_allocated,
                    dev.peak_reserved,
                    len(dev.ooms),
                ]
            )
            if dev.timeline_by_category and mf.kind == "memory_timeline":
                t = dev.timeline_t_us
                values = [
                    {"ms": t[i] / 1000, "series": cat, "value": _mib(v)}
                    for cat, levels in dev.timeline_by_category.items()
                    for i, v in enumerate(levels)
                ]
                pc.add(
                    s,
                    charts.lines(values, x="ms", x_title="time in the window (ms)", y_title="MiB", area=True),
                    f"Memory timeline by category, rank {mf.rank}, window ending at step {mf.step}.",
                )
    if rows:
        s.tables.append(
            table(
                "memory-files",
                [
                    col.FILE,
                    col.RANK_TEXT,
                    col.STEP_TEXT,
                    col.DEVICE,
                    col.PEAK_ALLOCATED,
                    col.PEAK_RESERVED,
                    col.OOMS,
                ],
                rows,
                caption="Peaks of the memory timelines and snapshots (`stepscope memory FILE` for the details).",
                filter=False,
            )
        )
    if not values and not rows and not s.items:
        s.empty = "this run logged no memory (memory_log_every, memory_timeline, memory_snapshot were off)"
    return s


# ------------------------------------------------------------------------------------------------ system
def system(data: ReportData, pc: Charts) -> Section:
    s = _section("system")
    series = data.run
    if series is None or not series.system:
        s.empty = (
            "system samples are taken during capture (system_sample_interval)"
            if series is None
            else "this run took no system samples (system_sample_interval was off)"
        )
        return s
    seen = set()
    cpu, mem, gpu = [], [], []
    for p in series.system:
        key = (p.rank, p.t_s)
        if key not in seen:
            seen.add(key)
            cpu.append({"s": p.t_s, "series": f"rank {p.rank} process", "value": p.process_cpu_percent})
            cpu.append({"s": p.t_s, "series": f"rank {p.rank} system", "value": p.system_cpu_percent})
            mem.append({"s": p.t_s, "series": f"rank {p.rank} RSS", "value": _mib(p.rss_bytes)})
        if p.gpu is not None and p.gpu_util_percent is not None:
            gpu.append({"s": p.t_s, "series": f"rank {p.rank} GPU {p.gpu}", "value": p.gpu_util_percent})
    pc.add(
        s,
        charts.lines(cpu, x="s", x_title="seconds", y_title="CPU %"),
        "CPU use: the training process (% of one core) and the whole machine (% of all cores).",
    )
    pc.add(s, charts.lines(mem, x="s", x_title="seconds", y_title="MiB"), "Resident memory of the process.")
    if gpu:
        pc.add(
            s,
            charts.lines(gpu, x="s", x_title="seconds", y_title="GPU utilisation %"),
            "GPU utilisation (NVML).",
        )
    for f in data.analysis.run.system if data.analysis.run else []:
        usage = f.note or ""
        if f.process_cpu_mean_percent is not None and f.process_cpu_max_percent is not None:
            usage = (
                f"process CPU mean {f.process_cpu_mean_percent:.0f}%, max {f.process_cpu_max_percent:.0f}%"
            )
        s.facts.append((f"rank {f.rank}: samples", f"{f.samples} over {f.seconds:.1f} s; {usage}"))
    return s


def _mib(n: int | None) -> float | None:
    return None if n is None else round(n / 2**20, 3)
