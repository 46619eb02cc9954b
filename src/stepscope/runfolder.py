"""The run folder and its manifest: the contract between capture and analysis (no torch here).

Layout (paths in the manifest are relative to the run folder):

    <out_dir>/<YYYY-MM-DD__HH-MM-SS>_<hash>/
        config.yaml  manifest.json  metrics.jsonl  traces/  summaries/  ...
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from stepscope._atomic import atomic_write_bytes
from stepscope.errors import InputError

MANIFEST_NAME = "manifest.json"
CONFIG_NAME = "config.yaml"
METRICS_NAME = "metrics.jsonl"
MANIFEST_SCHEMA = "stepscope.manifest/1"

# Artifact kinds (DESIGN.md). Tools find artifacts by kind through the manifest, never by guessing names.
ARTIFACT_KINDS = frozenset(
    {
        "config",
        "metrics",
        "trace",
        "summary",
        "flops",
        "comm_debug",
        "comm_json",
        "memory_log",
        "memory_timeline",
        "memory_snapshot",
        "system",
        "tensorboard",
        "report",
    }
)

# Sub-folders by kind; path templates live here so that every writer agrees.
TRACE_TEMPLATE = "traces/rank{rank}_step{step}.json.gz"
SUMMARY_TEMPLATE = "summaries/rank{rank}_step{step}.txt"


class Artifact(msgspec.Struct, frozen=True, omit_defaults=True):
    """One file of the run: what it is, who wrote it, for which step, where it lies (relative path)."""

    kind: str
    path: str
    rank: int | None = None
    step: int | None = None


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


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Manifest)


def encode_manifest(manifest: Manifest) -> bytes:
    return msgspec.json.format(_encoder.encode(manifest), indent=2) + b"\n"


def read_manifest(run_dir: str | Path) -> Manifest:
    """Load `run_dir/manifest.json`, raising InputError with the file name on any problem."""
    path = Path(run_dir) / MANIFEST_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(path, "no manifest.json: not a stepscope run folder") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise InputError(path, f"invalid manifest: {exc}") from None
    except UnicodeDecodeError:
        raise InputError(path, "invalid manifest: not UTF-8 text") from None


def artifacts_of_kind(run_dir: str | Path, kind: str) -> list[Path]:
    """Absolute paths of the artifacts of one kind, in manifest order."""
    run_dir = Path(run_dir)
    return [run_dir / a.path for a in read_manifest(run_dir).artifacts if a.kind == kind]


def is_run_folder(path: str | Path) -> bool:
    return (Path(path) / MANIFEST_NAME).is_file()


@contextlib.contextmanager
def _locked(run_dir: Path) -> Iterator[None]:
    lock_path = run_dir / ".manifest.lock"
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def update_manifest(
    run_dir: str | Path,
    *,
    artifacts: Iterable[Artifact] = (),
    hosts: Iterable[str] = (),
    notes: Iterable[str] = (),
    **fields: Any,
) -> Manifest:
    """Merge into the manifest under an exclusive lock, then replace it atomically.

    Artifacts are de-duplicated by path; `fields` overwrite top-level values (run_name, versions, ...).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with _locked(run_dir):
        path = run_dir / MANIFEST_NAME
        manifest = _decoder.decode(path.read_bytes()) if path.is_file() else Manifest()
        for key, value in fields.items():
            setattr(manifest, key, value)
        known = {a.path for a in manifest.artifacts}
        for artifact in artifacts:
            if artifact.kind not in ARTIFACT_KINDS:
                raise ValueError(f"unknown artifact kind {artifact.kind!r}")
            if artifact.path not in known:
                manifest.artifacts.append(artifact)
                known.add(artifact.path)
        for host in hosts:
            if host not in manifest.hosts:
                manifest.hosts.append(host)
        for note in notes:
            if note not in manifest.notes:
                manifest.notes.append(note)
        manifest.artifacts.sort(
            key=lambda a: (a.kind, a.rank if a.rank is not None else -1, a.step or 0, a.path)
        )
        atomic_write_bytes(path, encode_manifest(manifest))
    return manifest


def relpath(run_dir: str | Path, path: str | Path) -> str:
    return os.path.relpath(Path(path), Path(run_dir)).replace(os.sep, "/")
