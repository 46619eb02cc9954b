"""The manifest: the index of a run folder, merged by every rank under a lock that works on every OS.

A damaged manifest never makes a run unreadable: a writer rebuilds it from the files in the folder before it
merges (and each rank's writer merges its whole index again), a reader (`load_manifest`) reads the folder by
its layout instead, with a note, and adds the files that fit the layout but that a whole manifest lacks.

The lock (runfolder/lock.py) is an flock on the run folder itself on POSIX, which leaves no file behind, and
`filelock`'s elsewhere: msvcrt on Windows, and where neither exists a lock file that is created exclusively
(SoftFileLock: a lock left behind by a killed process makes later updates time out with a warning rather than
wait forever).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

from stepscope.errors import InputError
from stepscope.runfolder.atomic import atomic_write_bytes
from stepscope.runfolder.entries import READABLE_SCHEMAS, Artifact, Manifest
from stepscope.runfolder.files import read_regular
from stepscope.runfolder.layout import MANIFEST_NAME, ArtifactKind
from stepscope.runfolder.lock import LOCK_TIMEOUT_S, folder_lock
from stepscope.runfolder.recover import manifest_from_files

_EMPTY = Manifest()
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Manifest)


def encode_manifest(manifest: Manifest) -> bytes:
    return msgspec.json.format(_encoder.encode(manifest), indent=2) + b"\n"


MANIFEST_MAX_BYTES = (
    256 * 1024 * 1024
)  # ~1.5 million artifacts; a larger file is not a manifest stepscope wrote


def read_manifest(run_dir: str | Path) -> Manifest:
    """Load `run_dir/manifest.json`, raising InputError with the file name on any problem."""
    path = Path(run_dir) / MANIFEST_NAME
    if not path.exists() and not path.is_symlink():
        raise InputError(path, "no manifest.json: not a stepscope run folder")
    data = read_regular(path, "a manifest.json", limit=MANIFEST_MAX_BYTES)  # never a FIFO or a device
    return _decode(path, data)


def _decode(path: Path, data: bytes) -> Manifest:
    try:
        manifest = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        # (msgspec 0.23 says a string that is not UTF-8 so, where 0.22 raised UnicodeDecodeError)
        why = "not UTF-8 text" if "UTF-8" in str(exc) else str(exc)
        raise InputError(path, f"invalid manifest: {why}") from None
    except RecursionError:  # msgspec's own depth limit is Python's recursion limit
        raise InputError(path, "invalid manifest: nested too deeply") from None
    except UnicodeDecodeError:
        raise InputError(path, "invalid manifest: not UTF-8 text") from None
    if manifest.schema not in READABLE_SCHEMAS:
        raise InputError(path, f"manifest schema {manifest.schema!r} is not one this stepscope reads")
    return manifest


def load_manifest(run_dir: str | Path) -> tuple[Manifest, list[str]]:
    """The manifest of a run folder for a reader, and notes. The files of the folder complete it: a damaged
    manifest is replaced by the index of the files the layout names (runfolder/recover.py), and files that fit
    the layout but that a whole manifest lacks (a writer stopped, or kept from the lock, before it indexed them)
    are added; a note says so. InputError when the folder has no manifest, or a damaged one and no artifact."""

    try:
        manifest = read_manifest(run_dir)
    except InputError as exc:
        if not os.path.lexists(Path(run_dir) / MANIFEST_NAME):
            raise
        rebuilt = manifest_from_files(run_dir)
        if not rebuilt.artifacts:
            raise
        note = (
            f"{exc.path}: {exc.problem}; the run is read from the {len(rebuilt.artifacts)} files in its folder "
            "instead (versions, hosts and schedule unknown)"
        )
        manifest, notes = rebuilt, [note]
    else:
        notes = _outside_left_out(run_dir, manifest)
        indexed = {a.path for a in manifest.artifacts}
        missing = [a for a in manifest_from_files(run_dir).artifacts if a.path not in indexed]
        if missing:
            manifest.artifacts.extend(missing)
            listed = ", ".join(a.path for a in missing[:3]) + (", ..." if len(missing) > 3 else "")
            notes.append(
                f"{Path(run_dir) / MANIFEST_NAME}: {len(missing)} file(s) of the folder are not in it ({listed}; "
                "a writer stopped, or was kept from the folder's lock, before it indexed them); read all the same"
            )
    return manifest, notes + _links_left_out(run_dir, manifest)


# the end of every note that says an artifact of the run folder is not read (it is not inside the folder)
LEFT_OUT = "the run folder left out"


def _links_left_out(run_dir: str | Path, manifest: Manifest) -> list[str]:
    """An artifact whose path leads out of the run folder through a link (a trace linked to a file elsewhere, a
    folder swapped for a link) is not read: what a run folder shows is what it holds. A note names them."""
    inside = [resolves_inside(run_dir, Path(run_dir) / a.path) for a in manifest.artifacts]
    if all(inside):
        return []
    away = [a for a, ok in zip(manifest.artifacts, inside, strict=True) if not ok]
    manifest.artifacts = [a for a, ok in zip(manifest.artifacts, inside, strict=True) if ok]
    listed = ", ".join(a.path for a in away[:3]) + (", ..." if len(away) > 3 else "")
    return [f"{Path(run_dir)}: {len(away)} file(s) that link out of {LEFT_OUT} ({listed})"]


def resolves_inside(run_dir: str | Path, path: str | Path) -> bool:
    """Whether `path`, its links followed, lies inside `run_dir` (its own links followed too)."""
    top = os.path.realpath(run_dir)
    return os.path.commonpath([os.path.realpath(path), top]) == top


def _outside_left_out(run_dir: str | Path, manifest: Manifest) -> list[str]:
    """Artifacts are paths inside the run folder: one that is absolute or climbs out of it (`..`) is not read
    (a manifest is input like any other file), and a note names it."""
    outside = [a for a in manifest.artifacts if not is_inside_path(a.path)]
    if not outside:
        return []
    manifest.artifacts = [a for a in manifest.artifacts if is_inside_path(a.path)]
    listed = ", ".join(a.path for a in outside[:3]) + (", ..." if len(outside) > 3 else "")
    return [f"{Path(run_dir) / MANIFEST_NAME}: {len(outside)} artifact path(s) outside {LEFT_OUT} ({listed})"]


def is_inside_path(path: str) -> bool:
    """A manifest path that names a file inside its run folder: relative, no `..`, no drive, no NUL (which no
    file name holds, and which the OS calls refuse with a ValueError)."""
    pure = PurePosixPath(path.replace("\\", "/"))
    return (
        bool(path)
        and "\0" not in path
        and not pure.is_absolute()
        and ".." not in pure.parts
        and ":" not in (pure.parts[0] if pure.parts else "")
    )


def manifest_lock(run_dir: Path, timeout: float = LOCK_TIMEOUT_S) -> Any:
    """The run folder's manifest lock (a context manager)."""
    return folder_lock(run_dir, timeout)


def update_manifest(
    run_dir: str | Path,
    *,
    artifacts: Iterable[Artifact] = (),
    hosts: Iterable[str] = (),
    notes: Iterable[str] = (),
    profiled_ranks_add: Iterable[int] = (),
    timeout: float = LOCK_TIMEOUT_S,
    **fields: Any,
) -> Manifest:
    """Merge into the manifest under an exclusive lock, then replace it atomically.

    Artifacts are de-duplicated by path; `fields` overwrite top-level values (run_name, versions, ...);
    `profiled_ranks_add` joins ranks to profiled_ranks (each rank of profiled_ranks="all" adds itself). A
    manifest that cannot be read (overwritten, cut, not a regular file) is rebuilt from the files in the
    folder before the merge. TimeoutError when another process holds the lock for `timeout` s.
    """
    return merge_manifest(
        run_dir,
        artifacts=artifacts,
        hosts=hosts,
        notes=notes,
        fields=fields,
        profiled_ranks_add=profiled_ranks_add,
        timeout=timeout,
    )[0]


def merge_manifest(
    run_dir: str | Path,
    *,
    artifacts: Iterable[Artifact] = (),
    hosts: Iterable[str] = (),
    notes: Iterable[str] = (),
    fields: dict[str, Any] | None = None,
    defaults: dict[str, Any] | None = None,
    profiled_ranks_add: Iterable[int] = (),
    timeout: float = LOCK_TIMEOUT_S,
) -> tuple[Manifest, str | None]:
    """`update_manifest`, saying also what was wrong with the manifest it rebuilt (None: it was whole).

    `defaults` are top-level values set only where the manifest has none yet (the first rank's `created`
    stays): a writer can merge them again and again, as it does after a manifest was rebuilt."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    artifacts = list(artifacts)
    for artifact in artifacts:
        ArtifactKind(artifact.kind)  # ValueError on a kind the contract does not know
    with manifest_lock(run_dir, timeout):
        manifest, damage = _current(run_dir)
        for key, value in (defaults or {}).items():
            if getattr(manifest, key) == getattr(_EMPTY, key):
                setattr(manifest, key, value)
        for key, value in (fields or {}).items():
            setattr(manifest, key, value)
        known = {a.path for a in manifest.artifacts}
        for artifact in artifacts:
            if artifact.path not in known:
                manifest.artifacts.append(artifact)
                known.add(artifact.path)
        for host in hosts:
            if host not in manifest.hosts:
                manifest.hosts.append(host)
        for note in notes:
            if note not in manifest.notes:
                manifest.notes.append(note)
        added = set(profiled_ranks_add)
        if added:
            manifest.profiled_ranks = sorted({*manifest.profiled_ranks, *added})
        manifest.artifacts.sort(
            key=lambda a: (a.kind, a.rank if a.rank is not None else -1, a.step or 0, a.path)
        )
        aside = _folder_aside(run_dir / MANIFEST_NAME) if damage is not None else None
        if aside is not None:
            note = (
                f"{MANIFEST_NAME} was a folder; it was moved to {aside.name} and the manifest written again"
            )
            if note not in manifest.notes:
                manifest.notes.append(note)
        atomic_write_bytes(run_dir / MANIFEST_NAME, encode_manifest(manifest))
    return manifest, damage


def _folder_aside(path: Path) -> Path | None:
    """A folder where the manifest goes (put there by hand, or by a tool) is moved beside it, under a new name,
    so that the manifest can be written again (a rename cannot replace a folder with a file); None when `path`
    is not a folder."""
    if not path.is_dir() or path.is_symlink():
        return None
    for k in range(1, 1000):
        aside = path.with_name(f"{path.name}.folder-{k}")
        if not os.path.lexists(aside):
            os.rename(path, aside)
            return aside
    return None


def _current(run_dir: Path) -> tuple[Manifest, str | None]:
    """The manifest on disk (a new one where there is none), or, when it cannot be read, the index of the
    files in the folder and the problem."""
    path = run_dir / MANIFEST_NAME
    try:
        return read_manifest(run_dir), None
    except InputError as exc:
        if not os.path.lexists(path):
            return Manifest(), None

        return manifest_from_files(run_dir), exc.problem


def relpath(run_dir: str | Path, path: str | Path) -> str:
    return os.path.relpath(Path(path), Path(run_dir)).replace(os.sep, "/")
