"""The manifest: the index of a run folder, merged by every rank under a lock that works on every OS.

The lock (runfolder/lock.py) is an flock on the run folder itself on POSIX, which leaves no file behind, and
`filelock`'s elsewhere: msvcrt on Windows, and where neither exists a lock file that is created exclusively
(SoftFileLock: a lock left behind by a killed process makes later updates time out with a warning rather than
wait forever).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from stepscope.errors import InputError
from stepscope.runfolder.atomic import atomic_write_bytes
from stepscope.runfolder.layout import MANIFEST_NAME, ArtifactKind
from stepscope.runfolder.lock import folder_lock
from stepscope.runfolder.regular import read_regular

MANIFEST_SCHEMA = "stepscope.manifest/2"
# Manifests a reader understands (version 1 had no `schema` per artifact and other kind names).
READABLE_SCHEMAS = ("stepscope.manifest/1", MANIFEST_SCHEMA)


class Artifact(msgspec.Struct, frozen=True, omit_defaults=True):
    """One file of the run: what it is, who wrote it, for which step, where it lies (relative path), and the
    schema of its payload when stepscope reads it back."""

    kind: str
    path: str
    rank: int | None = None
    step: int | None = None
    schema: str | None = None


class Manifest(msgspec.Struct):
    """Index of a run folder. Every rank merges its own facts and artifacts into it under a file lock."""

    schema: str = MANIFEST_SCHEMA
    run_name: str = ""
    created: str = ""
    versions: dict[str, str] = {}
    hosts: list[str] = []
    world_size: int = 1
    profiled_ranks: list[int] = []
    schedule: dict[str, int] = {}
    artifacts: list[Artifact] = []
    notes: list[str] = []

    def of_kind(self, kind: ArtifactKind | str) -> list[Artifact]:
        kind = str(kind)
        return [a for a in self.artifacts if a.kind == kind]


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Manifest)


def encode_manifest(manifest: Manifest) -> bytes:
    return msgspec.json.format(_encoder.encode(manifest), indent=2) + b"\n"


def read_manifest(run_dir: str | Path) -> Manifest:
    """Load `run_dir/manifest.json`, raising InputError with the file name on any problem."""
    path = Path(run_dir) / MANIFEST_NAME
    if not path.exists() and not path.is_symlink():
        raise InputError(path, "no manifest.json: not a stepscope run folder")
    data = read_regular(path, "a manifest.json", limit=MAX_MANIFEST_BYTES)  # never a FIFO or a device
    try:
        manifest = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise InputError(path, f"invalid manifest: {exc}") from None
    except RecursionError:  # msgspec's own depth limit is Python's recursion limit
        raise InputError(path, "invalid manifest: nested too deeply") from None
    except UnicodeDecodeError:
        raise InputError(path, "invalid manifest: not UTF-8 text") from None
    if manifest.schema not in READABLE_SCHEMAS:
        raise InputError(path, f"manifest schema {manifest.schema!r} is not one this stepscope reads")
    return manifest


MAX_MANIFEST_BYTES = 256 << 20  # a manifest lists files: thousands of windows of thousands of ranks fit


def is_run_folder(path: str | Path) -> bool:
    return (Path(path) / MANIFEST_NAME).is_file()


def manifest_lock(run_dir: Path) -> Any:
    """The run folder's manifest lock (a context manager)."""
    return folder_lock(run_dir)


def update_manifest(
    run_dir: str | Path,
    *,
    artifacts: Iterable[Artifact] = (),
    hosts: Iterable[str] = (),
    notes: Iterable[str] = (),
    profiled_ranks_add: Iterable[int] = (),
    **fields: Any,
) -> Manifest:
    """Merge into the manifest under an exclusive lock, then replace it atomically.

    Artifacts are de-duplicated by path; `fields` overwrite top-level values (run_name, versions, ...);
    `profiled_ranks_add` joins ranks to profiled_ranks (each rank of profiled_ranks="all" adds itself).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with manifest_lock(run_dir):
        path = run_dir / MANIFEST_NAME
        manifest = _decoder.decode(path.read_bytes()) if path.is_file() else Manifest()
        for key, value in fields.items():
            setattr(manifest, key, value)
        known = {a.path for a in manifest.artifacts}
        for artifact in artifacts:
            ArtifactKind(artifact.kind)  # ValueError on a kind the contract does not know
            if artifact.path not in known:
                manifest.artifacts.append(artifact)
                known.add(artifact.path)
        for host in hosts:
            if host not in manifest.hosts:
                manifest.hosts.append(host)
        for note in notes:
            if note not in manifest.notes:
                manifest.notes.append(note)
        if profiled_ranks_add:
            manifest.profiled_ranks = sorted({*manifest.profiled_ranks, *profiled_ranks_add})
        manifest.artifacts.sort(
            key=lambda a: (a.kind, a.rank if a.rank is not None else -1, a.step or 0, a.path)
        )
        atomic_write_bytes(path, encode_manifest(manifest))
    return manifest


def relpath(run_dir: str | Path, path: str | Path) -> str:
    return os.path.relpath(Path(path), Path(run_dir)).replace(os.sep, "/")
