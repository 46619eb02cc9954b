"""The report's sections, as plain view objects (html.Section, html.Table) filled from ReportData.

Numbers are formatted here with stepscope.units, as in the terminal; nothing is computed that the analysis did
not already compute (sums of parts for a chart's stacking aside).
"""

from __future__ import annotations

import statistics
from typing import Any

from stepscope.analysis.findings.rules import Finding
from stepscope.analysis.report_data import ReportData
from stepscope.report import _charts as charts
from stepscope.report._page import (
    FINDING_SECTIONS,
    MAX_TABLE_RANKS,
    SECTION_TITLES,
    Cell,
    Charts,
    Section,
    Table,
    bytes_cell,
    int_cell,
    ms_cell,
    name_cell,
    pct_cell,
    us_cell,
)
from stepscope.runfolder.payloads import (
    FLOPS_BACKWARD,
    FLOPS_OUTSIDE_MODEL,
    FLOPS_OUTSIDE_MODULES,
    FlopsReport,
)
from stepscope.units import fmt_bytes, fmt_flops, fmt_ms, fmt_pct, fmt_ranks, fmt_tflops, fmt_us


def _section(sid: str) -> Section:
    return Section(sid, SECTION_TITLES[sid])


def header_facts(data: ReportData) -> list[tuple[str, str]]:
    result = data.analysis
    facts: list[tuple[str, str]] = []
    run = result.run
    has_gpu = any(r.temporal is not None for r in result.ranks)
    if data.devices:
        facts.append(("devices", ", ".join(data.devices)))
    else:
        facts.append(("devices", "not named in the traces" + ("" if has_gpu else " (and no GPU activity)")))
    if run is None:
        sizes = sorted({w for w in data.world_sizes if w})
        if sizes:
            facts.append(("world size", ", ".join(map(str, sizes)) + " (the traces' distributedInfo)"))
    if run is not None:
        facts.append(("world size", str(run.world_size)))
        facts.append(("profiled ranks", ", ".join(map(str, run.profiled_ranks)) or "-"))
        if run.schedule:
            facts.append(("schedule", ", ".join(f"{k} {v}" for k, v in run.schedule.items())))
    facts.append(("ranks in the traces", str(len(result.ranks))))
    facts.append(("versions", ", ".join(f"{k} {v}" for k, v in data.versions.items())))
    facts.append(("generated", data.generated))
    return facts


def findings(data: ReportData) -> list[dict[str, Any]]:
    out = []
    for f in data.analysis.findings:
        evidence = {k: v for k, v in f.evidence.items() if k != "arithmetic"}
        out.append(
            {
                "severity": f.severity,
                "id": f.id,
                "rank": f.rank,
                "ranks": fmt_ranks(f.ranks) if len(f.ranks) > 1 else "",
                "across": _across(f) if len(f.ranks) > 1 else "",
                "cost": fmt_ms(f.cost_ms_per_step) + " per step" if f.cost_ms_per_step is not None else "",
                "pct": fmt_pct(f.pct_of_step) + " of the step" if f.pct_of_step is not None else "",
                "message": f.message,
                "action": f.action,
                "arithmetic": f.evidence.get("arithmetic") or "",
                "evidence": [(k, _plain(v)) for k, v in evidence.items()],
                "section": FINDING_SECTIONS.get(f.id, "overview"),
            }
        )
    return out


def _across(f: Finding) -> str:
    """A finding on several ranks: its spread, and whose figures the message gives."""
    spread = f.cost_range_ms_per_step
    cost = (
        f"{fmt_ms(spread[0])} to {fmt_ms(spread[1])} per step across ranks {fmt_ranks(f.ranks)}; "
        if spread
        else ""
    )
    return f"{cost}the figures are rank {f.rank}'s" + (", the costliest" if spread else "")


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value is None else str(value)


def sections(data: ReportData, pc: Charts) -> list[Section]:
    return [
        _overview(data, pc),
        _ops(data),
        _gpu(data, pc),
        _communication(data, pc),
        _ranks(data, pc),
        _flops(data, pc),
        _memory(data, pc),
        _system(data, pc),
        _perfetto(data),
    ]


# ------------------------------------------------------------------------------------------------ overview
def _overview(data: ReportData, pc: Charts) -> Section:
    s = _section("overview")
    result = data.analysis
    for r in result.ranks:
        label = f"rank {r.rank}: " if len(result.ranks) > 1 else ""
        durs = [row.dur_us for row in r.steps]
        if durs:
            s.facts.append(
                (f"{label}profiled steps", f"{len(durs)} (of {r.window.total_steps} in the trace)")
            )
            s.facts.append((f"{label}mean step", fmt_us(statistics.fmean(durs))))
        if r.temporal is not None:
            s.facts.append(
                (
                    f"{label}GPU busy / idle",
                    f"{fmt_pct(r.temporal.compute_pct)} computing, "
                    f"{fmt_pct(r.temporal.non_compute_pct)} other GPU work, {fmt_pct(r.temporal.idle_pct)} idle",
                )
            )
        if len(s.facts) > 12:
            s.paragraphs.append("Further ranks: see the Ranks section.")
            break
    run = result.run
    if run is not None:
        for st in run.step_times[:4]:
            s.facts.append(
                (
                    f"rank {st.rank}: step time over the run",
                    f"median {fmt_ms(st.median_ms)}, p90 {fmt_ms(st.p90_ms)} "
                    f"over {st.plain_steps} unprofiled steps; {fmt_ms(st.traced_median_ms)} while profiled; "
                    f"{st.trend_note}",
                )
            )
    if data.run is not None and data.run.steps:
        pc.add(
            s,
            charts.step_times([_as_dict(p) for p in data.run.steps], data.run.windows),
            "Wall time of every step of the run (metrics.jsonl); the profiled windows are shaded.",
        )
    elif data.run is None:
        s.paragraphs.append(
            "Step times over the whole run come from a run folder's metrics; this report is of traces alone, "
            "so only the profiled steps are shown."
        )
    rows = [_as_dict(c) for r in result.ranks[:MAX_TABLE_RANKS] for c in r.step_categories]
    if rows:
        pc.add(
            s,
            charts.step_categories(rows, multi_rank=len(result.ranks) > 1),
            "Each profiled step split by what ran: a GPU kernel, a memcpy or memset, communication (waiting "
            "for the other ranks and transfer, where the collectives were matched across ranks), the CUDA "
            "runtime, the DataLoader, other CPU work, or nothing traced (TensorBoard's overview categories "
            "and communication; the first that applies wins).",
        )
        s.tables.append(_category_table(rows))
    if not rows and (data.run is None or not data.run.steps):
        s.empty = "no ProfilerStep spans in the traces and no step metrics: nothing to break down per step"
    return s


def _category_table(rows: list[dict[str, Any]]) -> Table:
    n = len(rows)
    total = sum(r["dur_us"] for r in rows)
    sums: dict[str, float] = {}
    for row in rows:
        for label, us in charts.category_parts(row):
            sums[label] = sums.get(label, 0.0) + us
    order = list(charts.CATEGORY_COLORS)
    cells = [
        [Cell(label), us_cell(sums[label] / n), pct_cell(100 * sums[label] / total if total else None)]
        for label in sorted(sums, key=order.index)
    ]
    return Table(
        "overview-categories",
        [("category", False), ("per step", True), ("share", True)],
        cells,
        caption=f"Mean over {n} profiled step(s).",
        filter=False,
    )


# ------------------------------------------------------------------------------------------------ ops
def _ops(data: ReportData) -> Section:
    s = _section("ops")
    if data.summary is None:
        s.empty = "no traces in this run"
        return s
    ranks = data.summary.ranks
    multi = len(ranks) > 1
    shown = ranks[:MAX_TABLE_RANKS]
    if len(ranks) > len(shown):
        s.paragraphs.append(
            f"Tables list ranks {shown[0].rank}-{shown[-1].rank} of {len(ranks)}; "
            "`stepscope summary PATH --json` lists every rank."
        )
    rank_col = [("rank", True)] if multi else []
    kernel_rows = [
        [
            *([int_cell(r.rank)] if multi else []),
            name_cell(k.name),
            int_cell(k.count),
            us_cell(k.total_us),
            us_cell(k.mean_us),
            pct_cell(k.pct),
        ]
        for r in shown
        for k in r.kernels
    ]
    if kernel_rows:
        s.tables.append(
            Table(
                "top-kernels",
                [
                    *rank_col,
                    ("kernel", False),
                    ("calls", True),
                    ("total", True),
                    ("mean", True),
                    ("% of kernel time", True),
                ],
                kernel_rows,
                caption=f"GPU kernels by total time (top {data.summary.top} per rank). Click a name for all of it.",
            )
        )
    else:
        s.paragraphs.append("No GPU kernels in the traces (no CUDA activity in this run).")
    op_rows = [
        [
            *([int_cell(r.rank)] if multi else []),
            name_cell(o.name),
            int_cell(o.count),
            us_cell(o.self_us),
            us_cell(o.total_us),
            us_cell(o.mean_self_us),
            pct_cell(o.self_pct),
        ]
        for r in shown
        for o in r.ops
    ]
    if op_rows:
        s.tables.append(
            Table(
                "top-ops",
                [
                    *rank_col,
                    ("op", False),
                    ("calls", True),
                    ("self", True),
                    ("total", True),
                    ("mean self", True),
                    ("% of self time", True),
                ],
                op_rows,
                caption=f"CPU ops by self time (top {data.summary.top} per rank).",
            )
        )
    if not kernel_rows and not op_rows:
        s.empty = "no ops and no kernels in the traces"
    return s


# ------------------------------------------------------------------------------------------------ GPU
def _gpu(data: ReportData, pc: Charts) -> Section:
    s = _section("gpu")
    ranks = [r for r in data.analysis.ranks if r.temporal is not None]
    if not ranks:
        s.empty = "no CUDA activity in this run: the traces hold no GPU kernel, memcpy or memset"
        return s
    shown = ranks[:MAX_TABLE_RANKS]
    s.tables.append(
        Table(
            "gpu-temporal",
            [
                ("rank", True),
                ("GPU span", True),
                ("computing", True),
                ("other GPU work", True),
                ("idle", True),
                ("communication hidden", True),
            ],
            [
                [
                    int_cell(r.rank),
                    us_cell(r.temporal.span_us),
                    pct_cell(r.temporal.compute_pct),
                    pct_cell(r.temporal.non_compute_pct),
                    pct_cell(r.temporal.idle_pct),
                    pct_cell(r.overlap_pct),
                ]
                for r in shown
                if r.temporal is not None
            ],
            caption="Where each rank's GPU time went over the window; 'communication hidden': the share of "
            "communication that overlapped computation.",
            filter=False,
        )
    )
    kt = [
        {
            "rank": f"rank {r.rank}",
            "type": t.type,
            "ms": round(t.busy_us / 1000, 4),
            "share": round(t.busy_pct or 0.0, 2),
        }
        for r in shown
        if r.kernel_types is not None
        for t in r.kernel_types.by_type
    ]
    pc.add(
        s,
        charts.horizontal_bars(
            kt,
            label="type",
            value="ms",
            value_title="GPU busy time (ms)",
            color="rank" if len(shown) > 1 else None,
        ),
        "GPU time by kind of kernel (computation, communication, memory).",
    )
    idle = []
    for r in shown:
        for st in r.idle_by_stream:
            label = f"rank {r.rank} gpu {st.device} stream {st.stream}"
            for part, us in (
                ("waiting on the host", st.host_wait_us),
                ("launch gap", st.kernel_wait_us),
                ("other (events, other streams)", st.other_us),
            ):
                idle.append({"stream": label, "part": part, "ms": round(us / 1000, 4)})
    pc.add(
        s,
        charts.stacked_horizontal(idle, label="stream", title="idle time (ms)"),
        "Idle time of each stream between its first and last activity, by cause: the GPU waited for the host "
        "to launch work, the launch gap between queued kernels, or something else (events, other streams).",
    )
    return s


# ------------------------------------------------------------------------------------------------ comm
def _communication(data: ReportData, pc: Charts) -> Section:
    s = _section("communication")
    stats = [c for r in data.analysis.ranks for c in r.collectives]
    if not stats:
        s.empty = "no collectives in the traces (a single-process job, or collectives outside the window)"
        return s
    pc.add(
        s,
        charts.horizontal_bars(
            [
                {
                    "collective": c.kind,
                    "rank": f"rank {c.rank}",
                    "ms": round(c.time_ms or 0.0, 4),
                    "count": c.count,
                }
                for c in stats[: 8 * MAX_TABLE_RANKS]
            ],
            label="collective",
            value="ms",
            value_title="time in the window (ms)",
            color="rank",
        ),
        "Time in each kind of collective, per rank.",
    )
    s.tables.append(
        Table(
            "collectives",
            [
                ("rank", True),
                ("collective", False),
                ("group", False),
                ("calls", True),
                ("bytes", True),
                ("time", True),
                ("waiting", True),
                ("transfer", True),
                ("bus GB/s", True),
                ("timed on", False),
            ],
            [
                [
                    int_cell(c.rank),
                    Cell(c.kind),
                    Cell(c.group or "-"),
                    int_cell(c.count),
                    bytes_cell(c.bytes),
                    ms_cell(c.time_ms),
                    ms_cell(c.wait_ms),
                    ms_cell(c.transfer_ms),
                    Cell("-" if c.busbw_gbps is None else f"{c.busbw_gbps:.2f}", c.busbw_gbps or -1.0),
                    Cell(c.time_source or "-"),
                ]
                for c in stats
            ],
            caption="'waiting': time the rank spent waiting for the last rank to arrive.",
        )
    )
    return s


# ------------------------------------------------------------------------------------------------ ranks
def _ranks(data: ReportData, pc: Charts) -> Section:
    s = _section("ranks")
    result = data.analysis
    cross = result.cross_rank
    if cross is None:
        s.empty = f"{len(result.ranks)} rank in the traces: nothing to compare across ranks"
        return s
    cells = [
        {"rank": r.rank, "step": row.step, "ms": round(row.dur_us / 1000, 4)}
        for r in result.ranks
        for row in r.steps
    ]
    pc.add(s, charts.heatmap(cells, len(result.ranks)), "Step time of every rank at every profiled step.")
    parts = []
    for rc in cross.ranks:
        comm = rc.comm_us or 0.0
        wait = rc.comm_wait_us or 0.0
        step = rc.step_us or 0.0
        parts += [
            {
                "rank": f"rank {rc.rank}",
                "part": "outside collectives",
                "ms": round(max(step - comm, 0) / 1000, 4),
            },
            {
                "rank": f"rank {rc.rank}",
                "part": "collective transfer",
                "ms": round(max(comm - wait, 0) / 1000, 4),
            },
            {"rank": f"rank {rc.rank}", "part": "waiting for peers", "ms": round(wait / 1000, 4)},
        ]
    pc.add(
        s,
        charts.stacked_horizontal(parts, label="rank", title="mean step (ms)"),
        "Each rank's mean step: time outside collectives, moving data, and waiting for the other ranks.",
    )
    s.tables.append(
        Table(
            "rank-steps",
            [
                ("rank", True),
                ("steps", True),
                ("mean step", True),
                ("collectives / step", True),
                ("waiting / step", True),
                ("arrived last", True),
            ],
            [
                [
                    int_cell(rc.rank),
                    int_cell(rc.steps),
                    us_cell(rc.step_us),
                    us_cell(rc.comm_us),
                    us_cell(rc.comm_wait_us),
                    int_cell(rc.last_arrivals),
                ]
                for rc in cross.ranks
            ],
        )
    )
    if cross.spread_us is not None:
        s.facts.append(
            (
                "slowest - fastest mean step",
                f"{fmt_us(cross.spread_us)} ({fmt_pct(cross.spread_pct)}): rank {cross.slowest_rank} vs "
                f"rank {cross.fastest_rank}",
            )
        )
    if cross.alignment is not None:
        s.facts.append(("clocks aligned by", f"{cross.alignment.method} ({cross.alignment.matched} matched)"))
    slow = result.straggler
    if slow is not None:
        cause = ""
        if slow.cause is not None:
            what = slow.cause.name or slow.cause.phase
            cause = (
                f"; it spends {fmt_ms(slow.cause.excess_ms_per_step)} more per step than the others in {what}"
            )
        s.paragraphs.append(
            f"Straggler: rank {slow.rank} holds the others back by {fmt_ms(slow.delay_ms_per_step)} per step "
            f"({fmt_pct(slow.delay_pct)} of the step; last to arrive in {slow.last_in_steps} of {slow.steps} "
            f"steps){cause}."
        )
    else:
        s.paragraphs.append("No straggler stands out.")
    return s


# ------------------------------------------------------------------------------------------------ FLOPs
def _flops(data: ReportData, pc: Charts) -> Section:
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
    depths = sorted({m.depth for m in report.modules})
    level = next(
        (d for d in depths if sum(m.depth == d for m in report.modules) > 1), depths[0] if depths else 0
    )
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

    def row(name: str, type_: str | None, depth: int | None, flops: int) -> list[Cell]:
        return [
            name_cell(name),
            Cell(type_ or "-"),
            int_cell(depth),
            Cell(fmt_flops(flops), flops),
            pct_cell(100 * flops / total if total else None),
        ]

    rows = [row(m.label or "(model)", m.type, m.depth, m.flops) for m in report.modules]
    if report.forward_outside_flops > 0:
        outside = FLOPS_OUTSIDE_MODEL if report.model is not None else FLOPS_OUTSIDE_MODULES
        rows.append(row(outside, None, None, report.forward_outside_flops))
    if report.backward_flops:
        rows.append(row(FLOPS_BACKWARD, None, None, report.backward_flops))
    s.tables.append(
        Table(
            "flops-modules",
            [("module", False), ("type", False), ("depth", True), ("FLOPs", True), ("share", True)],
            rows,
            caption="Forward FLOPs of every module that did any, its children's included; the backward in one "
            "row, charged to no module (docs/flops.md says why)."
            if forward
            else "Every module FlopCounterMode saw, nested by depth (forward + backward).",
        )
    )


# ------------------------------------------------------------------------------------------------ memory
def _memory(data: ReportData, pc: Charts) -> Section:
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
                    Cell(mf.kind),
                    Cell(str(mf.rank) if mf.rank is not None else "-"),
                    Cell(str(mf.step) if mf.step is not None else "-"),
                    Cell("-" if dev.device < 0 else str(dev.device)),
                    bytes_cell(dev.peak_allocated),
                    bytes_cell(dev.peak_reserved),
                    int_cell(len(dev.ooms)),
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
            Table(
                "memory-files",
                [
                    ("file", False),
                    ("rank", False),
                    ("step", False),
                    ("device", False),
                    ("peak allocated", True),
                    ("peak reserved", True),
                    ("OOMs", True),
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
def _system(data: ReportData, pc: Charts) -> Section:
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


# ------------------------------------------------------------------------------------------------ perfetto
def _perfetto(data: ReportData) -> Section:
    s = _section("perfetto")
    if not data.traces:
        s.empty = "no trace files"
        return s
    from pathlib import Path

    for t in data.traces:
        who = f"rank {t.rank}" if t.rank is not None else "trace"
        step = f", window ending at step {t.step}" if t.step is not None else ""
        s.items.append(f"{who}{step}: {t.path} ({fmt_bytes(t.bytes)})")
    s.paragraphs.append(
        "Open https://ui.perfetto.dev in a browser and drop a file on it (or use 'Open trace file'). Perfetto "
        "reads the file inside the browser; nothing is uploaded. Gzip'd traces open as they are."
    )
    if len({t.rank for t in data.traces}) > 1:
        src = Path(data.source)
        s.paragraphs.append(
            f"To see every rank on one clock: stepscope merge {src} -o {src.name or 'run'}_merged.json.gz, then "
            "open the merged file."
        )
    return s


def _mib(n: int | None) -> float | None:
    return None if n is None else round(n / 2**20, 3)


def _as_dict(obj: Any) -> dict[str, Any]:
    """A Struct's fields as the rows of a chart's inline data."""
    return {f: getattr(obj, f) for f in obj.__struct_fields__}
