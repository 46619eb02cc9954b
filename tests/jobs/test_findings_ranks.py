"""Findings of real 4-rank DDP jobs (gloo, `stepscope run --nproc-per-node 4`, tests/support/jobs/ddp.py): with one rank
traced, waiting cannot be told from transfer and no comm_bound is raised on it; with every rank traced, a finding
that holds on all ranks at a similar cost is one finding naming them, in JSON and in the terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepscope.cli import main

from ..support.jobs import run_ddp_job

pytestmark = pytest.mark.slow
SLEEP_MS = 60.0  # every rank's Python sleep per step in the all-ranks job


@pytest.fixture(scope="module")
def rank0_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rank 2's collate sleeps 60 ms per batch; only rank 0 (stepscope's default) is traced."""
    return run_ddp_job(tmp_path_factory.mktemp("ddp_rank0"), profiled_ranks=None)


@pytest.fixture(scope="module")
def all_ranks_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same job, every rank traced, and every rank sleeping SLEEP_MS after each step."""
    return run_ddp_job(tmp_path_factory.mktemp("ddp_all"), profiled_ranks="all", sleep_ms=SLEEP_MS)


def analyze_json(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["analyze", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def analyze_text(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["analyze", str(path)]) == 0
    return " ".join(capsys.readouterr().out.split())  # (lines wrap at the console's width)


def test_one_traced_rank_raises_no_comm_bound_on_its_waiting(
    rank0_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN rank 0 of 4 traced, waiting most of each step in the all-reduce for rank 2's slow collate
    doc = analyze_json(rank0_run, capsys)
    assert [r["rank"] for r in doc["ranks"]] == [0]
    # THEN no comm_bound is raised: the waiting cannot be told from the transfer
    assert [f for f in doc["findings"] if f["id"] == "comm_bound"] == []
    assert [f["id"] for f in doc["findings"] if f["severity"] == "high"] == []
    # AND the output says so, with the time at stake and what to trace
    (unknown,) = [f for f in doc["findings"] if f["id"] == "comm_wait_unknown"]
    assert (unknown["severity"], unknown["rank"], unknown["cost_ms_per_step"]) == ("info", 0, None)
    assert unknown["evidence"]["comm_pct_of_step"] >= 50  # the 60 ms of rank 2's collate, of a ~70 ms step
    assert (unknown["evidence"]["traced_ranks"], unknown["evidence"]["group_size"]) == (1, 4)
    text = analyze_text(rank0_run, capsys)
    assert "INFO rank 0 comm_wait_unknown" in text
    assert "only 1 of the 4 ranks of their process group is traced" in text
    assert "waits for slower peers cannot be told from the transfer, so it is not priced" in text
    assert "--profiled-ranks all" in text


def test_a_finding_on_every_rank_is_one_finding_naming_them(
    all_ranks_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN every rank sleeping 60 ms per step outside any op, and rank 2's collate 60 ms more
    doc = analyze_json(all_ranks_run, capsys)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    # THEN the Python time is one finding naming the four ranks, with the spread of its cost
    (python,) = [f for f in doc["findings"] if f["id"] == "python_overhead"]
    assert python["ranks"] == [0, 1, 2, 3] and python["rank"] in python["ranks"]
    low, high = python["cost_range_ms_per_step"]
    assert high == python["cost_ms_per_step"] and high / 2 <= low <= high  # the costliest rank's finding
    assert low >= SLEEP_MS * 0.8 and high <= SLEEP_MS * 2
    # AND what holds on one rank stays that rank's: the slow loader, and its different step breakdown
    (stall,) = [f for f in doc["findings"] if f["id"] == "data_loader_stall"]
    assert (stall["rank"], stall["ranks"], stall["cost_range_ms_per_step"]) == (2, [2], None)
    breakdowns = [f["ranks"] for f in doc["findings"] if f["id"] == "step_breakdown"]
    assert [2] in breakdowns and sorted(r for ranks in breakdowns for r in ranks) == [0, 1, 2, 3]
    # AND the terminal prints it once, with the ranks and the spread
    text = analyze_text(all_ranks_run, capsys)
    assert text.count("python_overhead:") == 1
    severity = python["severity"].upper()
    assert f"{severity} ranks 0-3 python_overhead: {' '.join(python['message'].split())}" in text
    assert f"per step across the ranks; figures of rank {python['rank']}, the costliest" in text
    # AND so does the report
    page = all_ranks_run / "grouped.html"
    assert main(["report", str(all_ranks_run), "-o", str(page)]) == 0
    html = page.read_text()
    assert html.count('<span class="fid">python_overhead</span>') == 1
    assert '<span class="frank">ranks 0-3</span>' in html
    assert "per step across ranks 0-3; the figures are rank" in html
