"""How close each op runs to the hardware (`stepscope ops`): the op families (`families`), FLOPs and bytes per op
from the shapes a trace recorded (`model`), the counted calls of a trace file with their time (`calls`) and where each was issued
(`where`), each op group against its device's roofline, with findings priced in time (`roofline`), and the
stacks of the costliest ops and time by module (`views`). Per rank: every file is its own story.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from stepscope.analysis.ops.calls import TraceOps, read_calls
from stepscope.analysis.ops.roofline import OPS_SCHEMA, OpFinding, OpGroup, RankOps, Roofline, rank_ops
from stepscope.analysis.ops.views import ModuleRow, StackRow
from stepscope.analysis.options import AnalysisOptions
from stepscope.analysis.read.combine import assign_ranks
from stepscope.analysis.read.loader import estimated_json_bytes, find_traces, skipping
from stepscope.analysis.read.source import Source, as_source
from stepscope.analysis.read.table import MISSING, RankInfo
from stepscope.analysis.tasks import POOL_MIN_BYTES, Failed, ProgressCallback, cpu_count, run_tasks

__all__ = [
    "OPS_SCHEMA",
    "ModuleRow",
    "OpFinding",
    "OpGroup",
    "OpsResult",
    "RankOps",
    "Roofline",
    "StackRow",
    "ops_source",
]


class OpsResult(msgspec.Struct):
    """Every rank's ops against its roofline (schema `stepscope.ops/1`)."""

    path: str
    ranks: list[RankOps]
    notices: list[str]
    schema: str = OPS_SCHEMA


def ops_source(
    path: str | Path | Source,
    options: AnalysisOptions | None = None,
    progress: ProgressCallback | None = None,
) -> OpsResult:
    """The ops of every trace of PATH (a trace, a folder of traces or a run folder), a rank per file as analyze
    numbers them: the manifest's rank, else the file's distributedInfo, else the lowest rank no file declares. The files are read
    on the task runner (`options.jobs` local processes; by default all CPUs from POOL_MIN_BYTES of JSON on); in a
    folder of traces a file that cannot be read is skipped with a notice, as analyze skips it."""
    options = options or AnalysisOptions()
    source = as_source(path)
    files, notices = find_traces(source, options.step)
    skipped = skipping(source)
    sizes = [estimated_json_bytes(f) for f, _ in files]
    jobs = options.jobs if options.jobs is not None else cpu_count() if sum(sizes) >= POOL_MIN_BYTES else 1
    done = dict(
        run_tasks(
            read_calls,
            [(str(f),) for f, _ in files],
            workers=jobs,
            weights=sizes,
            labels=[f.name for f, _ in files],
            progress=progress,
        )
    )
    read: list[_File] = []
    for i, (file, given) in enumerate(files):
        found = done[i]
        if isinstance(found, Failed):
            skipped.skip_or_raise(found.error())
            continue
        declared = given if given is not None else found.rank
        read.append(_File(str(file), declared, RankInfo(rank=MISSING, source=str(file)), found))
    if not read:
        raise skipped.nothing_left(source.path)
    notices.extend(skipped.notices)
    notices.extend(assign_ranks(read))  # type: ignore[arg-type]  # (analyze's numbering: the same ranks)
    ranks = [
        rank_ops(f.found, f.info.rank, peak_tflops=options.peak_tflops, tbps=options.peak_tbps) for f in read
    ]
    ranks.sort(key=lambda r: r.rank)
    return OpsResult(str(source.path), ranks, notices)


class _File(msgspec.Struct):
    """A file as the loader's rank assignment sees it (read.combine.assign_ranks)."""

    path: str
    declared_rank: int | None
    info: RankInfo
    found: TraceOps
