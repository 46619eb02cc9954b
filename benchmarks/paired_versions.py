"""End-to-end `load_trace` + `analyze` time of two source trees, paired on the same traces (this machine is
noisy: each round runs both trees one after the other, in fresh processes; the best of the rounds is kept).

    git worktree add /tmp/old <commit>
    .venv/bin/python benchmarks/paired_versions.py --old /tmp/old/src [--rounds 5]

Needs ../shared/traces. Prints one line per trace: old, new, new / old.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

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
    args = parser.parse_args()
    trees = {"old": args.old, "new": str(REPO / "src")}
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


if __name__ == "__main__":
    main()
