"""A run folder's index rebuilt from the files in it, for a manifest that is damaged or missing.

The layout names every artifact (runfolder/layout.py), so the files say what they are: `traces/rank1_step7.json.gz`
is rank 1's trace of the window ending at step 7. Only regular, visible files whose names fit a template are
taken (a writer's temp files are hidden); the run's facts that only the manifest held (versions, hosts,
schedule) stay empty, and world size and profiled ranks are those the files show.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

from stepscope.runfolder.entries import Artifact, Manifest
from stepscope.runfolder.layout import OOM_SNAPSHOT_TEMPLATE, TEMPLATES, ArtifactKind
from stepscope.runfolder.payloads import KIND_SCHEMAS

# a folder of artifacts, whose files the writer (TensorBoard) names itself
_FOLDER_KINDS = frozenset({ArtifactKind.TENSORBOARD})
MAX_FILES = 100_000  # files looked at in one folder of the run: a folder of millions is not a run's


def _pattern(template: str) -> re.Pattern[str]:
    """A layout template -> a regex of its paths, with the rank and step fields as named groups."""
    parts = re.split(r"(\{rank\}|\{step\})", template)
    body = "".join(
        "(?P<rank>[0-9]{1,9})"
        if p == "{rank}"
        else "(?P<step>[0-9]{1,18})"
        if p == "{step}"
        else re.escape(p)
        for p in parts
    )
    return re.compile(body + "\\Z")


_PATTERNS: list[tuple[ArtifactKind, re.Pattern[str]]] = [
    (ArtifactKind.MEMORY_SNAPSHOT, _pattern(OOM_SNAPSHOT_TEMPLATE)),
    *((kind, _pattern(template)) for kind, template in TEMPLATES.items()),
]


def artifact_of(relative: str) -> Artifact | None:
    """The artifact a run-folder path names by the layout (`traces/rank0_step3.json.gz`), or None."""
    folder, _, name = relative.rpartition("/")
    for kind, pattern in _PATTERNS:
        match = pattern.match(folder if kind in _FOLDER_KINDS else relative)
        if match is None or (kind in _FOLDER_KINDS and (not name or name.startswith("."))):
            continue
        groups = match.groupdict()
        rank = int(groups["rank"]) if groups.get("rank") is not None else None
        step = int(groups["step"]) if groups.get("step") is not None else None
        return Artifact(
            kind=kind.value, path=relative, rank=rank, step=step, schema=KIND_SCHEMAS.get(kind.value)
        )
    return None


def manifest_from_files(run_dir: str | Path) -> Manifest:
    """A manifest of what `run_dir` holds, by the layout; its artifacts are empty when nothing fits."""
    run_dir = Path(run_dir)
    artifacts = [a for relative in _visible_files(run_dir) if (a := artifact_of(relative)) is not None]
    artifacts.sort(key=lambda a: (a.kind, a.rank if a.rank is not None else -1, a.step or 0, a.path))
    ranks = sorted({a.rank for a in artifacts if a.rank is not None})
    return Manifest(
        run_name=run_dir.name,
        world_size=max(ranks) + 1 if ranks else 1,
        profiled_ranks=ranks,
        artifacts=artifacts,
    )


def _visible_files(run_dir: Path) -> list[str]:
    """Relative paths of the regular, visible files of the run folder and of its folders, two levels deep (the
    deepest template: tensorboard/rank0/<event file>). Symbolic links are not followed."""
    out: list[str] = []
    stack: list[tuple[Path, str, int]] = [(run_dir, "", 0)]
    while stack:
        folder, prefix, depth = stack.pop()
        try:
            entries = sorted(folder.iterdir())[:MAX_FILES]
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                mode = entry.lstat().st_mode
            except OSError:
                continue
            relative = prefix + entry.name
            if stat.S_ISREG(mode):
                out.append(relative)
            elif stat.S_ISDIR(mode) and depth < 2:
                stack.append((entry, relative + "/", depth + 1))
    return out
