"""The windows a run recorded, as its metrics.jsonl says: per rank, each run of consecutive active steps (phases
"record" and "record_and_save"). Read by the watch's tests and benchmarks/bench_watch.py."""

from __future__ import annotations

import json
from pathlib import Path


def recorded_windows(run_dir: Path) -> dict[int, list[list[int]]]:
    """Each rank's windows: its active steps, in runs of consecutive steps."""
    steps: dict[int, list[int]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["phase"] in ("record", "record_and_save"):
            steps.setdefault(row["rank"], []).append(row["step"])
    out: dict[int, list[list[int]]] = {}
    for rank, found in steps.items():
        runs: list[list[int]] = []
        for step in sorted(found):
            if runs and runs[-1][-1] == step - 1:
                runs[-1].append(step)
            else:
                runs.append([step])
        out[rank] = runs
    return out
