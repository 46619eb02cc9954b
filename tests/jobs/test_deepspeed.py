"""DeepSpeed engines profiled by the monitor line alone: real deepspeed on CPU, 2 ranks on gloo (torchrun,
loopback), ZeRO 1, 2 and 3 with `torch_adam`, a plain `engine(x)` / `engine.backward(loss)` / `engine.step()`
loop (tests/support/jobs/deepspeed_loop.py). What a user sees: `stepscope analyze --json` of the run folder (steps are the
engine's optimizer steps, the engine's settings, DeepSpeed's per-module FLOPs, its comms summary, its memory
figures) and the report the monitor writes at close (a DeepSpeed section); the HF Trainer under DeepSpeed with
stepscope's callback. One fast test sums up records by hand: what the facts say a run lacks or ranks disagree on."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.run.deepspeed import DeepSpeedRecords, deepspeed_facts
from stepscope.cli import main
from stepscope.runfolder.payloads import DeepSpeedEngineInfo, MemoryRow

from ..support.jobs import run_ranks

needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install 'stepscope[deepspeed]'; DS_BUILD_OPS=0 on a CPU machine)",
)

JOB = Path(__file__).parents[1] / "support" / "jobs" / "deepspeed_loop.py"
STEPS, GA_STEPS, MICRO_BATCH, WIDTH = 11, 2, 4, 64  # as in tests/support/jobs/deepspeed_loop.py


def run_job(tmp_path: Path, stage: int | str, micro_step_calls: bool = False) -> tuple[Path, str]:
    """`torchrun --standalone --nproc_per_node 2 tests/support/jobs/deepspeed_loop.py OUT STAGE [calls]`: the run folder, stderr."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(JOB.parents[3]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(JOB)]
    args = [str(tmp_path / "runs"), str(stage), *(["calls"] if micro_step_calls else [])]
    result = run_ranks([*cmd, *args], tmp_path, text=True, env=env, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir, result.stderr


def analyze_json(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["analyze", str(run_dir), "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


@pytest.mark.slow
@needs_deepspeed
# ZeRO 1 runs a loop that also calls monitor.step() after every micro-batch: the steps are still the engine's.
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_job_is_profiled_by_the_monitor_line_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stage: int
) -> None:
    # GIVEN a plain DeepSpeed loop whose only addition is performance_monitor(engine, ...)
    run_dir, stderr = run_job(tmp_path, stage, micro_step_calls=stage == 1)
    assert "stepscope:" not in stderr, stderr[-3000:]  # no warning of ours

    # WHEN the run folder is analysed
    doc = analyze_json(run_dir, capsys)
    run = doc["run"]
    ds = run["deepspeed"]

    # THEN steps are the engine's optimizer steps (not its micro-batches), on both ranks, and the window is traced
    assert [(t["rank"], t["steps"]) for t in run["step_times"]] == [(0, STEPS), (1, STEPS)]
    assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1]
    assert all(len(r["steps"]) >= 1 for r in doc["ranks"])
    # the engine's settings
    engine = ds["engine"]
    assert engine["zero_stage"] == stage
    assert (engine["world_size"], engine["dp_size"], engine["mp_size"], engine["pp_size"]) == (2, 2, 1, 1)
    assert (engine["micro_batch"], engine["gradient_accumulation"]) == (MICRO_BATCH, GA_STEPS)
    assert (engine["offload_optimizer"], engine["offload_param"], engine["precision"]) == (None, None, "fp32")
    # DeepSpeed's flops profile of the counted step (every micro-batch's forward), per rank and per module
    assert [(f["rank"], f["step"], f["micro_steps"]) for f in ds["flops"]] == [
        (0, 4, GA_STEPS),
        (1, 4, GA_STEPS),
    ]
    for f in ds["flops"]:
        linears = {m["name"]: m for m in f["modules"] if m["type"] == "Linear"}
        assert sorted(linears) == ["0", "2", "4"]
        hidden = linears["2"]
        assert hidden["params"] == WIDTH * WIDTH + WIDTH and hidden["depth"] == 2
        real_macs = MICRO_BATCH * WIDTH * WIDTH * GA_STEPS
        if stage < 3:
            assert (hidden["macs"], hidden["flops"]) == (real_macs, 2 * real_macs)
        else:  # ZeRO-3's own linear and the addmm inside it are both counted: said, not hidden
            assert hidden["macs"] == 2 * real_macs
            assert any("ZeRO-3" in note for note in ds["notes"])
        assert f["flops_per_step"] == 3 * f["fwd_flops"] and f["fwd_flops"] >= 3 * hidden["flops"] // 2
        assert f["tflops"] is not None and f["tflops"] > 0  # the median over the undisturbed steps
    # DeepSpeed's comms logger over the window's active steps (1-2), both ranks
    assert {(c["rank"], c["first_step"], c["last_step"]) for c in ds["comms"]} == {(0, 1, 2), (1, 1, 2)}
    assert all(c["count"] > 0 and c["msg_bytes"] > 0 and c["mean_latency_ms"] > 0 for c in ds["comms"])
    ops = {c["op"] for c in ds["comms"]}
    assert "all_gather_into_tensor" in ops  # ZeRO gathers the updated parameters partitions
    if stage == 3:
        assert "reduce_scatter_tensor" in ops  # ZeRO-3 reduce-scatters the gradients
    # see_memory_usage's figures from the memory log (DeepSpeed's CPU accelerator: the RSS)
    assert [(m["rank"], m["accelerator"]) for m in ds["memory"]] == [(0, "cpu"), (1, "cpu")]
    assert all(m["peak_allocated_bytes"] >= m["allocated_bytes"] > 0 for m in ds["memory"])

    # AND the report the monitor wrote at close shows them in its DeepSpeed section
    html = (run_dir / "report.html").read_text()
    section = html[html.index('<section id="deepspeed">') :]
    section = section[: section.index("</section>")]
    for text in ("ZeRO stage", "DeepSpeed flops profile", "DeepSpeed comms logger", "all_gather_into_tensor"):
        assert text in section


@pytest.mark.slow
@needs_deepspeed
def test_hf_trainer_under_deepspeed_records_the_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the HF Trainer under DeepSpeed ZeRO-2 (its engine out of the callback's sight) with stepscope's callback
    run_dir, stderr = run_job(tmp_path, "hf")
    assert "stepscope:" not in stderr, stderr[-3000:]

    # WHEN the run folder is analysed
    doc = analyze_json(run_dir, capsys)
    ds = doc["run"]["deepspeed"]

    # THEN the callback's steps (the Trainer's, 1..8) carry the engine's records: its settings, DeepSpeed's flops
    # profile of step 4 (both micro-batches), its comms logger over the window's steps 2-3
    assert [(t["rank"], t["steps"]) for t in doc["run"]["step_times"]] == [(0, 8), (1, 8)]
    assert (ds["engine"]["zero_stage"], ds["engine"]["gradient_accumulation"]) == (2, GA_STEPS)
    assert [(f["rank"], f["step"], f["micro_steps"]) for f in ds["flops"]] == [
        (0, 4, GA_STEPS),
        (1, 4, GA_STEPS),
    ]
    head = next(m for m in ds["flops"][0]["modules"] if m["name"] == "lm_head")
    assert head["macs"] == MICRO_BATCH * 16 * 32 * 64 * GA_STEPS  # tokens x n_embd x vocab, per micro-batch
    assert {(c["rank"], c["first_step"], c["last_step"]) for c in ds["comms"]} == {(0, 2, 3), (1, 2, 3)}


def _engine(rank: int, stage: int) -> DeepSpeedEngineInfo:
    return DeepSpeedEngineInfo(
        rank=rank,
        deepspeed_version="0.19.8",
        engine="DeepSpeedEngine",
        zero_stage=stage,
        offload_optimizer=None,
        offload_param=None,
        world_size=2,
        dp_size=2,
        mp_size=1,
        pp_size=1,
        micro_batch=4,
        gradient_accumulation=2,
        train_batch=16,
        precision="bf16",
        optimizer="AdamW",
    )


def test_facts_say_what_a_run_lacks_and_where_ranks_differ() -> None:
    # GIVEN two ranks' engine records that disagree on the ZeRO stage, no flops profile, no comms summary, and
    # memory rows of which only the later ones hold DeepSpeed's figures
    rows = [
        MemoryRow(step=1, unix_time=0.0, rss_bytes=10, sys_used_bytes=5, sys_percent=1.0),
        MemoryRow(step=3, unix_time=1.0, rss_bytes=10, sys_used_bytes=5, sys_percent=1.0, ds_accelerator="cuda",
                  ds_allocated_bytes=300, ds_peak_allocated_bytes=900, ds_reserved_bytes=400,
                  ds_peak_reserved_bytes=1000, ds_vm_used_bytes=7),
        MemoryRow(step=5, unix_time=2.0, rss_bytes=10, sys_used_bytes=5, sys_percent=1.0, ds_accelerator="cuda",
                  ds_allocated_bytes=200, ds_peak_allocated_bytes=500, ds_reserved_bytes=400,
                  ds_peak_reserved_bytes=800, ds_vm_used_bytes=9),
    ]  # fmt: skip
    records = DeepSpeedRecords(engines=[_engine(0, 2), _engine(1, 3)])

    # WHEN they are summed up
    facts = deepspeed_facts(records, flops=[], memory={0: rows})

    # THEN the first rank's engine is the job's, and the notes name what differs and what is missing
    assert facts.engine is not None and facts.engine.zero_stage == 2
    assert "rank 1's engine differs from rank 0's in zero_stage" in facts.notes
    assert any(n.startswith("no DeepSpeed flops profile") for n in facts.notes)
    assert any(n.startswith("no DeepSpeed comms summary") for n in facts.notes)
    # the memory figures: the last row's MA / CA, the largest peaks, over the rows that have them
    (memory,) = facts.memory
    assert (memory.rows, memory.allocated_bytes, memory.peak_allocated_bytes) == (2, 200, 900)
    assert (memory.peak_reserved_bytes, memory.vm_used_bytes, memory.accelerator) == (1000, 9, "cuda")
