"""stepscope's own gzip (a window's trace, a merged trace): ISA-L's deflate where installed, zlib's where not; a
plain gzip file either way."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from stepscope import compress

DATA = (
    b'{"traceEvents":['
    + b",".join(b'{"ph":"X","name":"op%d","ts":%d,"dur":3}' % (i, i) for i in range(5000))
    + b"]}"
)


@pytest.mark.parametrize("isal", [True, False])
def test_what_is_written_is_plain_gzip(isal: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not isal:
        monkeypatch.setattr(compress, "_igzip", lambda: None)
    elif compress._igzip() is None:
        pytest.skip("no ISA-L wheel here")
    with compress.open_gzip(tmp_path / "t.json.gz") as fh:
        fh.write(DATA)
    assert gzip.decompress((tmp_path / "t.json.gz").read_bytes()) == DATA
    packed = compress.gzip_bytes(DATA)
    assert gzip.decompress(packed) == DATA and len(packed) < len(DATA) / 5
