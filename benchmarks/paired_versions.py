"""End-to-end `load_trace` + `analyze` time of two source trees, paired on the same traces (this machine is
noisy: each round runs both trees one after the other, in fresh processes; the best of the rounds is kept).

    git worktree add /tmp/old <commit>
    .venv/bin/python benchmarks/paired_versions.py --old /tmp/old/src [--rounds 5]
    .venv/bin/python benchmarks/paired_versions.py --old /tmp/old/src --cli [--rounds 11] [--name NAME]

Needs ../shared/traces. Prints one line per trace: old, new, new / old. With --cli: whole processes of
`stepscope analyze TRACE --json` (each tree on PYTHONPATH, the cache of decoded tables off), the two trees in turn
in each round, their order flipped round by round; medians of each tree's times and of the paired ratios, written
to benchmarks/results/NAME.json (default paired_versions_cli).
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import write_result

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / ".." / "shared" / "traces"
CASES = [
    "kineto_resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    "hta_ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta_nccl_parser_config/nccl_data.json.gz",
    "hta_trace_filter",
]
CODE = """
import sys, time
sys.path.insert(0, sys.argv[1])
from stepscope.analysis.read.loader import load_trace
from stepscope.analysis.analyze import analyze
start = time.perf_counter()
analyze(load_trace(sys.argv[2], workers=1))
print(time.perf_counter() - start)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="src/ folder of the other tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cli", action="store_true", help="whole `stepscope analyze --json` processes")
    parser.add_argument("--name", default="paired_versions_cli", help="results file of --cli")
    args = parser.parse_args()
    trees = {"old": args.old, "new": str(REPO / "src")}
    if args.cli:
        whole_processes(trees, args.rounds, args.name)
        return
    for case in CASES:
        best = {tag: float("inf") for tag in trees}
        for _ in range(args.rounds):
            for tag, src in trees.items():
                out = subprocess.run(
                    [sys.executable, "-c", CODE, src, str(TRACES / case)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                best[tag] = min(best[tag], float(out.stdout))
        print(
            f"{case.split('/')[0]:34} old {best['old']:.3f} s  new {best['new']:.3f} s  {best['new'] / best['old']:.2f}x"
        )


def _process_seconds(src: str, trace: Path) -> float:
    env = {**os.environ, "PYTHONPATH": src, "STEPSCOPE_NO_CACHE": "1"}
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "stepscope", "analyze", str(trace), "--json"],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    _, status, _ = os.wait4(child.pid, 0)  # (not subprocess.run's timeout: it polls, in steps of up to 50 ms)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"analyze {trace} with {src}: exit {child.returncode}")
    return seconds


def whole_processes(given: dict[str, str], rounds: int, name: str) -> None:
    # both trees copied side by side into one new folder: where a tree lies changes its imports' cost (a tree under
    # /tmp against the repository's own: 25% of a whole process here), and their bytecode is compiled alike
    with tempfile.TemporaryDirectory(prefix="stepscope-paired-") as tmp:
        trees = {}
        for tag, src in given.items():
            trees[tag] = str(Path(tmp, tag, "src"))
            shutil.copytree(src, trees[tag], ignore=shutil.ignore_patterns("__pycache__"))
            # compiled as pip compiles an installed package: where PYTHONDONTWRITEBYTECODE is set (as on our
            # machines) the warm-up wrote none, every process compiled what it imported, and the larger tree
            # paid for its size (1.12x against 1.08x of the same trees compiled)
            compileall.compile_dir(trees[tag], quiet=1)
        _whole_processes(given, trees, rounds, name)


def _whole_processes(given: dict[str, str], trees: dict[str, str], rounds: int, name: str) -> None:
    rows, figures = [], {}
    for case in CASES:
        trace = TRACES / case
        for tag in trees:  # (a warm-up of each: the file in the page cache)
            _process_seconds(trees[tag], trace)
        times: dict[str, list[float]] = {tag: [] for tag in trees}
        for k in range(rounds):
            for tag in trees if k % 2 == 0 else reversed(list(trees)):
                times[tag].append(_process_seconds(trees[tag], trace))
        ratios = [new / old for new, old in zip(times["new"], times["old"], strict=True)]
        old, new = statistics.median(times["old"]), statistics.median(times["new"])
        row = [case.split("/")[0], f"{old:.3f} s", f"{new:.3f} s", f"{statistics.median(ratios):.2f}",
               f"{min(ratios):.2f}-{max(ratios):.2f}"]  # fmt: skip
        print(" | ".join(row), flush=True)
        rows.append(row)
        figures[case] = times
    write_result(
        name,
        "Whole `stepscope analyze --json` processes of two source trees",
        ["trace", "old, median", "new, median", "new / old, paired median", "paired range"],
        rows,
        figures=figures,
        notes=[
            f"old: {given['old']}; new: {given['new']} (both copied into one temporary folder); {rounds} rounds, "
            "the order flipped each round"
        ],
    )


if __name__ == "__main__":
    main()
