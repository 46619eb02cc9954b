"""FLOP counting on real models: exact per-module numbers, placement outside traced windows, throughput."""

from __future__ import annotations

import json
import statistics
import warnings
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.capture.collector import StepscopeWarning
from stepscope.runfolder import read_manifest

from .conftest import profiler_steps

B, SIZES = 4, [(16, 32), (32, 24), (24, 8)]  # batch and (in, out) of the three Linear layers


def mlp() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    (a, b), (_, c), (_, d) = SIZES
    return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, c), nn.ReLU(), nn.Linear(c, d))


def run(tmp_path: Path, steps: int, model: Any, step_fn: Any, **options: Any) -> tuple[Path, list[Any]]:
    """Run `steps` decorated steps; returns the run folder and the StepscopeWarnings raised."""
    options = {"console": False, **options}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = stepscope.performance_monitor(model, out_dir=str(tmp_path), **options)
        stepped = monitor(step_fn)
        for _ in range(steps):
            stepped()
        monitor.close()
    assert monitor.run_dir is not None
    return monitor.run_dir, [w for w in caught if issubclass(w.category, StepscopeWarning)]


def train_step_for(model: Any, input_requires_grad: bool) -> Any:
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        x = torch.randn(B, SIZES[0][0], requires_grad=input_requires_grad)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    return step


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("input_requires_grad", [True, False])
def test_mlp_flops_match_the_layer_sizes(tmp_path: Path, input_requires_grad: bool) -> None:
    # GIVEN an MLP, and a counted step requested inside the traced window (steps 1-2)
    model = mlp()
    run_dir, caught = run(
        tmp_path, 8, model, train_step_for(model, input_requires_grad),
        wait=1, warmup=1, active=1, repeat=1, flop_counter_step=1,
    )  # fmt: skip
    # THEN it was moved to step 3, the first untraced step, with one warning and a manifest note
    assert [str(w.message) for w in caught if "flop_counter_step" in str(w.message)] == [
        "stepscope: flop_counter_step=1 falls inside a traced window (steps 1-2), where the profiler would "
        "record every op twice and the step would run ~2x slower; FLOP counting runs at step 3 instead"
    ]
    manifest = read_manifest(run_dir)
    assert any("runs at step 3 instead" in note for note in manifest.notes)
    assert 3 not in profiler_steps(run_dir / "traces/rank0_step2.json.gz")
    flops_files = sorted((a.kind, a.path, a.rank, a.step) for a in manifest.artifacts if "flops" in a.kind)
    assert flops_files == [
        ("flops", "flops/rank0_step3.json", 0, 3),
        ("flops_table", "flops/rank0_step3.txt", 0, 3),
    ]

    # AND forward = 2*B*in*out per Linear (addmm); backward = the same for the weight gradient, and again
    # for the input gradient, except for the first layer when the batch needs no gradient (mm)
    report = json.loads((run_dir / "flops/rank0_step3.json").read_text())
    expected: dict[str, dict[str, int]] = {}
    for i, (n_in, n_out) in enumerate(SIZES):
        one = 2 * B * n_in * n_out
        backward = one if (i == 0 and not input_requires_grad) else 2 * one
        expected[str(2 * i)] = {"aten.addmm": one, "aten.mm": backward}
    total = sum(sum(ops.values()) for ops in expected.values())
    if input_requires_grad:
        assert total == sum(3 * 2 * B * n_in * n_out for n_in, n_out in SIZES)
    assert report["total_flops"] == total and report["step"] == 3 and report["requested_step"] == 1
    modules = {m["name"]: m for m in report["modules"]}
    assert list(modules) == ["", "0", "2", "4"]  # model order; the ReLUs do no FLOPs
    assert modules[""]["flops"] == total and modules[""]["type"] == "Sequential"
    for name, ops in expected.items():
        assert modules[name]["ops"] == ops and modules[name]["flops"] == sum(ops.values())
        assert modules[name]["type"] == "Linear" and modules[name]["depth"] == 2

    # AND the text table lists the layers to depth 2
    text = (run_dir / "flops/rank0_step3.txt").read_text()
    assert f"{total:,}" in text and "Sequential (model)" in text
    for name in expected:
        assert f"  {name} " in text

    # AND throughput uses the uninstrumented steps only: not 0 (start-up), 1-2 (traced) nor 3 (counted)
    lines = metrics(run_dir)
    assert lines[3]["flops"] == total and "tflops" not in lines[3]
    timed = lines[4:]
    for line in timed:
        assert line["tflops"] == total / (line["wall_ms"] / 1e3) / 1e12
        assert "mfu" not in line
    assert all("tflops" not in line for line in lines[:4])
    throughput = report["throughput"]
    median = statistics.median(line["wall_ms"] / 1e3 for line in timed)
    assert throughput["steps_timed"] == 4 and throughput["median_step_s"] == median
    assert throughput["tflops"] == total / median / 1e12
    assert throughput["mfu"] is None and "this run is on the CPU" in throughput["no_mfu_reason"]


def test_refuses_when_every_step_is_traced(tmp_path: Path) -> None:
    model = mlp()
    run_dir, caught = run(
        tmp_path,
        5,
        model,
        train_step_for(model, False),
        wait=0,
        warmup=1,
        active=1,
        repeat=0,
        flop_counter_step=2,
    )
    (warning,) = [w for w in caught if "flop_counter_step" in str(w.message)]
    assert "cannot lie outside the profiler's windows: with repeat=0 and wait=0" in str(warning.message)
    assert not [a for a in read_manifest(run_dir).artifacts if a.kind == "flops"]
    assert all("flops" not in line and "tflops" not in line for line in metrics(run_dir))


def test_transformer_fast_path_says_zero_flops(tmp_path: Path) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True).eval()

    def infer() -> None:
        with torch.no_grad():
            layer(torch.randn(2, 5, 16))

    run_dir, caught = run(tmp_path, 6, layer, infer, wait=3, warmup=1, active=1, flop_counter_step=0)
    report = json.loads((run_dir / "flops/rank0_step0.json").read_text())
    assert report["total_flops"] == 0 and report["throughput"] is None
    assert "counted 0 FLOPs at step 0" in report["note"] and "eval()/no_grad" in report["note"]
    assert any("counted 0 FLOPs" in str(w.message) for w in caught)
    assert all("tflops" not in line for line in metrics(run_dir))
    assert "No TFLOP/s is reported" in (run_dir / "flops/rank0_step0.txt").read_text()


def test_cpu_run_reports_tflops_and_why_no_mfu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = mlp()
    run(
        tmp_path / "a",
        7,
        model,
        train_step_for(model, True),
        wait=4,
        warmup=1,
        active=1,
        flop_counter_step=3,
        console=True,
    )
    out = " ".join(capsys.readouterr().err.split())  # the monitor prints on stderr
    assert "FLOPs of step 3, rank 0 (forward + backward)" in out
    assert (
        "stepscope: rank 0: achieved" in out
        and "TFLOP/s =" in out
        and "(median of 3 uninstrumented steps)" in out
    )
    assert "no MFU: this run is on the CPU, and stepscope has no peak FLOP/s table for CPUs" in out


def test_peak_override_gives_mfu_with_formula_and_peak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = mlp()
    run_dir, _ = run(
        tmp_path, 7, model, train_step_for(model, True),
        wait=4, warmup=1, active=1, flop_counter_step=3, peak_tflops=0.5, console=True, flop_table_depth=1,
    )  # fmt: skip
    out = " ".join(capsys.readouterr().err.split())  # the monitor prints on stderr
    assert (
        "MFU = achieved TFLOP/s / peak TFLOP/s" in out
        and "peak 0.5 TFLOP/s (cpu fp32; peak_tflops option)" in out
    )
    lines = metrics(run_dir)
    # steps 4-5 are traced and 3 is counted: only step 6 (after the count) carries a per-step figure
    assert [line["step"] for line in lines if "mfu" in line] == [6]
    assert lines[6]["mfu"] == lines[6]["tflops"] / 0.5
    throughput = json.loads((run_dir / "flops/rank0_step3.json").read_text())["throughput"]
    assert throughput["mfu"] == throughput["tflops"] / 0.5
    assert throughput["peak"] == {
        "tflops": 0.5,
        "device": "cpu",
        "dtype": "fp32",
        "source": "peak_tflops option",
    }
    # depth 1: the table shows the model only
    text = (run_dir / "flops/rank0_step3.txt").read_text()
    assert "Sequential (model)" in text and "Linear" not in text


def test_a_ddp_wrapped_model_lists_its_own_layers(tmp_path: Path) -> None:
    # GIVEN the MLP wrapped in real DistributedDataParallel (one gloo process on loopback)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    init = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    try:
        inner = mlp()
        model = DistributedDataParallel(inner)
        run_dir, _ = run(
            tmp_path / "runs", 6, model, train_step_for(model, True),
            wait=1, warmup=1, active=1, repeat=1, flop_counter_step=3,
        )  # fmt: skip
    finally:
        dist.destroy_process_group()
    # THEN the FLOP table at the default depth shows the layers, not only the wrapper
    report = json.loads((run_dir / "flops/rank0_step3.json").read_text())
    names = [m["name"] for m in report["modules"]]
    assert names == ["", "0", "2", "4"]
    assert report["modules"][0]["type"] == "Sequential"
    text = (run_dir / "flops/rank0_step3.txt").read_text()
    assert "Sequential (model)" in text and "  0 " in text
