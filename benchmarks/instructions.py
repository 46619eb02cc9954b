"""Instructions executed to load a trace (and analyze it), counted by valgrind's cachegrind: a measure that does
not move with the load of a shared machine, for comparing two versions of the loader where wall time cannot
tell a 2% change from noise. Needs `valgrind` on PATH; each count takes 5-15 s.

    .venv/bin/python benchmarks/instructions.py [--analyze] [--cli] [SET ...]

Prints, per trace, the instructions of `load_trace` (and of `analyze` + JSON encoding with --analyze): the
whole process's count minus that of a process that only imports. With --cli, also the whole process of
`stepscope analyze SET --json` (interpreter start, imports, load, analyses, output, exit: what a user waits for)
and, for scale, that of a process that only starts Python and of one that only imports numpy. A SET is a path
under ../shared/traces or any other path. OpenBLAS threads (which spin at numpy import) are limited to one and
hash randomisation is off, so two runs of one version agree to within a few thousand instructions.
Instructions are not time (cache misses, page faults and the memory traffic of a change do not show): confirm a
change found here with bench_analyze.py, bench_peers.py or bench_load.py.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from _results import write_result

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / ".." / "shared" / "traces"
DEFAULT_SETS = (
    "kineto_resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    "hta_ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
)
_CHILD = """
import sys
import msgspec
from stepscope.analysis.analyze import analyze
from stepscope.analysis.read.loader import load_trace
mode, path = sys.argv[1], sys.argv[2]
if mode != "imports":
    table = load_trace(path)
    if mode == "analyze":
        msgspec.json.encode(analyze(table, drop_last_step=True))
"""


def instructions(argv: list[str]) -> int:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    grind = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    proc = subprocess.run(
        [*grind, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    match = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if proc.returncode != 0 or match is None:
        raise SystemExit(f"{argv}: valgrind run failed (exit {proc.returncode}): {proc.stderr[-300:]}")
    return int(match.group(1).replace(",", ""))


def count(mode: str, path: Path) -> int:
    return instructions([sys.executable, "-c", _CHILD, mode, str(path)])


def count_cli(path: Path) -> int:
    """The whole `stepscope analyze PATH --json` process, as its console script runs it."""
    return instructions([str(Path(sys.executable).parent / "stepscope"), "analyze", str(path), "--json"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sets", nargs="*", default=list(DEFAULT_SETS), help="paths under ../shared/traces")
    parser.add_argument("--analyze", action="store_true", help="also count analyze + JSON encoding")
    parser.add_argument("--cli", action="store_true", help="also count the whole `stepscope analyze` process")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 2
    paths = [(TRACES / name).resolve() for name in args.sets]
    base = count("imports", paths[0])
    notes = [f"Imports only: {base / 1e6:,.1f} M instructions."]
    print(notes[0])
    if args.cli:
        start = instructions([sys.executable, "-c", "pass"])
        numpy = instructions([sys.executable, "-c", "import numpy"])
        notes.append(
            f"Python start: {start / 1e6:,.1f} M; python start + import numpy: {numpy / 1e6:,.1f} M."
        )
        print(notes[-1])
    columns = ["trace", "load_trace, M instructions"]
    columns += ["analyze + encode, M"] * args.analyze + [
        "whole `stepscope analyze --json` process, M"
    ] * args.cli
    rows = []
    for name, path in zip(args.sets, paths, strict=True):
        load = count("load", path) - base
        row = [name.split("/")[0], f"{load / 1e6:,.1f}"]
        if args.analyze:
            row.append(f"{(count('analyze', path) - base - load) / 1e6:,.1f}")
        if args.cli:
            row.append(f"{count_cli(path) / 1e6:,.1f}")
        print(
            ": ".join(row[:1])
            + ": "
            + ", ".join(f"{c} {v}" for c, v in zip(columns[1:], row[1:], strict=True))
        )
        rows.append(row)
    write_result(
        "instructions", "Instructions to load and analyze a trace (cachegrind)", columns, rows, notes=notes
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
