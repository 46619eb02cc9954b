"""A second command on a trace against the first (issue 48, item 5): whole processes of `stepscope analyze
--json`, `whatif --json` and `report`, each with an empty cache (the first command on a file), then again (the
answer the first one kept), then with only the decoded table kept (the answer let go: what another command on
the file finds), paired round by round.

    .venv/bin/python benchmarks/bench_cache.py [--size 60M] [--rounds 3]

The trace is make_big_trace.py's: the V100 trace of ../shared repeated to SIZE of plain JSON (or a trace of
its own with --trace). Wall seconds, medians over the rounds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import ROOT, write_result

COMMANDS = {
    "analyze --json": ["analyze", "{trace}", "--json"],
    "whatif --json": ["whatif", "{trace}", "--json"],
    "report": ["report", "{trace}", "-o", "{out}/report.html"],
}


def timed(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "stepscope", *args], env=env, stdout=subprocess.DEVNULL)
    _, status, _ = os.wait4(child.pid, 0)  # (not subprocess.run's timeout: it polls, in steps of up to 50 ms)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"stepscope {' '.join(args)}: exit {os.waitstatus_to_exitcode(status)}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="60M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trace", type=Path, help="a trace of your own instead of the generated one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stepscope-cache-") as tmp:
        trace = args.trace
        if trace is None:
            trace = Path(tmp, "big.json")
            subprocess.run(
                [sys.executable, str(ROOT / "benchmarks" / "make_big_trace.py"), "--size", args.size, "--out",
                 str(trace)],
                check=True, capture_output=True,
            )  # fmt: skip
        cache = Path(tmp, "cache")
        env = {**os.environ, "STEPSCOPE_CACHE_DIR": str(cache)}
        env.pop("STEPSCOPE_NO_CACHE", None)
        times: dict[str, dict[str, list[float]]] = {
            c: {"first": [], "second": [], "table only": []} for c in COMMANDS
        }
        for _ in range(args.rounds):
            for name, template in COMMANDS.items():
                argv = [a.format(trace=trace, out=tmp) for a in template]
                shutil.rmtree(cache, ignore_errors=True)
                times[name]["first"].append(timed(argv, env))
                times[name]["second"].append(timed(argv, env))
                shutil.rmtree(cache / "results")
                times[name]["table only"].append(timed(argv, env))
        size_mb = trace.stat().st_size / 1e6
    rows = []
    for name, t in times.items():
        first, second = statistics.median(t["first"]), statistics.median(t["second"])
        table = statistics.median(t["table only"])
        rows.append(
            [name, f"{first:.2f} s", f"{second:.3f} s", f"{first / second:.1f}x", f"{table:.2f} s",
             f"{first / table:.1f}x"]
        )  # fmt: skip
    notes = [
        f"{size_mb:.1f} MB trace file; wall seconds of whole processes, medians of {args.rounds} rounds; 'first': "
        "an empty cache (the table decoded, the table and the answer kept), 'second': the same command again (the "
        "kept answer), 'table only': the kept answer removed (the kept table mapped, the analysis run)"
    ]
    write_result(
        "bench_cache",
        "A second command on a trace against the first",
        ["command", "first", "second", "first / second", "table only", "first / table only"],
        rows,
        figures={"times_s": times, "size_mb": size_mb},
        notes=notes,
    )
    for row in rows:
        print("  ".join(row))
    print(notes[0])


if __name__ == "__main__":
    main()
