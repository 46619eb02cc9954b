"""The watch (config watch=True, issue 45) on real jobs: false windows on a busy machine, slow steps caught.

`--steady N`: N runs of a steady job of `--steps` (2,000) steps beside a process that keeps one of the machine's
cores busy, for each of two jobs: one process training a small MLP (about 3 ms a step), and 2 gloo DDP ranks
(tests/support/jobs/watch.py, `steady`: about 12 ms a step). A window the watch opens there is a false one.

`--bursts N`: N runs of tests/support/jobs/watch.py on 2 and on 4 ranks, rank 1's data loading 50 ms slower for 5
steps from a step drawn between 100 and 400 (seeded): on every rank, whether a window recorded one of the slow steps
and within two checks (20 steps) of the first; whether analyze names rank 1's data loading with the 50 ms within
20%. `--every N`: N runs of 2 ranks slow every 50th step: whether a window began at a slow step.

Writes benchmarks/results/bench_watch.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import ROOT, write_result

sys.path.insert(0, str(ROOT))
from tests.support.windows import recorded_windows as windows_by_rank

JOB = ROOT / "tests" / "support" / "jobs" / "watch.py"
PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
STEADY_JOB = """
import sys, time, torch, stepscope
torch.manual_seed(0); torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 512)
mon = stepscope.performance_monitor(out_dir=sys.argv[1], watch=True, console=False, report=False)
with mon:
    for _ in range(int(sys.argv[2])):
        model(x).square().mean().backward(); opt.step(); opt.zero_grad()
        mon.step()
"""


def busy_core() -> subprocess.Popen[bytes]:
    """A process that keeps one core busy until it is killed."""
    return subprocess.Popen([PYTHON, "-c", "while True: pass"])


def run_dir_of(out: Path) -> Path:
    (found,) = [p for p in out.iterdir() if p.is_dir()]
    return found


def watch_records(run_dir: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted((run_dir / "watch").glob("rank*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def analyze(run_dir: Path) -> dict[str, Any]:
    done = subprocess.run(
        [PYTHON, "-m", "stepscope", "analyze", str(run_dir), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def steady(runs: int, steps: int) -> list[dict[str, Any]]:
    out = []
    for kind in ("1 process (MLP)", "2 gloo ranks (DDP)"):
        for i in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                hog = busy_core()
                t0 = time.perf_counter()
                try:
                    if kind.startswith("1"):
                        subprocess.run(
                            [PYTHON, "-c", STEADY_JOB, tmp, str(steps)], check=True, capture_output=True
                        )
                    else:
                        cmd = [
                            TORCHRUN,
                            "--standalone",
                            "--nproc_per_node",
                            "2",
                            str(JOB),
                            tmp,
                            "steady",
                            "0",
                        ]
                        subprocess.run([*cmd, str(steps)], check=True, capture_output=True)
                finally:
                    hog.kill()
                    hog.wait()
                seconds = time.perf_counter() - t0
                records = watch_records(run_dir_of(Path(tmp)))
                opened = [r for r in records if r["decision"] in ("window", "planned")]
                skipped = [r for r in records if r["decision"] == "skipped"]
                print(
                    f"steady, {kind}, run {i + 1}: {len(opened)} window(s), {len(skipped)} skipped, {seconds:.0f} s"
                )
                out.append(
                    {"job": kind, "run": i + 1, "steps": steps, "windows": len(opened), "skipped": len(skipped),
                     "why": [r["why"] for r in opened + skipped], "seconds": round(seconds, 1)}
                )  # fmt: skip
    return out


def bursts(runs: int) -> list[dict[str, Any]]:
    out = []
    for ranks in (2, 4):
        rng = random.Random(ranks)
        for i in range(runs):
            first = rng.randint(100, 400)
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [
                    TORCHRUN,
                    "--standalone",
                    "--nproc_per_node",
                    str(ranks),
                    str(JOB),
                    tmp,
                    "burst",
                    str(first),
                ]
                subprocess.run([*cmd, str(first + 60)], check=True, capture_output=True)
                run_dir = run_dir_of(Path(tmp))
                burst = set(range(first, first + 5))
                covered, delays = 0, []
                for found in windows_by_rank(run_dir).values():
                    hits = [w for w in found if set(w) & burst]
                    if hits:
                        covered += 1
                        delays.append(hits[0][0] - first)
                doc = analyze(run_dir)
                hit = [a for a in doc["run"]["anomalies"] if set(a["slow_steps"]) & burst]
                cause = hit[0] if hit else None
                named = (
                    cause is not None
                    and cause["cause_ranks"][:1] == [1]
                    and cause["cause_phase"] == "data_loader"
                    and abs(cause["cause_ms"] - 50.0) <= 10.0
                )
                row = {
                    "ranks": ranks, "run": i + 1, "first_slow_step": first, "ranks_covered": covered,
                    "window_from_first_slow_step": max(delays) if delays else None,
                    "cause": None if cause is None else cause["message"], "cause_ms": None if cause is None else cause["cause_ms"],
                    "named": named,
                }  # fmt: skip
                print(f"burst, {ranks} ranks, step {first}: {covered}/{ranks} ranks covered, named {named}")
                out.append(row)
    return out


def every(runs: int) -> list[dict[str, Any]]:
    out = []
    for i in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [TORCHRUN, "--standalone", "--nproc_per_node", "2", str(JOB), tmp, "every", "50", "500"]
            subprocess.run(cmd, check=True, capture_output=True)
            run_dir = run_dir_of(Path(tmp))
            slow = set(range(50, 500, 50))
            starts = {
                rank: [w[0] for w in found if w[0] in slow]
                for rank, found in windows_by_rank(run_dir).items()
            }
            doc = analyze(run_dir)
            hit = [a for a in doc["run"]["anomalies"] if set(a["slow_steps"]) & slow]
            row = {
                "run": i + 1, "ranks_from_a_slow_step": sum(1 for s in starts.values() if s),
                "first_slow_start": min((s[0] for s in starts.values() if s), default=None),
                "cause": hit[-1]["message"] if hit else None,
                # (what happened, rank by rank: the windows recorded and the watch's decisions)
                "windows": {str(r): [[w[0], w[-1]] for w in found] for r, found in windows_by_rank(run_dir).items()},
                "decisions": [(r["rank"], r["step"], r["decision"], r.get("reason")) for r in watch_records(run_dir)],
            }  # fmt: skip
            print(f"every 50 steps, run {i + 1}: {row['ranks_from_a_slow_step']}/2 ranks from a slow step")
            out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steady", type=int, default=5, help="runs of each steady job")
    parser.add_argument("--steps", type=int, default=2000, help="steps of a steady job")
    parser.add_argument("--bursts", type=int, default=5, help="runs of the burst job on 2 and on 4 ranks")
    parser.add_argument("--every", type=int, default=3, help="runs of the every-50th-step job")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    figures = {
        "steady": steady(args.steady, args.steps),
        "bursts": bursts(args.bursts),
        "every": every(args.every),
    }
    rows = []
    for job in ("1 process (MLP)", "2 gloo ranks (DDP)"):
        found = [r for r in figures["steady"] if r["job"] == job]
        rows.append(
            (f"steady, {job}, beside a busy core", f"{len(found)} runs x {args.steps:,} steps",
             f"{sum(r['windows'] for r in found)} windows in {len(found)} runs", "-")
        )  # fmt: skip
    for ranks in (2, 4):
        found = [r for r in figures["bursts"] if r["ranks"] == ranks]
        every_rank = sum(1 for r in found if r["ranks_covered"] == ranks)
        soon = [
            r["window_from_first_slow_step"] for r in found if r["window_from_first_slow_step"] is not None
        ]
        rows.append(
            (f"5 steps +50 ms, rank 1's data loading, {ranks} ranks", f"{len(found)} runs",
             f"{every_rank}/{len(found)} runs: a slow step recorded on every rank, "
             f"window from {min(soon, default='-')}-{max(soon, default='-')} steps after the first",
             f"{sum(1 for r in found if r['named'])}/{len(found)} named, cause "
             + ", ".join(f"{r['cause_ms']:.1f}" for r in found if r["cause_ms"] is not None) + " ms"),
        )  # fmt: skip
    found = figures["every"]
    rows.append(
        ("every 50th step +50 ms, 2 ranks", f"{len(found)} runs x 500 steps",
         f"{sum(1 for r in found if r['ranks_from_a_slow_step'] == 2)}/{len(found)} runs: a window from a slow step "
         "on every rank", "-"),
    )  # fmt: skip
    write_result(
        "bench_watch",
        "The watch: false windows on a busy machine, slow steps caught",
        ("job", "runs", "windows", "analyze's cause"),
        rows,
        figures=figures,
    )


if __name__ == "__main__":
    main()
