"""Read memory files from unknown sources without running anything they contain.

A pickle can name any importable callable and have it called on load; `_PlainUnpickler` refuses every global,
so only the containers and scalars pickle builds by itself (dict, list, tuple, str, bytes, int, float, bool,
None) ever come out. Gzip is recognised by its magic bytes, JSON by its first character.
"""

from __future__ import annotations

import gzip
import io
import pickle
import zlib
from pathlib import Path
from typing import Any

import msgspec

from stepscope.errors import InputError

_GZIP_MAGIC = b"\x1f\x8b"


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle asked for a class or function: never loaded, the file is rejected."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise RefusedGlobal(
            f"refused to load {module}.{name}: only plain containers and scalars are accepted"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedGlobal("refused a persistent id: only plain containers and scalars are accepted")


def load_plain_pickle(data: bytes) -> Any:
    """Unpickle bytes admitting only plain containers and scalars; any global or persistent id raises."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def read_untrusted(path: str | Path) -> Any:
    """Decode a pickle or JSON file (optionally gzip'd) into plain Python objects, or raise InputError."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise InputError(path, "is a folder, expected a memory snapshot file") from None
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    if raw.startswith(_GZIP_MAGIC):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(path, f"corrupt gzip data: {exc}") from None
    if not raw.strip():
        raise InputError(path, "empty file")
    if raw.lstrip()[:1] in (b"[", b"{"):
        try:
            return msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise InputError(path, f"invalid JSON: {exc}") from None
    try:
        return load_plain_pickle(raw)
    except RefusedGlobal as exc:
        raise InputError(path, f"unsafe pickle rejected ({exc})") from None
    except RecursionError:
        raise InputError(path, "pickle nested too deeply") from None
    # Anything else a hostile or damaged byte stream makes the unpickler raise is still just bad input.
    except Exception as exc:
        raise InputError(path, f"not a readable pickle or JSON file ({type(exc).__name__}: {exc})") from None
