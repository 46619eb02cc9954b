"""The critical path of each step of a replay: walking back from the step's end, what held each instant.

On the host, time runs back to the synchronization before it; a synchronization that waited for the GPU hands
the path to the activity it waited for; an activity hands it to its stream's previous activity (it followed its
stream), to the activity it waited for on another stream or in its CUDA graph (it followed that), or to its
launch on the host (it followed its launch). A CUDA graph's activities are named `<graph> > <kernel>`. Of the
host time on the path, the part inside torch.compile's ranges (COMPILED_RE) is also told apart. Each stretch is counted by kind: host (by phase:
data_loader / forward / backward / optimizer / other), GPU computation, communication, memory, launch latency,
gaps between activities of a stream, synchronization (its own time).
"""

from __future__ import annotations

import re
from collections import Counter

import msgspec
import numpy as np

from stepscope.analysis.rank.kernels import KIND_NAMES
from stepscope.analysis.rank.steps import assign_phases, region_union
from stepscope.analysis.whatif.graph import RankGraph
from stepscope.analysis.whatif.replay import Replay

PATH_KINDS = ("host", "computation", "communication", "memory", "launch", "gap", "sync")
# torch.compile's ranges: its compiled frames (dynamo) and their autograd functions (AOTAutograd), both directions
COMPILED_RE = re.compile(r"^Torch-Compiled Region|^CompiledFunction")
_COMPILED = "\0compiled"  # (a key no phase has)


class PathStep(msgspec.Struct):
    """The critical path of one step: ms by kind, and the host time by phase."""

    step: int
    step_ms: float
    by_kind_ms: dict[str, float]
    host_by_phase_ms: dict[str, float]
    top: list[tuple[str, float]]  # the GPU activities (by name) longest on the path, ms
    host_compiled_ms: float = 0.0  # of the host time on the path, inside torch.compile regions


def critical_path(rep: Replay, top: int = 5) -> list[PathStep]:
    """Per step of the replay, its critical path (see the module's doc)."""
    g = rep.graph
    gpu, syncs = g.gpu, g.syncs
    phases = assign_phases(g.data.table)
    compiled = region_union(g.data.table, COMPILED_RE)
    if compiled is not None:
        phases = {**phases, _COMPILED: compiled}
    launch_host = rep.gpu_start - gpu.latency  # the launch, in replayed time (its latency before the start)
    prev_end = np.where(gpu.prev >= 0, rep.gpu_end[np.maximum(gpu.prev, 0)], np.iinfo(np.int64).min)
    after_end = np.where(gpu.after >= 0, rep.gpu_end[np.maximum(gpu.after, 0)], np.iinfo(np.int64).min)
    labels = _labels(g)
    out = []
    for k in range(len(rep.step_start)):
        t_lo, t = int(rep.step_start[k]), int(rep.step_end[k])
        tm = int(g.step_end[k])  # t's measured time (host stretches are attributed by their measured times)
        tm_lo = int(g.step_start[k])
        kinds: Counter[str] = Counter()
        host: Counter[str] = Counter()
        names: Counter[str] = Counter()
        limit = len(rep.sync_end) - 1
        while t > t_lo:
            # the last synchronization over by t (never one already walked)
            j = min(int(np.searchsorted(rep.sync_end, t, side="right")) - 1, limit)
            if j < 0 or rep.sync_end[j] <= t_lo:
                _host(host, kinds, phases, rep, (t_lo, t), (tm_lo, tm))
                break
            _host(host, kinds, phases, rep, (int(rep.sync_end[j]), t), (int(syncs.end[j]), tm))
            s, e = int(rep.sync_start[j]), int(rep.sync_end[j])
            limit = j - 1
            ready = e - int(syncs.own[j])
            kinds["sync"] += max(e - max(ready, s), 0)
            a = _awaited(rep, j)
            if a < 0 or ready <= s:
                t, tm = s, int(syncs.start[j])
                continue
            # on the GPU: back through the chain of activities that ended at `ready`
            t_gpu = ready
            while a >= 0 and t_gpu > t_lo:
                start = int(rep.gpu_start[a])
                spent = t_gpu - max(start, t_lo)
                kinds[KIND_NAMES[int(gpu.kind[a])]] += spent
                names[labels[a]] += spent
                t_gpu = start
                if gpu.prev[a] >= 0 and prev_end[a] + gpu.gap[a] >= start:
                    kinds["gap"] += max(start - int(prev_end[a]), 0)
                    t_gpu = int(prev_end[a])
                    a = int(gpu.prev[a])
                elif gpu.after[a] >= 0 and after_end[a] + gpu.after_gap[a] >= start:
                    # it waited for work on another stream (an event) or before it in its CUDA graph
                    kinds["gap"] += max(start - int(after_end[a]), 0)
                    t_gpu = int(after_end[a])
                    a = int(gpu.after[a])
                else:
                    kinds["launch"] += int(gpu.latency[a])
                    t_gpu = int(launch_host[a])
                    break
            if a >= 0 and t_gpu < s:
                t, tm = t_gpu, int(gpu.launch[a])
            else:
                t, tm = min(t_gpu, s), int(syncs.start[j])
        step_ns = int(rep.step_end[k] - rep.step_start[k])
        names_top = [(name, round(v / 1e6, 3)) for name, v in names.most_common(top)]
        out.append(
            PathStep(
                step=int(g.step_number[k]),
                step_ms=round(step_ns / 1e6, 3),
                by_kind_ms={kind: round(kinds[kind] / 1e6, 3) for kind in PATH_KINDS if kinds[kind]},
                host_by_phase_ms={p: round(v / 1e6, 3) for p, v in host.items() if v and p != _COMPILED},
                top=names_top,
                host_compiled_ms=round(host[_COMPILED] / 1e6, 3),
            )
        )
    return out


def _labels(g: RankGraph) -> list[str]:
    """Each GPU activity's name on the path: a CUDA graph's activities as `<graph> > <kernel>`."""
    names, graphs = g.names, g.graph_names
    return [
        f"{graphs[k]} > {names[c]}" if k >= 0 else names[c]
        for c, k in zip(g.gpu.name.tolist(), g.gpu.graph.tolist(), strict=True)
    ]


def _awaited(rep: Replay, j: int) -> int:
    """The activity a synchronization waited for in the replay (the latest to end of what it awaits)."""
    syncs = rep.graph.syncs
    if syncs.awaits[j] < 0:
        return -1
    if syncs.stream[j] != -1:
        return int(syncs.awaits[j])
    n = int(syncs.launched[j])
    return int(np.argmax(rep.gpu_end[:n])) if n else -1


def _host(
    host: Counter[str],
    kinds: Counter[str],
    phases: dict,
    rep: Replay,
    span: tuple[int, int],
    measured: tuple[int, int],
) -> None:
    """Host time `span` of the replay on the path, by phase: the phases' measured intervals inside `measured` (the
    same stretch in the trace's time), each as long as the replay's clock makes it."""
    lo, hi = span
    if hi <= lo:
        return
    kinds["host"] += hi - lo
    m_lo, m_hi = measured
    covered = 0
    for phase, (start, end) in phases.items():
        a, b = np.maximum(start, m_lo), np.minimum(end, m_hi)
        keep = b > a
        if keep.any():
            part = int((rep.clock(b[keep]) - rep.clock(a[keep])).sum())
            host[phase] += part
            covered += part if phase != _COMPILED else 0  # (it overlaps the phases)
    if hi - lo - covered > 0:
        host["other"] += hi - lo - covered
