"""A DeepSpeed engine's records in a run folder, read back and summed up: the engine's configuration (kind
`deepspeed`), DeepSpeed's flops profile (`ds_flops`) with the run's TFLOP/s and MFU, its comms logger's summary
per window (`ds_comms`) and the memory log's DeepSpeed figures. No torch, no deepspeed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from stepscope.runfolder import ArtifactKind, Manifest
from stepscope.runfolder.payloads import (
    DeepSpeedEngineInfo,
    DsCommsSummary,
    DsFlopsProfile,
    DsModuleProfile,
    FlopsReport,
    MemoryRow,
)

T = TypeVar("T")
# the config fields every rank of a job shares; a rank that says otherwise gets a note
SHARED_FIELDS = (
    "zero_stage",
    "offload_optimizer",
    "offload_param",
    "dp_size",
    "mp_size",
    "pp_size",
    "micro_batch",
    "gradient_accumulation",
    "precision",
)


@dataclass
class DeepSpeedRecords:
    """What a DeepSpeed engine's monitor wrote, per rank."""

    engines: list[DeepSpeedEngineInfo] = field(default_factory=list)
    flops: list[DsFlopsProfile] = field(default_factory=list)
    comms: list[DsCommsSummary] = field(default_factory=list)


def read_deepspeed(
    path: Path, manifest: Manifest, read_json: Callable[[Path, type[Any]], Any]
) -> DeepSpeedRecords | None:
    """The folder's DeepSpeed records (None: the run had no engine); `read_json(file, type)` decodes one file
    (None where it is damaged, with a note)."""
    engines = manifest.of_kind(ArtifactKind.DEEPSPEED)
    if not engines:
        return None

    def read(kind: ArtifactKind, of: type[T]) -> list[T]:
        return [r for a in manifest.of_kind(kind) if (r := read_json(path / a.path, of)) is not None]

    return DeepSpeedRecords(
        engines=sorted(read(ArtifactKind.DEEPSPEED, DeepSpeedEngineInfo), key=lambda e: e.rank),
        flops=sorted(read(ArtifactKind.DS_FLOPS, DsFlopsProfile), key=lambda f: (f.rank, f.step)),
        comms=sorted(read(ArtifactKind.DS_COMMS, DsCommsSummary), key=lambda c: (c.rank, c.last_step)),
    )


class DsFlopsFacts(msgspec.Struct):
    """DeepSpeed's flops profile of one rank's counted step, with the run's throughput (from the FLOP report)."""

    rank: int
    step: int
    micro_steps: int
    params: int
    fwd_macs: int
    fwd_flops: int
    flops_per_step: int
    bwd_factor: float
    fwd_latency_s: float
    tflops: float | None  # median over the undisturbed steps; None: too few (see no_throughput_reason)
    mfu: float | None
    no_mfu_reason: str | None
    no_throughput_reason: str | None
    modules: list[DsModuleProfile]


class DsCommFacts(msgspec.Struct):
    """One collective and message size of DeepSpeed's comms logger, one rank, one window."""

    rank: int
    first_step: int
    last_step: int
    op: str
    msg_bytes: int
    count: int
    total_latency_ms: float
    mean_latency_ms: float
    algbw_gbps: float
    busbw_gbps: float


class DsMemoryFacts(msgspec.Struct):
    """see_memory_usage's figures over the memory log of one rank: the last row's and the peaks."""

    rank: int
    accelerator: str
    rows: int
    allocated_bytes: int  # MA at the last row
    peak_allocated_bytes: int  # the largest Max_MA
    reserved_bytes: int  # CA at the last row
    peak_reserved_bytes: int  # the largest Max_CA
    vm_used_bytes: int  # the largest CPU virtual memory used


class DeepSpeedFacts(msgspec.Struct):
    """`analyze --json`'s run.deepspeed: the engine, DeepSpeed's FLOPs, comms and memory figures."""

    engine: DeepSpeedEngineInfo | None  # the first profiled rank's
    flops: list[DsFlopsFacts]
    comms: list[DsCommFacts]
    memory: list[DsMemoryFacts]
    notes: list[str]


def deepspeed_facts(
    records: DeepSpeedRecords, flops: list[FlopsReport], memory: dict[int, list[MemoryRow]]
) -> DeepSpeedFacts:
    notes: list[str] = []
    engine = records.engines[0] if records.engines else None
    for other in records.engines[1:]:
        assert engine is not None
        differ = [f for f in SHARED_FIELDS if getattr(other, f) != getattr(engine, f)]
        if differ:
            notes.append(
                f"rank {other.rank}'s engine differs from rank {engine.rank}'s in {', '.join(differ)}"
            )
    for e in records.engines:
        notes.extend(f"rank {e.rank}: {n}" for n in e.notes)
    for p in records.flops:
        notes.extend(f"rank {p.rank}, step {p.step}: {n}" for n in p.notes)
    reports = {(r.rank, r.step): r for r in flops}
    if not records.flops:
        notes.append("no DeepSpeed flops profile: set flop_counter_step to count one optimizer step's FLOPs")
    if not records.comms:
        notes.append(
            "no DeepSpeed comms summary: no window's active steps ran, or the job's own logger was on"
        )
    return DeepSpeedFacts(
        engine=engine,
        flops=[_flops_facts(p, reports.get((p.rank, p.step))) for p in records.flops],
        comms=[
            DsCommFacts(
                rank=c.rank,
                first_step=c.first_step,
                last_step=c.last_step,
                op=op.op,
                msg_bytes=op.msg_bytes,
                count=op.count,
                total_latency_ms=op.total_latency_ms,
                mean_latency_ms=op.mean_latency_ms,
                algbw_gbps=op.algbw_gbps,
                busbw_gbps=op.busbw_gbps,
            )
            for c in records.comms
            for op in c.ops
        ],
        memory=[m for rank, rows in sorted(memory.items()) if (m := _memory_facts(rank, rows))],
        notes=notes,
    )


def _flops_facts(profile: DsFlopsProfile, report: FlopsReport | None) -> DsFlopsFacts:
    throughput = report.throughput if report is not None else None
    return DsFlopsFacts(
        rank=profile.rank,
        step=profile.step,
        micro_steps=profile.micro_steps,
        params=profile.params,
        fwd_macs=profile.fwd_macs,
        fwd_flops=profile.fwd_flops,
        flops_per_step=profile.flops_per_step,
        bwd_factor=profile.bwd_factor,
        fwd_latency_s=profile.fwd_latency_s,
        tflops=throughput.tflops if throughput is not None else None,
        mfu=throughput.mfu if throughput is not None else None,
        no_mfu_reason=throughput.no_mfu_reason if throughput is not None else None,
        no_throughput_reason=report.no_throughput_reason if report is not None else "no FLOP report",
        modules=profile.modules,
    )


def _memory_facts(rank: int, rows: list[MemoryRow]) -> DsMemoryFacts | None:
    rows = [r for r in rows if r.ds_allocated_bytes is not None]
    if not rows:
        return None
    last = rows[-1]
    return DsMemoryFacts(
        rank=rank,
        accelerator=last.ds_accelerator or "unknown",
        rows=len(rows),
        allocated_bytes=last.ds_allocated_bytes or 0,
        peak_allocated_bytes=max(r.ds_peak_allocated_bytes or 0 for r in rows),
        reserved_bytes=last.ds_reserved_bytes or 0,
        peak_reserved_bytes=max(r.ds_peak_reserved_bytes or 0 for r in rows),
        vm_used_bytes=max(r.ds_vm_used_bytes or 0 for r in rows),
    )
