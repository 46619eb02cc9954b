"""Columns of one trace file, built from decoded events one chunk at a time (see _decode and _stream).

`ColumnBuilder.add(events)` turns a list of decoded event Structs into numpy columns: one pass per field
(a list comprehension reads a Struct attribute in ~20 ns; never a dict per event), symbol codes through
dicts that live for the whole file (so only distinct names stay alive once a chunk's Structs are freed),
and rows the table leaves out dropped per chunk (the values of each field are read in _values).
`finish()` gives the file's `FileTable`; a column that held one value in every chunk is that value (a
table.constant_column), not a row each.

Events come from a strict decoder (ints where ints are expected, so numpy converts without a type scan) or,
for odd files, from a permissive one (any JSON value; every column then checks its types). Both give the
same columns for the same events: the table is defined by the reference builder of the tests
(tests/support/reference.py).

Precision: times become integer ns, exactly for what Kineto writes (microseconds with up to three decimals).
Integers are multiplied by 1000. Floats below 2^43 us (~100 days: durations, relative timestamps) are
recovered exactly from float64 (see _values.floats_to_ns). Float timestamps beyond that (epoch microseconds with a
ns fraction, which float64 holds only to ~0.25 us) are read as JSON text and converted digit by digit
(_numparse).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from stepscope.analysis.read._numparse import NotANumber, us_texts_to_ns
from stepscope.analysis.read._parts import (
    _DTYPES,
    _OFTEN_CONSTANT,
    _SPARSE,
    FileTable,
    PartTable,
    SparsePieces,
    SpilledColumn,
    _sparse_column,
    join_parts,
)
from stepscope.analysis.read._values import (
    LEFT_OUT,
    LEFT_OUT_WITH_FLOWS,
    RARE_FIELDS,
    as_str,
    codes_of,
    get_rare,
    int_column,
    ns_from_us,
    ph_column,
    rare_rows,
    strict_all_ints,
)
from stepscope.analysis.read.limits import MAX_EVENTS_ENV, MAX_NAME_CHARS, max_events
from stepscope.analysis.read.messages import (
    P2P_OPS,
    SHAPED_RANGE_RE,
    all_to_all_message,
    p2p_peer,
    shapes_message,
)
from stepscope.analysis.read.table import (
    GPU_CATEGORIES,
    INT_ARGS,
    MISSING,
    OLD_CATEGORIES,
    SPARSE_COLUMNS,
    STRING_ARGS,
    SYNC_CATEGORY,
    SYNC_INT_ARGS,
    RankInfo,
    constant_column,
    id_as_int,
)
from stepscope.errors import InputError

_MIN_CAPACITY = 1 << 12  # rows of a dense column when it first grows


class Chunk(msgspec.Struct):
    """Decoded events of one piece of a file and how to read them.

    `strict`: decoded with the strict Structs (int fields hold ints). `text_ts`: `ts` holds JSON text.
    `exact_ts`: when `ts` are floats, a callable giving the exact ns from the JSON text (a second, ts-only
    decode of the same piece), used when float64 cannot hold them.
    """

    events: Sequence[Any]
    strict: bool
    text_ts: bool
    exact_ts: Callable[[], np.ndarray]
    no_args: Any  # the args of an event without any (permissive Structs decode `"args": null` as None)
    shapes: Callable[[], list[Any]]  # per event, its args' `Input Dims` / `Input type` (a second decode)


class ColumnBuilder:
    """Accumulates the columns of one file chunk by chunk; `finish` gives its FileTable."""

    def __init__(self, path: Path, *, flows: bool = True, spill: Path | None = None) -> None:
        """`spill`: a folder where the dense columns are written chunk by chunk instead of kept (a worker
        reading a stretch of a big file: see _split); `part()` then refers to the files."""
        self.path = path
        self.flows = flows
        self._spill = spill
        self._spilled: dict[str, Any] = {}  # key -> open file, in spill mode
        self._left_out = LEFT_OUT if flows else LEFT_OUT_WITH_FLOWS  # phases (ord) the table leaves out
        self.info = RankInfo(rank=MISSING, source=str(path))
        self.names: dict[str, int] = {}
        self.cats: dict[str, int] = {}
        self.n_events = 0  # events added so far, kept or not (error messages count them)
        self._max_events = max_events()
        self.inexact_ts = False  # some chunk needed the exact (text) pass for its timestamps
        self.n_rows = 0  # rows kept so far
        # Dense columns, grown in place (see _append): chunk arrays kept in lists until a final concatenate made
        # the peak twice the table, and their freed small blocks stayed in the heap for the analyses.
        self._dense: dict[str, np.ndarray] = {
            key: np.empty(0, dtype=_DTYPES[key]) for key in _DTYPES if key not in _SPARSE
        }
        self._sparse: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {key: [] for key in _SPARSE}
        # the value of each column that has held one value so far (None before the first row)
        self._constant: dict[str, Any] = dict.fromkeys(_OFTEN_CONSTANT if spill is None else ())
        self._name_codes: dict[str | None, int] = {}
        self._cat_codes: dict[str | None, int] = {}
        self._id_values: dict[Any, int] = {}
        # string args, by key: they join `names` after all event names, key by key (see finish)
        self._arg_strings: dict[str, dict[str, int]] = {key: {} for key in STRING_ARGS}
        self._backend_names = np.zeros(0, dtype=bool)  # by name code: a backend collective range
        self._all_to_all_names: dict[
            int, str
        ] = {}  # name code -> all-to-all op (messages.all_to_all_message)
        self._p2p_names = np.zeros(0, dtype=bool)  # by name code: a point-to-point c10d op (P2P_OPS)

    # --- symbols -----------------------------------------------------------------------------------
    def _add_name(self, value: str | None) -> int:
        if value is None:
            value = ""
        elif type(value) is not str:
            raise TypeError(value)
        if len(value) > MAX_NAME_CHARS:
            raise InputError(
                self.path, f"an event name of {len(value)} characters (the limit is {MAX_NAME_CHARS})"
            )
        return self.names.setdefault(value, len(self.names))

    def _add_cat(self, value: str | None) -> int:
        if value is None:
            return MISSING
        if type(value) is not str:
            raise TypeError(value)
        if len(value) > MAX_NAME_CHARS:
            raise InputError(
                self.path, f"a category of {len(value)} characters (the limit is {MAX_NAME_CHARS})"
            )
        # Old (2021) categories map onto the current ones; two raw names may become one.
        return self.cats.setdefault(OLD_CATEGORIES.get(value, value), len(self.cats))

    # --- one chunk ---------------------------------------------------------------------------------
    def add(self, chunk: Chunk) -> None:
        events = chunk.events
        n = len(events)
        if n == 0:
            return
        if self.n_events + n > self._max_events:
            raise InputError(
                self.path, f"more than {self._max_events} events (the limit; {MAX_EVENTS_ENV} raises it)"
            )
        strict = chunk.strict
        cols: dict[str, np.ndarray] = {}  # dense columns of this chunk
        sparse: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # key -> (rows, values): -1 elsewhere
        ph = ph_column([e.ph for e in events], self._left_out)
        kept = np.flatnonzero(ph)
        first = self.n_events  # (error messages number events in the file)
        self.n_events += n
        index: np.ndarray | None = None
        # rows the table leaves out ('M' metadata, odd phases; flows when asked) go before any column is built
        if len(kept) < n:
            if not len(kept):
                return
            ph, chunk, index = ph[kept], _rows_of(chunk, kept), kept
            events = chunk.events
            n = len(kept)
        cols["ph"] = ph
        cols["name"] = codes_of([e.name for e in events], self._name_codes, self._add_name, np.int32)
        cat = cols["cat"] = codes_of([e.cat for e in events], self._cat_codes, self._add_cat, np.int32)
        cols["pid"] = self._ids([e.pid for e in events], strict=strict)
        cols["tid"] = self._ids([e.tid for e in events], strict=strict)
        try:
            cols["ts"] = self._timestamps(chunk)
        except NotANumber as exc:  # numbered within the file
            exc.index = first + (exc.index if index is None else int(index[exc.index]))
            raise
        cols["dur"] = np.maximum(ns_from_us([e.dur for e in events], strict=strict)[0], 0)
        args: list[Any] = [e.args for e in events]
        if not chunk.strict and None in args:  # "args": null
            args = [a or chunk.no_args for a in args]
        is_gpu = np.zeros(len(self.cats) + 1, dtype=bool)  # by category code; the last is -1 (none)
        is_gpu[[i for c, i in self.cats.items() if c in GPU_CATEGORIES]] = True
        gpu = np.flatnonzero(is_gpu[cat])
        gpu_args = [args[i] for i in gpu.tolist()]
        stream = int_column([a.stream for a in gpu_args], strict=strict)
        sparse["stream"] = gpu, np.where((stream >= -(2**31)) & (stream < 2**31), stream, MISSING)
        device = int_column([a.device for a in gpu_args], strict=strict)
        sparse["device"] = gpu, np.where((device >= -(2**31)) & (device < 2**31), device, MISSING)
        sparse["bytes"] = gpu, int_column([a.bytes for a in gpu_args], strict=False)
        cols["correlation"] = int_column([a.correlation for a in args], strict=strict)
        sync_cat = self.cats.get(SYNC_CATEGORY)
        if sync_cat is not None:
            self._sync_columns(sparse, np.flatnonzero(cat == sync_cat), args)
        self._rare_columns(sparse, args)
        self._shape_messages(sparse, cols["name"], chunk)
        for key, column in cols.items():
            if self._spill is None:
                self._append(key, column)
            else:
                self._write_spilled(key, column)
        for key, (rows, values) in sparse.items():
            if len(rows):
                self._sparse[key].append((rows + self.n_rows, values))
        self.n_rows += n

    @staticmethod
    def _sync_columns(
        sparse: dict[str, tuple[np.ndarray, np.ndarray]], rows: np.ndarray, args: list[Any]
    ) -> None:
        """The event a `cuda_sync` event waits on (SYNC_INT_ARGS), read on those rows only."""
        if not len(rows):
            return
        picked = [args[i] for i in rows.tolist()]
        for key in SYNC_INT_ARGS:
            sparse["args_" + key] = rows, int_column([getattr(a, f"w_{key}") for a in picked], strict=False)

    def _append(self, key: str, column: np.ndarray) -> None:
        """Write a chunk's column after the rows so far, growing the column by an eighth when it is full:
        numpy's resize is a realloc, which moves the pages of a big block (mremap) instead of copying them, so
        the peak is the columns plus at most an eighth, not twice the columns."""
        if key in self._constant:
            value = column[0]
            if (self.n_rows == 0 or value == self._constant[key]) and bool((column == value).all()):
                self._constant[key] = value
                return
            previous = self._constant.pop(key)  # the column holds two values from this chunk on
            if self.n_rows:
                self._dense[key] = np.full(self.n_rows, previous, dtype=_DTYPES[key])
        out = self._dense[key]
        need = self.n_rows + len(column)
        if need > len(out):
            out.resize(max(need, len(out) + (len(out) >> 3), _MIN_CAPACITY), refcheck=False)
        out[self.n_rows : need] = column

    def _timestamps(self, chunk: Chunk) -> np.ndarray:
        timestamps = [e.ts for e in chunk.events]
        if chunk.text_ts:
            return us_texts_to_ns(timestamps)  # NotANumber: the caller names the event
        ts, inexact = ns_from_us(timestamps, strict=chunk.strict)
        if inexact:
            self.inexact_ts = True
            return chunk.exact_ts()
        return ts

    def _ids(self, values: list[Any], *, strict: bool) -> np.ndarray:
        """pid / tid: ints as they are, other values (the strings of 2021 traces) converted once each."""
        all_ints = strict_all_ints(values) if strict else set(map(type, values)) == {int}
        if all_ints:
            with contextlib.suppress(OverflowError):
                return np.fromiter(values, dtype=np.int64, count=len(values))
        return codes_of(values, self._id_values, id_as_int, np.int64)

    def _rare_columns(self, sparse: dict[str, tuple[np.ndarray, np.ndarray]], args: list[Any]) -> None:
        """The args of collectives (record_param_comms), which few events carry: read only where present.
        String args get codes in `_arg_strings` (names codes at the end, see finish)."""
        rare = rare_rows(args)
        if not rare:
            return
        at = np.array(rare, dtype=np.int64)
        fields = dict(zip(RARE_FIELDS, zip(*(get_rare(args[i]) for i in rare), strict=True), strict=True))
        for key in STRING_ARGS:
            lookup = self._arg_strings[key]
            strings = as_str(fields[f"s_{key}"])
            codes = [MISSING if v is None else lookup.setdefault(v, len(lookup)) for v in strings]
            sparse["args_" + key] = at, np.array(codes, dtype=np.int64)
        for key in INT_ARGS:
            sparse["args_" + key] = at, int_column(fields[f"i_{key}"], strict=False)

    def _shape_messages(
        self, sparse: dict[str, tuple[np.ndarray, np.ndarray]], names: np.ndarray, chunk: Chunk
    ) -> None:
        """Message size and dtype of backend collective ranges (`gloo:all_reduce`) from their recorded shapes,
        where their args give none (see messages.shapes_message); the peer of point-to-point c10d ops (P2P_OPS)
        from their concrete inputs (messages.p2p_peer)."""
        if len(self._backend_names) < len(self.names):
            known = len(self._backend_names)
            added = list(self.names)[known:]
            new = [SHAPED_RANGE_RE.match(name) is not None for name in added]
            self._backend_names = np.concatenate([self._backend_names, np.array(new, dtype=bool)])
            self._all_to_all_names.update(
                (known + i, name)
                for i, name in enumerate(added)
                if not name.endswith(":") and "::" in name and new[i]
            )
            p2p = [name in P2P_OPS for name in added]
            self._p2p_names = np.concatenate([self._p2p_names, np.array(p2p, dtype=bool)])
        rows = np.flatnonzero(self._backend_names[names])
        peer_rows = np.flatnonzero(self._p2p_names[names])
        if not len(rows) and not len(peer_rows):
            return
        try:
            shapes = chunk.shapes()
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return  # an odd `args` somewhere in the chunk: its ranges keep no size
        if len(shapes) != len(names):
            return
        self._peers(sparse, peer_rows, shapes)
        have = {
            key: sparse.get(key, (np.zeros(0, np.int64), None))[0] for key in ("args_in_nelems", "args_dtype")
        }
        at: list[int] = []
        nelems: list[int] = []
        dtypes: list[int] = []
        splits: dict[str, list[tuple[int, int]]] = {
            "args_out_nelems": [],
            "args_in_split": [],
            "args_out_split": [],
        }
        lookup = self._arg_strings["dtype"]
        for row in rows.tolist():
            a = shapes[row]
            if a is None or row in have["args_in_nelems"]:
                continue
            op = self._all_to_all_names.get(int(names[row]))
            if op is not None:
                found = all_to_all_message(op, a.input_dims, a.input_type, a.concrete_inputs)
                if found is None:
                    continue
                splits["args_out_nelems"].append((row, found[1]))
                for key, text in (("in_split", found[3]), ("out_split", found[4])):
                    strings = self._arg_strings[key]
                    splits[f"args_{key}"].append((row, strings.setdefault(text, len(strings))))
                message: tuple[int, str | None] | None = (found[0], found[2])
            else:
                message = shapes_message(a.input_dims, a.input_type)
            if message is None:
                continue
            at.append(row)
            nelems.append(message[0])
            dtypes.append(MISSING if message[1] is None else lookup.setdefault(message[1], len(lookup)))
        if not at:
            return
        rows_at = np.array(at, dtype=np.int64)
        columns: list[tuple[str, np.ndarray, list[int]]] = [
            ("args_in_nelems", rows_at, nelems),
            ("args_dtype", rows_at, dtypes),
        ]
        for key, pairs in splits.items():
            if pairs:
                columns.append((key, np.array([r for r, _ in pairs], np.int64), [v for _, v in pairs]))
        for key, rows_at, values in columns:
            old_rows, old_values = sparse.get(key, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
            keep = ~np.isin(rows_at, old_rows)
            sparse[key] = (
                np.concatenate([old_rows, rows_at[keep]]),
                np.concatenate([old_values, np.array(values, dtype=np.int64)[keep]]),
            )

    @staticmethod
    def _peers(sparse: dict[str, tuple[np.ndarray, np.ndarray]], rows: np.ndarray, shapes: list[Any]) -> None:
        """args_peer of the point-to-point c10d ops among `rows`, where their concrete inputs name it."""
        at: list[int] = []
        peers: list[int] = []
        for row in rows.tolist():
            a = shapes[row]
            peer = p2p_peer(a.concrete_inputs) if a is not None else None
            if peer is not None:
                at.append(row)
                peers.append(peer)
        if at:
            sparse["args_peer"] = np.array(at, dtype=np.int64), np.array(peers, dtype=np.int64)

    # --- the file ----------------------------------------------------------------------------------
    def finish(self, rank_hint: int | None) -> FileTable:
        return join_parts(str(self.path), [self.part()], self.info, rank_hint)

    def _write_spilled(self, key: str, column: np.ndarray) -> None:
        out = self._spilled.get(key)
        if out is None:
            assert self._spill is not None
            out = self._spilled[key] = open(self._spill / key, "wb")  # noqa: SIM115 (closed in part())
        column.astype(_DTYPES[key], copy=False).tofile(out)

    def part(self) -> PartTable:
        """The columns built so far, with this builder's own symbols (see join_parts); the builder is spent.
        In spill mode the dense columns are files and the sparse ones stay (rows, values) pieces."""
        if self._spill is not None:
            for out in self._spilled.values():
                out.close()
            columns: dict[str, Any] = {}
            for key, dtype in _DTYPES.items():
                if key in _SPARSE:
                    columns[key] = SparsePieces(self._sparse.pop(key))
                else:
                    columns[key] = SpilledColumn(str(self._spill / key), dtype, self.n_rows)
            arg_strings = {key: list(strings) for key, strings in self._arg_strings.items()}
            return PartTable(
                list(self.names), list(self.cats), arg_strings, columns, self.n_events, self.n_rows
            )
        columns = {}
        for key, dtype in _DTYPES.items():
            if key in SPARSE_COLUMNS:
                columns[key] = _sparse_column(self.n_rows, self._sparse.pop(key), dtype)
                continue
            if key in _SPARSE:
                pieces = self._sparse.pop(key)
                column = constant_column(MISSING, self.n_rows, dtype)
                if pieces:
                    column = np.full(self.n_rows, MISSING, dtype=dtype)
                for rows, values in pieces:
                    column[rows] = values
            elif key in self._constant:
                value = self._constant.pop(key)  # (None: no rows)
                column = np.empty(0, dtype) if value is None else constant_column(value, self.n_rows, dtype)
            else:
                column = self._dense.pop(key)
                column.resize(self.n_rows, refcheck=False)  # (in place: the spare rows are given back)
            columns[key] = column.astype(dtype, copy=False)
        arg_strings = {key: list(strings) for key, strings in self._arg_strings.items()}
        return PartTable(list(self.names), list(self.cats), arg_strings, columns, self.n_events, self.n_rows)


def _rows_of(chunk: Chunk, rows: np.ndarray) -> Chunk:
    """The chunk with only these events (its second-pass readers indexed alike)."""
    take = rows.tolist()
    events = list(operator.itemgetter(*take)(chunk.events)) if len(take) > 1 else [chunk.events[take[0]]]
    exact_ts, shapes = chunk.exact_ts, chunk.shapes
    return Chunk(
        events,
        chunk.strict,
        chunk.text_ts,
        lambda: exact_ts()[rows],
        chunk.no_args,
        lambda: _pick(shapes(), take),
    )


def _pick(values: list[Any], rows: list[int]) -> list[Any]:
    return [values[i] for i in rows]
