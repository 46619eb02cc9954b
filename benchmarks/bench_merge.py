"""Memory and time of `stepscope merge` on millions of events (docs/scale.md, "Merge").

Writes RANKS gzip'd rank files of EVENTS small events each (CPU ops and kernels with args, about 150 bytes
of JSON each), then runs `stepscope merge` on them in a child and prints its peak RSS and wall time, and the
events in the merged file. `--against SRC` runs another version's `src` folder (e.g. one made by `git archive
REV src | tar -x -C /tmp/rev`) in turn with this one, `--rounds` times, for a paired comparison:

    .venv/bin/python benchmarks/bench_merge.py --events 5000000 --ranks 2 --out /tmp/merge-bench
    .venv/bin/python benchmarks/bench_merge.py --events 1000000 --out /tmp/merge-bench --against /tmp/rev/src
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import time
from pathlib import Path

from _results import write_result

# Runs the command given as its arguments and prints its exit status, peak RSS (KiB) and CPU seconds (user +
# system): a child forked from this small process reports its own peak, not the parent's.
PEAK_OF = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[1:])\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss, usage.ru_utime + usage.ru_stime)\n"
)


def write_rank(path: Path, rank: int, events: int, world: int) -> None:
    """`events` events of one rank: ProfilerSteps of 1,000 events, ops on thread 1, kernels on stream 7."""
    head = (
        f'{{"schemaVersion":1,"distributedInfo":{{"rank":{rank},"world_size":{world},"backend":"nccl"}},'
        '"deviceProperties":[],"traceEvents":['
    ).encode()
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(head)
        block = []
        for i in range(events):
            ts = 1_000_000 + i * 10
            if i % 1000 == 0:
                event = (
                    f'{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{i // 1000}","pid":1,"tid":1,'
                    f'"ts":{ts},"dur":9990}}'
                )
            elif i % 2:
                event = (
                    f'{{"ph":"X","cat":"kernel","name":"gemm_kernel","pid":0,"tid":7,"ts":{ts},"dur":4,'
                    f'"args":{{"device":0,"stream":7,"correlation":{i}}}}}'
                )
            else:
                event = (
                    f'{{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":{ts},"dur":5,'
                    f'"args":{{"External id":{i},"Sequence number":{i}}}}}'
                )
            block.append(event)
            if len(block) == 10_000:
                fh.write((("," if i >= 10_000 else "") + ",".join(block)).encode())
                block = []
        if block:
            fh.write((("," if events > len(block) else "") + ",".join(block)).encode())
        fh.write(b"]}")


def run_merge(
    folder: Path, out: Path, env: dict[str, str] | None = None
) -> tuple[int, int, float, float, str]:
    """(exit status, peak RSS in MiB, wall seconds, CPU seconds, stderr) of `stepscope merge FOLDER -o OUT`."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PEAK_OF,
            sys.executable,
            "-m",
            "stepscope",
            "merge",
            str(folder),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    code, peak, cpu = done.stdout.split()[-3:]
    return int(code), int(peak) // 1024, time.perf_counter() - t0, float(cpu), done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=2_000_000, help="events per rank")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="a folder for the rank files and the result")
    parser.add_argument(
        "--against", type=Path, default=None, help="another version's src folder, run in turn"
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of each version (alternating)")
    args = parser.parse_args()
    folder = args.out / "ranks"
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(args.ranks):
        path = folder / f"rank{rank}.json.gz"
        if not path.exists():
            write_rank(path, rank, args.events, args.ranks)
    size = sum(p.stat().st_size for p in folder.iterdir())
    versions: list[tuple[str, dict[str, str] | None]] = [("this", None)]
    if args.against is not None:
        versions.insert(0, (str(args.against), {"PYTHONPATH": str(args.against.resolve())}))
    rows = []
    for round_ in range(args.rounds):
        for label, env in versions:
            code, peak, seconds, cpu, err = run_merge(folder, args.out / "merged.json.gz", env)
            print(
                f"{label}: {args.ranks} x {args.events:,} events ({size / 1e6:.0f} MB gzip): exit {code}, "
                f"{peak} MiB, {seconds:.1f} s wall, {cpu:.1f} s CPU",
                flush=True,
            )
            if code:
                print(err)
                return code
            rows.append(
                (
                    label,
                    round_ + 1,
                    args.ranks,
                    f"{args.events:,}",
                    f"{size / 1e6:.0f}",
                    peak,
                    f"{seconds:.1f}",
                    f"{cpu:.1f}",
                )
            )
    columns = ("version", "round", "ranks", "events per rank", "gzip MB", "peak RSS MiB", "wall s", "CPU s")
    write_result("bench_merge", "stepscope merge on generated rank files", columns, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
