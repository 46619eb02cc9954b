"""The run folder as the contract between capture and analysis: a real monitored run, read back by the CLI."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from types import FrameType

import pytest

import stepscope
from stepscope.analysis.read.loader import load_trace
from stepscope.cli import main
from stepscope.errors import InputError

from ..support.train import make_training


@pytest.fixture(scope="module")
def two_window_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose rank 0 has two windows: steps 2-3 and 6-7."""
    out = tmp_path_factory.mktemp("runs")
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(
        model, out_dir=str(out), wait=1, warmup=1, active=2, repeat=2, console=False
    )
    step = monitor(train_step)
    for _ in range(9):
        step()
    monitor.close()
    assert monitor.run_dir is not None
    return monitor.run_dir


def test_latest_window_per_rank_by_default(two_window_run: Path) -> None:
    table = load_trace(two_window_run)
    assert table.rank_ids() == [0]  # two windows of one rank are not two ranks
    assert table.ranks[0].source.endswith("traces/rank0_step7.json.gz")
    assert any("windows end at steps 3, 7" in n for n in table.notices)


def test_step_chooses_the_window(two_window_run: Path) -> None:
    assert load_trace(two_window_run, step=3).ranks[0].source.endswith("rank0_step3.json.gz")
    with pytest.raises(InputError, match="no trace of a window ending at step 5"):
        load_trace(two_window_run, step=5)


def test_analyze_a_run_folder_finds_its_steps_and_no_straggler(
    two_window_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(two_window_run), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "stepscope.analysis/4"
    assert [r["rank"] for r in doc["ranks"]] == [0]
    assert [s["step"] for s in doc["ranks"][0]["steps"]] == [6, 7]
    assert not [f for f in doc["findings"] if f["id"] == "straggler"]
    assert main(["summary", str(two_window_run), "--step", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == "stepscope.summary/1"
    assert main(["analyze", str(two_window_run), "--step", "4"]) == 2
    assert "windows end at steps: 3, 7" in capsys.readouterr().err


def test_the_runs_comm_patterns_join_the_command_lines(tmp_path: Path) -> None:
    from stepscope.analysis.read import Source

    train_step, model = make_training()
    monitor = stepscope.performance_monitor(
        model,
        out_dir=str(tmp_path),
        wait=1,
        warmup=0,
        active=1,
        console=False,
        comm_patterns=["my_all_reduce"],
    )
    step = monitor(train_step)
    for _ in range(3):
        step()
    monitor.close()
    assert monitor.run_dir is not None
    # what the run was configured with comes first, then what the command line adds
    assert Source(monitor.run_dir).comm_patterns(("dispatch",)) == ("my_all_reduce", "dispatch")
    assert Source(tmp_path).comm_patterns(("dispatch",)) == ("dispatch",)  # not a run folder


def _with_gpu_trace(run: Path, where: Path, patterns: list[str]) -> Path:
    """A copy of `run` whose latest window's trace is a GPU trace with a kernel named `my_exchange_kernel`, and
    whose config.yaml gives `patterns` as its communication patterns."""
    import gzip
    import shutil

    from ..support.traces import launched, step, trace

    shutil.copytree(run, where)
    events, t = [], 0.0
    for k in range(4):
        events.append(step(k + 1, t, 1000.0))
        events += launched("gemm_A", t + 20, t + 30, 300.0, 100 + k, stream=7)
        events += launched("my_exchange_kernel", t + 400, t + 410, 200.0, 200 + k, stream=20)
        t += 1000.0
    with gzip.open(where / "traces" / "rank0_step7.json.gz", "wt") as fh:
        json.dump(trace(events, 0, world_size=1), fh)
    config = where / "config.yaml"
    listed = "".join(f"\n- {p}" for p in patterns) if patterns else " []"
    config.write_text(config.read_text().replace("comm_patterns: []", f"comm_patterns:{listed}"))
    return where


def test_each_side_of_a_diff_counts_communication_by_its_own_runs_patterns(
    two_window_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN two runs of the same trace: one configured to call my_exchange_kernel communication, one not
    named = _with_gpu_trace(two_window_run, tmp_path / "named", ["my_exchange"])
    plain = _with_gpu_trace(two_window_run, tmp_path / "plain", [])
    # WHEN they are compared both ways
    for base, test, base_ms, test_ms in ((named, plain, 0.2, None), (plain, named, None, 0.2)):
        assert main(["diff", str(base), str(test), "--json"]) == 0
        phases = {p["name"]: p for p in json.loads(capsys.readouterr().out)["phases"]}
        # THEN each side's communication is what its own run says (the test side's patterns once served both)
        assert (phases["communication"]["base_ms"], phases["communication"]["test_ms"]) == (base_ms, test_ms)


@pytest.mark.parametrize(
    ("command", "sides"),
    [("analyze", 1), ("report", 1), ("diff", 2), ("summary", 1), ("whatif", 1), ("merge", 1)],
    ids=["analyze", "report", "diff", "summary", "whatif", "merge"],
)
def test_one_command_on_a_run_folder_reads_what_it_is_its_manifest_and_its_config_once(
    two_window_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, sides: int
) -> None:
    # GIVEN calls counted by the function that does the reading, however the caller imported it
    watched = {
        ("layout.py", "is_run_folder"): "is_run_folder",
        ("manifest.py", "load_manifest"): "load_manifest",
        ("records.py", "read_config"): "read_config",
    }
    calls: Counter[str] = Counter()

    def count(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and "stepscope" in frame.f_code.co_filename:
            name = watched.get((Path(frame.f_code.co_filename).name, frame.f_code.co_name))
            if name is not None:
                calls[name] += 1

    run = str(two_window_run)
    argv = {
        "analyze": ["analyze", run, "--json", "--jobs", "1"],
        "report": ["report", run, "-o", str(tmp_path / "page.html"), "--jobs", "1"],
        "diff": ["diff", run, run, "--json", "--jobs", "1"],
        "summary": ["summary", run, "--json"],
        "whatif": ["whatif", run, "--json"],
        "merge": ["merge", run, "-o", str(tmp_path / "merged.json.gz")],
    }[command]
    # WHEN the command runs on the run folder (its steps: the command line, the listing of the traces, the process
    # groups' record, the load, the run's own figures; a diff: for each side)
    sys.setprofile(count)
    try:
        status = main(argv)
    finally:
        sys.setprofile(None)
    # THEN what the folder is, its manifest and its config.yaml were each read once (once per side of a diff)
    assert status == 0 and capsys.readouterr().out
    config = 0 if command in ("summary", "whatif") else sides  # (neither reads the run's comm_patterns)
    expected = Counter(is_run_folder=sides, load_manifest=sides, read_config=config)
    assert +calls == +expected


def test_the_service_answers_what_analyze_prints(
    two_window_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the CLI parses, checks and prints; the run folder's own figures and config come from the service
    import msgspec

    from stepscope.analysis import analyze_source

    assert main(["analyze", str(two_window_run), "--json", "--step", "3"]) == 0
    printed = json.loads(capsys.readouterr().out)
    answered = json.loads(msgspec.json.encode(analyze_source(two_window_run, step=3)))
    assert printed == answered and answered["run"] is not None
