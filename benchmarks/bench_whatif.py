"""`stepscope whatif` against `stepscope analyze` on about 50 MB of real GPU trace: is whatif within 2x analyze?

Each base trace (a real GPU trace of ../shared/traces) is repeated by make_big_trace.py until its JSON reaches
--size (each copy shifted by the base's span, with fresh ids and its ProfilerSteps renumbered), gzipped into a
temporary folder. Then, per round, `stepscope analyze BIG --json` and `stepscope whatif BIG --json` run one right
after the other, in fresh processes, the first of the two alternating between rounds, so that a busy machine
slows both alike; the wall time of each command is taken from the parent (what a user waits for). The table
gives each command's median over the rounds and the median (and range) of the rounds' whatif / analyze ratios.

    .venv/bin/python benchmarks/bench_whatif.py [--rounds 7] [--size 50M] [BASE ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import ROOT, write_result
from make_big_trace import Base, big_file, parse_size

TRACES = ROOT / ".." / "shared" / "traces"
DEFAULT_BASES = (
    "hta_ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "kineto_resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    "hta_nccl_parser_config/nccl_data.json.gz",
)
GOAL = 2.0  # issue #29: whatif within 2x the time of analyze


def run(command: str, path: Path) -> float:
    """Wall seconds of `stepscope COMMAND PATH --json` in a fresh process (its output read and dropped)."""
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "stepscope", command, str(path), "--json"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def measure(path: Path, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"analyze": [], "whatif": []}
    run("analyze", path)  # one of each unmeasured: the file in the page cache, the bytecode compiled
    run("whatif", path)
    for k in range(rounds):
        for command in ("analyze", "whatif") if k % 2 == 0 else ("whatif", "analyze"):
            times[command].append(run(command, path))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bases", nargs="*", help="real traces to repeat (default: three GPU traces)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=parse_size, default=parse_size("50M"), help="JSON per big file")
    args = parser.parse_args(argv)
    bases = [Path(b) for b in args.bases] or [TRACES / b for b in DEFAULT_BASES]
    header = ("base trace", "big file", "analyze s", "whatif s", "whatif / analyze (paired)", "within 2x")
    rows, figures = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for base_path in bases:
            big = Path(tmp) / (base_path.name.split(".")[0] + ".big.json.gz")
            base = Base(base_path)
            big_file(base, args.size, big)
            json_mb = _json_mb(big)
            times = measure(big, args.rounds)
            ratios = [w / a for w, a in zip(times["whatif"], times["analyze"], strict=True)]
            a, w, r = (statistics.median(x) for x in (times["analyze"], times["whatif"], ratios))
            name = (
                str(base_path.resolve().relative_to(TRACES.resolve()))
                if base_path.is_relative_to(TRACES)
                else base_path.name
            )
            rows.append(
                (
                    name,
                    f"{json_mb:.1f} MB of JSON, {_steps(big)} ProfilerSteps",
                    f"{a:.2f}",
                    f"{w:.2f}",
                    f"{r:.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                    "yes" if r <= GOAL else "NO",
                )
            )
            figures.append({"base": name, "json_mb": json_mb, "times_s": times, "ratios": ratios})
            print(" | ".join(rows[-1]), file=sys.stderr)
    write_result(
        "bench_whatif",
        "whatif against analyze on about 50 MB of trace",
        header,
        rows,
        figures=figures,
        notes=[f"Wall time of each command in a fresh process, median of {args.rounds} paired rounds."],
    )
    return 0 if all(row[-1] == "yes" for row in rows) else 1


def _json_mb(path: Path) -> float:
    import gzip

    with gzip.open(path, "rb") as fh:
        return sum(len(chunk) for chunk in iter(lambda: fh.read(1 << 20), b"")) / 1e6


def _steps(big: Path) -> int:
    import gzip
    import re

    with gzip.open(big, "rb") as fh:
        return len(set(re.findall(rb'"ProfilerStep#(\d+)"', fh.read())))


if __name__ == "__main__":
    sys.exit(main())
