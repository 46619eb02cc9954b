"""The replay reports its own error (issue 43, item 1): per rank and per step, in whatif's headline and JSON and in
analyze's critical path; beyond 5% the prediction and the path are labelled approximate with the reason the graph
gives, and the rank's findings are not priced by that replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepscope.cli import main

from ..support.traces import SHARED_TRACES, cpu, launched, runtime, step, write_trace


def job(path: Path, *, overlap: bool) -> Path:
    """4 steps of 1 ms: an op launches two 500 us GEMMs on one stream, then the host synchronizes the device.
    `overlap`: the trace shows the second GEMM starting 70 us after the first (the stream ran them at once, which
    the replay, one activity at a time on a stream, cannot give back); else it starts when the first ends."""
    events, corr = [], 0
    for k in range(4):
        t0 = k * 1000
        second = t0 + 100 if overlap else t0 + 530
        events += [step(k, t0, 1000), cpu("aten::mm", t0 + 10, 50)]
        events += launched("gemm_a", t0 + 20, t0 + 30, 500, corr := corr + 1)
        events += launched("gemm_b", t0 + 25, second, 500 if overlap else 100, corr := corr + 1)
        events.append(
            runtime(
                "cudaDeviceSynchronize",
                t0 + 110,
                (second + 500 if overlap else second + 100) - t0 - 110,
                corr := corr + 1,
            )
        )
    return write_trace(path, events, 0, world_size=1)


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_replay_off_its_trace_says_so_and_prices_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = job(tmp_path / "t.json", overlap=True)
    # WHEN a what-if is asked of it
    doc = run_json(capsys, "whatif", str(trace), "--scale", "kernel:.=0.5")
    (rank,) = doc["ranks"]
    # THEN the replay's error is there per rank and per step, and the prediction is labelled approximate, why
    assert rank["replay"]["error_pct"] == pytest.approx(43.0, abs=0.5)
    assert rank["replay"]["step_error_pct"] == pytest.approx([43.0] * 4, abs=0.5)
    assert doc["approximate"] and rank["replay"]["approximate"]
    (reason,) = doc["approximate_reasons"]
    assert "+43.0% off its measured steps" in reason and "start before the one before them" in reason
    assert main(["whatif", str(trace), "--scale", "kernel:.=0.5", "--wide"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "APPROXIMATE: the replay of rank 0 is +43.0% off its measured steps" in out
    # AND analyze's critical path carries it, and no finding is priced by that replay
    result = run_json(capsys, "analyze", str(trace))
    path = result["critical_path"]
    assert path["approximate"] and path["replay"][0]["error_pct"] == pytest.approx(43.0, abs=0.5)
    priced = [f for f in result["findings"] if f["saving_from"] is not None]
    assert priced and all(f["saving_from"] == "rule" for f in priced)
    assert all("the replay of rank 0 is +43.0% off" in f["saving_note"] for f in priced), priced


def test_a_replay_on_its_trace_states_its_error_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = job(tmp_path / "t.json", overlap=False)
    doc = run_json(capsys, "whatif", str(trace))
    (rank,) = doc["ranks"]
    assert rank["replay"]["error_pct"] == 0.0 and rank["replay"]["step_error_pct"] == [0.0] * 4
    assert not doc["approximate"] and doc["approximate_reasons"] == []
    assert main(["whatif", str(trace)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "replay error: the replay with nothing changed is within 0.0% of the measured mean step" in out


@pytest.mark.shared
def test_every_shared_trace_states_its_replay_error(capsys: pytest.CaptureFixture[str]) -> None:
    # every trace of ../shared/traces with steps: within 5%, or the output says how far off and why
    checked = 0
    for path in sorted(p for p in SHARED_TRACES.rglob("*.json*") if p.stat().st_size < 60_000_000):
        if main(["whatif", str(path), "--json"]) != 0:
            capsys.readouterr()
            continue
        doc = json.loads(capsys.readouterr().out)
        for rank in doc["ranks"]:
            fid = rank["replay"]
            if not rank["steps"] or fid["error_pct"] is None:
                continue
            checked += 1
            assert len(fid["step_error_pct"]) == rank["steps"], path
            if abs(fid["error_pct"]) > 5.0:
                assert fid["approximate"] and fid["reasons"], path
            else:
                assert not fid["approximate"], path
    assert checked >= 20
