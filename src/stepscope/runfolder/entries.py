"""The run folder's index as data: one `Artifact` per file and the `Manifest` that lists them (manifest.py reads,
merges and writes it; recover.py rebuilds it from the files)."""

from __future__ import annotations

import msgspec

from stepscope.runfolder.layout import ArtifactKind

__all__ = ["MANIFEST_SCHEMA", "READABLE_SCHEMAS", "Artifact", "Manifest"]

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
    # a window's trace: [first, last] ranges of the job's steps that ran while the window's end work (its gzip
    # and summary, in a child process) used the CPU (analyses of plain steps leave them out)
    beside_steps: list[tuple[int, int]] | None = None


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
