"""Gzip as stepscope writes it (a window's trace, a merged trace): ISA-L's deflate (python-isal's `igzip`) where
its wheel is installed, about 7x zlib's level 6 on a trace's JSON for files about 30% larger; zlib elsewhere. The
files are plain gzip either way: any reader inflates them."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO, Any

ISAL_LEVEL = 2  # ISA-L's default: as small as its level 3 on traces, in half the time
ZLIB_LEVEL = 6  # where ISA-L is missing: about torch's own size (it uses 9) in much less time


def _igzip() -> Any:
    try:
        from isal import igzip
    except ImportError:
        return None
    return igzip


def open_gzip(path: str | Path, mode: str = "wb") -> IO[bytes]:
    """A gzip file opened for writing (ISA-L where installed)."""
    igzip = _igzip()
    if igzip is not None:
        return igzip.open(path, mode, compresslevel=ISAL_LEVEL)  # type: ignore[no-any-return]
    return gzip.open(path, mode, compresslevel=ZLIB_LEVEL)  # type: ignore[return-value]


def gzip_bytes(data: bytes) -> bytes:
    """`data` gzipped as open_gzip writes it."""
    igzip = _igzip()
    if igzip is not None:
        return igzip.compress(data, compresslevel=ISAL_LEVEL)  # type: ignore[no-any-return]
    return gzip.compress(data, ZLIB_LEVEL)
