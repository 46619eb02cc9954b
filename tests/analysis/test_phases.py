"""What a step is and which phase its time goes to, on real jobs (tests/support/jobs/phases.py) read through
`stepscope analyze` as a user would: one step time in the Steps table, the findings and metrics.jsonl, the data
loader where the findings price it, and the optimizer's closure counted as forward and backward."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from statistics import median
from typing import Any

import pytest

from stepscope.analysis.analyze import analyze
from stepscope.cli import main

from ..support.traces import cpu, step, table_of

pytestmark = pytest.mark.slow
JOBS = Path(__file__).resolve().parents[1] / "support" / "jobs" / "phases.py"
PHASE_KEYS = ("dataloader_us", "forward_us", "backward_us", "optimizer_us")


def run_job(out: Path, job: str) -> Path:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    done = subprocess.run(
        [sys.executable, str(JOBS), str(out), job], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def lightning_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("lightning")
    return run_job(tmp_path_factory.mktemp("lightning_cnn"), "lightning_cnn")


@pytest.fixture(scope="session")
def decorator_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_job(tmp_path_factory.mktemp("decorator_loader"), "decorator_loader")


def analyze_json(run: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["analyze", str(run), "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def analyze_text(run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "160")
    assert main(["analyze", str(run)]) == 0
    return capsys.readouterr().out


def trace_events(run: Path) -> list[dict[str, Any]]:
    (trace,) = (run / "traces").glob("rank0_step*.json.gz")
    with gzip.open(trace, "rt") as fh:
        return json.load(fh)["traceEvents"]  # type: ignore[no-any-return]


def finding(doc: dict[str, Any], finding_id: str) -> dict[str, Any]:
    (found,) = [f for f in doc["findings"] if f["id"] == finding_id]
    return found  # type: ignore[no-any-return]


_UNITS_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def terminal_steps(text: str) -> dict[int, list[str]]:
    """The rows of the terminal's Steps table: step -> its cells (time, GPU busy, data loader, ...)."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) >= 8 and cells[0].isdigit():
            rows[int(cells[0])] = cells[1:]
    return rows


def us_of(cell: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+) (ns|us|ms|s)", cell).groups()  # type: ignore[union-attr]
    return float(value) * _UNITS_US[unit]


# --- item 3: the optimizer's closure (Lightning) -----------------------------------------------------------
def test_lightning_closure_is_forward_and_backward_not_optimizer(
    lightning_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a Lightning CNN trained with SGD: forward and backward run inside optimizer.step(closure)
    doc = analyze_json(lightning_run, capsys)
    (rank,) = doc["ranks"]
    steps = rank["steps"]
    assert [s["step"] for s in steps] == [3, 4, 5]
    # THEN the phases of every step add up to at most the step
    for s in steps:
        assert sum(s[k] for k in PHASE_KEYS) <= s["dur_us"] + 0.01, s
    # AND forward and backward carry the closure's work: most of the optimizer's span is theirs
    events = trace_events(lightning_run)
    optimizer_span_us = sum(e["dur"] for e in events if e.get("name") == "Optimizer.step#SGD.step")
    forward, backward, optimizer = (
        sum(s[k] for s in steps) for k in ("forward_us", "backward_us", "optimizer_us")
    )
    assert forward > 0 and backward > 0
    assert forward + backward >= 0.8 * optimizer_span_us
    assert optimizer <= 0.25 * optimizer_span_us
    # AND no optimizer finding: the SGD update is a sliver of the step
    assert not [f for f in doc["findings"] if f["id"] == "optimizer_bound"], doc["findings"]
    breakdown = finding(doc, "step_breakdown")["evidence"]
    assert breakdown["forward_ms_per_step"] > 0 and breakdown["backward_ms_per_step"] > 0
    # (each figure is the median over the window's steps: none exceeds the median step)
    assert all(v <= breakdown["step_ms"] + 0.01 for k, v in breakdown.items() if k.endswith("_ms_per_step"))


def test_a_closure_inside_the_optimizer_on_a_synthetic_trace() -> None:
    # GIVEN a step [0, 1000) whose optimizer span [100, 1000) calls the closure: ops [100, 400), a nested
    # zero_grad [400, 450), the autograd engine [450, 800); then the update [800, 1000)
    t = 1_700_000_000_000
    ev = [
        step(1, t, 1000),
        cpu("Optimizer.step#SGD.step", t + 100, 900, cat="user_annotation"),
        cpu("aten::conv2d", t + 110, 280),
        cpu("Optimizer.zero_grad#SGD.zero_grad", t + 400, 50, cat="user_annotation"),
        cpu("autograd::engine::evaluate_function: ConvolutionBackward0", t + 450, 350),
        cpu("aten::add_", t + 820, 150),
    ]
    (s,) = analyze(table_of({0: ev})).ranks[0].steps
    # THEN the closure is forward 300 us and backward 350; the optimizer keeps zero_grad and its update
    assert (s.forward_us, s.backward_us, s.optimizer_us, s.dataloader_us) == (300.0, 350.0, 250.0, None)


# --- item 4: one step time (decorator form, slow DataLoader) ----------------------------------------------
def test_decorator_steps_hold_their_batch_and_every_output_states_one_step_time(
    decorator_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN `@monitor def train_step(batch)` fed by a DataLoader sleeping 3 ms per sample, 8 per batch
    doc = analyze_json(decorator_run, capsys)
    (rank,) = doc["ranks"]
    steps = rank["steps"]
    assert [s["step"] for s in steps] == [3, 4, 5]
    # THEN each step holds the fetch of its batch (24 ms of sleeping at least) in the table
    for s in steps:
        assert s["dataloader_us"] >= 20_000 and s["dataloader_us"] <= s["dur_us"], s
        assert sum(s[k] or 0 for k in PHASE_KEYS) <= s["dur_us"] + 0.01, s
    # AND the findings price the same steps: their step and loader time are the table's medians
    step_ms = median([s["dur_us"] for s in steps]) / 1e3
    loader_ms = median([s["dataloader_us"] for s in steps]) / 1e3
    stall = finding(doc, "data_loader_stall")
    assert stall["severity"] == "high"
    assert stall["evidence"]["dataloader_ms_per_step"] == pytest.approx(loader_ms, abs=0.002)
    assert stall["cost_ms_per_step"] == pytest.approx(loader_ms, abs=0.002)
    assert finding(doc, "step_breakdown")["evidence"]["step_ms"] == pytest.approx(step_ms, abs=0.002)
    # AND metrics.jsonl times the same steps (the monitor's clock, not the trace's: a small margin)
    lines = [json.loads(line) for line in (decorator_run / "metrics.jsonl").read_text().splitlines()]
    wall = {line["step"]: line["wall_ms"] for line in lines}
    for s in steps:
        assert wall[s["step"]] == pytest.approx(s["dur_us"] / 1e3, rel=0.35)  # (without the fetch: 10x less)
    # AND the terminal table shows what the JSON holds, loader time included
    rows = terminal_steps(analyze_text(decorator_run, capsys, monkeypatch))
    assert sorted(rows) == [3, 4, 5]
    for s in steps:
        time_cell, _, loader_cell = rows[s["step"]][:3]
        assert us_of(time_cell) == pytest.approx(s["dur_us"], rel=0.01)
        assert us_of(loader_cell) == pytest.approx(s["dataloader_us"], rel=0.01)


def test_decorator_trace_spans_are_contiguous_and_hold_the_fetch(decorator_run: Path) -> None:
    # GIVEN the decorator job's trace, as Perfetto shows it
    events = trace_events(decorator_run)
    spans = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
    )
    fetches = [e["ts"] for e in events if str(e.get("name", "")).startswith("enumerate(DataLoader)")]
    # THEN a step begins where the one before it ended (within the monitor's few microseconds) ...
    assert len(spans) == 3
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert 0 <= start - end < 1000
    # ... and each holds the fetch of its batch
    for start, end in spans:
        assert any(start <= ts < end for ts in fetches)


def test_time_between_step_spans_belongs_to_the_next_step() -> None:
    # GIVEN a trace whose ProfilerStep spans mark the calls only, with the next batch fetched between them
    t = 1_700_000_000_000
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    ev = [step(1, t, 100), cpu(loader, t + 100, 400, cat="user_annotation"), step(2, t + 500, 100)]
    result = analyze(table_of({0: ev}))
    s1, s2 = result.ranks[0].steps
    # THEN step 2 runs from the end of step 1, its fetch included; the breakdown splits one real step (of two, the
    # lower middle one: step 1), not a median made of both
    assert (s1.dur_us, s1.dataloader_us, s2.start_us, s2.dur_us, s2.dataloader_us) == (
        100.0,
        0.0,
        100.0,
        500.0,
        400.0,
    )
    (stall,) = [f for f in result.findings if f.id == "data_loader_stall"]
    assert (stall.steps_held, stall.steps, stall.evidence["dataloader_ms_per_step"]) == (1, 2, 0.4)
    (breakdown,) = [f for f in result.findings if f.id == "step_breakdown"]
    assert (breakdown.evidence["step_ms"], breakdown.evidence["step"]) == (0.1, 1)
