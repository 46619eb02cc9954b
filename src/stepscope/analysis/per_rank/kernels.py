"""GPU activity of one rank as flat arrays, and the rules that sort it into computation / communication / memory.

The classification is decided once per *name* in the symbol table (a few thousand regex matches at most), then
looked up per event with numpy indexing. The rules are documented in docs/analysis.md ("Kernel types").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np

from stepscope.analysis.per_rank.comm_names import async_tp_op, cpu_collective, ep_kernel
from stepscope.analysis.read.table import GPU_CATEGORIES, MISSING, TraceTable
from stepscope.errors import InputError

COMPUTATION, COMMUNICATION, MEMORY = 0, 1, 2
KIND_NAMES: tuple[str, ...] = ("computation", "communication", "memory")

# Communication kernels: NCCL and RCCL (ncclKernel_*, ncclDevKernel_*), NVSHMEM,
# MSCCL(++), PyTorch symmetric-memory collectives (one/two-shot and multimem all-reduce, all-gather), vLLM-style
# custom all-reduce, and kernels that name a collective outright. Gloo collectives run on the CPU.
# Matched against the lowercased name (an IGNORECASE search is ~7x slower on long kernel names).
COMMUNICATION_RE = re.compile(
    r"nccl|rccl|nvshmem|msccl|symmetric_memory|symm_mem|multimem_|one_shot_all|two_shot_all"
    r"|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"
)
# Each alternative of COMMUNICATION_RE holds one of these, in both spellings of its `_?`: a name that holds none
# is not searched (the search takes ~5 us on a templated kernel name of 300 characters, these tests ~1 us).
_COMMUNICATION_HINTS = ("ccl", "nvshmem", "symm", "multimem_", "all", "reduce")
if not all(
    any(hint in spelled for hint in _COMMUNICATION_HINTS)
    for alternative in COMMUNICATION_RE.pattern.split("|")
    for spelled in (alternative.replace("_?", ""), alternative.replace("_?", "_"))
):
    raise AssertionError("every alternative of COMMUNICATION_RE must hold one of _COMMUNICATION_HINTS")
# Memory kernels by name (as HTA): copies and fills launched as kernels or reported as activities.
MEMORY_NAME_RE = re.compile(r"^(?:Memcpy|Memset|dma)")
MEMORY_CATEGORIES = ("gpu_memcpy", "gpu_memset")

_X = ord("X")


def kind_of_name(name: str, patterns: Sequence[CommPattern] = ()) -> int:
    """Kernel type of a GPU event name: COMMUNICATION, MEMORY or COMPUTATION (the rest). `patterns`: the
    user's communication patterns (`--comm-pattern`), searched in the name as written."""
    low = name.lower()
    if any(hint in low for hint in _COMMUNICATION_HINTS) and COMMUNICATION_RE.search(low):
        return COMMUNICATION
    if (
        ep_kernel(name) is not None
    ):  # DeepEP and its forks' dispatch / combine / notify (comm_names.EP_KERNEL)
        return COMMUNICATION
    if any(p.search(name) for p in patterns):
        return COMMUNICATION
    if MEMORY_NAME_RE.match(name):
        return MEMORY
    return COMPUTATION


# Records of arrays: compared and printed by identity (a field-wise == of arrays raises, and their repr
# would print the arrays); generating __eq__ and __repr__ cost ~0.15 ms of every start.
class GpuEvents(msgspec.Struct, eq=False):
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
    context: np.ndarray  # row (in the rank's table) of the collective range the launch lies in, else -1
    row: np.ndarray  # the event's own row in the rank's table
    fused: (
        np.ndarray
    )  # row of the fused async-TP range (comm_names.ASYNC_TP_RANGE) the launch lies in, else -1

    def __len__(self) -> int:
        return len(self.start)

    def select(self, mask: np.ndarray) -> GpuEvents:
        """The events where `mask` is true (these events themselves when it holds everywhere: not a copy)."""
        if isinstance(mask, np.ndarray) and mask.dtype == bool and len(mask) == len(self) and mask.all():
            return self
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
            context=self.context[mask],
            row=self.row[mask],
            fused=self.fused[mask],
        )

    def of_kind(self, kind: int) -> GpuEvents:
        return self.select(self.kind == kind)


MISSING_TS = np.iinfo(np.int64).min


# A communication pattern may come from a file (a run folder's config.yaml): one that backtracks without end on
# long kernel names (`(x+x+)+y`) would hang every command. Each search has a time limit, and each pattern a budget
# over all the names it is searched in; past either, the pattern is refused (InputError: one line, exit 2).
SEARCH_LIMIT_S = 0.1
PATTERN_BUDGET_S = 2.0


class CommPattern:
    """A user's communication pattern, searched with a time limit (the `regex` module's `timeout`). Compared,
    hashed and pickled by its text: it keys the per-name cache and travels to worker processes."""

    __slots__ = ("_compiled", "_spent", "text")

    def __init__(self, text: str) -> None:
        import regex

        self.text = text
        self._compiled = regex.compile(text)
        self._spent = 0.0

    def search(self, name: str) -> Any:
        import time

        left = min(SEARCH_LIMIT_S, PATTERN_BUDGET_S - self._spent)
        started = time.perf_counter()
        found, timed_out = None, False
        try:
            found = self._compiled.search(name, timeout=max(left, 1e-3))
        except TimeoutError:
            timed_out = True
        self._spent += time.perf_counter() - started
        if timed_out or self._spent > PATTERN_BUDGET_S:
            raise InputError(
                f"communication pattern {self.text!r}",
                f"too slow to search (over {SEARCH_LIMIT_S:g} s on one kernel name of {len(name):,} "
                f"characters, or {PATTERN_BUDGET_S:g} s in all: repetition nested in repetition backtracks); "
                "refused: write it without nested repeats, in --comm-pattern or the run folder's config.yaml",
            )
        return found

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CommPattern) and other.text == self.text

    def __hash__(self) -> int:
        return hash(("CommPattern", self.text))

    def __reduce__(self) -> tuple[Any, ...]:
        return (CommPattern, (self.text,))

    def __repr__(self) -> str:
        return f"CommPattern({self.text!r})"


def compile_patterns(patterns: Sequence[str]) -> tuple[CommPattern, ...]:
    """The user's communication patterns, bounded in time (a bad one is a usage error the caller reports)."""
    return tuple(CommPattern(p) for p in patterns)


def gpu_events(table: TraceTable, comm_patterns: Sequence[CommPattern] = ()) -> GpuEvents:
    """All GPU activities of a one-rank table, classified, with the start of their launching runtime call.

    A kernel is communication by its name (COMMUNICATION_RE, `comm_patterns`) or by where it was launched:
    inside a collective's CPU range (record_param_comms, a c10d collective op, a backend range such as
    `nccl:all_reduce`), whatever its name. Inside a fused async-TP op (`symm_mem::fused_all_gather_matmul`, ...),
    what is not a computation kernel (the peer copies, the symmetric-memory signals) is that op's collective:
    communication; its matmuls stay computation."""
    cat = table.columns["cat"]
    gpu_cat_ids = [table.cat_id(c) for c in GPU_CATEGORIES]
    is_x = table.columns["ph"] == _X
    mask = is_x & np.isin(cat, [i for i in gpu_cat_ids if i != MISSING])
    rows = np.flatnonzero(mask)
    name = table.columns["name"][rows]
    start = table.columns["ts"][rows]
    end = start + table.columns["dur"][rows]

    # each distinct name of a GPU event classified once per load (CPU-side names are many, and long)
    kind = table.name_values(
        lambda n: kind_of_name(n, comm_patterns), np.int8, key=("kernel_kind", comm_patterns), among=name
    )[name]
    launch, launch_row = _launch_times(table, rows, is_x & ~mask)
    context = _collective_context(table, launch_row)
    kind = np.where(context != MISSING, COMMUNICATION, kind)
    memory_cats = [table.cat_id(c) for c in MEMORY_CATEGORIES]
    kind = np.where(np.isin(cat[rows], [i for i in memory_cats if i != MISSING]), MEMORY, kind).astype(
        np.int8
    )
    fused = _enclosing(table, launch_row, lambda n: async_tp_op(n) is not None, "async_tp")
    kind = np.where((fused != MISSING) & (kind != COMPUTATION), COMMUNICATION, kind).astype(np.int8)

    return GpuEvents(
        names=table.names,
        start=start,
        end=end,
        name=name,
        cat=cat[rows],
        stream=table.columns["stream"][rows],
        device=table.columns["device"][rows],
        kind=kind,
        launch=launch,
        nbytes=table.columns["bytes"][rows],
        context=context,
        row=rows,
        fused=fused,
    )


# Categories of the CPU ranges of collectives (record_function lands in either).
CONTEXT_CATEGORIES = ("cpu_op", "user_annotation")


def _context_rank(table: TraceTable, row: int) -> int:
    """Which enclosing collective range describes a launch best: a record_param_comms that names its
    collective (it has the sizes), then a c10d op or backend range (their names say the kind), then the rest."""
    name = table.names[int(table.columns["name"][row])]
    if name == "record_param_comms":
        return 0 if int(table.columns["args_collective"][row]) != MISSING else 2
    return 1


def _collective_context(table: TraceTable, launch_row: np.ndarray) -> np.ndarray:
    """Per launch (a row of `table`, or -1), the collective CPU range on the same thread that encloses its
    start (the best by _context_rank, the innermost among equals), else -1."""
    out = np.full(len(launch_row), MISSING, dtype=np.int64)
    cols = table.columns
    names = cols["name"]
    is_coll = table.name_values(lambda n: cpu_collective(n) is not None, bool, key="cpu_collective")
    cats = [c for c in (table.cat_id(x) for x in CONTEXT_CATEGORIES) if c != MISSING]
    ranges = np.flatnonzero(is_coll[names] & (cols["ph"] == _X) & np.isin(cols["cat"], cats))
    known = np.flatnonzero(launch_row != MISSING)
    if not len(ranges) or not len(known):
        return out
    pid, tid, ts, dur = cols["pid"], cols["tid"], cols["ts"], cols["dur"]
    by_thread: dict[tuple[int, int], list[int]] = {}
    for row in ranges[np.lexsort((ts[ranges], tid[ranges], pid[ranges]))].tolist():
        by_thread.setdefault((int(pid[row]), int(tid[row])), []).append(row)
    threads = {key: np.array(rows_, dtype=np.int64) for key, rows_ in by_thread.items()}
    launches = launch_row[known]
    for (p, t), thread_rows in threads.items():
        on_thread = np.flatnonzero((pid[launches] == p) & (tid[launches] == t))
        if not len(on_thread):
            continue
        starts = ts[thread_rows]
        ends = starts + dur[thread_rows]
        reach = np.maximum.accumulate(ends)  # a launch past every earlier range's end lies in none of them
        at = ts[launches[on_thread]]
        last = np.searchsorted(starts, at, side="right") - 1
        inside = (last >= 0) & (reach[np.maximum(last, 0)] > at)
        for i in np.flatnonzero(inside).tolist():
            enclosing = []
            for j in range(int(last[i]), -1, -1):  # back through the ranges that started before it
                if ends[j] > at[i]:
                    enclosing.append(int(thread_rows[j]))  # innermost first
                if j == 0 or reach[j - 1] <= at[i]:
                    break
            best = min(enclosing, key=lambda r: _context_rank(table, r), default=MISSING)
            out[known[on_thread[i]]] = best
    return out


def _enclosing(
    table: TraceTable, launch_row: np.ndarray, named: Callable[[str], bool], key: str
) -> np.ndarray:
    """Per launch (a row, or -1), the outermost CPU range of a name `named` accepts, on the launch's thread, that
    encloses its start; else -1. For rare ranges (a few per step): one search per thread."""
    out = np.full(len(launch_row), MISSING, dtype=np.int64)
    cols = table.columns
    is_named = table.name_values(named, bool, key=key)
    ranges = np.flatnonzero(is_named[cols["name"]] & (cols["ph"] == _X))
    known = np.flatnonzero(launch_row != MISSING)
    if not len(ranges) or not len(known):
        return out
    pid, tid, ts, dur = cols["pid"], cols["tid"], cols["ts"], cols["dur"]
    launches = launch_row[known]
    for p, t in {(int(pid[r]), int(tid[r])) for r in ranges.tolist()}:
        mine = ranges[(pid[ranges] == p) & (tid[ranges] == t)]
        mine = mine[np.lexsort((-dur[mine], ts[mine]))]
        keep, reach = [], np.iinfo(np.int64).min
        for r in mine.tolist():  # the outermost: a range inside the one before it is left out
            if int(ts[r]) >= reach:
                keep.append(r)
                reach = int(ts[r] + dur[r])
        outer = np.array(keep, dtype=np.int64)
        on_thread = np.flatnonzero((pid[launches] == p) & (tid[launches] == t))
        at = ts[launches[on_thread]]
        last = np.searchsorted(ts[outer], at, side="right") - 1
        inside = (last >= 0) & ((ts[outer] + dur[outer])[np.maximum(last, 0)] > at)
        out[known[on_thread[inside]]] = outer[last[inside]]
    return out


def _launch_times(
    table: TraceTable, gpu_rows: np.ndarray, cpu_mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Start of the CPU-side event sharing each GPU row's correlation id (the launch), else MISSING_TS; and
    that event's row, else -1."""
    corr = table.columns["correlation"]
    cpu_rows = np.flatnonzero(cpu_mask & (corr != MISSING))
    out = np.full(len(gpu_rows), MISSING_TS, dtype=np.int64)
    rows = np.full(len(gpu_rows), MISSING, dtype=np.int64)
    if len(cpu_rows) == 0 or len(gpu_rows) == 0:
        return out, rows
    cpu_corr = corr[cpu_rows]
    order = np.argsort(cpu_corr, kind="stable")
    sorted_corr = cpu_corr[order]
    want = corr[gpu_rows]
    pos = np.clip(np.searchsorted(sorted_corr, want), 0, len(sorted_corr) - 1)
    found = (sorted_corr[pos] == want) & (want != MISSING)
    rows[found] = cpu_rows[order[pos[found]]]
    out[found] = table.columns["ts"][rows[found]]
    return out, rows
