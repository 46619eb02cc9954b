"""A run folder read whole: `load_run`, and `stepscope analyze RUN` adding what the run measured outside its
traces (step times over the run, FLOPs / MFU, memory, system samples), checked against the files the run wrote."""

from __future__ import annotations

import json
import shutil
import statistics
import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import stepscope
from stepscope.analysis.run.folder import load_run
from stepscope.analysis.run.plain import MIN_PLAIN_KEPT
from stepscope.cli import cli

from ..support.output import tables
from ..support.train import make_training, profiled_run

# every test reads one module fixture: a CPU run with every collector on
pytestmark = pytest.mark.slow

STEPS = 24


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CPU run with every collector that works on a CPU switched on."""
    return profiled_run(
        tmp_path_factory.mktemp("runs"),
        STEPS,
        wait=4, warmup=1, active=2, repeat=2,
        flop_counter_step=1, comm_logger_step=2, memory_log_every=3, system_sample_interval=0.02,
        memory_timeline=True, tensorboard=True, console=False,
    )  # fmt: skip


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def analyze_json(path: Path) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["analyze", str(path), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def test_load_run_reads_every_artifact(full_run: Path) -> None:
    run = load_run(full_run)
    assert run.notes == []
    assert [m.step for m in run.metrics] == list(range(STEPS))
    assert run.config["flop_counter_step"] == 1 and run.config["memory_log_every"] == 3
    (flops,) = run.flops
    assert (
        flops.step == 1
        and flops.total_flops == json.loads((full_run / "flops/rank0_step1.json").read_text())["total_flops"]
    )
    (counts,) = run.comm_counts
    assert counts.step == 2 and counts.distributed is False
    assert [r.step for r in run.memory[0]] == list(range(2, STEPS, 3))
    assert len(run.system[0]) == len((full_run / "system/rank0.jsonl").read_text().splitlines()) >= 3
    assert run.has_traces and run.traces().rank_ids() == [0]


def test_analyze_json_has_the_runs_figures(full_run: Path) -> None:
    doc = analyze_json(full_run)
    assert doc["schema"] == "stepscope.analysis/4"
    run = doc["run"]
    metrics = lines(full_run / "metrics.jsonl")
    # step times: plain steps are outside the windows, after step 0, neither the FLOP nor the comm step, nor
    # beside a window's end work (where enough remain without them)
    candidates = [m for m in metrics if m["phase"] == "none" and m["step"] not in (0, 1, 2)]
    busy = {
        s
        for a in json.loads((full_run / "manifest.json").read_text())["artifacts"]
        if a["kind"] == "trace"
        for first, last in a["beside_steps"]
        for s in range(first, last + 1)
    }
    kept = [m for m in candidates if m["step"] not in busy]
    # (the analysis keeps those beside the end work when fewer than MIN_PLAIN_KEPT would remain without them)
    plain = [m["wall_ms"] for m in (kept if len(kept) >= MIN_PLAIN_KEPT else candidates)]
    (times,) = run["step_times"]
    assert times["steps"] == STEPS and times["plain_steps"] == len(plain)
    assert times["overlapped_steps"] == len(candidates) - len(plain)
    assert times["median_ms"] == pytest.approx(statistics.median(plain))
    assert times["mean_ms"] == pytest.approx(statistics.fmean(plain))
    assert min(plain) <= times["p90_ms"] <= max(plain)
    traced = [m["wall_ms"] for m in metrics if m["phase"] != "none"]
    assert times["traced_median_ms"] == pytest.approx(statistics.median(traced))
    assert times["windows"] == [[5, 6], [12, 13]]
    assert times["slowest"][0]["wall_ms"] == max(m["wall_ms"] for m in metrics)
    # FLOPs: the counted figure and the throughput the FLOP collector wrote
    report = json.loads((full_run / "flops/rank0_step1.json").read_text())
    (flops,) = run["flops"]
    assert flops["total_flops"] == report["total_flops"] > 0
    assert flops["tflops"] == pytest.approx(report["throughput"]["tflops"])
    assert flops["mfu"] is None and "no MFU" in flops["reason"] and run["flops_note"] is None
    # memory: the rows of the memory log
    rows = lines(full_run / "memory/rank0.jsonl")
    (memory,) = run["memory"]
    assert memory["rows"] == len(rows) and memory["peak_rss_bytes"] == max(r["rss_bytes"] for r in rows)
    assert memory["peak_cuda_allocated_bytes"] is None  # a CPU run
    # system: the sampler's rows
    samples = lines(full_run / "system/rank0.jsonl")
    (system,) = run["system"]
    assert system["samples"] == len(samples) and system["peak_rss_bytes"] == max(
        s["rss_bytes"] for s in samples
    )
    # CPU % from the samples after the first (whose CPU % covers the millisecond since the sampler started)
    assert system["process_cpu_max_percent"] == max(s["process_cpu_percent"] for s in samples[1:])
    assert system["process_cpu_mean_percent"] == pytest.approx(
        statistics.fmean(s["process_cpu_percent"] for s in samples[1:])
    )
    assert system["note"] is None


def run_table(out: str, *columns: str) -> list[list[str]]:
    """The rows of the printed table that has `columns` (headers read across their wrapped lines)."""
    return next(
        rows for heads, rows in tables(out) if all(c in [" ".join(h.split()) for h in heads] for c in columns)
    )


def test_analyze_prints_the_run_section(full_run: Path) -> None:
    result = CliRunner().invoke(cli, ["analyze", str(full_run)], terminal_width=100)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Step time over the whole run" in out and "profiled windows (active steps): 5-6, 12-13" in out
    assert "FLOPs per step (counted at step 1)" in out and "TFLOP/s" in out
    memory = run_table(out, "peak RSS", "RSS growth per step")
    assert (
        memory[0][0] == "0" and "-" in memory[0][1] and memory[0][2].endswith("MiB")
    )  # steps first-last, peak
    system = run_table(out, "samples", "process CPU mean")
    assert system[0][0] == "0" and int(system[0][1]) > 0


def test_one_system_sample_is_too_few_for_cpu_figures(tmp_path: Path) -> None:
    # GIVEN a run shorter than its sampling interval: one sample, taken as the sampler started
    train_step, model = make_training()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = stepscope.performance_monitor(
            model, out_dir=str(tmp_path), wait=1, warmup=0, active=1, system_sample_interval=30.0,
            console=False, report=False,
        )  # fmt: skip
        step = monitor(train_step)
        for _ in range(3):
            step()
        monitor.close()
    assert monitor.run_dir is not None
    (system,) = analyze_json(monitor.run_dir)["run"]["system"]
    # THEN no CPU mean of one sample (it read "1 samples over 0.0 s, process CPU 0% mean"), and a note says why
    assert system["samples"] == 1 and system["seconds"] == 0.0 and system["peak_rss_bytes"] > 0
    assert system["process_cpu_mean_percent"] is None and system["process_cpu_max_percent"] is None
    assert system["system_cpu_mean_percent"] is None
    assert system["note"].startswith("too few samples for CPU figures (1; 3 needed)")
    result = CliRunner().invoke(cli, ["analyze", str(monitor.run_dir)], env={"COLUMNS": "200"})
    (row,) = run_table(result.output, "samples", "process CPU mean")
    assert row[:5] == ["0", "1", "0 us", "-", "-"] and row[5].endswith("MiB")  # no CPU mean, no CPU max
    assert "rank 0: too few samples for CPU figures" in result.output


def test_a_run_without_flops_says_why(tmp_path: Path) -> None:
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(
        model, out_dir=str(tmp_path), wait=1, warmup=0, active=1, console=False
    )
    step = monitor(train_step)
    for _ in range(4):
        step()
    monitor.close()
    assert monitor.run_dir is not None
    run = analyze_json(monitor.run_dir)["run"]
    assert run["flops"] == [] and "flop_counter_step" in run["flops_note"]
    assert run["memory"] == [] and run["system"] == []


def test_damaged_artifacts_are_left_out_with_a_note(full_run: Path, tmp_path: Path) -> None:
    run_dir = Path(shutil.copytree(full_run, tmp_path / "copy"))
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 99, "rank"')  # a line torn by a kill
    (run_dir / "flops/rank0_step1.json").write_text("{not json")
    doc = analyze_json(run_dir)
    notes = doc["run"]["notes"]
    assert any("metrics.jsonl: 1 line(s) could not be read" in n for n in notes)
    assert any("rank0_step1.json: not a valid FlopsReport" in n for n in notes)
    assert doc["run"]["flops"] == [] and doc["run"]["step_times"][0]["steps"] == STEPS


def test_a_run_that_ended_before_its_first_window(tmp_path: Path) -> None:
    train_step, model = make_training()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = stepscope.performance_monitor(model, out_dir=str(tmp_path), wait=10, console=False)
        step = monitor(train_step)
        for _ in range(3):
            step()
        monitor.close()
    assert monitor.run_dir is not None
    doc = analyze_json(monitor.run_dir)
    assert doc["ranks"] == [] and any("has no traces" in n for n in doc["notices"])
    assert doc["run"]["step_times"][0]["steps"] == 3
