"""The run-folder contract: one template per kind, a manifest merged safely by concurrent writers, with or without
fcntl (Windows has none: filelock then locks with msvcrt, and elsewhere with an exclusively created lock file)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepscope.runfolder import (
    TEMPLATES,
    Artifact,
    ArtifactKind,
    artifact_path,
    read_manifest,
    update_manifest,
)
from stepscope.runfolder.payloads import KIND_SCHEMAS

SRC = Path(__file__).resolve().parents[2] / "src"

WRITER = textwrap.dedent(
    """
    import sys
    if sys.argv[3] == "no-fcntl":
        sys.modules["fcntl"] = None  # as on Windows: `import fcntl` fails
    import filelock
    from stepscope.runfolder import Artifact, update_manifest
    if sys.argv[3] == "no-fcntl":
        assert sys.modules["fcntl"] is None and filelock.FileLock is filelock.SoftFileLock, filelock.FileLock
    run_dir, who = sys.argv[1], int(sys.argv[2])
    for i in range(25):
        update_manifest(run_dir, artifacts=[Artifact(kind="trace", path=f"traces/rank{who}_step{i}.json.gz", rank=who, step=i)])
    print(filelock.FileLock.__name__)
    """
)


@pytest.mark.parametrize("mode", ["fcntl", "no-fcntl"])
def test_concurrent_writers_lose_no_artifact(tmp_path: Path, mode: str) -> None:
    # GIVEN 4 processes that each add 25 artifacts to one manifest at the same time
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    run_dir = tmp_path / "run"
    env = {"PYTHONPATH": str(SRC)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(run_dir), str(w), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for w in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    # THEN the lock was the expected one, and every artifact of every writer is in the manifest
    expected_lock = "SoftFileLock" if mode == "no-fcntl" else "UnixFileLock"
    assert {out.strip() for out, _ in outs} == {expected_lock}
    manifest = read_manifest(run_dir)
    assert sorted((a.rank, a.step) for a in manifest.artifacts) == [
        (w, i) for w in range(4) for i in range(25)
    ]
    # AND no lock file is left: with fcntl the lock is on the folder itself, a soft lock is removed on release
    assert not (run_dir / ".manifest.lock").exists()


def test_every_kind_has_one_template_and_unknown_kinds_are_refused(tmp_path: Path) -> None:
    assert set(TEMPLATES) == set(ArtifactKind)
    assert set(KIND_SCHEMAS) <= {k.value for k in ArtifactKind}
    assert artifact_path("trace", rank=3, step=7) == "traces/rank3_step7.json.gz"
    with pytest.raises(ValueError, match="not_a_kind"):
        update_manifest(tmp_path, artifacts=[Artifact(kind="not_a_kind", path="x")])


def test_path_templates_are_spelled_only_in_the_layout() -> None:
    # "every path template is defined once": no other module spells a run-folder path pattern
    pattern_bits = ("rank{rank}", "_step{step}", "{rank}_step")
    package = SRC / "stepscope"
    offenders = [
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if p.name != "layout.py" and any(bit in p.read_text(encoding="utf-8") for bit in pattern_bits)
    ]
    assert offenders == []
