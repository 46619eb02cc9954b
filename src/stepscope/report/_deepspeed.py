"""A DeepSpeed engine's job in the reports: the engine's settings, DeepSpeed's flops profile, its comms logger and
its memory figures as model Tables (the terminal's `analyze` prints them, the page's DeepSpeed section holds
them). Formatting only."""

from __future__ import annotations

from stepscope.analysis.run.deepspeed import DeepSpeedFacts
from stepscope.report import columns as col
from stepscope.report.model import SECTION_TITLES, Section, Table, table
from stepscope.units import fmt_flops, fmt_tflops

MODULE_DEPTH = 3  # the flops profile's modules shown: the model and two levels below it


def engine_rows(facts: DeepSpeedFacts) -> list[tuple[str, str]]:
    """The engine's settings as (setting, value): ZeRO stage, offload, parallel sizes, batch, precision."""
    e = facts.engine
    if e is None:
        return []

    def size(n: int | None) -> str:
        return "-" if n is None else str(n)

    return [
        ("DeepSpeed", f"{e.deepspeed_version} ({e.engine})"),
        ("ZeRO stage", str(e.zero_stage)),
        ("offload optimizer", e.offload_optimizer or "none"),
        ("offload params", e.offload_param or "none"),
        (
            "world / dp / mp / pp size",
            f"{e.world_size} / {size(e.dp_size)} / {size(e.mp_size)} / {size(e.pp_size)}",
        ),
        ("micro-batch per rank", size(e.micro_batch)),
        ("gradient accumulation", size(e.gradient_accumulation)),
        ("train batch", size(e.train_batch)),
        ("precision", e.precision),
        ("optimizer", e.optimizer or "-"),
    ]


def flops_lines(facts: DeepSpeedFacts) -> list[str]:
    """One line per rank: DeepSpeed's totals of the counted step and the run's TFLOP/s and MFU."""
    lines = []
    for f in facts.flops:
        line = (
            f"rank {f.rank}, step {f.step} ({f.micro_steps} forwards): {f.params:,} params, forward "
            f"{fmt_flops(f.fwd_flops)} ({f.fwd_macs:,} MACs), {fmt_flops(f.flops_per_step)} per step "
            f"(backward {f.bwd_factor:g}x the forward)"
        )
        if f.tflops is not None:
            line += f", {fmt_tflops(f.tflops)}"
            line += f", MFU {100 * f.mfu:.2f}%" if f.mfu is not None else f" (no MFU: {f.no_mfu_reason})"
        lines.append(line)
    return lines


def tables(facts: DeepSpeedFacts) -> list[Table]:
    """The engine's settings, the first profile's modules, the comms summary and the memory figures."""
    out = []
    rows = engine_rows(facts)
    if rows:
        out.append(
            table(
                "ds-engine",
                [col.DS_SETTING, col.DS_VALUE],
                rows,
                title="DeepSpeed engine",
                caption="DeepSpeed engine: its settings as the engine reports them.",
                filter=False,
            )
        )
    if facts.flops:
        f = facts.flops[0]
        out.append(
            table(
                "ds-flops",
                [col.DS_MODULE, col.DS_TYPE, col.DS_PARAMS, col.DS_MACS, col.DS_FLOPS, col.DS_LATENCY],
                (
                    [m.name or f"{m.type} (model)", m.type, m.params, m.macs, m.flops, 1e3 * m.latency_s]
                    for m in f.modules
                    if m.depth <= MODULE_DEPTH
                ),
                title=f"DeepSpeed flops profile, rank {f.rank}, step {f.step}",
                caption=f"DeepSpeed flops profile, rank {f.rank}, step {f.step}: DeepSpeed's flops profiler over "
                "the counted optimizer step, each module's forward (its descendants included).",
            )
        )
    if facts.comms:
        out.append(
            table(
                "ds-comms",
                [
                    col.RANK,
                    col.DS_WINDOW,
                    col.DS_COMM_OP,
                    col.DS_MSG,
                    col.DS_COUNT,
                    col.DS_TOTAL_LATENCY,
                    col.DS_MEAN_LATENCY,
                    col.DS_ALGBW,
                    col.DS_BUSBW,
                ],
                (
                    [
                        c.rank,
                        f"{c.first_step}-{c.last_step}",
                        c.op,
                        c.msg_bytes,
                        c.count,
                        c.total_latency_ms,
                        c.mean_latency_ms,
                        c.algbw_gbps,
                        c.busbw_gbps,
                    ]
                    for c in facts.comms
                ),
                title="DeepSpeed comms logger",
                caption="DeepSpeed comms logger: the collectives DeepSpeed issued through deepspeed.comm in each "
                "window's active steps.",
            )
        )
    if facts.memory:
        out.append(
            table(
                "ds-memory",
                [
                    col.RANK,
                    col.DS_ACCELERATOR,
                    col.DS_MA,
                    col.DS_MAX_MA,
                    col.DS_CA,
                    col.DS_MAX_CA,
                    col.DS_VM_USED,
                ],
                (
                    [
                        m.rank,
                        m.accelerator,
                        m.allocated_bytes,
                        m.peak_allocated_bytes,
                        m.reserved_bytes,
                        m.peak_reserved_bytes,
                        m.vm_used_bytes,
                    ]
                    for m in facts.memory
                ),
                title="DeepSpeed memory (see_memory_usage)",
                caption="DeepSpeed memory (see_memory_usage): MA / CA at the memory log's last row, Max_MA / Max_CA the largest peak between rows; on "
                "DeepSpeed's CPU accelerator these are the process RSS.",
                filter=False,
            )
        )
    return out


def section(facts: DeepSpeedFacts) -> Section:
    """The page's DeepSpeed section."""
    s = Section("deepspeed", SECTION_TITLES["deepspeed"])
    s.paragraphs.extend(flops_lines(facts))
    s.tables.extend(tables(facts))
    s.items.extend(facts.notes)
    return s
