"""`stepscope merge`: the traces of every rank as one chrome trace, clocks aligned, collectives linked.

Each rank becomes one process named "rank N" (pid N + 1): its CPU threads keep their ids, its GPU streams
become threads `GPU d stream s`. Times are shifted by the rank's clock offset (distributed.py), so the
ranks share the reference rank's clock. Every collective instance matched across ranks gets flow arrows
from the instance on one rank to the same instance on the next. Ids of the ranks' own flows and async
events are made distinct per rank. The document names what it did under `stepscopeMerge`, which our
loader reads to load the file back as one rank per process.

Memory stays bounded by the loaded table (the columns alignment and flows need): each rank's file is read again
a batch of events at a time (_event_stream) and the merged document is written as it is made, to a temp file
renamed into place.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

from stepscope.analysis.cross_rank.distributed import (
    ClockAlignment,
    Matching,
    cross_rank_analysis,
    summarize_rank,
)
from stepscope.analysis.per_rank.comm.collectives import Instances, rank_instances
from stepscope.analysis.per_rank.comm.groups import KnownGroups
from stepscope.analysis.per_rank.kernels import compile_patterns
from stepscope.analysis.per_rank.prepare import prepare_rank
from stepscope.analysis.read.event_stream import iter_event_batches
from stepscope.analysis.read.table import GPU_CATEGORIES, OLD_CATEGORIES, TraceTable
from stepscope.compress import open_gzip
from stepscope.errors import InputError

MERGE_SCHEMA = "stepscope.merge/1"
MERGE_KEY = "stepscopeMerge"
GPU_TID_BASE = 1_000_000_000  # GPU stream threads: base + device * 100_000 + stream (CPU tids stay below)
FLOW_CAT = "stepscope_collective"
_ID_SHIFT = 40  # a rank's own numeric ids move to (rank + 1) << 40 + id


class MergedRank(msgspec.Struct):
    rank: int
    pid: int
    source: str
    clock_offset_us: float
    world_size: int | None = None
    backend: str | None = None


class MergeInfo(msgspec.Struct):
    schema: str
    ranks: list[MergedRank]
    alignment: ClockAlignment | None
    flows: int  # flow arrows drawn between matched collective instances


def merge_traces(
    table: TraceTable,
    out: Path,
    *,
    comm_patterns: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
    known_groups: KnownGroups | None = None,
) -> MergeInfo:
    """Write the merged trace of every rank of `table` (loaded from files) to `out` (.json or .json.gz).

    `out` must be a regular file or not exist yet, in an existing folder; InputError otherwise. `known_groups`:
    a run folder's record of the process groups (run.folder.recorded_groups), by which collectives are matched
    (and linked) within their group only, as `analyze` does."""
    ranks = table.rank_ids()
    for rank in ranks:
        if table.ranks[rank].merge_header is not None:
            source = table.ranks[rank].source.rsplit(" (rank ", 1)[0]
            raise InputError(source, "is already a merged trace: merge the per-rank traces it came from")
    out = _output_path(out)
    patterns = compile_patterns(comm_patterns)
    prepared = {r: prepare_rank(table, r, comm_patterns=patterns) for r in ranks}
    instances = {r: rank_instances(d, table.ranks[r].world_size, known_groups) for r, d in prepared.items()}
    summaries = {r: summarize_rank(d, ops=False) for r, d in prepared.items()}
    dist = cross_rank_analysis(summaries, instances, {r: [] for r in ranks})
    match = dist.match
    offsets = dist.offsets_ns
    info = MergeInfo(
        schema=MERGE_SCHEMA,
        ranks=[
            MergedRank(
                rank=r,
                pid=r + 1,
                source=table.ranks[r].source,
                clock_offset_us=round(offsets.get(r, 0) / 1e3, 3),
                world_size=table.ranks[r].world_size,
                backend=table.ranks[r].backend,
            )
            for r in ranks
        ],
        alignment=dist.alignment,
        flows=0,
    )
    flows = list(_flows(prepared, instances, match, offsets))
    info.flows = len(flows) // 2
    _write(out, _events(table, ranks, offsets, flows, progress), info)
    return info


def _gpu_tid(device: int, stream: int) -> int:
    return GPU_TID_BASE + max(device, 0) * 100_000 + max(stream, 0)


def _flows(
    prepared: dict[int, Any],
    instances: dict[int, Instances],
    match: Matching,
    offsets: dict[int, int],
) -> Iterator[dict[str, Any]]:
    """A flow start on each matched instance and its end on the same instance of the next rank."""
    flow_id = 1
    for ranks, index in zip(match.ranks, match.index, strict=True):
        where = []
        for rank, i in zip(ranks.tolist(), index.tolist(), strict=True):
            inst = instances[rank]
            table = prepared[rank].table
            row = int(inst.row[i])
            cat = table.cats[int(table.columns["cat"][row])] if table.columns["cat"][row] >= 0 else ""
            if cat in GPU_CATEGORIES:
                tid = _gpu_tid(int(table.columns["device"][row]), int(table.columns["stream"][row]))
            else:
                tid = int(table.columns["tid"][row])
            middle = (int(inst.start[i]) + int(inst.end[i])) // 2 - offsets.get(rank, 0)
            where.append((rank + 1, tid, middle / 1e3, inst.kind[i]))
        where.sort(key=lambda w: w[2])  # arrows run forward in time
        for (pid_a, tid_a, ts_a, kind), (pid_b, tid_b, ts_b, _) in itertools.pairwise(where):
            name = f"{kind} across ranks"
            yield {
                "ph": "s",
                "id": flow_id,
                "cat": FLOW_CAT,
                "name": name,
                "pid": pid_a,
                "tid": tid_a,
                "ts": ts_a,
            }
            yield {
                "ph": "f",
                "bp": "e",
                "id": flow_id,
                "cat": FLOW_CAT,
                "name": name,
                "pid": pid_b,
                "tid": tid_b,
                "ts": ts_b,
            }
            flow_id += 1


def _events(
    table: TraceTable,
    ranks: list[int],
    offsets: dict[int, int],
    flows: list[dict[str, Any]],
    progress: Callable[[int, int], None] | None,
) -> Iterator[list[Any]]:
    """The merged document's events, a batch at a time."""
    for done, rank in enumerate(ranks):
        source = Path(table.ranks[rank].source)
        pid = rank + 1
        yield [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {rank}"}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": rank}},
        ]
        shift_us = offsets.get(rank, 0) / 1e3
        streams: set[tuple[int, int]] = set()
        # A batch of events at a time: a file's events as dicts would take ~1 KB each (11.5 GB for 10 M).
        for batch in iter_event_batches(source):
            yield _move(batch, rank, pid, shift_us, streams)
        yield [
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": _gpu_tid(device, stream),
                "args": {"name": f"GPU {device} stream {stream}"},
            }
            for device, stream in sorted(streams)
        ]
        if progress is not None:
            progress(done + 1, len(ranks))
    yield flows


# Categories (as written, old names too) of the events that go to a GPU stream's thread
_ON_STREAMS = frozenset(
    cat
    for cat in (*GPU_CATEGORIES, "gpu_user_annotation", *OLD_CATEGORIES)
    if OLD_CATEGORIES.get(cat, cat) in GPU_CATEGORIES or OLD_CATEGORIES.get(cat, cat) == "gpu_user_annotation"
)
_OWN_METADATA = ("thread_name", "thread_sort_index")  # of a rank's metadata events, the ones kept


def _move(
    events: list[Any], rank: int, pid: int, shift_us: float, streams: set[tuple[int, int]]
) -> list[Any]:
    """A batch of a rank's events, changed in place into the merged trace's terms (what is not an object,
    and process names and sort indexes, which are the merge's own, left out). The loop runs once per event
    of every rank: it does only what each event needs."""
    out: list[Any] = []
    append = out.append
    for event in events:
        if type(event) is not dict:
            continue
        ph = event.get("ph")
        if ph == "M" and event.get("name") not in _OWN_METADATA:
            continue
        cat = event.get("cat")
        if type(cat) is str and cat in _ON_STREAMS:
            event["tid"] = _stream_tid(event, streams)
        elif not isinstance(event.get("tid"), int):
            event["tid"] = _int(event.get("tid"), 0)
        event["pid"] = pid
        ts = event.get("ts")
        if (type(ts) is float or type(ts) is int) and ph != "M":
            event["ts"] = ts - shift_us
        if "id" in event:
            ident = event["id"]
            event["id"] = ((rank + 1) << _ID_SHIFT) + ident if isinstance(ident, int) else f"r{rank}:{ident}"
        append(event)
    return out


def _stream_tid(event: dict[str, Any], streams: set[tuple[int, int]]) -> int:
    """The merged thread of a GPU event (its device and stream, from its args, else its pid and tid)."""
    raw_args = event.get("args")
    args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
    device, stream = args.get("device"), args.get("stream")
    if type(device) is not int or type(stream) is not int:  # (ints: the common case, read as they are)
        device = _int(device, _int(event.get("pid"), 0))
        stream = _int(stream, 0) if "stream" in args else _int(event.get("tid"), 0)
    streams.add((device, stream))
    return GPU_TID_BASE + (device if device > 0 else 0) * 100_000 + (stream if stream > 0 else 0)


def _int(value: Any, default: int) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        digits = "".join(ch for ch in value if ch.isdigit())
        return int(digits) if digits and len(digits) < 18 else default
    return default


def _output_path(out: Path) -> Path:
    """The file to write: `out`, or the file a symlink points to; never a device, FIFO or folder."""
    target = out.resolve() if out.is_symlink() else out
    if target.exists() and not target.is_file():
        raise InputError(out, "exists and is not a regular file: give a file name for the merged trace")
    if not target.parent.is_dir():
        raise InputError(out, f"no such folder: {target.parent}")
    return target


def _write(out: Path, batches: Iterator[list[Any]], info: MergeInfo) -> None:
    """Stream the document into a temp file beside `out`, then rename it (gzip when the name ends .gz)."""
    from stepscope.runfolder.atomic import FILE_MODE, temp_path_beside

    try:
        tmp = temp_path_beside(out)
    except OSError as exc:
        raise InputError(out, f"cannot write: {exc.strerror or exc}") from None
    encoder = msgspec.json.Encoder()
    try:
        # ISA-L's deflate where installed (stepscope.compress): zlib's level 9 compresses real traces at ~50 MB/s
        # of JSON (28 s for 10 M events), its level 6 at ~85 MB/s, ISA-L several times faster
        opener = open_gzip if out.name.endswith(".gz") else open
        with opener(tmp, "wb") as fh:
            fh.write(b'{"traceEvents":[')
            first = True
            for batch in batches:
                if batch:
                    fh.write((b"" if first else b",") + encoder.encode(batch)[1:-1])
                    first = False
            fh.write(b'],"displayTimeUnit":"ms","' + MERGE_KEY.encode() + b'":' + encoder.encode(info) + b"}")
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(out, f"cannot write: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
