"""`stepscope ops PATH`: each op against its device's roofline, through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope.cli import main

QWEN = Path("tracelens_qwen1.5_h100_mi300")


def _ops(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["ops", *args, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.shared
def test_a_gpu_trace_gives_each_product_its_rate_bound_and_efficiency_on_its_device(
    shared_traces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for vendor, device, peak in (("h100", "H100", 989.5), ("mi300", "MI300X", 1307.4)):
        (trace,) = (shared_traces / QWEN / vendor).glob("*.json.gz")
        doc = _ops(capsys, str(trace))
        assert doc["schema"] == "stepscope.ops/1"
        (rank,) = doc["ranks"]
        assert device in rank["device"] and rank["roofline"]["peak_tflops"]["bf16"] == peak
        assert rank["time_kind"] == "device"
        # the model's 2·M·K·N for the MLP's up projection, 48 calls
        (up,) = [g for g in rank["groups"] if g["shapes"] == "[8944, 1024] x [1024, 2816]"]
        assert up["name"] == "aten::mm" and up["calls"] == 48 and up["dtype"] == "bf16"
        assert up["flops"] == 48 * 2 * 8944 * 1024 * 2816
        assert up["bound"] == "compute" and 0.2 < up["efficiency"] < 1.0
        assert up["tflops"] == pytest.approx(up["flops"] / (up["time_us"] * 1e-6) / 1e12)
        # causal attention: half the product, judged against the roof at its intensity
        (attn,) = [g for g in rank["groups"] if g["family"] == "attention"]
        assert attn["causal"] and attn["efficiency"] is not None
        assert rank["findings"] and all(f["saving_us"] > 0 and f["action"] for f in rank["findings"])
        assert sum(g["share"] for g in rank["groups"]) == pytest.approx(1.0)


@pytest.mark.shared
def test_a_2021_trace_counts_its_convolutions_through_their_backward_and_names_fp32(
    shared_traces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = shared_traces / "kineto_resnet50_num_workers_4" / "worker0.1623212756351.pt.trace.json.gz"
    (rank,) = _ops(capsys, str(trace))["ranks"]
    assert "V100" in rank["device"] and rank["steps"] == 6
    conv = [g for g in rank["groups"] if g["family"] == "conv"]
    assert sum(g["calls"] for g in conv if g["name"] == "aten::cudnn_convolution") == 318
    # the batch's copy to the device is a host transfer: not judged against the device memory
    (copy,) = [g for g in rank["groups"] if g["family"] == "transfer" and "224" in g["shapes"]]
    assert copy["efficiency"] is None and copy["name"] == "aten::copy_"
    (top,) = [f for f in rank["findings"] if f["name"] == "aten::cudnn_convolution_backward"]
    assert "fp32" in top["message"] and "bf16" in top["action"]


def test_a_run_folder_recorded_with_shapes_gives_its_products_on_the_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from ..support.train import profiled_run

    run = profiled_run(tmp_path, 8, wait=1, warmup=1, active=2, repeat=1, record_shapes=True)
    doc = _ops(capsys, str(run), "--peak-tflops", "0.5", "--peak-tbps", "0.02")
    (rank,) = doc["ranks"]
    assert rank["device"] is None and rank["time_kind"] == "wall"
    gemms = [g for g in rank["groups"] if g["family"] == "gemm"]
    assert gemms and all(g["tflops"] > 0 and g["efficiency"] is not None for g in gemms)
    assert "0.5 TFLOP/s given" in rank["roofline"]["source"]
    # the terminal's table names the products and its roof
    assert main(["ops", str(run), "--wide", "--peak-tflops", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "Ops against the roofline" in out and "aten::addmm" in out and "given" in out
    # a CPU's products are too small to fill it, never advice for a GPU's number formats
    assert "too small" in out and "bf16" not in out


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", ')
    assert main(["ops", str(bad)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and captured.out == ""
