"""The answers commands keep (cli/_output.py says which and when): how one is stored and read back, and the key
of a command line. The standard library only: a command line answered from here imports neither msgspec nor
click, so a second `whatif --json` costs little more than Python's start.

An answer file (`results/KEY.result` in the user's cache folder): the line `stepscope-answer/1`, one line of JSON
(what the command printed on stderr before its answer and after it, a page's notes and time of writing, its exit
code, and how many bytes its stdout and page hold), then those bytes. A file that does not read back exactly so
(cut short, longer, another format) is no answer: it is removed, and the command runs.

A command line's key (`results/KEY.line`): every argument as typed, the working folder, the code and the
STEPSCOPE_ variables. The line is never parsed here, only hashed as it is; a line not seen before goes through the
command's own parsing, which keys the answer by its options. The `.line` file holds the name of the answer the
line gave, where it wrote its page (if it wrote one) and the inputs the command read, each with its key as the
command began: the same line is answered again only while every one of them still has that key.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from stepscope.analysis.read.cache import (
    base,
    blake2b,
    code_key,
    enabled,
    evict,
    input_key,
    kept_env,
    max_bytes,
)

MAGIC = b"stepscope-answer/1\n"
SUFFIX = ".result"
LINE_SUFFIX = ".line"
NOT_AT_ONCE = frozenset({"--help", "-h", "--no-cache"})  # a line holding one of these is always run


class Kept:
    """What a command printed and wrote."""

    __slots__ = ("code", "generated", "notes", "page", "stderr", "stderr_after", "stdout")

    def __init__(
        self,
        *,
        stdout: bytes = b"",
        stderr: str = "",
        stderr_after: str = "",
        notes: list[str] | None = None,
        page: bytes | None = None,
        code: int = 0,
        generated: str | None = None,
    ) -> None:
        self.stdout = stdout
        self.stderr = stderr  # the lines the command printed on stderr (its notes) before its answer
        self.stderr_after = stderr_after  # and after it (diff's gates)
        self.notes = notes if notes is not None else []  # report: the page's notes
        self.page = page  # report: the page's bytes
        self.code = code  # the exit code the command returned (diff's gates)
        self.generated = generated  # report: the page's time of writing (a kept page says when it is written)


def folder() -> Path:
    return base() / "results"


def largest() -> int:
    """The largest answer kept: a sixteenth of the results' bound (32 MiB by default)."""
    return max_bytes() // 64


def encode(kept: Kept) -> bytes:
    page = kept.page
    head = {
        "stderr": kept.stderr,
        "stderr_after": kept.stderr_after,
        "notes": kept.notes,
        "code": kept.code,
        "generated": kept.generated,
        "stdout": len(kept.stdout),
        "page": None if page is None else len(page),
    }
    return b"".join([MAGIC, json.dumps(head).encode(), b"\n", kept.stdout, page or b""])


def decode(data: bytes) -> Kept | None:
    """The answer `data` holds; None when it does not read back exactly."""
    if not data.startswith(MAGIC):
        return None
    end = data.find(b"\n", len(MAGIC))
    try:
        head = json.loads(data[len(MAGIC) : end]) if end >= 0 else None
        if not isinstance(head, dict):
            return None
        out, page = head["stdout"], head["page"]
        stderr, after, notes = head["stderr"], head["stderr_after"], head["notes"]
        code, generated = head["code"], head["generated"]
    except (ValueError, KeyError):
        return None
    body = memoryview(data)[end + 1 :]
    fits = type(out) is int and (page is None or type(page) is int) and out + (page or 0) == len(body)
    kinds = (
        isinstance(stderr, str)
        and isinstance(after, str)
        and isinstance(notes, list)
        and all(isinstance(n, str) for n in notes)
        and type(code) is int
        and (generated is None or isinstance(generated, str))
    )
    if not (fits and kinds) or out < 0:
        return None
    return Kept(
        stdout=bytes(body[:out]),
        stderr=stderr,
        stderr_after=after,
        notes=notes,
        page=None if page is None else bytes(body[out:]),
        code=code,
        generated=generated,
    )


def _read_file(where: Path) -> bytes | None:
    """The bytes of the regular file `where` (never a FIFO, which could wait forever), else None."""
    try:
        with open(where, "rb", opener=lambda path, flags: os.open(path, flags | os.O_NONBLOCK)) as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            return fh.read()
    except OSError:
        return None


def read(name: str | None) -> Kept | None:
    """The answer kept under `name` (a key), else None (one that does not read back is removed)."""
    if name is None or not name.isalnum():
        return None
    where = folder() / f"{name}{SUFFIX}"
    data = _read_file(where)
    if data is None:
        return None
    kept = decode(data)
    if kept is None:
        with contextlib.suppress(OSError):
            where.unlink()
        return None
    with contextlib.suppress(OSError):
        os.utime(where)  # (recently used: evicted last)
    return kept


def write(name: str | None, kept: Kept) -> None:
    """Keep `kept` under `name` (nothing when `name` is None, or the answer is too big); never fails."""
    if name is None or len(kept.stdout) + len(kept.page or b"") > largest():
        return
    _write(folder() / f"{name}{SUFFIX}", encode(kept), max_bytes() // 4)


def _write(where: Path, data: bytes, most: int) -> None:
    """`data` into `where` through a temp file and a rename, the files of its kind kept to `most` bytes."""
    tmp = where.with_name(f".{where.name}.{os.getpid()}.tmp")
    with contextlib.suppress(Exception):  # (a cache that cannot be written is no reason to fail a command)
        where.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp.write_bytes(data)
            os.replace(tmp, where)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        evict(where.parent, most, where.suffix)


def line_key(line: Sequence[str]) -> str | None:
    """The key of a command line (the arguments after `stepscope`: the caller knows which commands may be
    answered so); None when the line asks for help or no cache, or the cache is off."""
    if not line or NOT_AT_ONCE.intersection(line) or not enabled():
        return None
    try:
        described = json.dumps(["line", os.getcwd(), kept_env(), code_key(), list(line)])
    except (OSError, ValueError):
        return None
    return blake2b(described.encode(), digest_size=20).hexdigest()


class Input(NamedTuple):
    """An input a command read: its path as the command named it, the file its key leaves out (a page the
    command writes into the folder), and its key as the command began."""

    path: str
    exclude: str | None
    key: str


def keep_line(
    line: Sequence[str], name: str | None, inputs: Sequence[Input], write: Path | None = None
) -> None:
    """Note that command line `line` gave the answer kept under `name` (when that one is kept), having read
    `inputs` and written its page to `write` (None: it printed its answer)."""
    if name is None or not (folder() / f"{name}{SUFFIX}").is_file():
        return
    key = line_key(line)
    if key is not None:
        noted = {
            "answer": name,
            "write": None if write is None else str(write),
            "inputs": [list(i) for i in inputs],
        }
        _write(folder() / f"{key}{LINE_SUFFIX}", json.dumps(noted).encode(), max_bytes() // 256)


def line_answer(line: Sequence[str]) -> tuple[str, Kept, Path | None] | None:
    """What the same command line gave before, while every input it read has the same key: the answer's name,
    the answer and where it wrote its page (None: it printed it); None when there is none."""
    key = line_key(line)
    data = None if key is None else _read_file(folder() / f"{key}{LINE_SUFFIX}")
    if data is None:
        return None
    try:
        noted = json.loads(data)
        name, write, inputs = noted["answer"], noted["write"], [Input(*i) for i in noted["inputs"]]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(name, str) or not (write is None or isinstance(write, str)):
        return None
    for one in inputs:
        if input_key(one.path, one.exclude) != one.key:
            return None  # (changed since, or cannot be keyed now)
    kept = read(name)
    if kept is None:
        return None
    return name, kept, None if write is None else Path(write)


def replay(kept: Kept) -> None:
    """Print what a kept answer printed, in its order: its lines on stderr, its bytes on stdout, its lines on
    stderr after them."""
    if kept.stderr:
        sys.stderr.write(kept.stderr)
        sys.stderr.flush()
    if kept.stdout:
        sys.stdout.buffer.write(kept.stdout)
        sys.stdout.flush()
    if kept.stderr_after:
        sys.stderr.write(kept.stderr_after)
        sys.stderr.flush()
