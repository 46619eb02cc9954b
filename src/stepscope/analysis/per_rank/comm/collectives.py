"""Collectives of one rank's window: the instances (one per collective the rank took part in) and, per kind and
process group, the count, message size, time, algorithm and bandwidth (`stats.py`).

Each collective leaves several events in a trace: the c10d op (`c10d::allreduce_`), `record_param_comms` (args
`Collective name`, `In msg nelems`, `Out msg nelems`, `dtype`, `Group size`, `Process Group Name`), the backend's
range (`nccl:all_reduce`, `gloo:all_reduce`) and, on GPUs, the kernels. An instance is taken from the first
source that times the collective itself:

1. communication kernels (by name or launch context, see kernels.py): the kernels launched inside one
   collective CPU range form one instance; a kernel launched outside any is one by itself. Device time.
2. without them, the ranges of CPU backends (gloo, mpi, ucc), which run the collective on the backend's
   thread. CPU time.
3. without either, the collective is only counted, from record_param_comms, else the backend ranges (their
   time is the CPU enqueue of an NCCL job whose kernels were not recorded), else the c10d ops.

Sizes come from the args of the kernel, else of the launching record_param_comms, else (gloo) from the
recorded shapes of the range (record_shapes=True). Events count when they are issued inside the window.

Time is a union: a backend runs collectives concurrently (DDP's gradient buckets on gloo's threads, NCCL's
streams), and an instant in two of them is one instant of communication, never two.
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.codes import distinct_sorted
from stepscope.analysis.per_rank.comm.exposed import exposed_communication
from stepscope.analysis.per_rank.comm.groups import GroupResolver, KnownGroups, parse_ranks
from stepscope.analysis.per_rank.comm.issued import IssuedOps
from stepscope.analysis.per_rank.comm_names import (
    BACKEND_RANGE,
    CPU_BACKENDS,
    collective_kind,
    cpu_collective,
    element_bytes,
    kernel_collective,
    nccl_algorithm,
)
from stepscope.analysis.per_rank.kernels import COMMUNICATION, CONTEXT_CATEGORIES, MISSING_TS, GpuEvents
from stepscope.analysis.per_rank.prepare import RankData
from stepscope.analysis.per_rank.steps import find_steps
from stepscope.analysis.read.table import MISSING, TraceTable

__all__ = [
    "Instances",
    "communication_intervals",
    "exposed_communication",  # (per_rank/comm/exposed.py; importable from here as before)
    "rank_instances",
    "wait_intervals",
]

SOURCES = ("kernel", "backend_range", "record_param_comms", "c10d_op")
_X = ord("X")


# Records of arrays: compared by identity (a field-wise == of arrays raises); a msgspec Struct compiles no
# __init__ at import (a dataclass's costs ~0.2 ms of every start).
class Instances(msgspec.Struct, eq=False):
    """The collectives of one rank, one entry each; times in ns on the rank's own clock."""

    rank: int
    source: str | None  # one of SOURCES; None: no collective
    time_source: str | None  # "device", "cpu" (gloo/mpi/ucc), "cpu enqueue" (NCCL without kernels), None
    kind: list[str]
    group: list[str]  # process-group name; "" when unknown (see groups.py)
    group_desc: list[str]  # the group's description ("mesh_tp", "default_pg"); "" unknown
    group_ranks: list[tuple[int, ...] | None]  # its ranks, None unknown
    dim: list[str | None]  # mesh dimension, else description, else None
    group_source: list[str]  # how the group is known: groups.GROUP_SOURCES
    group_size: np.ndarray  # -1 unknown
    issue: np.ndarray  # when the rank issued it (kernel launch; the c10d op that issued a backend's range)
    start: np.ndarray
    end: np.ndarray
    in_bytes: np.ndarray  # -1 unknown
    out_bytes: np.ndarray
    dtype: list[str]
    algorithm: list[str]  # NCCL's RING_LL, ...; "" unknown
    row: np.ndarray  # the row (in the rank's table) of the event that shows it: its first kernel, its range

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def timed(self) -> bool:
        """Start and end are the collective itself (kernels or CPU backend ranges), fit for matching."""
        return self.time_source in ("device", "cpu")


def rank_instances(
    data: RankData, world_size: int | None = None, known_groups: KnownGroups | None = None
) -> Instances:
    """The collectives of one prepared rank, issued inside its window, each in its process group (groups.py;
    `known_groups`: name -> {description, ranks, backend, mesh_dim} of the job's groups, where known)."""
    info = data.table.ranks.get(data.rank)
    resolver = GroupResolver(data.rank, info.process_groups if info else [], known_groups)
    out = _instances(data, world_size)
    by_thread = _thread_groups(data, resolver) if out.source == "backend_range" else {}
    tids = data.table.columns["tid"]
    for i, (name, desc, ranks) in enumerate(zip(out.group, out.group_desc, out.group_ranks, strict=True)):
        thread_group = by_thread.get(int(tids[out.row[i]])) if by_thread and not name else None
        group = resolver.by_capture(thread_group) if thread_group else resolver.resolve(name, desc, ranks)
        out.group[i], out.group_desc[i], out.group_ranks[i] = group.name, group.description, group.ranks
        if group.ranks:  # (a gloo range names no group: its size defaulted to the world's)
            out.group_size[i] = len(group.ranks)
        out.dim.append(group.dim)
        out.group_source.append(group.source)
    return out


def _thread_groups(data: RankData, resolver: GroupResolver) -> dict[int, str]:
    """tid -> group name of the rank's gloo threads, where capture's record and the trace agree (groups.py)."""
    table = data.table
    everywhere = cpu_rows(table)
    rows = [
        r for r, source, _ in everywhere if source == "backend_range" and _backend(table, r) in CPU_BACKENDS
    ]
    tids, counts = np.unique(table.columns["tid"][np.array(rows, dtype=np.int64)], return_counts=True)
    numbers = find_steps(table).number
    steps = (int(numbers.min()), int(numbers.max())) if len(numbers) else None
    return resolver.thread_groups(steps, dict(zip(tids.tolist(), counts.tolist(), strict=True)), data.notes)


def _instances(data: RankData, world_size: int | None) -> Instances:
    table = data.table
    comm = data.gpu.of_kind(COMMUNICATION)
    comm = comm.select(comm.cat == table.cat_id("kernel")) if len(comm) else comm
    everywhere = cpu_rows(table)
    issued = IssuedOps(table, everywhere)
    if len(comm):
        return _kernel_instances(data, comm, issued)
    ranges = [r for r in everywhere if data.lo <= table.columns["ts"][r[0]] < data.hi]
    backend = [r for r in ranges if r[1] == "backend_range" and _backend(table, r[0]) in CPU_BACKENDS]
    if backend:
        everywhere_backend = [
            r for r in everywhere if r[1] == "backend_range" and _backend(table, r[0]) in CPU_BACKENDS
        ]
        paired = issued.pair_ranges(everywhere_backend)
        backend = [
            (row, source, issued.kind.get(paired.get(row, MISSING), kind)) for row, source, kind in backend
        ]
        out = _range_instances(table, data.rank, backend, world_size)
        # issued when the op that issued it was called (the backend's thread may start it later)
        ops = np.array([paired.get(int(row), MISSING) for row in out.row.tolist()], dtype=np.int64)
        known = ops != MISSING
        out.issue[known] = np.minimum(out.issue[known], table.columns["ts"][ops[known]])
        return out
    # the issued op names what the events inside it ran; c10d ops under another issued op are that one
    counted = []
    for row, source, kind in ranges:
        op = issued.enclosing(row)
        if source == "c10d_op" and op != row:
            continue
        counted.append((row, source, issued.kind.get(op, kind)))
    return _counted_instances(table, data.rank, counted)


def communication_intervals(data: RankData) -> iv.Intervals | None:
    """The rank's time in communication, as a union over its whole trace: its communication GPU activity (by
    name or launch context, see kernels.py) and the ranges of CPU backends (gloo, mpi, ucc: the collective
    itself, on the backend's thread); None when it has neither."""
    comm = data.gpu_all.of_kind(COMMUNICATION)
    table = data.table
    rows = np.array(
        [r for r, source, _ in cpu_rows(table)
         if source == "backend_range" and _backend(table, r) in CPU_BACKENDS],
        dtype=np.int64,
    )  # fmt: skip
    if not len(comm) and not len(rows):
        return None
    start = table.columns["ts"][rows]
    return iv.merge(
        np.concatenate((comm.start, start)), np.concatenate((comm.end, start + table.columns["dur"][rows]))
    )


def wait_intervals(inst: Instances, wait_ns: np.ndarray) -> iv.Intervals:
    """The union of the instances' waiting for peers (rank's own clock): from each matched instance's start,
    its wait (`wait_ns` per instance, -1 where not matched)."""
    waiting = wait_ns > 0
    start = inst.start[waiting]
    return iv.merge(start, start + wait_ns[waiting])


def _empty(rank: int) -> Instances:
    z = np.zeros(0, dtype=np.int64)
    return Instances(rank, None, None, [], [], [], [], [], [], z, z, z, z, z, z, [], [], z)


def _text(table: TraceTable, column: str, row: int) -> str:
    code = int(table.columns[column][row]) if row != MISSING else MISSING
    return table.names[code] if code != MISSING else ""


def _int(table: TraceTable, column: str, row: int) -> int:
    return int(table.columns[column][row]) if row != MISSING else MISSING


_MESSAGE_COLUMNS = (
    "args_collective", "args_dtype", "args_in_nelems", "args_out_nelems", "args_group_size", "args_pg_name",
    "args_pg_desc", "args_pg_ranks",
)  # fmt: skip


class _Args:
    """The collective args of a set of rows, read from the table's columns in one pass (a column read row by
    row costs a Python call each: thousands of collectives read ten columns each)."""

    def __init__(self, table: TraceTable, rows: np.ndarray) -> None:
        rows = distinct_sorted(np.asarray(rows, dtype=np.int64))  # (not np.unique: it imports numpy.ma)
        rows = rows[rows != MISSING]
        self.names = table.names
        self.at = dict(zip(rows.tolist(), range(len(rows)), strict=True))
        self.cols = {c: table.columns[c][rows].tolist() for c in _MESSAGE_COLUMNS}

    def number(self, column: str, row: int) -> int:
        return self.cols[column][self.at[row]] if row != MISSING else MISSING  # type: ignore[no-any-return]

    def text(self, column: str, row: int) -> str:
        code = self.number(column, row)
        return self.names[code] if code != MISSING else ""


def _message(args: _Args, rows: list[int]) -> tuple[int, int, str, int, tuple[str, str, str]]:
    """(in bytes, out bytes, dtype, group size, group (name, description, ranks)) from the first row among `rows`
    that has each."""
    in_b = out_b = size = MISSING
    dtype = group = desc = ranks = ""
    for row in rows:
        if row == MISSING:
            continue
        width = element_bytes(args.text("args_dtype", row))
        if in_b == MISSING and width and args.number("args_in_nelems", row) >= 0:
            in_b = args.number("args_in_nelems", row) * width
            out_n = args.number("args_out_nelems", row)
            out_b = out_n * width if out_n >= 0 else MISSING
            dtype = args.text("args_dtype", row)
        if size == MISSING and args.number("args_group_size", row) > 0:
            size = args.number("args_group_size", row)
        if not group:
            group = args.text("args_pg_name", row)
            desc, ranks = args.text("args_pg_desc", row), args.text("args_pg_ranks", row)
    return in_b, out_b, dtype, size, (group, desc, ranks)


def _kernel_instances(data: RankData, comm: GpuEvents, issued: IssuedOps) -> Instances:
    table = data.table
    launch = np.where(comm.launch == MISSING_TS, comm.start, comm.launch)
    # kernels launched in the same collective range are one instance
    key = np.where(comm.context != MISSING, comm.context, -2 - np.arange(len(comm)))
    order = np.lexsort((comm.start, key))
    cuts = np.flatnonzero(np.diff(key[order])) + 1
    groups = np.split(order, cuts)
    first_start = comm.start[order][np.r_[0, cuts]]  # (each group is sorted by start: its first is its least)
    groups = [groups[i] for i in np.argsort(first_start, kind="stable").tolist()]
    args = _Args(table, np.concatenate((comm.row, comm.context)))
    op_of = dict(zip(comm.context.tolist(), issued.enclosing_rows(comm.context).tolist(), strict=True))
    kinds: dict[str, str | None] = {}  # (names repeat: each is classified once)
    algorithms: dict[str, str | None] = {}
    rows_all, names_all = comm.row.tolist(), comm.name.tolist()
    starts, ends, launches = comm.start.tolist(), comm.end.tolist(), launch.tolist()
    out = _empty(data.rank)
    out.source, out.time_source = "kernel", "device"
    cols: dict[str, list[int]] = {k: [] for k in ("issue", "start", "end", "in", "out", "size", "row")}
    for g in groups:
        members = g.tolist()
        names = [table.names[names_all[i]] for i in members]
        rows = [rows_all[i] for i in members]
        context = int(comm.context[members[0]])
        # the issued op, else the launching range says what the collective is (NCCL runs an all-to-all as
        # SendRecv kernels)
        kind = issued.kind.get(op_of[context])
        if not kind:
            for r in rows:
                raw = args.text("args_collective", r)
                if raw not in kinds:
                    kinds[raw] = collective_kind(raw)
                kind = kinds[raw]
                if kind:
                    break
        kind = (
            kind
            or _context_kind(table, context)
            or next((k for k in map(kernel_collective, names) if k), None)
            or "other"
        )
        in_b, out_b, dtype, size, group = _message(args, [*rows, context])
        out.kind.append(kind)
        _add_group(out, group)
        out.dtype.append(dtype)
        for n in names:
            if n not in algorithms:
                algorithms[n] = nccl_algorithm(n)
        out.algorithm.append(next((a for a in map(algorithms.__getitem__, names) if a), ""))
        cols["row"].append(rows[0])
        cols["issue"].append(min(launches[i] for i in members))
        cols["start"].append(min(starts[i] for i in members))
        cols["end"].append(max(ends[i] for i in members))
        cols["in"].append(in_b)
        cols["out"].append(out_b)
        cols["size"].append(size)
    _set_arrays(out, cols)
    return out


def _add_group(out: Instances, group: tuple[str, str, str]) -> None:
    out.group.append(group[0])
    out.group_desc.append(group[1])
    out.group_ranks.append(parse_ranks(group[2]))


def _context_kind(table: TraceTable, row: int) -> str | None:
    if row == MISSING:
        return None
    name = table.names[int(table.columns["name"][row])]
    if name == "record_param_comms":
        return collective_kind(_text(table, "args_collective", row))
    found = cpu_collective(name)
    return found[1] if found else None


def _set_arrays(out: Instances, cols: dict[str, list[int]]) -> None:
    arrays = {k: np.array(v, dtype=np.int64) for k, v in cols.items()}
    out.issue, out.start, out.end = arrays["issue"], arrays["start"], arrays["end"]
    out.in_bytes, out.out_bytes, out.group_size = arrays["in"], arrays["out"], arrays["size"]
    out.row = arrays["row"]


def cpu_rows(table: TraceTable) -> list[tuple[int, str, str]]:
    """(row, source, kind) of the table's CPU-side collective events, by start: found once per table and kept
    with it (`DerivedRows.collective_rows`: five analyses read them)."""
    found = table.derived.collective_rows
    if found is not None:
        return found
    cols = table.columns
    names = cols["name"]
    classes = table.name_values(cpu_collective, object, key="cpu_collective_class", among=names)
    named = table.name_values(lambda n: cpu_collective(n) is not None, bool, key="cpu_collective")
    cats = [c for c in (table.cat_id(x) for x in CONTEXT_CATEGORIES) if c != MISSING]
    rows = np.flatnonzero(named[names] & (cols["ph"] == _X) & np.isin(cols["cat"], cats))
    rows = rows[np.argsort(cols["ts"][rows], kind="stable")]
    collective = cols["args_collective"][rows].tolist()
    kinds: dict[int, str] = {}  # (record_param_comms' collective names repeat: each is classified once)
    out = []
    for row, code in zip(rows.tolist(), collective, strict=True):
        source, kind = classes[names[row]]
        if source == "record_param_comms":
            if code not in kinds:
                kinds[code] = collective_kind(table.names[code] if code != MISSING else "") or ""
            kind = kinds[code]
        if kind:
            out.append((row, source, kind))
    table.derived.collective_rows = out
    return out


def _backend(table: TraceTable, row: int) -> str:
    match = BACKEND_RANGE.match(table.names[int(table.columns["name"][row])])
    return match.group(1) if match else ""


def _range_instances(
    table: TraceTable, rank: int, ranges: list[tuple[int, str, str]], world_size: int | None
) -> Instances:
    """One instance per CPU backend range (gloo runs the collective on its own thread: CPU time)."""
    out = _row_instances(table, rank, ranges, world_size)
    out.source, out.time_source = "backend_range", "cpu"
    return out


def _counted_instances(table: TraceTable, rank: int, rows: list[tuple[int, str, str]]) -> Instances:
    """Untimed collectives: per kind, the events of the first source that has the kind (never two sources)."""
    if not rows:
        return _empty(rank)
    first: dict[str, str] = {}
    for source in ("record_param_comms", "backend_range", "c10d_op"):
        for _, s, kind in rows:
            if s == source:
                first.setdefault(kind, source)
    kept = [r for r in rows if first[r[2]] == r[1]]
    out = _row_instances(table, rank, kept, None)
    sources = {s for _, s, _ in kept}
    out.source = next(s for s in SOURCES if s in sources)
    if sources == {"backend_range"}:
        out.time_source = "cpu enqueue"
    return out


def _row_instances(
    table: TraceTable, rank: int, rows: list[tuple[int, str, str]], world_size: int | None
) -> Instances:
    """One instance per CPU event (row, source, kind), timed by the event; the group size defaults to
    `world_size` (gloo ranges name no group: the default one)."""
    out = _empty(rank)
    cols: dict[str, list[int]] = {k: [] for k in ("issue", "start", "end", "in", "out", "size", "row")}
    ts, dur = table.columns["ts"], table.columns["dur"]
    args = _Args(table, np.array([r[0] for r in rows], dtype=np.int64))
    for row, _, kind in rows:
        cols["row"].append(row)
        in_b, out_b, dtype, size, group = _message(args, [row])
        out.kind.append(kind)
        _add_group(out, group)
        out.dtype.append(dtype)
        out.algorithm.append("")
        cols["issue"].append(int(ts[row]))
        cols["start"].append(int(ts[row]))
        cols["end"].append(int(ts[row] + dur[row]))
        cols["in"].append(in_b)
        cols["out"].append(out_b)
        cols["size"].append(size if size != MISSING else (world_size or MISSING))
    _set_arrays(out, cols)
    return out
