"""Runs Holistic Trace Analysis (HTA) inside HTA's own virtual environment; never imported by stepscope.

Usage: <hta-venv>/bin/python _hta_runner.py compare|bench SPEC.json
SPEC: {"files": {"<rank>": "<path>", ...}, "include_last_step": false}
Prints one JSON object on stdout: per-rank temporal breakdown and overlap (compare), or timings and peak RSS of
TraceAnalysis construction + temporal + idle + overlap + kernel breakdown (bench).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time
import warnings


def peak_rss_mb() -> float:
    """Peak RSS of this process image (VmHWM: unlike ru_maxrss it is not inherited across fork+exec), or of its
    largest worker process when HTA parsed ranks in a pool."""
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024


def main() -> None:
    mode, spec_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from hta.trace_analysis import TraceAnalysis

    files = {int(rank): path for rank, path in spec["files"].items()}
    trace_dir = os.path.commonpath([os.path.dirname(p) for p in files.values()])
    out: dict[str, object] = {}
    t0 = time.perf_counter()
    try:
        analysis = TraceAnalysis(
            trace_files=files,
            trace_dir=trace_dir,
            include_last_profiler_step=spec.get("include_last_step", False),
        )
        t1 = time.perf_counter()
        temporal = analysis.get_temporal_breakdown(visualize=False)
        overlap = analysis.get_comm_comp_overlap(visualize=False)
        if mode == "bench":
            analysis.get_idle_time_breakdown(ranks=sorted(files), visualize=False)
            analysis.get_gpu_kernel_breakdown(visualize=False)
        t2 = time.perf_counter()
    except Exception as exc:  # HTA's own failure is a result here, not a crash of the comparison
        out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    else:
        ranks = {}
        for row in temporal.to_dict(orient="records"):
            ranks[int(row["rank"])] = {
                "idle_pct": float(row["idle_time_pctg"]),
                "compute_pct": float(row["compute_time_pctg"]),
                "non_compute_pct": float(row["non_compute_time_pctg"]),
                "span_us": float(row["kernel_time(us)"]),
            }
        for row in overlap.to_dict(orient="records"):
            value = float(row["comp_comm_overlap_pctg"])
            ranks.setdefault(int(row["rank"]), {})["overlap_pct"] = None if value != value else value
        out["ranks"] = ranks
        out["load_s"] = t1 - t0
        out["analyses_s"] = t2 - t1
    out["total_s"] = time.perf_counter() - t0
    out["peak_rss_mb"] = peak_rss_mb()
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
