"""`stepscope whatif` against reruns (issue 43, item 4): a job with one rank made slow, the prediction of the job
without that slowness (with its interval), and the job rerun without it.

    .venv/bin/python benchmarks/whatif_reruns.py [--runs 3] [--ranks 4] [--delay-ms 50]

tests/support/jobs/ddp.py under `stepscope run --nproc-per-node RANKS --profiled-ranks all` (gloo, this machine's cores):
rank 2's DataLoader sleeps DELAY ms per step in its collate_fn, so the other ranks wait for it in the all-reduces.
Each of RUNS rounds runs the slow job and the same job without the sleep, one after the other. Then
`whatif SLOW_RUN --scale 'data_loader@2=0'` predicts each slow run's step without the slow loader, and `whatif
FAST_RUN` gives each rerun's measured step (the slowest rank's mean over its window). The reruns' median must lie
in each predicted interval, and the predicted median within 25% of it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _results import ROOT, write_result

JOB = ROOT / "tests" / "support" / "jobs" / "ddp.py"
SCALE = "data_loader@2=0"


def run(out: Path, ranks: int, delay_ms: float, steps: int) -> Path:
    subprocess.run(
        [sys.executable, "-m", "stepscope", "run", "--nproc-per-node", str(ranks), "--profiled-ranks", "all",
         "--out-dir", str(out), "--no-report", str(JOB), "--slow-rank", "2", "--delay-ms", str(delay_ms),
         "--steps", str(steps), "--report-dir", str(out)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return next(p for p in out.iterdir() if p.is_dir())


def whatif(run_dir: Path, *scale: str) -> dict[str, Any]:
    flags = [a for s in scale for a in ("--scale", s)]
    done = subprocess.run(
        [sys.executable, "-m", "stepscope", "whatif", str(run_dir), *flags, "--json"],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    predictions, reruns = [], []
    with tempfile.TemporaryDirectory(prefix="stepscope-whatif-") as tmp:
        for i in range(args.runs):
            slow = run(Path(tmp, f"slow{i}"), args.ranks, args.delay_ms, args.steps)
            fast = run(Path(tmp, f"fast{i}"), args.ranks, 0.0, args.steps)
            predictions.append(whatif(slow, SCALE))
            reruns.append(whatif(fast)["baseline_step_ms"])
            print(f"round {i + 1}: done", file=sys.stderr)
    rerun_median = statistics.median(reruns)
    predicted_median = statistics.median(p["predicted_step_ms"] for p in predictions)
    rows = []
    for i, p in enumerate(predictions):
        low, high = p["predicted_low_ms"], p["predicted_high_ms"]
        inside = low is not None and low <= rerun_median <= high
        half = (high - low) / 2 if low is not None else None
        rows.append(
            [
                i + 1,
                f"{p['baseline_step_ms']:.1f} ms",
                f"{p['predicted_step_ms']:.1f} ms",
                f"{low:.1f} to {high:.1f} ms" if low is not None else "-",
                f"+-{100 * half / p['predicted_step_ms']:.0f}%" if half is not None else "-",
                f"{reruns[i]:.1f} ms",
                "yes" if inside else "no",
            ]
        )
    error = 100 * (predicted_median - rerun_median) / rerun_median
    notes = [
        f"{args.ranks} gloo DDP ranks on this machine's cores, rank 2's collate sleeping {args.delay_ms:g} ms per "
        f"step, {args.steps} steps (a window of 3); whatif --scale '{SCALE}' on each slow run",
        f"reruns' median {rerun_median:.1f} ms; predicted median {predicted_median:.1f} ms ({error:+.1f}%); the "
        f"reruns' median inside {sum(r[-1] == 'yes' for r in rows)} of {len(rows)} intervals",
    ]
    write_result(
        "whatif_reruns",
        "whatif's prediction without the slow rank against reruns without it",
        ["run", "measured (slow)", "predicted", "90% interval", "half-width", "rerun measured",
         "reruns' median inside"],
        rows,
        figures={"predictions": predictions, "reruns_ms": reruns, "rerun_median_ms": rerun_median,
                 "predicted_median_ms": predicted_median, "error_pct": error},
        notes=notes,
    )  # fmt: skip
    for row in rows:
        print("  ".join(str(c) for c in row))
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
