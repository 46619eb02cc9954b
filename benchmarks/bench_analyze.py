"""Speed and peak memory of `stepscope analyze` against HTA 0.5.0 and against the gunzip + typed-decode floor.

Each measurement runs in a fresh child process (peak RSS is that process's own); times are taken inside the child
around the work (imports excluded) and, from the parent, for the whole process. Sides alternate per trace so a
busy machine slows them alike; compare ratios within one run. Besides the ratio of the bests, the "paired"
column gives HTA / stepscope of each round's two runs, made one right after the other: median and range.

    python3 -m venv /work/hta-venv && /work/hta-venv/bin/pip install holistictraceanalysis 'pandas<3'
    .venv/bin/python benchmarks/bench_analyze.py [--repeat 3] [--hta-python /work/hta-venv/bin/python] [SET ...]

stepscope: load_trace + analyze (every analysis, last step dropped as HTA does) + JSON encoding of the result.
HTA: TraceAnalysis construction + temporal breakdown + idle time breakdown (all ranks) + comm/comp overlap +
GPU kernel breakdown. Floor: gunzip (ISA-L's where installed, as the loader's) + msgspec decode of the events
into typed Structs, nothing else.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from _results import write_result

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / ".." / "shared" / "traces"
# the larger shared sets (a folder is one multi-rank job)
DEFAULT_SETS = (
    "kineto_resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    "hta_ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta_nccl_parser_config/nccl_data.json.gz",
    "tracelens_qwen1.5_h100_mi300/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "hta_trace_filter",
)


def gunzip(data: bytes) -> bytes:
    """The fastest gunzip stepscope's loader has: ISA-L's where installed (as the loader uses), else zlib's."""
    try:
        from isal import igzip
    except ImportError:
        return gzip.decompress(data)
    return igzip.decompress(data)


def trace_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.name.endswith((".json", ".json.gz")))
    return [path]


def json_bytes(path: Path) -> int:
    total = 0
    for f in trace_files(path):
        raw = f.read_bytes()
        total += len(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return total


# --- the floor: what any typed decoder must do at least ---------------------------------------------
class _FloorArgs(msgspec.Struct):
    stream: int | float | str | None = None
    device: int | float | str | None = None
    correlation: int | float | str | None = None
    external_id: int | float | str | None = msgspec.field(default=None, name="External id")
    nbytes: int | float | str | None = msgspec.field(default=None, name="bytes")


class _FloorEvent(msgspec.Struct):
    ph: str = ""
    name: str | None = None
    cat: str | None = None
    pid: int | float | str | None = None
    tid: int | float | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: _FloorArgs | None = None


class _FloorTrace(msgspec.Struct):
    traceEvents: list[_FloorEvent]


def peak_rss_mb() -> float:
    """Peak RSS of this process image (VmHWM is not inherited across fork+exec, unlike ru_maxrss), or of its
    largest worker process when the loader used a pool."""
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024


# --- children ---------------------------------------------------------------------------------------
def child_ours(path: Path) -> dict[str, Any]:
    """load_trace + analyze + the JSON encoding `stepscope analyze --json` does."""
    from stepscope.analysis.analyze import analyze
    from stepscope.analysis.read.loader import load_trace

    t0 = time.perf_counter()
    table = load_trace(path)
    t1 = time.perf_counter()
    result = analyze(table, drop_last_step=True)
    msgspec.json.encode(result)
    t2 = time.perf_counter()
    return {"load_s": t1 - t0, "analyses_s": t2 - t1, "total_s": t2 - t0}


def child_floor(path: Path) -> dict[str, Any]:
    """gunzip + typed decode of the fields an analysis needs; nothing is built from them."""
    decoder = msgspec.json.Decoder(_FloorTrace)
    t0 = time.perf_counter()
    n = 0
    for f in trace_files(path):
        raw = f.read_bytes()
        data = gunzip(raw) if raw[:2] == b"\x1f\x8b" else raw
        gc.disable()
        try:
            n += len(decoder.decode(data).traceEvents)
        finally:
            gc.enable()
    return {"total_s": time.perf_counter() - t0, "events": n}


def run_child(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one measurement process; its own JSON report (with its peak RSS) plus its wall time seen from here."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    result: dict[str, Any] = (
        json.loads(lines[-1]) if lines else {"error": f"no output (exit {proc.returncode})"}
    )
    result["process_s"] = wall
    return result


def measure(kind: str, path: Path, hta_python: str) -> dict[str, Any]:
    if kind == "hta":
        spec = ROOT / "benchmarks" / f".bench_spec_{os.getpid()}.json"
        files = trace_files(path)
        spec.write_text(json.dumps({"files": {str(i): str(f) for i, f in enumerate(files)}}))
        try:
            argv = [hta_python, str(ROOT / "benchmarks" / "_hta_runner.py"), "bench", str(spec)]
            result = run_child(argv, env={**os.environ, "HTA_DISABLE_NS_ROUNDING": "0"})
            if "error" in result:
                retry = run_child(argv, env={**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"})
                if "error" not in retry:
                    retry["note"] = "HTA_DISABLE_NS_ROUNDING=1"
                    result = retry
        finally:
            spec.unlink()
        return result
    return run_child([sys.executable, __file__, "--child", kind, str(path)])


def paired(runs: dict[str, list[dict[str, Any]]]) -> list[float]:
    """HTA / stepscope of the runs made one right after the other (same round): on a machine whose speed
    drifts, a pair shares the drift that separate bests do not."""
    return sorted(
        h["total_s"] / o["total_s"]
        for o, h in zip(runs["ours"], runs["hta"], strict=False)
        if "error" not in o and "error" not in h
    )


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    top = min(ok, key=lambda r: r["total_s"])
    return {**top, "peak_rss_mb": max(r["peak_rss_mb"] for r in ok)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sets", nargs="*", default=list(DEFAULT_SETS), help="paths under ../shared/traces")
    parser.add_argument("--repeat", type=int, default=3, help="runs of stepscope and the floor (best kept)")
    parser.add_argument("--hta-repeat", type=int, default=1)
    parser.add_argument("--hta-python", default="/work/hta-venv/bin/python")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, path = args.child
        result = (child_ours if kind == "ours" else child_floor)(Path(path))
        result["peak_rss_mb"] = peak_rss_mb()
        print(json.dumps(result))
        return 0

    rows = []
    for name in args.sets:
        path = (TRACES / name).resolve()
        if not path.exists():
            print(f"skip {name}: not found", file=sys.stderr)
            continue
        mb = json_bytes(path) / 1e6
        runs: dict[str, list[dict[str, Any]]] = {"floor": [], "ours": [], "hta": []}
        for i in range(max(args.repeat, args.hta_repeat)):
            for kind in ("floor", "ours", "hta"):
                if i < (args.hta_repeat if kind == "hta" else args.repeat):
                    runs[kind].append(measure(kind, path, args.hta_python))
        row = {"set": name, "json_mb": mb, **{k: best(v) for k, v in runs.items()}, "paired": paired(runs)}
        row["runs"] = runs
        rows.append(row)
        _print_row(row)
    header, lines, notes = _table(rows)
    _print_table(header, lines, notes)
    write_result(
        "bench_analyze",
        "stepscope analyze against HTA and the decode floor",
        header,
        lines,
        figures=rows,
        notes=notes,
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def _print_row(row: dict[str, Any]) -> None:
    parts = [f"{row['set']}: {row['json_mb']:.1f} MB JSON"]
    for kind in ("floor", "ours", "hta"):
        r = row[kind]
        parts.append(
            f"{kind} " + (r["error"] if "error" in r else f"{r['total_s']:.3f}s {r['peak_rss_mb']:.0f}MB")
        )
    print("  ".join(parts), file=sys.stderr)


def _time(r: dict[str, Any], mb: float) -> str:
    return "fails" if "error" in r else f"{r['total_s']:.3f} ({mb / r['total_s']:.0f})"


def _paired(ratios: list[float]) -> str:
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.1f}x ({ratios[0]:.1f}-{ratios[-1]:.1f})"


def _table(rows: list[dict[str, Any]]) -> tuple[tuple[str, ...], list[tuple[str, ...]], list[str]]:
    header = (
        "trace set",
        "JSON MB",
        "floor s (MB/s)",
        "stepscope s (MB/s)",
        "HTA s (MB/s)",
        "HTA/stepscope",
        "paired: median (min-max)",
        "RSS floor/stepscope/HTA MB",
        "stepscope/HTA RSS",
        "stepscope load / analyses s",
        "process s stepscope/HTA",
    )
    lines = []
    for row in rows:
        f, o, h = row["floor"], row["ours"], row["hta"]
        mb = row["json_mb"]

        ok = "error" not in h and "error" not in o
        lines.append(
            (
                row["set"].split("/")[0] + (" *" if h.get("note") else ""),
                f"{mb:.1f}",
                _time(f, mb),
                _time(o, mb),
                _time(h, mb),
                f"{h['total_s'] / o['total_s']:.1f}x" if ok else "-",
                _paired(row["paired"]),
                f"{f['peak_rss_mb']:.0f} / {o['peak_rss_mb']:.0f} / {h['peak_rss_mb']:.0f}",
                f"{100 * o['peak_rss_mb'] / h['peak_rss_mb']:.0f}%" if ok else "-",
                f"{o['load_s']:.3f} / {o['analyses_s']:.3f}" if "error" not in o else "-",
                f"{o['process_s']:.2f} / {h['process_s']:.2f}",
            )
        )
    notes = []
    if any(row["hta"].get("note") for row in rows):
        notes.append("* HTA failed with its default ns rounding and was run with HTA_DISABLE_NS_ROUNDING=1")
    return header, lines, notes


def _print_table(header: tuple[str, ...], lines: list[tuple[str, ...]], notes: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *lines]) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in lines:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
    print("\n".join(notes))


if __name__ == "__main__":
    sys.exit(main())
