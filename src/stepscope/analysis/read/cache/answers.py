"""The answers commands keep (cli/_output.py says which and when): how one is stored and read back, and the key
of a command line. The standard library only: a command line answered from here imports neither msgspec nor
click, so a second `whatif --json` costs little more than Python's start.

An answer file (`results/KEY.result` in the user's cache folder): the line `stepscope-answer/1`, one line of JSON
(what the command printed on stderr, a page's notes and time of writing, its exit code, and how many bytes its
stdout and page hold), then those bytes. A file that does not read back exactly so (cut short, longer, another
format) is no answer: it is removed, and the command runs.

A command line's key (`results/KEY.line`, which holds the name of the answer it gave and where it wrote its page,
if it wrote one): every argument as typed, the working folder, each argument that names a file or folder (keyed
as an input is: `input_key`; a FIFO or a device cannot be, and the line is then not answered so), the code and the
STEPSCOPE_ variables. The line is never parsed here, only hashed as it is; a line not seen before goes through the
command's own parsing, which keys the answer by its options.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from stepscope.analysis.read.cache import (
    DIR_ENV,
    MAX_ENV,
    NO_CACHE_ENV,
    base,
    blake2b,
    code_key,
    enabled,
    evict,
    input_key,
    max_bytes,
)

MAGIC = b"stepscope-answer/1\n"
SUFFIX = ".result"
LINE_SUFFIX = ".line"
# the variables that change where and whether answers are kept, not what they say
ENV_SKIPPED = frozenset({DIR_ENV, NO_CACHE_ENV, MAX_ENV, "STEPSCOPE_PROGRESS"})
NOT_AT_ONCE = frozenset({"--help", "-h", "--no-cache"})  # a line holding one of these is always run


class Kept:
    """What a command printed and wrote."""

    __slots__ = ("code", "generated", "notes", "page", "stderr", "stdout")

    def __init__(
        self,
        *,
        stdout: bytes = b"",
        stderr: str = "",
        notes: list[str] | None = None,
        page: bytes | None = None,
        code: int = 0,
        generated: str | None = None,
    ) -> None:
        self.stdout = stdout
        self.stderr = stderr  # the lines the command printed on stderr (its notes)
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
        stderr, notes, code, generated = head["stderr"], head["notes"], head["code"], head["generated"]
    except (ValueError, KeyError):
        return None
    body = memoryview(data)[end + 1 :]
    fits = type(out) is int and (page is None or type(page) is int) and out + (page or 0) == len(body)
    kinds = (
        isinstance(stderr, str)
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
        notes=notes,
        page=None if page is None else bytes(body[out:]),
        code=code,
        generated=generated,
    )


def read(name: str | None) -> Kept | None:
    """The answer kept under `name` (a key), else None (one that does not read back is removed)."""
    if name is None or not name.isalnum():
        return None
    where = folder() / f"{name}{SUFFIX}"
    try:
        data = where.read_bytes()
    except OSError:
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


def kept_env() -> list[tuple[str, str]]:
    """The STEPSCOPE_ variables that may change an answer, sorted."""
    return sorted(
        (k, v) for k, v in os.environ.items() if k.startswith("STEPSCOPE_") and k not in ENV_SKIPPED
    )


def line_key(line: Sequence[str]) -> str | None:
    """The key of a command line (the arguments after `stepscope`: the caller knows which commands may be
    answered so); None when the line asks for help or no cache, the cache is off, or a file or folder it names
    cannot be keyed."""
    if not line or NOT_AT_ONCE.intersection(line) or not enabled():
        return None
    keys = []
    for token in line[1:]:
        for text in (token, token.partition("=")[2]):
            if text and not text.startswith("-") and os.path.lexists(text):
                one = input_key(text)
                if one is None:
                    return None
                keys.append(one)
    try:
        described = json.dumps(["line", os.getcwd(), keys, kept_env(), code_key(), list(line)])
    except (OSError, ValueError):
        return None
    return blake2b(described.encode(), digest_size=20).hexdigest()


def keep_line(line: Sequence[str], name: str | None, write: Path | None = None) -> None:
    """Note that command line `line` is answered by the answer kept under `name` (when that one is kept), a page
    written to `write` where it writes one (its key taken after the page is written: the page may be an
    argument)."""
    if name is None or not (folder() / f"{name}{SUFFIX}").is_file():
        return
    key = line_key(line)
    if key is not None:
        noted = json.dumps({"answer": name, "write": None if write is None else str(write)})
        _write(folder() / f"{key}{LINE_SUFFIX}", noted.encode(), max_bytes() // 256)


def line_answer(line: Sequence[str]) -> tuple[str, Kept, Path | None] | None:
    """What the same command line gave before: the answer's name, the answer and where it wrote its page (None:
    it printed it); None when there is none."""
    key = line_key(line)
    if key is None:
        return None
    try:
        noted = json.loads((folder() / f"{key}{LINE_SUFFIX}").read_bytes())
        name, write = noted["answer"], noted["write"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    kept = read(name) if isinstance(name, str) else None
    if kept is None or not (write is None or isinstance(write, str)):
        return None
    return name, kept, None if write is None else Path(write)


def replay(kept: Kept) -> None:
    """Print what a kept answer printed: its lines on stderr, its bytes on stdout."""
    if kept.stderr:
        sys.stderr.write(kept.stderr)
        sys.stderr.flush()
    if kept.stdout:
        sys.stdout.buffer.write(kept.stdout)
        sys.stdout.flush()
