"""One big trace file read by several processes at once, each a stretch of its `traceEvents` array.

The file is cut near `k * size / parts` at a spot that looks like the gap between two events (`}` `,` `{`,
as _stream cuts its pieces). Each stretch is read by _stream's chunk reader in a worker process: the first
also reads the header keys before the array, the last the end of the array and the keys after it. Each
writes its columns to a temporary folder as it builds them and sends back its own symbols; the parent joins
the stretches in file order (_parts.join_parts): the same table one process reading the whole file builds.

Whether a cut really lies between two events is known only once the stretch before it decodes up to it:
a stretch starts at an event (the first at the array's start, each next at a verified cut), so a last
piece that decodes as a list of events ends where an event ends. A cut inside a string or inside an
event's args makes that piece fail; any failure, in any stretch, sends the file to the one-process reader,
which gives the same table or the error message it always gives.

Only plain JSON is split: a gzip stream can only be inflated from its start.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

import msgspec

from stepscope.analysis.read._decode import HEADER_FIELDS, UNSET, gc_paused, read_header
from stepscope.analysis.read._parts import PartTable, join_parts
from stepscope.analysis.read._stream import (
    CHUNK_BYTES,
    FileTable,
    _check_times,
    _ChunkReader,
    load_file,
)
from stepscope.analysis.read._text import CUT, TraceText
from stepscope.analysis.read.limits import (
    DEFAULT_MAX_TRACE_BYTES,
    MAX_EVENTS_ENV,
    max_events,
    max_input_bytes,
)
from stepscope.analysis.read.table import MISSING, RankInfo
from stepscope.analysis.tasks import fork_is_safe, run_tasks
from stepscope.errors import InputError

SPLIT_MIN_BYTES = 64 << 20  # below this a file is read by one process: a pool costs more than it saves
# Stretches per process, each of at least _MIN_STRETCH bytes: a process that runs slower than the others (a
# busy CPU) then takes fewer of them, instead of all waiting for its one.
STRETCHES_PER_PROCESS = 4
_MIN_STRETCH = 16 << 20
_CUT_WINDOW = 1 << 20  # text searched for a cut after each split point
_POLL_S = 0.2  # how often the parent reports the stretches' progress

# Fractions done of each stretch, written by the workers (shared memory, inherited when they are forked).
_FRACTIONS: Any = None


class _Stretch(msgspec.Struct):
    index: int
    start: int
    stop: int
    first: bool
    last: bool


class _StretchResult(msgspec.Struct):
    part: PartTable
    head: dict[str, Any]  # header keys before the array (first stretch), those present
    tail: dict[str, Any]  # header keys after it (last stretch)


def load_file_split(
    path: str | Path,
    rank_hint: int | None,
    parts: int,
    progress: Callable[[float], None] | None = None,
    *,
    flows: bool = True,
    chunk_bytes: int | None = None,
    min_bytes: int | None = None,
) -> FileTable:
    """`_stream.load_file` of one file, with up to `parts` processes reading stretches of it side by side
    (a file smaller than `min_bytes`, gzipped, or without cuts to be found is read by this process). A big
    file is cut into up to STRETCHES_PER_PROCESS stretches per process, which the processes take in turn."""
    p = Path(path)
    least = SPLIT_MIN_BYTES if min_bytes is None else min_bytes
    size = p.stat().st_size if p.is_file() else 0
    pieces = max(parts, min(parts * STRETCHES_PER_PROCESS, size // _MIN_STRETCH))
    stretches = _stretches(p, pieces, least) if parts > 1 else None
    if stretches is None:
        return load_file(p, rank_hint, progress, chunk_bytes=chunk_bytes, flows=flows)
    import tempfile  # (here, not at the top: the many files that are read whole need none of these modules)

    try:
        spill = Path(tempfile.mkdtemp(prefix="stepscope-split-"))
    except OSError:
        spill = None
    try:
        results = _run(p, stretches, parts, progress, flows, chunk_bytes or CHUNK_BYTES, spill)
        if results is not None:
            n_events = sum(r.part.n_events for r in results)
            if n_events > max_events():
                raise InputError(
                    p, f"more than {max_events()} events (the limit; {MAX_EVENTS_ENV} raises it)"
                )
            header = {**results[0].head, **results[-1].tail}  # keys after the array win, as in one reading
            info = RankInfo(rank=MISSING, source=str(p))
            read_header(info, {key: header.get(key) for key in HEADER_FIELDS})
            try:
                table = join_parts(str(p), [r.part for r in results], info, rank_hint)
            except OSError:  # a spilled column could not be read back
                results = None
    finally:
        if spill is not None:
            _remove(spill)
    if results is None:  # a stretch could not vouch for its text: one process gives the table or the error
        return load_file(p, rank_hint, progress, chunk_bytes=chunk_bytes, flows=flows)
    _check_times(table, p)
    if progress is not None:
        progress(1.0)
    return table


def _remove(folder: Path) -> None:
    """Remove the spill folder. After an error the other stretches' workers may still be writing into it (the
    pool is not waited for): a file made while it is being removed leaves it behind, so it is removed again
    until it is gone (once it is, a worker can make nothing in it), for a second at most."""
    import shutil
    import time

    for _ in range(50):
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            return
        time.sleep(0.02)


def _stretches(path: Path, parts: int, min_bytes: int) -> list[_Stretch] | None:
    """Where each stretch starts and stops; None when the file is not to be split."""
    try:
        size = path.stat().st_size
        if size < max(min_bytes, 1) or size > max_input_bytes(DEFAULT_MAX_TRACE_BYTES):
            return None
        bounds = [(0, 0)]
        with open(path, "rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                return None
            for k in range(1, parts):
                at = size * k // parts
                fh.seek(at)
                cut = _event_gap(fh.read(_CUT_WINDOW))
                if cut is None:
                    return None
                stop, start = at + cut[0], at + cut[1]
                if stop <= bounds[-1][1]:
                    return None
                bounds.append((stop, start))
    except OSError:
        return None  # the one-process reader names the problem
    bounds.append((size, size))
    return [
        _Stretch(i, bounds[i][1], bounds[i + 1][0], i == 0, i == len(bounds) - 2)
        for i in range(len(bounds) - 1)
    ]


class _Probe(msgspec.Struct):
    ph: Any = ""


_PROBE = msgspec.json.Decoder(list[_Probe])
_CANDIDATES = 64  # cut spots tried after a split point
_ENDS = 8  # ends tried for the events that follow one


def _event_gap(text: bytes) -> tuple[int, int] | None:
    """The first cut spot in `text` that is followed by events: (offset after the `}` before it, offset of
    the `{` after it). A spot counts when the text from its `{` to one of the next spots decodes as a list of
    objects that all have a phase: a good guess, which the stretch before it verifies (see the module's
    doc)."""
    for m in islice(CUT.finditer(text), _CANDIDATES):
        begin = m.end() - 1
        for end in islice(CUT.finditer(text, begin + 1), _ENDS):
            try:
                events = _PROBE.decode(b"[" + text[begin : end.start() + 1] + b"]")
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
                continue
            if all(isinstance(e.ph, str) and e.ph for e in events):
                return m.start() + 1, begin
            break
    return None


def _run(
    path: Path,
    stretches: list[_Stretch],
    processes: int,
    progress: Callable[[float], None] | None,
    flows: bool,
    chunk_bytes: int,
    spill: Path | None,
) -> list[_StretchResult] | None:
    """The stretches' results in order, each read by a task on the task runner; None when any failed."""
    global _FRACTIONS
    import multiprocessing

    sizes = [s.stop - s.start for s in stretches]
    # where the workers are forked, they report how far they are through shared memory they inherit
    _FRACTIONS = multiprocessing.Array("d", len(stretches), lock=False) if fork_is_safe() else None

    def report() -> None:
        if progress is not None and _FRACTIONS is not None:
            read = sum(f * n for f, n in zip(_FRACTIONS[:], sizes, strict=True))
            progress(0.95 * read / max(sum(sizes), 1))

    folder = None if spill is None else str(spill)
    tasks = [(str(path), s, flows, chunk_bytes, folder) for s in stretches]
    results: list[_StretchResult | None] = [None] * len(stretches)
    try:
        for i, result in run_tasks(_read_stretch, tasks, workers=processes, weights=sizes, poll=report):
            if result is None:
                return None  # (the stretches not started are cancelled)
            results[i] = result
    except Exception:  # whatever it was, the one-process reader says it properly
        return None
    finally:
        _FRACTIONS = None
    return [r for r in results if r is not None]


def _read_stretch(
    path: str, stretch: _Stretch, flows: bool, chunk_bytes: int, spill: str | None
) -> _StretchResult | None:
    """Worker: the columns of one stretch; None when it cannot vouch for its text (see the module's doc).
    With `spill` (a folder), its dense columns are written to files there as they are built, so that
    neither the worker nor the pipe back holds them whole."""
    p = Path(path)
    fractions = _FRACTIONS

    def report(fraction: float) -> None:
        if fractions is not None:
            fractions[stretch.index] = fraction

    try:
        with open(p, "rb") as fh, gc_paused():
            size = stretch.stop - stretch.start
            text = TraceText(fh, size, max_input_bytes(DEFAULT_MAX_TRACE_BYTES), stretch.start, stretch.stop)
            folder = None
            if spill is not None:
                folder = Path(spill) / str(stretch.index)
                folder.mkdir()
            reader = _ChunkReader(
                p, text, chunk_bytes, flows, first=stretch.first, last=stretch.last, spill=folder
            )
            reader.run(report)
            head = {}
            if stretch.first:
                head = {key: getattr(reader.head, key) for key in HEADER_FIELDS}
                head = {key: value for key, value in head.items() if value is not UNSET}
            report(1.0)
            return _StretchResult(reader.builder.part(), head, reader.tail_header)
    except Exception:  # whatever it was, the one-process reader says it properly
        return None


__all__ = ["SPLIT_MIN_BYTES", "load_file_split"]
