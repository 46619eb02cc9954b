"""The run folder: the contract between capture and analysis (no torch, no rich).

`layout` names every path and artifact kind, `manifest` indexes the folder under a cross-platform lock,
`payloads` types every file stepscope reads back, `atomic` writes files that are never seen half-written,
`files` opens only regular files (never waiting on a FIFO), `entries` holds the manifest's types, `lock` its
lock, and `recover` indexes a folder by its layout (`manifest_from_files`) when its manifest is damaged or
missing.
Readers take `load_manifest` (the manifest completed, or replaced when damaged, by the files in the folder);
`read_manifest` is the file as written. Names are imported on first use: asking whether a folder is a run folder
(`is_run_folder`, in `layout`) costs no more than that module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

if TYPE_CHECKING:
    from stepscope.runfolder.entries import MANIFEST_SCHEMA, Artifact, Manifest
    from stepscope.runfolder.layout import (
        CONFIG_NAME,
        MANIFEST_NAME,
        METRICS_NAME,
        OOM_SNAPSHOT_TEMPLATE,
        TEMPLATES,
        ArtifactKind,
        artifact_path,
        is_run_folder,
    )
    from stepscope.runfolder.manifest import (
        encode_manifest,
        load_manifest,
        read_manifest,
        relpath,
        update_manifest,
    )

_EXPORTS = {
    "CONFIG_NAME": "layout",
    "MANIFEST_NAME": "layout",
    "MANIFEST_SCHEMA": "entries",
    "METRICS_NAME": "layout",
    "OOM_SNAPSHOT_TEMPLATE": "layout",
    "TEMPLATES": "layout",
    "Artifact": "entries",
    "ArtifactKind": "layout",
    "Manifest": "entries",
    "artifact_path": "layout",
    "encode_manifest": "manifest",
    "is_run_folder": "layout",
    "load_manifest": "manifest",
    "read_manifest": "manifest",
    "relpath": "manifest",
    "update_manifest": "manifest",
}

__all__ = [
    "CONFIG_NAME",
    "MANIFEST_NAME",
    "MANIFEST_SCHEMA",
    "METRICS_NAME",
    "OOM_SNAPSHOT_TEMPLATE",
    "TEMPLATES",
    "Artifact",
    "ArtifactKind",
    "Manifest",
    "artifact_path",
    "encode_manifest",
    "is_run_folder",
    "load_manifest",
    "read_manifest",
    "relpath",
    "update_manifest",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
