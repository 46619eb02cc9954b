"""TensorBoard scalars read back from the event files; W&B logged offline and read back from its run file."""

from __future__ import annotations

import json
import struct
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.capture.console import StepscopeWarning
from stepscope.runfolder import read_manifest

from ..support.train import bare_losses, make_training

# wait 1, warmup 1, active 2 -> traced steps 1-3 (window ends at 3); FLOPs counted at step 4; 11 steps: the
# undisturbed steps (for TFLOP/s) are 6-10 (5 follows the counted step).
SCHEDULE = {"wait": 1, "warmup": 1, "active": 2, "repeat": 1, "flop_counter_step": 4, "console": False}
STEPS = 11


def run(tmp_path: Path, **options: Any) -> tuple[Path, list[float]]:
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(model, out_dir=str(tmp_path), **SCHEDULE, **options)
    step = monitor(train_step)
    losses = [step() for _ in range(STEPS)]
    monitor.close()
    assert monitor.run_dir is not None
    return monitor.run_dir, losses


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_scalars_match_the_metrics(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = run(tmp_path, tensorboard=True, memory_log_every=2)
    (event_file,) = [a for a in read_manifest(run_dir).artifacts if a.kind == "tensorboard"]
    assert event_file.path.startswith("tensorboard/rank0/events.out.tfevents.") and event_file.rank == 0
    acc = EventAccumulator(str(run_dir / "tensorboard/rank0"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"step/wall_ms", "throughput/tflops", "throughput/flops", "throughput/tflops_median"} <= tags
    lines = metrics(run_dir)

    def series(tag: str) -> list[tuple[int, float]]:
        return [(e.step, e.value) for e in acc.Scalars(tag)]

    # event files hold float32: compare at that precision
    assert series("step/wall_ms") == [(m["step"], pytest.approx(m["wall_ms"], rel=1e-6)) for m in lines]
    assert series("throughput/tflops") == [
        (m["step"], pytest.approx(m["tflops"], rel=1e-6)) for m in lines if "tflops" in m
    ]
    assert [s for s, _ in series("throughput/tflops")] == [6, 7, 8, 9, 10]
    assert series("throughput/flops") == [(4, lines[4]["flops"])]
    # memory fields of the memory log (every 2 steps) land under memory/
    memory_fields = sorted({k for m in lines for k in m if k.startswith("mem_")})
    assert memory_fields and {f"memory/{k}" for k in memory_fields} <= tags
    for field in memory_fields:
        expected = [(m["step"], pytest.approx(m[field], rel=1e-6)) for m in lines if field in m]
        assert series(f"memory/{field}") == expected and [s for s, _ in expected] == [1, 3, 5, 7, 9]
    ((step, median),) = series("throughput/tflops_median")
    report = json.loads((run_dir / "flops/rank0_step4.json").read_text())
    assert step == 10 and median == pytest.approx(report["throughput"]["tflops"], rel=1e-6)


def wandb_records(path: Path) -> Iterator[Any]:
    """Records of a W&B run file (LevelDB log format: 32 KiB blocks of crc32/length/type-framed chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunk = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 or pos + 7 + length > len(data):  # end, or a record still being written
            break
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("wandb")
    wandb_dir = tmp_path / "wandb_dir"
    wandb_dir.mkdir()
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(wandb_dir),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_PROJECT": "stepscope-test",
    }.items():
        monkeypatch.setenv(key, value)
    return wandb_dir


def wandb_history(wandb_dir: Path, timeout: float = 30.0) -> dict[int, dict[str, Any]]:
    """{step: {key: value}} of the one offline run under `wandb_dir`, once its exit record is written
    (W&B's service writes the file in the background: finish() can return before it is complete)."""
    deadline = time.monotonic() + timeout
    while True:
        files = list(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
        records = list(wandb_records(files[0])) if len(files) == 1 else []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(files) == 1, files
    history: dict[int, dict[str, Any]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            history.setdefault(record.history.step.num, {}).update(items)
    return history


@pytest.mark.slow
def test_wandb_offline_run_holds_tflops_and_top_ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wandb_dir = offline_wandb(tmp_path, monkeypatch)
    run_dir, _ = run(tmp_path / "runs", wandb=True)
    history = wandb_history(wandb_dir)
    # THEN the window's top 10 host ops are logged once, with the window's last step (3) as window_step (they
    # come from the worker that reads the trace off the training thread); a CPU window has no kernels
    rows = [values for values in history.values() if "window_step" in values]
    assert len(rows) == 1 and rows[0]["window_step"] == 3
    prof = {k for k in rows[0] if k.startswith("prof/")}
    assert len(prof) == 10 and all(k.endswith("/cpu_time_total") for k in prof)
    assert "prof/aten::addmm/cpu_time_total" in prof and all(rows[0][k] > 0 for k in prof)
    # AND tflops_rank_0 when the throughput is known (5 undisturbed steps: 6-10), and its final value at close
    tflops = {step: values["tflops_rank_0"] for step, values in history.items() if "tflops_rank_0" in values}
    report = json.loads((run_dir / "flops/rank0_step4.json").read_text())
    assert list(tflops) == [10] and tflops[10] == pytest.approx(report["throughput"]["tflops"])
    assert not any("mfu_rank_0" in values for values in history.values())  # CPU: no MFU


@pytest.mark.slow
def test_wandb_joins_the_scripts_own_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a script with its own W&B run, logging its loss at each step
    wandb_dir = offline_wandb(tmp_path, monkeypatch)
    import wandb

    user_run = wandb.init(project="user-project", dir=str(wandb_dir))
    try:
        train_step, model = make_training()
        monitor = stepscope.performance_monitor(model, out_dir=str(tmp_path / "runs"), **SCHEDULE, wandb=True)
        step = monitor(train_step)
        for _ in range(STEPS):
            wandb.log({"loss": step()})
        monitor.close()
        # THEN stepscope left the script's run open
        assert wandb.run is user_run
    finally:
        user_run.finish()
    history = wandb_history(wandb_dir)
    # AND its values joined the script's steps (commit=False) instead of moving the step axis (a window's top ops
    # known only at close join the row W&B commits at the script's finish, after its last step)
    assert sorted(history)[:STEPS] == list(range(STEPS)) and max(history) <= STEPS
    assert all("loss" in history[step] for step in range(STEPS))
    assert "tflops_rank_0" in history[10]
    assert [v["window_step"] for v in history.values() if any(k.startswith("prof/") for k in v)] == [3]


def test_missing_packages_warn_once_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN neither wandb nor tensorboard can be imported
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_dir, losses = run(tmp_path, wandb=True, tensorboard=True)
    messages = [str(w.message) for w in caught if issubclass(w.category, StepscopeWarning)]
    assert [m for m in messages if "needs the" in m] == [
        "stepscope: tensorboard=True needs the 'tensorboard' package (pip install 'stepscope[tensorboard]'); "
        "tensorboard logging is off for this run, training goes on",
        "stepscope: wandb=True needs the 'wandb' package (pip install 'stepscope[wandb]'); "
        "wandb logging is off for this run, training goes on",
    ]
    assert not [m for m in messages if "switched off" in m]  # no collector failed
    kinds = {a.kind for a in read_manifest(run_dir).artifacts}
    assert {"trace", "flops"} <= kinds and "tensorboard" not in kinds
    assert losses == bare_losses(STEPS)
