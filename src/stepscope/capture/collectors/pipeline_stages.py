"""The `torch.distributed.pipelining` stages of this rank, for the process-group record (process_groups.py).

A trace names the peer of a point-to-point op only when recorded with shapes (`record_shapes=True`, off by
default), and without peers analysis cannot tell a pipeline's order. The stages know it: each `PipelineStage`
(any `_PipelineStageBase`) holds its index, the stage count, its process group and the group rank of every
stage. Nothing registers the stages, so they are found among the objects the garbage collector tracks: one scan,
done only in a job that imported pipelining, at a look of the recorder (never inside a step), a few times at most
(MAX_SCANS) until stages are found.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

from stepscope.runfolder.payloads import PipelineStageRecord

MAX_SCANS = 3  # looks that may scan for stages before the recorder stops looking (a job without any)


def find_stages(dist: Any, miss: Callable[[str], None]) -> list[PipelineStageRecord] | None:
    """The stages alive in this process, by stage index; None when pipelining was never imported (nothing to
    look for). `miss(what)`: called with the private part of torch that is missing or changed."""
    module = sys.modules.get("torch.distributed.pipelining.stage")
    if module is None:
        return None
    base = getattr(module, "_PipelineStageBase", None)
    if not isinstance(base, type):
        miss("torch.distributed.pipelining.stage._PipelineStageBase")
        return []
    stages = [obj for obj in gc.get_objects() if isinstance(obj, base)]
    records: list[PipelineStageRecord] = []
    for stage in stages:
        record = _record(dist, stage)
        if record is None:
            miss("PipelineStage.stage_index / num_stages / group / stage_index_to_group_rank")
        elif all(r.stage_index != record.stage_index for r in records):
            records.append(record)
    return sorted(records, key=lambda r: r.stage_index)


def _record(dist: Any, stage: Any) -> PipelineStageRecord | None:
    try:
        index, count = int(stage.stage_index), int(stage.num_stages)
        group = stage.group or dist.distributed_c10d._get_default_group()
        to_group_rank = dict(stage.stage_index_to_group_rank)
        ranks = [int(dist.get_global_rank(group, int(to_group_rank[i]))) for i in range(count)]
        name = getattr(group, "group_name", None)
    except Exception:
        return None
    return PipelineStageRecord(index, count, None if name is None else str(name), ranks)
