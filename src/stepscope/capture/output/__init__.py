"""What a recording rank writes into its run folder: the run writer (every artifact, metrics.jsonl, the index),
the thread that keeps this rank's part of the manifest merged, the run folder's name that all ranks of a job
agree on (and each rank's number), and the HTML report written when the monitor closes.

Modules: `writer` (RunWriter, JsonLines), `manifest_keeper` (ManifestKeeper), `dist` (rank, world size and the
run name), `report` (the report at close, made by a child process). Names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

if TYPE_CHECKING:
    from stepscope.capture.output.dist import agree_run_name, new_run_name, rank_and_world
    from stepscope.capture.output.manifest_keeper import ManifestKeeper
    from stepscope.capture.output.report import write_run_report
    from stepscope.capture.output.writer import JsonLines, RunWriter

_EXPORTS = {
    "JsonLines": "writer",
    "ManifestKeeper": "manifest_keeper",
    "RunWriter": "writer",
    "agree_run_name": "dist",
    "new_run_name": "dist",
    "rank_and_world": "dist",
    "write_run_report": "report",
}

__all__ = [
    "JsonLines",
    "ManifestKeeper",
    "RunWriter",
    "agree_run_name",
    "new_run_name",
    "rank_and_world",
    "write_run_report",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
