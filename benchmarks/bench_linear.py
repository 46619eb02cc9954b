"""Is every analysis linear in events and collectives? Each stage of `analyze`, timed by name on generated comm-heavy
traces of two sizes (the second --factor times the first), with the growth exponent log(t2/t1) / log(factor).

The traces come from make_comm_trace.py (a data-parallel step with all-reduces on their own stream, 14 events per
collective): one rank of plain c10d all-reduces, one rank where every other collective is a functional one (the
tensor-parallel path), and --ranks ranks with a slow one (the cross-rank stages: matching, stragglers, the coupled
replay). Every stage `analyze` calls (load_trace, prepare_rank, summarize_rank, rank_instances, price_by_replay,
the critical path's replay_job, ...) is wrapped with a timer in a fresh child process; a stage's time is the sum of
its calls, the best of --repeat children. A stage whose exponent exceeds 1.3 while it takes 5% or more of the
larger run is flagged SUPERLINEAR (a smaller one is flagged only in the notes: its noise is larger than its share).

    .venv/bin/python benchmarks/bench_linear.py [--collectives 25000] [--factor 4] [--ranks 8] [--repeat 2]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import write_result

# module -> the names `analyze` (and the critical path it computes) calls through it
STAGES = {
    "stepscope.analysis.analyze": (
        "prepare_rank", "summarize_rank", "keep_op_trees", "analyze_rank", "rank_instances", "rank_findings",
        "fsdp_rank", "rank_graph", "price_by_replay", "rank_pipeline", "expert_rank", "tensor_rank",
        "cross_rank_analysis", "collective_stats", "wait_intervals", "add_comm_waiting", "comm_findings",
        "straggler_findings", "pipeline_analysis", "group_across_ranks", "rank_by_cost", "dimensions", "couple",
        "replay_job", "job_critical_path", "summarize_path", "path_timeline",
    ),
}  # fmt: skip
SUPERLINEAR = 1.3  # exponent above which a stage is not linear (noise on 2 busy cores stays below)
SHARE = 0.05  # of the larger run's time: a stage below it is flagged in the notes only


def child(path: str) -> dict[str, float]:
    """Seconds per stage for one load + analyze (+ the JSON encoding) of `path`, in this process."""
    import importlib

    import msgspec

    times: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times[name] = times.get(name, 0.0) + time.perf_counter() - t0

        return wrapper

    for module_name, names in STAGES.items():
        module = importlib.import_module(module_name)
        for name in names:
            setattr(module, name, timed(name, getattr(module, name)))
    from stepscope.analysis.analyze import analyze
    from stepscope.analysis.read.loader import load_trace

    t0 = time.perf_counter()
    table = load_trace(Path(path))
    times["load_trace"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    result = analyze(table, drop_last_step=True)
    times["json encoding"] = -time.perf_counter()
    msgspec.json.encode(result)
    times["json encoding"] += time.perf_counter()
    times["analyze (all)"] = time.perf_counter() - t1
    times["total"] = time.perf_counter() - t0
    return times


def measure(path: Path, repeat: int) -> dict[str, float]:
    best: dict[str, float] = {}
    for _ in range(repeat):
        done = subprocess.run(
            [sys.executable, __file__, "--child", str(path)], check=True, capture_output=True, text=True
        )
        for name, seconds in json.loads(done.stdout.splitlines()[-1]).items():
            best[name] = min(best.get(name, math.inf), seconds)
    return best


def make(out: Path, collectives: int, extra: list[str]) -> str:
    here = Path(__file__).resolve().parent
    done = subprocess.run(
        [sys.executable, str(here / "make_comm_trace.py"), "--collectives", str(collectives), "--steps", "20",
         "--out", str(out), *extra],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collectives", type=int, default=25_000, help="collectives per rank, smaller size")
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=8, help="ranks of the multi-rank case (0: none)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    cases: list[tuple[str, list[str], int]] = [
        ("one rank, c10d all-reduces", [], args.collectives),
        ("one rank, half functional collectives", ["--functional", "2"], args.collectives),
    ]
    if args.ranks:
        cases.append(
            (f"{args.ranks} ranks, one slow", ["--ranks", str(args.ranks)], args.collectives // args.ranks)
        )
    rows: list[list[str]] = []
    figures: list[dict[str, Any]] = []
    notes = [
        f"Each case at two sizes, the second {args.factor}x the first; exponent = log(t2/t1) / log({args.factor}) "
        f"(1: linear, 2: quadratic); best of {args.repeat} fresh processes per size. SUPERLINEAR: exponent above "
        f"{SUPERLINEAR} on a stage taking {SHARE:.0%} or more of the larger run.",
    ]
    with tempfile.TemporaryDirectory(prefix="stepscope-linear-") as tmp:
        for case, extra, n in cases:
            sizes = (n, n * args.factor)
            described, timings = [], []
            for k, size in enumerate(sizes):
                out = Path(tmp) / (f"case{len(figures)}_{k}" + ("" if "--ranks" in extra else ".json"))
                described.append(make(out, size, extra))
                timings.append(measure(out, args.repeat))
                print(described[-1], file=sys.stderr)
            small, big = timings
            total = big["total"]
            stages = sorted(big, key=lambda s: -big[s])
            entry: dict[str, Any] = {"case": case, "sizes": sizes, "traces": described, "stages": {}}
            for stage in stages:
                t1, t2 = small.get(stage, 0.0), big[stage]
                exponent = math.log(t2 / t1) / math.log(args.factor) if t1 > 0 and t2 > 0 else None
                flag = ""
                if exponent is not None and exponent > SUPERLINEAR:
                    if stage in ("total", "analyze (all)") or t2 >= SHARE * total:
                        flag = "SUPERLINEAR"
                    else:
                        notes.append(
                            f"{case}: {stage} exponent {exponent:.2f} at {t2 * 1e3:.1f} ms (small share)"
                        )
                entry["stages"][stage] = {"small_s": t1, "big_s": t2, "exponent": exponent}
                if t2 < 0.01 * total and not flag:
                    continue  # (in the figures, not the table: under 1% of the run)
                rows.append(
                    [case, f"{sizes[0]:,} / {sizes[1]:,}", stage, f"{t1 * 1e3:,.1f} ms", f"{t2 * 1e3:,.1f} ms",
                     "-" if exponent is None else f"{exponent:.2f}", flag]
                )  # fmt: skip
            figures.append(entry)
    columns = ["case", "collectives per rank", "stage", "smaller", "larger", "exponent", ""]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    for note in notes:
        print(note)
    write_result(
        "bench_linear",
        "Every analysis linear in events and collectives",
        columns,
        rows,
        figures=figures,
        notes=notes,
    )
    flagged = [r for r in rows if r[-1]]
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
