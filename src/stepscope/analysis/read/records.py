"""A run folder's files read as typed records, each bounded: a file that is missing, damaged, not a regular
file or over its limit is left out with a note, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from stepscope.analysis.read.limits import LIMIT_ENV, max_input_bytes
from stepscope.errors import InputError
from stepscope.runfolder.files import read_regular

T = TypeVar("T")
# One JSON record of a window (FLOPs, collectives, host memory, process groups, DeepSpeed's figures) is KB to a
# few MB (a FLOP report of a 1,000-module model: ~1 MB); py-spy's samples of a long window a few MB more. A
# bigger one is left out with a note: decoded whole, it would cost the analysis several times its size.
# STEPSCOPE_MAX_INPUT_BYTES, where set, is the limit of every file instead.
RECORD_MAX_BYTES = 16 << 20
SAMPLES_MAX_BYTES = 64 << 20


def read_bytes(path: Path, notes: list[str], limit: int | None = None) -> bytes | None:
    """A run-folder file's bytes, at most `limit` (None: the limit of any input, 1 GiB)."""
    limit = max_input_bytes() if limit is None else max_input_bytes(limit)
    try:  # a FIFO, a device or a file over the limit in its place is left out, never waited on or read whole
        return read_regular(path, f"a run-folder file ({LIMIT_ENV} raises the limit)", limit=limit)
    except InputError as exc:
        notes.append(f"{exc.path}: {exc.problem}; left out")
        return None


def read_config(path: Path, notes: list[str]) -> dict[str, Any]:
    """A run's config.yaml as a dict: {} when it is missing or damaged (with a note in `notes`)."""
    import yaml

    data = read_bytes(path, notes, RECORD_MAX_BYTES)
    if data is None:
        return {}
    try:
        config = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        notes.append(f"{path}: not valid YAML ({str(exc).splitlines()[0]}); left out")
        return {}
    except (ValueError, RecursionError) as exc:  # (an integer of 5,000 digits: Python's int() refuses it)
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        notes.append(f"{path}: not usable YAML ({problem}); left out")
        return {}
    return config if isinstance(config, dict) else {}


def read_json(path: Path, kind: type[T], notes: list[str], limit: int = RECORD_MAX_BYTES) -> T | None:
    data = read_bytes(path, notes, limit)
    if data is None:
        return None
    try:
        return msgspec.json.decode(data, type=kind)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        notes.append(f"{path}: not a valid {kind.__name__} ({exc}); left out")
        return None


def read_lines(path: Path, kind: type[T], notes: list[str]) -> Iterator[T]:
    """Typed JSON lines; a line that does not decode (a torn last line of a killed job) is skipped and counted."""
    data = read_bytes(path, notes)
    if data is None:
        return
    decoder = msgspec.json.Decoder(kind)
    bad = 0
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            yield decoder.decode(line)
        except (msgspec.DecodeError, UnicodeDecodeError):
            bad += 1
    if bad:
        notes.append(f"{path}: {bad} line(s) could not be read; left out")


# --- the figures ------------------------------------------------------------------------------------
