"""Runs HTA's critical path analysis inside HTA's own virtual environment, for compare_critical_path.py; never
imported by stepscope.

Usage: <hta-venv>/bin/python _hta_critical_path.py SPEC.json
SPEC: {"files": {"<rank>": "<path>", ...}, "rank": R, "step": "ProfilerStep#N" or null}
Prints one JSON object on stdout: the critical path of that step of rank R (TraceAnalysis.critical_path_analysis
with annotation "ProfilerStep" and the instance that is step N; step null: annotation "", the whole trace), its
edges' time by HTA's `bound_by` (with
gpu_compute_bound split by the edge's category: kernels, copies, fills), the step's and the path's span, the
longest cpu_bound events and the time taken; or {"error": ...} where HTA raises or finds no path.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from collections import Counter


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    out: dict[str, object] = {}
    try:
        out.update(_critical_path(spec))
    except Exception as exc:  # HTA's own failure is a result here, not a crash of the comparison
        out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    out["total_s"] = round(time.perf_counter() - t0, 3)
    sys.stdout.write(json.dumps(out) + "\n")


def _critical_path(spec: dict) -> dict[str, object]:
    from hta.trace_analysis import TraceAnalysis

    files = {int(rank): path for rank, path in spec["files"].items()}
    rank, step = int(spec["rank"]), spec["step"]
    trace_dir = os.path.commonpath([os.path.dirname(p) for p in files.values()])
    t0 = time.perf_counter()
    # the last step kept: the step compared may be the last, and its GPU work may end after it
    analysis = TraceAnalysis(trace_files=files, trace_dir=trace_dir, include_last_profiler_step=True)
    t1 = time.perf_counter()
    df = analysis.t.get_trace(rank)
    sym = analysis.t.symbol_table.get_sym_id_map()
    if step is None:
        return _path(
            analysis, rank, "", 0, int(df.ts.min()), int((df.ts + df.dur).max() - df.ts.min()), t1 - t0
        )
    # HTA picks the instance by position among every event whose name contains the annotation, in the
    # frame's order (GPU-side ProfilerStep annotations included): find the position of the host's step N
    ids = [v for k, v in sym.items() if "ProfilerStep" in k]
    annotations = df[df.name.isin(ids)].reset_index(drop=True)
    wanted = annotations[(annotations.name == sym.get(step, -1)) & (annotations.stream == -1)]
    if wanted.empty:
        return {"error": f"no {step} on the host in HTA's frame of rank {rank}"}
    instance = int(wanted.index[0])
    return _path(
        analysis, rank, "ProfilerStep", instance, int(wanted.ts.iloc[0]), int(wanted.dur.iloc[0]), t1 - t0
    )


def _path(analysis, rank: int, annotation: str, instance: int, step_ts: int, step_dur: int, load_s: float):
    sym = analysis.t.symbol_table.get_sym_id_map()
    t1 = time.perf_counter()
    result = analysis.critical_path_analysis(rank=rank, annotation=annotation, instance_id=instance)
    t2 = time.perf_counter()
    if result is None:
        return {"error": "critical_path_analysis returned nothing (annotation not found)"}
    graph, ok = result
    if not ok:
        return {"error": "critical path algorithm failed (graph invalid or cyclic)"}
    edges = graph.get_critical_path_breakdown()
    cats = {v: k for k, v in sym.items()}
    by_bound: Counter[str] = Counter()
    cpu_names: Counter[str] = Counter()
    for row in edges.itertuples(index=False):
        bound = row.bound_by or "dependency"
        if bound == "gpu_compute_bound" and cats.get(row.cat, "") in ("gpu_memcpy", "gpu_memset"):
            bound = "gpu_memory"
        by_bound[bound] += int(row.duration)
        if row.bound_by == "cpu_bound":
            cpu_names[str(row.s_name)] += int(row.duration)
    nodes = [graph.node_list[n] for n in graph.critical_path_nodes]
    return {
        "instance_id": instance,
        "step_us": step_dur,
        "step_start_us": step_ts,
        "path_start_us": int(nodes[0].ts),
        "path_end_us": int(nodes[-1].ts),
        "path_us": int(edges.duration.sum()),
        "by_bound_us": dict(by_bound),
        "edges": len(edges),
        "graph_nodes": graph.number_of_nodes(),
        "cpu_top": cpu_names.most_common(5),
        "load_s": round(load_s, 3),
        "critical_path_s": round(t2 - t1, 3),
    }


if __name__ == "__main__":
    main()
