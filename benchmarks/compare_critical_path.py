"""Compare our critical path (`stepscope whatif --json`) with HTA 0.5.0's on every trace set in ../shared/traces.

HTA runs in its own virtual environment (it is never a stepscope dependency):
    python3 -m venv /work/hta-venv && /work/hta-venv/bin/pip install holistictraceanalysis 'pandas<3'
    .venv/bin/python benchmarks/compare_critical_path.py [--hta-python PY] [--timeout 300] [--traces DIR]

One step per rank: the second ProfilerStep of the trace (the first where there is one only; HTA advises against
the first), as HTA's `critical_path_analysis(rank, "ProfilerStep", instance)` with the instance that is that
step, and as the step of the same number in our `critical_path`. A trace without ProfilerSteps is compared on
its whole span (HTA's annotation ""; our one window). Both paths are mapped to common kinds, in ms and in % of
the path: host (HTA's cpu_bound; our host), compute (gpu_compute_bound on kernels; computation), communication,
memory (copies and fills: HTA's gpu_compute_bound on gpu_memcpy / gpu_memset), launch (HTA's kernel launch
overhead; our launch latency), gap (HTA's kernel-kernel overhead; our gaps between a stream's activities), sync
(our synchronizations' own time; HTA gives synchronizations no weight). Where HTA raises, finds no path or
runs past --timeout, that is the row's result.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from tests.support.traces import SHARED_TRACES  # noqa: E402

from _results import write_result  # noqa: E402
from compare_hta import trace_units  # noqa: E402

KINDS = ("host", "compute", "communication", "memory", "launch", "gap", "sync")
HTA_KINDS = {
    "cpu_bound": "host",
    "gpu_compute_bound": "compute",
    "gpu_communication_bound": "communication",
    "gpu_memory": "memory",
    "gpu_kernel_launch_overhead": "launch",
    "gpu_kernel_kernel_overhead": "gap",
}
OUR_KINDS = {"computation": "compute"}
# not raw traces of a run: HTA's own output (the input plus its critical_path events)
SKIP = ("hta_critical_path/end_to_end/simple_add/output/",)


def ours(path: Path) -> dict:
    """`stepscope whatif PATH --json`, with the wall time of the command."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope", "whatif", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail[:200], "wall_s": took}
    doc: dict = json.loads(proc.stdout)
    doc["wall_s"] = took
    return doc


def pick_step(rank_doc: dict) -> dict:
    """The step compared: the second of the window where there are two or more, else the only one."""
    steps = rank_doc["critical_path"]
    return steps[1] if len(steps) > 1 else steps[0]


def run_hta(hta_python: str, files: dict[int, Path], rank: int, step: str | None, timeout: float) -> dict:
    """HTA's critical path of `step` on `rank`, from a subprocess in HTA's venv (benchmarks/_hta_critical_path.py)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec:
        json.dump({"files": {str(r): str(p) for r, p in files.items()}, "rank": rank, "step": step}, spec)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [hta_python, str(ROOT / "benchmarks" / "_hta_critical_path.py"), spec.name],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - t0}
    finally:
        Path(spec.name).unlink()
    took = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"runner failed: {tail[:200]}", "wall_s": took}
    result: dict = json.loads(lines[-1])
    result["wall_s"] = took
    return result


def hta_kinds(hta: dict) -> dict[str, float]:
    """HTA's edges' time (us) as ms by common kind."""
    out = dict.fromkeys(KINDS, 0.0)
    for bound, us in hta.get("by_bound_us", {}).items():
        if bound in HTA_KINDS:
            out[HTA_KINDS[bound]] += us / 1e3
    return out


def our_kinds(step: dict) -> dict[str, float]:
    out = dict.fromkeys(KINDS, 0.0)
    for kind, ms in step["by_kind_ms"].items():
        out[OUR_KINDS.get(kind, kind)] += ms
    return out


def _cells(kinds: dict[str, float]) -> list[str]:
    total = sum(kinds.values())
    cells = [f"{kinds[k]:.3g} ({100 * kinds[k] / total:.0f}%)" if kinds[k] and total else "-" for k in KINDS]
    return [f"{total:.4g}", *cells]


def compare(hta_python: str, root: Path, timeout: float) -> tuple[list[list[str]], list[dict]]:
    rows: list[list[str]] = []
    records: list[dict] = []
    seen: set[str] = set()
    for label, files in trace_units(root):
        if label.startswith(SKIP):
            continue
        digest = hashlib.sha1(b"".join(p.read_bytes() for p in files.values())).hexdigest()
        if digest in seen:
            continue  # a byte-identical copy of a unit already compared
        seen.add(digest)
        for rank, path in sorted(files.items()):
            mine = ours(path)
            if "error" in mine or not mine.get("ranks"):
                records.append({"trace": label, "rank": rank, "ours": mine, "hta": None})
                continue
            rank_doc = mine["ranks"][0]
            has_steps = has_profiler_steps(path)
            step = pick_step(rank_doc)
            name = f"ProfilerStep#{step['step']}" if has_steps else None
            hta = run_hta(hta_python, files, rank, name, timeout)
            mine_kinds = our_kinds(step)
            theirs = None if "error" in hta else hta_kinds(hta)
            where = name or "whole trace"
            records.append(
                {
                    "trace": label,
                    "rank": rank,
                    "step": where,
                    "step_ms": step["step_ms"],
                    "ours": {
                        "path_ms": round(sum(mine_kinds.values()), 3),
                        "by_kind_ms": mine_kinds,
                        "host_by_phase_ms": step["host_by_phase_ms"],
                        "top": step["top"],
                        "whatif_wall_s": round(mine["wall_s"], 3),
                    },
                    "hta": hta if theirs is None else {**hta, "by_kind_ms": theirs},
                }
            )
            step_cell = f"{where} ({step['step_ms']:.3g} ms)"
            rows.append(
                [label, str(rank), step_cell, "stepscope", *_cells(mine_kinds), f"{mine['wall_s']:.2f}"]
            )
            if theirs is None:
                rows.append(
                    [
                        label,
                        str(rank),
                        step_cell,
                        "HTA",
                        "-",
                        f"fails: {hta['error']}",
                        *[""] * 6,
                        f"{hta['wall_s']:.2f}",
                    ]
                )
            else:
                rows.append([label, str(rank), step_cell, "HTA", *_cells(theirs), f"{hta['wall_s']:.2f}"])
            print(" | ".join(rows[-2]), file=sys.stderr)
            print(" | ".join(rows[-1]), file=sys.stderr)
    return rows, records


def has_profiler_steps(path: Path) -> bool:
    from stepscope.analysis.read.loader import load_trace

    return any(n.startswith("ProfilerStep#") for n in load_trace(path).names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hta-python", default="/work/hta-venv/bin/python")
    parser.add_argument("--traces", type=Path, default=SHARED_TRACES)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds HTA may take on one rank")
    args = parser.parse_args(argv)
    if not args.traces.is_dir():
        print(f"no traces at {args.traces}", file=sys.stderr)
        return 2
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    rows, records = compare(args.hta_python, args.traces.resolve(), args.timeout)
    header = ("trace", "rank", "step (ms)", "tool", "path ms", *(f"{k} ms (%)" for k in KINDS), "time s")
    write_result(
        "compare_critical_path",
        "Critical path against HTA",
        header,
        rows,
        figures=records,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
