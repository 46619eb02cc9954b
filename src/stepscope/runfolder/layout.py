"""Where every artifact of a run lies, and what it is: the one place that names paths in a run folder.

    <out_dir>/<YYYY-MM-DD__HH-MM-SS>_<hash>/
        config.yaml  manifest.json  metrics.jsonl  traces/  summaries/  flops/  comm/  memory/  ...

Paths are relative to the run folder. Each kind has one format (docs/runfolder.md lists kind, path, format,
writer and reader); tools find artifacts through the manifest by kind, never by guessing names.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path

MANIFEST_NAME = "manifest.json"
LOCK_NAME = ".manifest.lock"
# kept by each profiled rank of an on-demand run while it listens for `stepscope trigger` (capture/window/trigger.py)
LISTENER_TEMPLATE = ".listening-rank{rank}.json"


class ArtifactKind(str, enum.Enum):
    """The kinds of file a run folder holds (the `kind` of a manifest entry)."""

    CONFIG = "config"  # config.yaml: the resolved ProfileConfig
    METRICS = "metrics"  # metrics.jsonl: StepMetrics lines, every step of every recording rank
    TRACE = "trace"  # Kineto chrome trace of one window (.json.gz)
    SUMMARY = "summary"  # torch's key_averages table of one window (text)
    FLOPS = "flops"  # FlopsReport (JSON) of the counted step
    FLOPS_TABLE = "flops_table"  # the per-module FLOP table of the counted step (text)
    COMM_COUNTS = "comm_counts"  # CommCounts (JSON): collectives per module of the logged step
    COMM_DEBUG = "comm_debug"  # CommDebugMode's table of the logged step (text)
    COMM_JSON = "comm_json"  # CommDebugMode's own JSON dump (torch's format)
    MEMORY_LOG = "memory_log"  # MemoryRow lines (JSONL), every `memory_log_every` steps
    MEMORY_TIMELINE = "memory_timeline"  # torch's raw memory timeline of one window (.raw.json.gz)
    MEMORY_TIMELINE_HTML = "memory_timeline_html"  # torch's HTML memory timeline of one window
    MEMORY_SNAPSHOT = "memory_snapshot"  # CUDA allocator snapshot (pickle), window ends and OOM
    SYSTEM = "system"  # SystemRow lines (JSONL) of the background sampler
    TENSORBOARD = "tensorboard"  # TensorBoard event file
    REPORT = "report"  # the self-contained HTML report of the run
    PROCESS_GROUPS = "process_groups"  # ProcessGroups (JSON): the process groups and device meshes of a rank
    PYTHON_SAMPLES = "python_samples"  # PythonSamples (JSON): py-spy's folded stacks of one window
    HOST_MEMORY = "host_memory"  # HostMemory (JSON): tracemalloc's top allocation sites of one window
    DEEPSPEED = "deepspeed"  # DeepSpeedEngineInfo (JSON): a DeepSpeed engine's configuration, per rank
    DS_FLOPS = "ds_flops"  # DsFlopsProfile (JSON): DeepSpeed's flops profiler at the counted step
    DS_COMMS = "ds_comms"  # DsCommsSummary (JSON): DeepSpeed's comms logger over one window
    WATCH = "watch"  # WatchRecord lines (JSONL): the decisions of a rank's watch (config watch=True)

    def __str__(self) -> str:
        return self.value


# kind -> path template (fields: rank, step). Every writer and reader formats these; no path is spelled elsewhere.
TEMPLATES: dict[ArtifactKind, str] = {
    ArtifactKind.CONFIG: "config.yaml",
    ArtifactKind.METRICS: "metrics.jsonl",
    ArtifactKind.TRACE: "traces/rank{rank}_step{step}.json.gz",
    ArtifactKind.SUMMARY: "summaries/rank{rank}_step{step}.txt",
    ArtifactKind.FLOPS: "flops/rank{rank}_step{step}.json",
    ArtifactKind.FLOPS_TABLE: "flops/rank{rank}_step{step}.txt",
    ArtifactKind.COMM_COUNTS: "comm/rank{rank}_step{step}.json",
    ArtifactKind.COMM_DEBUG: "comm/rank{rank}_step{step}.txt",
    ArtifactKind.COMM_JSON: "comm/rank{rank}_step{step}_comm_mode_log.json",
    ArtifactKind.MEMORY_LOG: "memory/rank{rank}.jsonl",
    ArtifactKind.MEMORY_TIMELINE: "memory_timeline/rank{rank}_step{step}.raw.json.gz",
    ArtifactKind.MEMORY_TIMELINE_HTML: "memory_timeline/rank{rank}_step{step}.html",
    ArtifactKind.MEMORY_SNAPSHOT: "memory_snapshot/rank{rank}_step{step}.pickle",
    ArtifactKind.SYSTEM: "system/rank{rank}.jsonl",
    ArtifactKind.TENSORBOARD: "tensorboard/rank{rank}",  # a folder: TensorBoard names the event files in it
    ArtifactKind.REPORT: "report.html",
    ArtifactKind.PROCESS_GROUPS: "process_groups/rank{rank}.json",
    ArtifactKind.PYTHON_SAMPLES: "python_samples/rank{rank}_step{step}.json",
    ArtifactKind.HOST_MEMORY: "host_memory/rank{rank}_step{step}.json",
    ArtifactKind.DEEPSPEED: "deepspeed/rank{rank}_engine.json",
    ArtifactKind.DS_FLOPS: "deepspeed/rank{rank}_step{step}_flops.json",
    ArtifactKind.DS_COMMS: "deepspeed/rank{rank}_step{step}_comms.json",
    ArtifactKind.WATCH: "watch/rank{rank}.jsonl",
}
# A second file of the memory_snapshot kind: the snapshot taken when a step ran out of memory.
OOM_SNAPSHOT_TEMPLATE = "memory_snapshot/rank{rank}_step{step}_oom.pickle"

CONFIG_NAME = TEMPLATES[ArtifactKind.CONFIG]
METRICS_NAME = TEMPLATES[ArtifactKind.METRICS]


def artifact_path(kind: ArtifactKind | str, rank: int | None = None, step: int | None = None) -> str:
    """The relative path of an artifact: `artifact_path("trace", rank=0, step=7)` -> traces/rank0_step7.json.gz."""
    return TEMPLATES[ArtifactKind(kind)].format(rank=rank, step=step)


def is_run_folder(path: str | Path) -> bool:
    """A folder with a manifest.json: a file, even a damaged one or a FIFO put in its place (readers then read
    the folder by its layout), but not a folder of that name."""
    manifest = Path(path) / MANIFEST_NAME
    return os.path.lexists(manifest) and not manifest.is_dir()
