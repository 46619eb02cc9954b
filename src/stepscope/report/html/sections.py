"""The report's sections, as plain view objects (html.Section, html.Table) filled from ReportData.

Numbers are formatted here with stepscope.units, as in the terminal; nothing is computed that the analysis did
not already compute (sums of parts for a chart's stacking aside).
"""

from __future__ import annotations

import statistics
from typing import Any

from stepscope.report import columns as col
from stepscope.report._deepspeed import section as ds_section
from stepscope.report.data import ReportData
from stepscope.report.html import charts, host_section, run_sections
from stepscope.report.html.parallelism import parallelism
from stepscope.report.html.path_section import critical_path
from stepscope.report.html.roofline_section import roofline
from stepscope.report.model import MAX_TABLE_RANKS, SECTION_TITLES, Charts, Section, Table, table
from stepscope.report.tables import (
    collectives_table,
    gpu_time_table,
    kernel_table,
    op_table,
    rank_steps_table,
    stragglers_table,
)
from stepscope.units import fmt_bytes, fmt_ms, fmt_pct, fmt_us


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


def sections(data: ReportData, pc: Charts) -> list[Section]:
    run = data.analysis.run
    deepspeed = [ds_section(run.deepspeed)] if run is not None and run.deepspeed is not None else []
    anomalies = [run_sections.anomalies(run)] if run is not None and run.anomalies else []
    return [
        *anomalies,
        _overview(data, pc),
        critical_path(data, pc),
        _ops(data),
        roofline(data, pc),
        _gpu(data, pc),
        _communication(data, pc),
        parallelism(data, pc),
        _ranks(data, pc),
        run_sections.flops(data, pc),
        *deepspeed,
        run_sections.memory(data, pc),
        run_sections.system(data, pc),
        host_section.host(data, pc),
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
                    f"{st.trend_note}" + (f"; {st.overlap_note}" if st.overlap_note else ""),
                )
            )
    if data.run is not None and data.run.steps:
        pc.add(
            s,
            charts.step_times([_as_dict(p) for p in data.run.steps], data.run.windows),
            "Wall time of every step of the run (metrics.jsonl); the profiled windows are shaded."
            + (
                " A red mark: a step after which the job waited 1 ms or more for stepscope (the stop and export "
                "of a window that ends there, a FLOP count's report), at its whole time by the job's clock."
                if any(p.whole_ms is not None for p in data.run.steps)
                else ""
            ),
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
    return table(
        "overview-categories",
        [col.CATEGORY, col.PER_STEP, col.SHARE],
        (
            [label, sums[label] / n, 100 * sums[label] / total if total else None]
            for label in sorted(sums, key=order.index)
        ),
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
    shown = ranks[:MAX_TABLE_RANKS]
    if len(ranks) > len(shown):
        s.paragraphs.append(
            f"Tables list ranks {shown[0].rank}-{shown[-1].rank} of {len(ranks)}; "
            "`stepscope summary PATH --json` lists every rank."
        )
    kernels = kernel_table(shown, top=data.summary.top)
    if kernels.rows:
        s.tables.append(kernels)
    else:
        s.paragraphs.append("No GPU kernels in the traces (no CUDA activity in this run).")
    ops = op_table(shown, top=data.summary.top)
    if ops.rows:
        s.tables.append(ops)
    if not kernels.rows and not ops.rows:
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
    s.tables.append(gpu_time_table(shown))
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
    s.tables.append(collectives_table(stats))
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
    s.tables.append(rank_steps_table(cross))
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
    if any(g.group is not None for g in result.stragglers):
        s.tables.append(stragglers_table(result.stragglers, title="Stragglers by process group"))
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
