"""Trace loading speed: gunzip alone, gunzip + typed msgspec decode (the floor), and `load_trace`.

gunzip is ISA-L's (python-isal) where installed, as in the loader; zlib's otherwise.

Run from the repository root (needs ../shared/traces):

    .venv/bin/python benchmarks/bench_load.py [--repeat 5] [--out FILE]

Each figure is the best of `--repeat` runs (the machine is shared, so the minimum is the least noisy);
MB/s are megabytes of decompressed JSON per second. Also loads a folder of six traces with and without the
process pool. Prints a markdown table (and writes it to FILE with --out).

Memory per event (`--memory FILE ...`, e.g. the tiny events of `make_big_trace.py --size 1G --tiny`): the peak RSS
of the largest process of `stepscope summary`, `analyze` and `diff FILE FILE`, each a fresh process, and the
same per event of the file and per GB of its JSON:

    .venv/bin/python benchmarks/bench_load.py --memory /tmp/big/tiny1g.json /tmp/big/1g.json
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from _results import write_markdown_result
from bench_analyze import gunzip  # (the same gunzip as the other floor; run from benchmarks/)

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / ".." / "shared" / "traces"
FILES = [
    "kineto_resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    "hta_ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta_nccl_parser_config/nccl_data.json.gz",
    "tracelens_qwen1.5_h100_mi300/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
]
FOLDER = [
    *FILES,
    "kineto_resnet50_num_workers_4/worker0.1623213129365.pt.trace.json.gz",
    "tracelens_qwen1.5_h100_mi300/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
]


def best_of(repeat: int, fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        del result
    return min(times)


def floor_decode(data: bytes) -> None:
    """The least a typed loader must do: parse into the loader's own Structs (GC off), then free them."""
    from stepscope.analysis.read._decode import _DECODER

    gc.disable()
    try:
        _DECODER.decode(data)
    finally:
        gc.enable()


def _discard(value: Any) -> None:
    del value


def peak_rss(command: list[str]) -> tuple[float, int]:
    """Seconds and peak RSS (bytes) of the largest process of `command` (its workers included, as wait4 counts
    them), its output discarded."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)}: {child.stderr.read().decode() if child.stderr else ''}")
    return time.perf_counter() - start, usage.ru_maxrss * 1024


def count_rows(path: Path) -> int:
    """The rows `analyze` loads from `path`, counted in a process of its own: a child forked from a process that
    held the table would start its peak RSS from this one's (Linux keeps the high-water mark across exec)."""
    code = "import sys; from stepscope.analysis.read.loader import load_trace as l; print(len(l(sys.argv[1], flows=False)))"
    done = subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True, text=True)
    return int(done.stdout)


def memory_table(files: list[Path]) -> list[str]:
    stepscope = str(REPO / ".venv" / "bin" / "stepscope")
    lines = [
        "| trace | JSON MB | events | command | time | peak RSS | per event | per GB of JSON |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for path in files:
        events = count_rows(path)
        with open(path, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
        mb = (len(gzip.decompress(path.read_bytes())) if gz else path.stat().st_size) / 1e6
        for name, command in (
            ("summary", [stepscope, "summary", str(path)]),
            ("analyze", [stepscope, "analyze", str(path)]),
            ("diff", [stepscope, "diff", str(path), str(path)]),
        ):
            seconds, peak = peak_rss(command)
            lines.append(
                f"| `{path.name}` | {mb:.0f} | {events:,} | {name} | {seconds:.1f} s | {peak / 2**20:.0f} MiB | "
                f"{peak / events:.0f} B | {peak / 2**20 / (mb / 1e3):.0f} MiB |"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-json", action="store_true", help="skip the json.loads baseline (slow)")
    parser.add_argument("--memory", nargs="+", type=Path, metavar="FILE", help="peak RSS per event instead")
    args = parser.parse_args()
    if args.memory:
        table = memory_table(args.memory)
        print("\n".join(table))
        write_markdown_result(
            "bench_load_memory", "Peak memory per event of summary, analyze and diff", table
        )
        return 0
    if not TRACES.is_dir():
        print(f"{TRACES} not found: the benchmark needs the shared traces", file=sys.stderr)
        return 2
    from stepscope.analysis.read.loader import load_trace

    lines = [
        f"Python {platform.python_version()}, msgspec {msgspec.__version__}, {os.cpu_count()} CPUs "
        f"({platform.machine()}), best of {args.repeat}.",
        "",
        "| trace | gz MB | JSON MB | events | gunzip | gunzip + typed decode (floor) | load_trace | "
        "load / floor | json.loads (dicts) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in FILES:
        path = TRACES / name
        raw = path.read_bytes()
        data = gzip.decompress(raw)
        mb = len(data) / 1e6
        t_gunzip = best_of(args.repeat, lambda raw=raw: gunzip(raw))
        t_floor = best_of(args.repeat, lambda raw=raw: floor_decode(gunzip(raw)))
        t_load = best_of(args.repeat, lambda path=path: load_trace(path))
        events = len(load_trace(path))
        t_json = (
            None
            if args.no_json
            else best_of(min(args.repeat, 2), lambda raw=raw: _discard(json.loads(gzip.decompress(raw))))
        )

        def cell(t: float | None, mb: float = mb) -> str:
            return "-" if t is None else f"{t * 1000:.0f} ms ({mb / t:.0f} MB/s)"

        lines.append(
            f"| `{name.split('/')[0]}` | {len(raw) / 1e6:.2f} | {mb:.1f} | {events:,} | {cell(t_gunzip)} | "
            f"{cell(t_floor)} | {cell(t_load)} | {t_load / t_floor:.2f}x | {cell(t_json)} |"
        )
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(FOLDER):
            os.symlink(TRACES / name, Path(tmp) / f"r{i}.json.gz")
        total = sum(len(gzip.decompress((TRACES / n).read_bytes())) for n in FOLDER) / 1e6
        serial = best_of(args.repeat, lambda: load_trace(tmp, workers=1))
        pooled = best_of(args.repeat, lambda: load_trace(tmp, workers=2))
    lines += [
        "",
        f"A folder of {len(FOLDER)} of these traces ({total:.0f} MB of JSON): serial {serial * 1000:.0f} ms "
        f"({total / serial:.0f} MB/s), process pool of 2 {pooled * 1000:.0f} ms ({total / pooled:.0f} MB/s), "
        f"pool / serial = {pooled / serial:.2f}x.",
    ]
    text = "\n".join(lines)
    print(text)
    write_markdown_result("bench_load", "Trace loading against gunzip and the typed-decode floor", lines)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
