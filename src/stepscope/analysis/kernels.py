"""GPU activity of one rank as flat arrays, and the rules that sort it into computation / communication / memory.

The classification is decided once per *name* in the symbol table (a few thousand regex matches at most), then
looked up per event with numpy indexing. The rules are documented in docs/analysis.md ("Kernel types").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from stepscope.analysis.table import GPU_CATEGORIES, MISSING, TraceTable

COMPUTATION, COMMUNICATION, MEMORY = 0, 1, 2
KIND_NAMES: tuple[str, ...] = ("computation", "communication", "memory")

# Communication kernels: NCCL and RCCL (ncclKernel_*, ncclDevKernel_*), DeepEP dispatch/combine, NVSHMEM,
# MSCCL(++), PyTorch symmetric-memory collectives (one/two-shot and multimem all-reduce, all-gather), vLLM-style
# custom all-reduce, and kernels that name a collective outright. Gloo collectives run on the CPU.
# Matched against the lowercased name (an IGNORECASE search is ~7x slower on long kernel names).
COMMUNICATION_RE = re.compile(
    r"nccl|rccl|deep_?ep|nvshmem|msccl|symmetric_memory|symm_mem|multimem_|one_shot_all|two_shot_all"
    r"|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"
)
# Memory kernels by name (as HTA): copies and fills launched as kernels or reported as activities.
MEMORY_NAME_RE = re.compile(r"^(?:Memcpy|Memset|dma)")
MEMORY_CATEGORIES = ("gpu_memcpy", "gpu_memset")

_X = ord("X")


def kind_of_name(name: str) -> int:
    """Kernel type of a GPU event name: COMMUNICATION, MEMORY or COMPUTATION (the rest)."""
    if COMMUNICATION_RE.search(name.lower()):
        return COMMUNICATION
    if MEMORY_NAME_RE.match(name):
        return MEMORY
    return COMPUTATION


@dataclass
class GpuEvents:
    """GPU activities (kernels, memcpy, memset) of one rank; times in integer ns."""

    names: list[str]
    start: np.ndarray
    end: np.ndarray
    name: np.ndarray
    cat: np.ndarray
    stream: np.ndarray
    device: np.ndarray
    kind: np.ndarray
    launch: np.ndarray  # start of the runtime call that launched the event (ns); MISSING_TS when unknown
    nbytes: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    def select(self, mask: np.ndarray) -> GpuEvents:
        """The events where `mask` is true."""
        return GpuEvents(
            names=self.names,
            start=self.start[mask],
            end=self.end[mask],
            name=self.name[mask],
            cat=self.cat[mask],
            stream=self.stream[mask],
            device=self.device[mask],
            kind=self.kind[mask],
            launch=self.launch[mask],
            nbytes=self.nbytes[mask],
        )

    def of_kind(self, kind: int) -> GpuEvents:
        return self.select(self.kind == kind)


MISSING_TS = np.iinfo(np.int64).min


def gpu_events(table: TraceTable) -> GpuEvents:
    """All GPU activities of a one-rank table, classified, with the start of their launching runtime call."""
    cat = table.columns["cat"]
    gpu_cat_ids = [table.cat_id(c) for c in GPU_CATEGORIES]
    is_x = table.columns["ph"] == _X
    mask = is_x & np.isin(cat, [i for i in gpu_cat_ids if i != MISSING])
    rows = np.flatnonzero(mask)
    name = table.columns["name"][rows]
    start = table.columns["ts"][rows]
    end = start + table.columns["dur"][rows]

    # each distinct name of a GPU event classified once per load (CPU-side names are many, and long)
    kind = table.name_values(kind_of_name, np.int8, key="kernel_kind", among=name)[name]
    memory_cats = [table.cat_id(c) for c in MEMORY_CATEGORIES]
    kind = np.where(np.isin(cat[rows], [i for i in memory_cats if i != MISSING]), MEMORY, kind).astype(
        np.int8
    )

    return GpuEvents(
        names=table.names,
        start=start,
        end=end,
        name=name,
        cat=cat[rows],
        stream=table.columns["stream"][rows],
        device=table.columns["device"][rows],
        kind=kind,
        launch=_launch_times(table, rows, is_x & ~mask),
        nbytes=table.columns["bytes"][rows],
    )


def _launch_times(table: TraceTable, gpu_rows: np.ndarray, cpu_mask: np.ndarray) -> np.ndarray:
    """Start of the CPU-side event sharing each GPU row's correlation id (the launch), else MISSING_TS."""
    corr = table.columns["correlation"]
    cpu_rows = np.flatnonzero(cpu_mask & (corr != MISSING))
    out = np.full(len(gpu_rows), MISSING_TS, dtype=np.int64)
    if len(cpu_rows) == 0 or len(gpu_rows) == 0:
        return out
    cpu_corr = corr[cpu_rows]
    order = np.argsort(cpu_corr, kind="stable")
    sorted_corr = cpu_corr[order]
    want = corr[gpu_rows]
    pos = np.clip(np.searchsorted(sorted_corr, want), 0, len(sorted_corr) - 1)
    found = (sorted_corr[pos] == want) & (want != MISSING)
    out[found] = table.columns["ts"][cpu_rows[order[pos[found]]]]
    return out
