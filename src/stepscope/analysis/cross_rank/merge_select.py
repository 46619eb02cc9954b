"""The events that aligning the ranks of `stepscope merge` needs, found by streaming each file: a small table.

Alignment (distributed.py) rests on each rank's ProfilerSteps and collective instances (collectives.py), and
the flow arrows on the rows of those instances. An instance comes from communication kernels (by name, or by a
launch inside a collective CPU range) with their launching runtime calls, else from the collective CPU ranges
themselves. So the rows that can matter are the complete 'X' events that are

- ProfilerStep spans and collective CPU ranges (by name);
- GPU activities whose name says communication, or whose correlation id is in the set C below;
- CPU events whose correlation id is in C,

where C holds the correlation ids of those GPU activities and of every CPU event that starts inside a collective
range on its thread (its kernels are communication by context). Every CPU event sharing a correlation id with a
kept GPU activity is kept too, so the loader finds the same launch (the first one in the file) in the small
table as in the whole one; a kept event that is not one of these after all changes nothing, because the loader
and the analysis decide on the small table by the same rules as on the whole (this is a superset: times are
compared with a margin of 1 us, for the loader reads them exactly).

Three streaming passes at most, each holding one piece of text and what it keeps: the first finds the ranges and
the correlation ids of communication kernels by name; the second keeps the events, adding to C the ids launched
in ranges; a third is needed only when such an id turns up after an event that carries it was passed over (a
16 MB table of the ids seen so far tells, with rare false alarms). The kept events are written as a small
trace (the file's other keys as they are) and read by the loader, so the rank and its header are read as always.
"""

from __future__ import annotations

import bisect
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from stepscope.analysis.per_rank.comm_names import cpu_collective
from stepscope.analysis.per_rank.kernels import COMMUNICATION, CommPattern, kind_of_name
from stepscope.analysis.per_rank.steps import STEP_RE
from stepscope.analysis.read.event_stream import EventPieces, Piece
from stepscope.analysis.read.source import Source, as_source
from stepscope.analysis.read.table import (
    GPU_CATEGORIES,
    MISSING,
    OLD_CATEGORIES,
    TraceTable,
    as_int,
    id_as_int,
)
from stepscope.errors import InputError

__all__ = ["alignment_table"]

_STEP, _RANGE, _COMM = 1, 2, 4  # what an event's name makes it
_MARGIN_US = (
    1.0  # times compared in float us against the loader's exact ns: a launch this near a range counts
)
_SEEN_BITS = 1 << 24  # slots of the table of correlation ids passed over (ids are sequential in traces)
_GPU_CATS = frozenset(GPU_CATEGORIES | {old for old, new in OLD_CATEGORIES.items() if new in GPU_CATEGORIES})


class _Args(msgspec.Struct):
    correlation: Any = None


# Typed fields decode twice as fast as `Any` ones (411 against 189 MB/s of JSON); a piece where an event does not
# fit them is decoded plainly and read through _probe (the same fields, any types).
class _TypedArgs(msgspec.Struct):
    correlation: int | None = None


class _Probe(msgspec.Struct):
    """The fields of an event the selection reads (the rest of it is skipped by the decoder)."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: _TypedArgs | None = None


class _AnyProbe(msgspec.Struct):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


_PROBES = msgspec.json.Decoder(list[_Probe])
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])


def _probe(event: Any) -> _AnyProbe | None:
    """A plainly decoded event (its piece did not fit _Probe) as a probe; None for what is not an object."""
    if not isinstance(event, dict):
        return None
    args = event.get("args")
    return _AnyProbe(
        event.get("ph"),
        event.get("cat"),
        event.get("name"),
        event.get("pid"),
        event.get("tid"),
        event.get("ts"),
        event.get("dur"),
        _Args(args.get("correlation")) if isinstance(args, dict) else None,
    )


def _number(value: Any) -> float | None:
    return float(value) if type(value) is int or type(value) is float else None


class _Ranges:
    """Collective CPU ranges per thread, to ask whether a time lies inside one (with the margin)."""

    def __init__(self) -> None:
        self._spans: dict[tuple[int, int], list[tuple[float, float]]] = {}
        self._index: dict[tuple[int, int], tuple[list[float], list[float]]] = {}

    def add(self, pid: int, tid: int, start: float, end: float) -> None:
        self._spans.setdefault((pid, tid), []).append((start, end))

    def freeze(self) -> None:
        for key, spans in self._spans.items():
            spans.sort()
            reach, top = [], float("-inf")
            for _, end in spans:
                top = max(top, end)
                reach.append(top)
            self._index[key] = ([s for s, _ in spans], reach)

    def holds(self, pid: int, tid: int, at: float) -> bool:
        found = self._index.get((pid, tid))
        if found is None:
            return False
        starts, reach = found
        i = bisect.bisect_right(starts, at + _MARGIN_US) - 1
        return i >= 0 and reach[i] > at - _MARGIN_US


class _Selection:
    """What the passes over one file learn: the ranges, the correlation ids in C, and the kept events."""

    def __init__(self, patterns: Sequence[CommPattern]) -> None:
        self.patterns = patterns
        self.kinds: dict[str, int] = {}
        self.ranges = _Ranges()
        self.comm_ids: set[int] = set()  # correlation ids of GPU activities named as communication
        self.ids: set[int] = set()  # C
        self.kept: list[bytes] = []

    def kind(self, name: str) -> int:
        found = self.kinds.get(name)
        if found is None:
            m = STEP_RE.match(name)
            found = _STEP if m is not None and int(m.group(1)) < 1 << 62 else 0
            if cpu_collective(name) is not None:
                found |= _RANGE
            if kind_of_name(name, self.patterns) == COMMUNICATION:
                found |= _COMM
            self.kinds[name] = found
        return found

    def first_pass(self, events: list[Any]) -> None:
        """The collective ranges, and the correlation ids of communication GPU activities named so."""
        kinds = self.kinds
        for e in events:
            if e is None or e.ph != "X" or type(e.name) is not str:
                continue
            kind = kinds.get(e.name)
            if kind is None:
                kind = self.kind(e.name)
            if not kind:
                continue
            if kind & _RANGE:
                start, dur = _number(e.ts), _number(e.dur)
                if start is not None:
                    end = start + max(dur or 0.0, 0.0)
                    self.ranges.add(id_as_int(e.pid), id_as_int(e.tid), start, end)
            elif kind & _COMM and isinstance(e.cat, str) and e.cat in _GPU_CATS and e.args is not None:
                ident = as_int(e.args.correlation)
                if ident != MISSING:
                    self.comm_ids.add(ident)

    def keep_pass(self, piece: Piece, events: list[Any], seen: bytearray | None) -> bool:
        """Keep this piece's events that can matter; with `seen` (the second pass) add the ids launched in a
        range to C and say whether one came after an event carrying it was passed over."""
        late = False
        keep = []
        ids, kinds = self.ids, self.kinds
        for i, e in enumerate(events):
            if e is None or e.ph != "X" or type(e.name) is not str:
                continue
            kind = kinds.get(e.name)
            if kind is None:
                kind = self.kind(e.name)
            if kind & (_STEP | _RANGE):
                keep.append(i)
                continue
            ident = e.args.correlation if e.args is not None else None
            if type(ident) is not int:  # (an int: the common case, as it is)
                ident = as_int(ident)
            gpu = isinstance(e.cat, str) and e.cat in _GPU_CATS
            if (gpu and kind & _COMM) or (ident != MISSING and ident in ids):
                keep.append(i)
                continue
            if ident == MISSING:
                continue
            if seen is not None and not gpu:
                at = _number(e.ts)
                if at is not None and self.ranges.holds(id_as_int(e.pid), id_as_int(e.tid), at):
                    late = late or bool(seen[ident & (_SEEN_BITS - 1)])
                    ids.add(ident)
                    keep.append(i)
                    continue
            if seen is not None:
                seen[ident & (_SEEN_BITS - 1)] = 1
        if keep:
            raws = _RAWS.decode(piece.text)
            self.kept.extend(bytes(raws[i]) for i in keep)
        return late


def _passes(path: Path, patterns: Sequence[CommPattern]) -> tuple[_Selection, EventPieces]:
    sel = _Selection(patterns)
    for piece in EventPieces(path, decoder=_PROBES):
        sel.first_pass(_events(piece))
    sel.ranges.freeze()
    sel.ids |= sel.comm_ids
    seen = bytearray(_SEEN_BITS)
    reader = EventPieces(path, decoder=_PROBES)
    late = False
    for piece in reader:
        late = sel.keep_pass(piece, _events(piece), seen) or late
    del seen
    if late:  # an id of C came after an event carrying it was passed over: keep again, C now whole
        sel.kept = []
        reader = EventPieces(path, decoder=_PROBES)
        for piece in reader:
            sel.keep_pass(piece, _events(piece), None)
    return sel, reader


def _events(piece: Piece) -> list[Any]:
    return piece.events if piece.typed else [_probe(e) for e in piece.events]


def _small_trace(sel: _Selection, reader: EventPieces) -> bytes:
    """A trace of the kept events, with the file's other keys (before the array, then after it)."""
    keys = [b'"' + k.encode() + b'":' + bytes(v) for k, v in (*reader.head.items(), *reader.tail.items())]
    events = b'"traceEvents":[' + b",".join(sel.kept) + b"]"
    return b"{" + b",".join([events, *keys]) + b"}"


def alignment_table(
    path: str | Path | Source, *, step: int | None = None, patterns: Sequence[CommPattern] = ()
) -> TraceTable:
    """The trace(s) at `path` as `load_trace` reads them (files, ranks, notices), but holding only the events
    that aligning the ranks and linking their collectives needs (see the module doc); each rank's `source` is
    its file, to be read again for the merge. `patterns`: the user's communication patterns, compiled."""
    from stepscope.analysis.read import loader
    from stepscope.analysis.read.loader import load_file

    source = as_source(path)
    files, window_notices = loader.find_traces(source, step)
    skipped = loader.skipping(source)  # (as analyze leaves files out: a damaged rank of a run, a non-trace)
    tables = []
    with tempfile.TemporaryDirectory(prefix="stepscope-merge-") as tmp:
        small = Path(tmp) / "events.json"
        for file, hint in files:
            try:
                sel, reader = _passes(file, patterns)
                small.write_bytes(_small_trace(sel, reader))
                del sel, reader
                try:
                    table = load_file(small, hint)
                except InputError as exc:
                    raise InputError(file, exc.problem) from None
            except InputError as exc:
                skipped.skip_or_raise(exc)
                continue
            table.path = table.info.source = str(file)
            table.notices = [n.replace(str(small), str(file)) for n in table.notices]
            tables.append(table)
    if not tables:
        raise skipped.nothing_left(source.path)
    merged = loader.merge_tables(tables)
    merged.notices[:0] = window_notices + skipped.notices
    return merged
