"""Many ranks: `stepscope analyze FOLDER --json` on generated rank folders, with 1 and 2 (or more) workers.

    .venv/bin/python benchmarks/bench_ranks.py --ranks 8 64 256 --jobs 1 2 --repeat 3

Each folder is made once by make_big_trace.py (--base, default the 1.8 MB rank 0 of hta_trace_filter, --copies
of it per rank, rank N // 2 slow) under --work. 32 ranks of 54 MB of JSON (issue #32's many-rank figure):

    .venv/bin/python benchmarks/bench_ranks.py --ranks 32 --copies 30 --jobs 2 --repeat 3
 Every run is a fresh process, timed from start to exit; the runs of
one folder alternate between the --jobs values round after round (paired), and the best time of the rounds is
kept. Peak RSS is the largest single process (`os.wait4`); CPU is the user + system time of the whole run, workers
included (the least of the rounds): on a shared machine, where wall time moves with the other jobs, it is the
figure to compare. Prints a markdown table: seconds, ms per rank, CPU seconds, the speed-up of each --jobs value
over the first, and the straggler found (it must be the slow rank).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import write_markdown_result

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT.parent / "shared" / "traces" / "hta_trace_filter" / "sampled_rank-0.json.gz"


def make_folder(work: Path, ranks: int, base: Path, copies: int = 1) -> Path:
    out = work / (f"ranks{ranks}" if copies == 1 else f"ranks{ranks}x{copies}")
    if not (out / f"rank{ranks - 1}.json.gz").exists():
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "make_big_trace.py"),
                "--ranks",
                str(ranks),
                "--copies",
                str(copies),
                "--slow-ms",
                "100",
                "--base",
                str(base),
                "--out",
                str(out),
            ],
            check=True,
        )
    return out


def _json_bytes(path: Path) -> int:
    """A gzip file's inflated size (its last 4 bytes: below 4 GiB a rank is), else its size."""
    with open(path, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b":
            return path.stat().st_size
        fh.seek(-4, os.SEEK_END)
        return int.from_bytes(fh.read(4), "little")


def run_once(stepscope: str, folder: Path, jobs: int) -> tuple[float, int, float, dict]:
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        child = subprocess.Popen(
            [stepscope, "analyze", str(folder), "--json", "--jobs", str(jobs)],
            stdout=out,
            stderr=subprocess.PIPE,
        )
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(
                f"{folder}: stepscope failed: {child.stderr.read().decode() if child.stderr else ''}"
            )
        out.seek(0)
        cpu = usage.ru_utime + usage.ru_stime  # (its waited-for workers included)
        return seconds, usage.ru_maxrss // 1024, cpu, json.loads(out.read())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--base", type=Path, default=BASE)
    parser.add_argument("--copies", type=int, default=1, help="copies of the base per rank file")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "stepscope-ranks")
    parser.add_argument("--stepscope", default=str(ROOT / ".venv" / "bin" / "stepscope"))
    args = parser.parse_args(argv)
    rows = []
    for n in args.ranks:
        folder = make_folder(args.work, n, args.base, args.copies)
        mb = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
        json_mb = sum(_json_bytes(f) for f in folder.iterdir()) / 1e6
        best: dict[int, float] = {}
        rss: dict[int, int] = {}
        cpus: dict[int, float] = {}
        straggler = None
        for _ in range(args.repeat):
            for jobs in args.jobs:
                seconds, peak, cpu, doc = run_once(args.stepscope, folder, jobs)
                best[jobs] = min(best.get(jobs, seconds), seconds)
                cpus[jobs] = min(cpus.get(jobs, cpu), cpu)
                rss[jobs] = max(rss.get(jobs, 0), peak)
                straggler = (doc.get("straggler") or {}).get("rank")
        first = args.jobs[0]
        cells = [
            f"{best[j]:.2f} s ({json_mb / best[j]:.0f} MB/s, {best[j] / n * 1e3:.0f} ms/rank, {rss[j]} MB, "
            f"CPU {cpus[j]:.2f} s)"
            for j in args.jobs
        ]
        speedups = [f"{best[first] / best[j]:.2f}x" for j in args.jobs[1:]]
        rows.append(
            f"| {n} | {mb:.1f} | {json_mb:.0f} | "
            + " | ".join(cells + speedups)
            + f" | {straggler} (slow: {n // 2}) |"
        )
        print(rows[-1], flush=True)
    head = ["ranks", "gz MB", "JSON MB"] + [
        f"--jobs {j}: best (JSON MB/s, per rank, peak RSS, CPU)" for j in args.jobs
    ]
    head += [f"{j} vs {args.jobs[0]}" for j in args.jobs[1:]] + ["straggler found"]
    print()
    print(f"`{' '.join([Path(sys.executable).name, *sys.argv])}`, {os.cpu_count()} CPUs\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    print("\n".join(rows))
    write_markdown_result(
        "bench_ranks",
        "analyze on many rank files, by --jobs",
        ["| " + " | ".join(head) + " |", "|---|", *rows],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
