"""`stepscope analyze`: JSON document, terminal report, and one-line errors with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope.cli import main

from ..support.synthetic import rank_trace, two_step_trace
from ..support.traces import write_trace


@pytest.mark.parametrize("preset", [None, "3"])
def test_blas_threads_setting_is_left_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], preset: str | None
) -> None:
    # GIVEN no BLAS thread count in the environment, or the user's own
    for var in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    if preset is not None:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", preset)
    path = write_trace(tmp_path / "rank0.json.gz", two_step_trace(), rank=0)
    # WHEN analysed (the command imports numpy with one BLAS thread where none was asked for)
    assert main(["analyze", str(path), "--json"]) == 0
    capsys.readouterr()
    # THEN the environment is as it was: nothing left for what the process runs next
    import os

    assert os.environ.get("OPENBLAS_NUM_THREADS") == preset


def test_json_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN one rank's trace on disk
    path = write_trace(tmp_path / "rank0.json.gz", two_step_trace(), rank=0)
    # WHEN analysed with --json
    assert main(["analyze", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # THEN the documented schema and per-rank sections are there
    assert doc["schema"] == "stepscope.analysis/4"
    (rank,) = doc["ranks"]
    assert rank["rank"] == 0
    assert rank["temporal"] == {
        "span_us": 1300.0,
        "idle_us": 460.0,
        "compute_us": 640.0,
        "non_compute_us": 200.0,
        "idle_pct": 35.385,
        "compute_pct": 49.231,
        "non_compute_pct": 15.385,
    }
    assert rank["overlap_pct"] == 62.5
    for key in ("kernel_types", "idle_by_stream", "top_kernels", "steps"):
        assert rank[key]
    assert set(rank["top_kernels"][0]) == {"name", "count", "total_us", "pct"}
    assert doc["cross_rank"] is None and doc["straggler"] is None and rank["clock_offset_us"] is None
    assert [f["id"] for f in doc["findings"]] == ["host_bound", "pageable_copies"]
    assert set(doc["findings"][0]) == {
        "id",
        "severity",
        "rank",
        "message",
        "evidence",
        "cost_ms_per_step",
        "pct_of_step",
        "action",
        "steps_held",
        "steps",
        "ranks",
        "cost_range_ms_per_step",
        "saving_ms_per_step",
        "saving_from",
        "whatif",
        "saving_note",
    }


def test_drop_last_step_and_folder_of_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # (12 steps after the last is dropped: of 2 ranks, jitter makes one last at 12 of 12 with chance 1/4096)
    write_trace(tmp_path / "run" / "r0.json", rank_trace(1000, steps=13), rank=0, world_size=2)
    write_trace(tmp_path / "run" / "r1.json", rank_trace(4000, shift_us=250, steps=13), rank=1, world_size=2)
    assert main(["analyze", str(tmp_path / "run"), "--json", "--drop-last-step"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert [len(r["steps"]) for r in doc["ranks"]] == [12, 12]
    assert [r["clock_offset_us"] for r in doc["ranks"]] == [0.0, 250.0]
    assert [(c["rank"], c["kind"], c["count"]) for r in doc["ranks"] for c in r["collectives"]] == [
        (0, "all_reduce", 12),
        (1, "all_reduce", 12),
    ]
    assert doc["straggler"]["rank"] == 1 and doc["straggler"]["delay_ms_per_step"] == 3.0
    assert doc["straggler"]["cause"]["phase"] == "data_loader"


def test_terminal_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_trace(tmp_path / "t.json", two_step_trace(), rank=0)
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    for text in (
        "Rank 0",
        "idle",
        "Kernel types",
        "Idle time per stream",
        "Steps",
        "Findings",
        "host_bound",
    ):
        assert text in out
    assert "62.5%" in out


@pytest.mark.parametrize(
    ("name", "content"),
    [("missing.json", None), ("bad.json", b"{not json"), ("empty.json.gz", b"\x1f\x8b\x08\x00trunc")],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes | None
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    assert main(["analyze", str(path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0]
    assert captured.out == ""


NCCL_TRACE = (
    Path(__file__).resolve().parents[2]
    / ".."
    / "shared"
    / "traces"
    / "hta_nccl_parser_config"
    / "nccl_data.json.gz"
)


def _analysis(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["analyze", str(NCCL_TRACE), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


@pytest.mark.shared
@pytest.mark.parametrize(("given", "numbers"), [("5:6", [5, 6]), ("6", [6]), ("5:", [5, 6]), (":4", [4])])
def test_steps_picks_the_window(capsys: pytest.CaptureFixture[str], given: str, numbers: list[int]) -> None:
    whole = _analysis(capsys)["ranks"][0]
    assert [s["step"] for s in whole["steps"]] == [4, 5, 6]
    part = _analysis(capsys, "--steps", given)["ranks"][0]
    assert [s["step"] for s in part["steps"]] == numbers
    same = [{**s, "start_us": None} for s in whole["steps"] if s["step"] in numbers]
    assert [{**s, "start_us": None} for s in part["steps"]] == same  # each step as in the whole
    assert part["window"]["dur_us"] == pytest.approx(sum(s["dur_us"] for s in part["steps"]), rel=1e-3)
    assert part["window"]["dur_us"] < whole["window"]["dur_us"]
    assert sum(k["count"] for k in part["top_kernels"]) < sum(k["count"] for k in whole["top_kernels"])


@pytest.mark.shared
def test_steps_outside_the_trace_and_bad_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(NCCL_TRACE), "--steps", "10:12"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nccl_data.json.gz" in err
    assert "no ProfilerStep in --steps 10:12 (the trace has #4 to #6)" in err
    for bad in ("7:5", "a:b", ":"):
        assert main(["analyze", str(NCCL_TRACE), "--steps", bad]) == 2
        assert "--steps" in capsys.readouterr().err
