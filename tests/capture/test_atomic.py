from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from stepscope.runfolder.atomic import atomic_write_text


def test_atomic_write_replaces_whole_file_with_usual_permissions(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.txt"
    atomic_write_text(target, "first")
    atomic_write_text(target, "second")
    assert target.read_text() == "second"
    assert [p.name for p in target.parent.iterdir()] == ["out.txt"]  # no temp file left behind
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def test_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    atomic_write_text(target, "kept")

    from stepscope.runfolder.atomic import atomic_write_bytes

    with pytest.raises(TypeError):  # the write fails midway: a str is not bytes
        atomic_write_bytes(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
