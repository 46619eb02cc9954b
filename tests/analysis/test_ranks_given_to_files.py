"""A file's rank is given by the parent once every worker has read its file: a worker analyses a file that
declares no rank, or one another file declares too, as the rank it declares (or 0), and the parent then gives
each part the rank it chose (analysis/parallel.py). Whatever a part says of its rank must follow: the job's
answer is the same as when every file declares its own rank, whatever a part holds and however it says it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ..support.truth import Job, write_job
from ..support.truth_pipeline import Pipe, write_pipe


def _analyze(folder: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "stepscope", "analyze", str(folder), "--json", "--jobs", "2"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def _all_declaring_rank_0(folder: Path, to: Path) -> None:
    """`folder`'s rank{R} traces copied to `to` as a.json, b.json, ... (no rank in their names), each declaring
    rank 0: every worker analyses its file as rank 0, and the parent gives them 0, 1, 2, ..."""
    import gzip

    to.mkdir()
    for i, path in enumerate(sorted(folder.glob("rank*.json*"), key=lambda p: int(p.name[4:].split(".")[0]))):
        opened = gzip.open if path.suffix == ".gz" else open
        with opened(path, "rt") as fh:
            doc = json.load(fh)
        doc["distributedInfo"]["rank"] = 0
        (to / f"{'abcdefgh'[i]}.json").write_text(json.dumps(doc))


def _without_inputs(doc: Any) -> Any:
    """The answer less what names the input: its notices (how ranks were given) and each rank's file."""
    doc = dict(doc, notices=None)
    doc["ranks"] = [dict(r, source=None) for r in doc["ranks"]]
    return doc


@pytest.mark.parametrize("job", ["collectives with a late rank", "pipeline stages"])
def test_ranks_given_to_files_are_what_every_part_says(job: str, tmp_path: Path) -> None:
    # GIVEN a 4-rank job whose files declare their ranks, and the same files all declaring rank 0
    declared = tmp_path / "declared"
    if job == "pipeline stages":
        write_pipe(Pipe(forward_us=[400.0, 900.0, 400.0, 400.0], backward_us=[800.0] * 4), declared)
    else:  # (a late rank: findings priced by a replay of one rank, whose selectors name it)
        write_job(Job(ranks=4, steps=6, late={2: (3000.0, 0.5)}), declared)
    colliding = tmp_path / "colliding"
    _all_declaring_rank_0(declared, colliding)
    # WHEN each folder is analysed by two worker processes
    truth, given = _analyze(declared), _analyze(colliding)
    # THEN the parent gave the colliding files ranks 0-3 and said so
    assert [r["rank"] for r in given["ranks"]] == [0, 1, 2, 3]
    assert sum("declares rank 0 like" in n for n in given["notices"]) == 3
    # AND every figure, finding, view and text of the answer is what the declared ranks give (before, a
    # finding's note named the replay's selector of rank 0, `op:^aten::nonzero$@0=0`, on ranks 2 and 3)
    assert _without_inputs(given) == _without_inputs(truth)
