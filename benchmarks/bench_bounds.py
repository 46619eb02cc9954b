"""Every analysis command on a folder of many small ranks, as whole processes: wall time and peak memory against
the bounds docs/reliability.md promises (60 s and 1 GiB each for 3,000 ranks on 2 cores).

The folder is `make_comm_trace.py --collectives 40 --steps 4 --ranks N` (gzipped rank files; each of the 40
all-reduces names its N-rank group, so the JSON grows as N squared: 2.4 GB at 3,000 ranks). Peak memory is the
largest resident set of the command's process tree (`getrusage` of the children: the largest one, which is the
parent for every command here), not their sum.

    .venv/bin/python benchmarks/bench_bounds.py --ranks 3000     # about 4 minutes, 320 MB of disk
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import ROOT, write_result

COMMANDS = {
    "summary": ["summary", "{folder}"],
    "analyze --json": ["analyze", "{folder}", "--json"],
    "whatif --json": ["whatif", "{folder}", "--scale", "data_loader=0", "--json"],
    "report": ["report", "{folder}", "-o", "{out}/report.html"],
    "diff --json (the folder with itself)": ["diff", "{folder}", "{folder}", "--json"],
}
LIMIT_S = 60.0
LIMIT_MIB = 1024.0


def measured(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak MiB) of one `stepscope` process, run in a fresh child of a fresh child (so that the
    children's peak is this command's alone)."""
    probe = (
        "import resource, subprocess, sys, time\n"
        "t = time.perf_counter()\n"
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
        "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, sys.executable, "-m", "stepscope", *argv],
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    seconds, kib = done.stdout.split()
    return float(seconds), int(kib) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=3000)
    parser.add_argument(
        "--folder", type=Path, help="a folder of rank files of your own instead of the generated one"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stepscope-bounds-") as tmp:
        folder = args.folder
        if folder is None:
            folder = Path(tmp, "ranks")
            subprocess.run(
                [sys.executable, str(ROOT / "benchmarks" / "make_comm_trace.py"), "--collectives", "40", "--steps",
                 "4", "--ranks", str(args.ranks), "--out", str(folder)],
                check=True, capture_output=True, timeout=3600,
            )  # fmt: skip
        gz_mb = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
        files = len(list(folder.iterdir()))
        rows, figures = [], {}
        for name, template in COMMANDS.items():
            seconds, mib = measured([a.format(folder=folder, out=tmp) for a in template])
            within = seconds <= LIMIT_S and mib <= LIMIT_MIB
            figures[name] = {"seconds": seconds, "peak_mib": mib}
            rows.append([name, f"{seconds:.1f} s", f"{mib:,.0f} MiB", "yes" if within else "**no**"])
            print("  ".join(rows[-1]), flush=True)
    notes = [
        f"{files:,} rank files, {gz_mb:.0f} MB gzipped; one "
        f"run of each command, a fresh process each; the bound: {LIMIT_S:.0f} s and {LIMIT_MIB:.0f} MiB; "
        f"{os.cpu_count()} CPUs"
    ]
    write_result(
        "bench_bounds",
        "Each analysis command on a folder of many small ranks",
        ["command", "wall time", "peak memory", "within the bound"],
        rows,
        figures={"commands": figures, "files": files, "gz_mb": gz_mb},
        notes=notes,
    )
    print(notes[0])


if __name__ == "__main__":
    main()
