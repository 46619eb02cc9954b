"""`stepscope ops PATH`: each op against its device's roofline, through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope.cli import main

from ..support.ops import record

QWEN = Path("tracelens_qwen1.5_h100_mi300")


def _ops(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["ops", *args, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.shared
def test_an_mi250_that_rocm_names_generically_is_judged_against_one_gcds_roof(
    shared_traces: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the shared ROCm 6.2 trace, whose devices are "AMD Radeon Graphics" (compute 9.0, 104 compute units)
    doc = _ops(capsys, str(shared_traces / "hta_amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"))
    (rank,) = doc["ranks"]
    # THEN the device is told by its properties, and its roof is one GCD's (half the MI250's datasheet figures)
    assert rank["device"].startswith("AMD Radeon Graphics (MI250 by its properties")
    assert rank["roofline"]["peak_tflops"]["bf16"] == 181.05 and rank["roofline"]["tbps"] == 1.6384
    assert "one GCD" in rank["roofline"]["source"]
    assert any(g["efficiency"] is not None for g in rank["groups"] if g["family"] == "gemm")


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


@pytest.mark.parametrize("flag", ["--peak-tflops", "--peak-tbps"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "lots"])
def test_a_roof_of_nothing_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": []}')
    assert main(["ops", str(trace), flag, value]) == 2
    assert "above 0" in capsys.readouterr().err or value == "lots"


def _event(name: str, cat: str, ts: float, dur: float, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def _gpu_trace(path: Path, step_us: list[float], queued_us: float = 0.0) -> Path:
    """A GPU trace with known answers: per step an aten::linear over an aten::mm whose launch runs a 100 us
    kernel, a view launching nothing, and the batch's copy to the device (a 50 us HtoD memcpy); `queued_us`: a
    kernel at the start launched before the trace began (no launch in it)."""
    events: list[dict] = []
    if queued_us:
        queued = _event("queued_kernel", "kernel", -queued_us, queued_us, correlation=999999, device=0)
        queued.update(pid=0, tid=7)
        events.append(queued)
    ts, corr = 0.0, 0
    mm = {"Input Dims": [[512, 1024], [1024, 768]], "Input type": ["c10::BFloat16"] * 2}
    for i, dur in enumerate(step_us):
        events.append(_event(f"ProfilerStep#{i}", "user_annotation", ts, dur))
        events.append(
            _event(
                "aten::copy_",
                "cpu_op",
                ts + 1,
                5,
                **{"Input Dims": [[64, 1024], [64, 1024]], "Input type": ["float", "float"]},
            )
        )
        corr += 1
        events.append(_event("cudaMemcpyAsync", "cuda_runtime", ts + 2, 1, correlation=corr))
        copy = _event(
            "Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", ts + 3, 50, correlation=corr, device=0
        )
        copy.update(pid=0, tid=7)
        events.append(copy)
        linear = {"Input Dims": [[512, 1024], [768, 1024]], "Input type": ["c10::BFloat16"] * 2}
        events.append(_event("aten::linear", "cpu_op", ts + 10, 20, **linear))
        events.append(_event("aten::mm", "cpu_op", ts + 12, 10, **mm))
        corr += 1
        events.append(_event("cudaLaunchKernel", "cuda_runtime", ts + 13, 2, correlation=corr))
        kernel = _event("gemm_kernel", "kernel", ts + 20, 100, correlation=corr, device=0)
        kernel.update(pid=0, tid=7)
        events.append(kernel)
        events.append(
            _event(
                "aten::view",
                "cpu_op",
                ts + 31,
                1,
                **{"Input Dims": [[512, 768]], "Input type": ["c10::BFloat16"]},
            )
        )
        ts += dur
    doc = {"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


def test_a_gpu_trace_with_known_answers_times_each_op_by_its_kernels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _ops(capsys, str(_gpu_trace(tmp_path / "g.json", [400.0, 410.0, 405.0])))
    (rank,) = doc["ranks"]
    assert rank["device"] == "NVIDIA H100 80GB HBM3" and rank["steps"] == 3
    (mm,) = [g for g in rank["groups"] if g["family"] == "gemm"]
    # the linear is counted once, as its mm, timed by its kernels: 3 x 100 us
    assert mm["name"] == "aten::mm" and mm["calls"] == 3 and mm["time_us"] == pytest.approx(300.0)
    assert mm["flops"] == 3 * 2 * 512 * 1024 * 768
    assert mm["tflops"] == pytest.approx(mm["flops"] / 300e-6 / 1e12)
    # its roof: the H100's bf16 peak or its memory's 3.35 TB/s times its FLOPs per byte (236: below the ridge)
    moved = 3 * 2 * (512 * 1024 + 1024 * 768 + 512 * 768)
    assert mm["bytes"] == moved and mm["intensity"] == pytest.approx(mm["flops"] / moved)
    roof = min(989.5, 3.35 * mm["intensity"])
    assert mm["bound"] == "memory" and mm["efficiency"] == pytest.approx(mm["tflops"] / roof)
    # the copy to the device is a host transfer, not judged against the device's memory; the view is left out
    (copy,) = [g for g in rank["groups"] if g["name"] == "aten::copy_"]
    assert (
        copy["family"] == "transfer"
        and copy["time_us"] == pytest.approx(150.0)
        and copy["efficiency"] is None
    )
    assert not [g for g in rank["groups"] if g["name"] == "aten::view"]
    assert not [n for n in rank["notes"] if "median step" in n]
    assert rank["coverage"] == pytest.approx(1.0)  # every launched kernel and copy is a counted op's


def test_device_work_queued_before_the_trace_is_said_and_left_out_of_the_coverage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _ops(capsys, str(_gpu_trace(tmp_path / "g.json", [400.0, 410.0, 405.0], queued_us=450.0)))
    (rank,) = doc["ranks"]
    assert rank["coverage"] == pytest.approx(1.0)
    (note,) = [n for n in rank["notes"] if "no launch in the trace" in n]
    assert note.startswith("0.5 ms of the device's work (50%)")


def test_a_step_far_longer_than_the_others_is_said_to_weigh_on_the_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _ops(capsys, str(_gpu_trace(tmp_path / "g.json", [400.0, 4000.0, 405.0, 410.0])))
    (note,) = [n for n in doc["ranks"][0]["notes"] if "median step" in n]
    assert note.startswith("ProfilerStep#1 took 4.0 ms, 10x the median step")


def test_the_terminal_table_keeps_every_figure_at_80_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["ops", str(_gpu_trace(tmp_path / "g.json", [400.0, 410.0, 405.0]))]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    for header in ("of roof", "saving", "TFLOP/s", "bound", "calls"):
        assert header in out, header
    assert "300 us" in out  # the products' time, whole


def test_a_folder_of_ranks_is_read_side_by_side_and_a_json_that_is_no_trace_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in range(3):
        _gpu_trace(folder / f"rank{rank}.json", [400.0 + rank, 410.0, 405.0])
    (folder / "config.json").write_text('{"lr": 0.1}')  # (as analyze does: skipped with a notice)
    one = _ops(capsys, str(folder), "--jobs", "1")
    two = _ops(capsys, str(folder), "--jobs", "2")
    assert [r["rank"] for r in one["ranks"]] == [0, 1, 2]
    assert [r["groups"] for r in one["ranks"]] == [r["groups"] for r in two["ranks"]]
    assert any("config.json: skipped" in n for n in one["notices"])
    # a damaged trace stops it, naming the file (exit 2), as it stops analyze
    (folder / "rank3.json").write_text('{"traceEvents": [{"ph": "X", ')
    assert main(["ops", str(folder), "--jobs", "2"]) == 2
    assert "rank3.json" in capsys.readouterr().err


def test_a_trace_with_an_event_that_is_no_object_is_still_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _gpu_trace(tmp_path / "g.json", [400.0, 410.0, 405.0])
    doc = json.loads(path.read_text())
    doc["traceEvents"].insert(3, 7)  # (not an event: the piece is read as plain objects)
    path.write_text(json.dumps(doc))
    (rank,) = _ops(capsys, str(path))["ranks"]
    (mm,) = [g for g in rank["groups"] if g["family"] == "gemm"]
    assert mm["calls"] == 3 and mm["time_us"] == pytest.approx(300.0)


def _bound_trace(path: Path, *, wait_for_gpu: bool, kernel_us: tuple[float, ...] = (340.0,) * 3) -> Path:
    """Three steps of 400 us, each an aten::mm whose 340 us kernel is far below its roof; `wait_for_gpu`: the
    host then waits for it (cudaDeviceSynchronize) and the kernel bounds the step, else the host's own work does."""
    events: list[dict] = []
    mm = {"Input Dims": [[512, 1024], [1024, 768]], "Input type": ["c10::BFloat16"] * 2}
    for i, took in enumerate(kernel_us):
        ts = 2000.0 * i
        events.append(_event(f"ProfilerStep#{i}", "user_annotation", ts, 400.0 if took < 400 else took + 60))
        events.append(_event("aten::mm", "cpu_op", ts + 10, 10, **mm))
        events.append(_event("cudaLaunchKernel", "cuda_runtime", ts + 13, 2, correlation=i + 1))
        kernel = _event("gemm_kernel", "kernel", ts + 20, took, correlation=i + 1, device=0)
        kernel.update(pid=0, tid=7)
        events.append(kernel)
        if wait_for_gpu:
            events.append(
                _event("cudaDeviceSynchronize", "cuda_runtime", ts + 25, took - 4, correlation=100 + i)
            )
    doc = {"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


def test_a_finding_is_priced_in_step_time_by_a_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the same slow product, bounding the step (the host waits for it) or hidden under the host's work
    bound = _ops(capsys, str(_bound_trace(tmp_path / "bound.json", wait_for_gpu=True)))["ranks"][0]
    hidden = _ops(capsys, str(_bound_trace(tmp_path / "hidden.json", wait_for_gpu=False)))["ranks"][0]
    (f_bound,) = [f for f in bound["findings"] if f["name"] == "aten::mm"]
    (f_hidden,) = [f for f in hidden["findings"] if f["name"] == "aten::mm"]
    # THEN both save the same op time, but only the kernel that bounds the step saves step time: about as much
    assert f_bound["saving_us"] == pytest.approx(f_hidden["saving_us"])
    per_step = f_bound["saving_us"] / 3
    assert f_bound["step_saving_us"] == pytest.approx(per_step, rel=0.1)
    assert f_hidden["step_saving_us"] == pytest.approx(0.0, abs=1.0)
    assert "replay" in f_bound["replay_note"] and "within 0.0%" in f_bound["replay_note"]


def test_a_product_whose_calls_vary_says_its_efficiency_includes_the_slow_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _bound_trace(tmp_path / "t.json", wait_for_gpu=True, kernel_us=(100.0, 110.0, 105.0, 1200.0))
    (finding,) = [f for f in _ops(capsys, str(trace))["ranks"][0]["findings"] if f["name"] == "aten::mm"]
    assert "its calls took 100 us to 1.20 ms (median 110 us)" in finding["message"], finding["message"]


def test_a_trace_without_profiler_steps_is_priced_as_one_step_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    from ..support.ops import record

    # GIVEN a CPU trace of products recorded outside any ProfilerStep, judged against a roof it is far below
    a = torch.randn(256, 256)
    trace = record(lambda: [a @ a for _ in range(4)], tmp_path / "t.json")
    doc = _ops(capsys, str(trace), "--peak-tflops", "100", "--peak-tbps", "10")
    (rank,) = doc["ranks"]
    assert rank["steps"] == 0 and rank["findings"]
    # THEN its findings are priced on the whole trace, taken as one step, and say so
    for finding in rank["findings"]:
        assert "of the whole trace, taken as one step (it marks no ProfilerStep)" in finding["replay_note"]
    assert main(["ops", str(trace), "--peak-tflops", "100", "--peak-tbps", "10"]) == 0
    out = capsys.readouterr().out
    assert "of the whole trace" in out and "of the median step" not in out


def test_a_finding_over_shapes_of_different_bounds_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN an H100 trace of one step: aten::mm of a compute-bound shape (230 us) and of a memory-bound one
    # (270 us), each under 70% of its roof but saving under 3% of the op time alone, and a fast add (1.5 ms)
    events, ts = [_event("ProfilerStep#0", "user_annotation", 0, 3000)], 10.0
    calls = (
        ("aten::mm", [[4096, 4096], [4096, 4096]], 230.0),  # 2·4096³ FLOPs over 100 MB: compute-bound
        ("aten::mm", [[16384, 64], [64, 16384]], 270.0),  # its output dominates the bytes: memory-bound
        ("aten::add", [[32768, 32768], [32768, 32768]], 1500.0),  # 6.4 GB at 4.3 TB/s: no saving
    )
    for corr, (name, dims, kernel_us) in enumerate(calls, 1):
        events.append(
            _event(name, "cpu_op", ts, 20, **{"Input Dims": dims, "Input type": ["c10::BFloat16"] * 2})
        )
        events.append(_event("cudaLaunchKernel", "cuda_runtime", ts + 2, 2, correlation=corr))
        kernel = _event(f"{name}_kernel", "kernel", ts + 5, kernel_us, correlation=corr, device=0)
        kernel.update(pid=0, tid=7)
        events.append(kernel)
        ts += kernel_us + 10
    trace = tmp_path / "g.json"
    trace.write_text(
        json.dumps({"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": events})
    )
    (rank,) = _ops(capsys, str(trace))["ranks"]
    # THEN the product's two shapes are one finding, which says their bounds differ, not the costlier one's
    (finding,) = [f for f in rank["findings"] if f["name"] == "aten::mm"]
    assert finding["shapes"].startswith("2 input shapes")
    assert "some compute-bound, some memory-bound" in finding["message"]
    assert (
        "memory-bound, bf16)" not in finding["message"] and "compute-bound, bf16)" not in finding["message"]
    )


def test_the_stacks_table_at_80_columns_names_each_op_and_its_frame_beside_long_shapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a trace with stacks whose costliest op is a layer norm's backward of six input shapes (an H200 job's
    # stacks table at 80 columns gave its whole width to such shapes, and its op and frame columns none)
    torch = pytest.importorskip("torch")
    norm = torch.nn.LayerNorm(256)
    x = torch.randn(64, 128, 256, requires_grad=True)

    def train_step() -> None:
        norm(x).sum().backward()

    trace = record(train_step, tmp_path / "t.json", with_stack=True)
    # WHEN stepscope ops prints it on a terminal of 80 columns
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["ops", str(trace)]) == 0
    out = capsys.readouterr().out
    # THEN every part of the stacks table names the op and the user's frame on each row, within 80 columns
    assert max(len(line) for line in out.splitlines()) <= 80
    stacks = out.split("Where the costliest ops were issued")[1:]
    assert stacks
    for part in stacks:
        rows = [line for line in part.split("\n\n")[0].splitlines() if "│" in line]
        assert rows and all(row.split("│")[0].strip().startswith("aten::") for row in rows), part
        assert any("test_ops.py" in row for row in rows), part
