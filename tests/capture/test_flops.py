"""FLOP counting on real models: exact per-module numbers, placement outside traced windows, throughput."""

from __future__ import annotations

import json
import statistics
import warnings
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.capture.console import StepscopeWarning
from stepscope.cli import main
from stepscope.runfolder import read_manifest
from stepscope.units import fmt_tflops

from ..support.output import profiler_steps

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


def table_rows(text: str) -> list[list[str]]:
    """The cells of each row of a printed table (lines with column separators), stripped."""
    return [[cell.strip() for cell in line.split("│")] for line in text.splitlines() if "│" in line]


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("input_requires_grad", [True, False])
@pytest.mark.slow
def test_mlp_flops_match_the_layer_sizes(tmp_path: Path, input_requires_grad: bool) -> None:
    # GIVEN an MLP, and a counted step requested inside the traced window (steps 1-2)
    model = mlp()
    run_dir, caught = run(
        tmp_path, 11, model, train_step_for(model, input_requires_grad),
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

    # AND forward = 2*B*in*out per Linear (addmm), charged to the layer; the backward is one row: the same
    # again for each weight gradient and for each input gradient, except the first layer's when the batch
    # needs no gradient (mm)
    report = json.loads((run_dir / "flops/rank0_step3.json").read_text())
    forward = {str(2 * i): 2 * B * n_in * n_out for i, (n_in, n_out) in enumerate(SIZES)}
    backward = sum(2 * f for f in forward.values()) - (0 if input_requires_grad else forward["0"])
    total = sum(forward.values()) + backward
    if input_requires_grad:
        assert total == sum(3 * 2 * B * n_in * n_out for n_in, n_out in SIZES)
    assert report["total_flops"] == total and report["step"] == 3 and report["requested_step"] == 1
    assert report["backward_flops"] == backward and report["backward_ops"] == {"aten.mm": backward}
    assert report["forward_outside_flops"] == 0 and report["model"] == "Sequential"
    modules = {m["name"]: m for m in report["modules"]}
    assert list(modules) == ["", "0", "2", "4"]  # model order; the ReLUs do no FLOPs
    assert modules[""]["flops"] == sum(forward.values()) and modules[""]["type"] == "Sequential"
    for name, flops in forward.items():
        assert modules[name]["ops"] == {"aten.addmm": flops} and modules[name]["flops"] == flops
        assert modules[name]["type"] == "Linear" and modules[name]["depth"] == 2

    # AND the text table lists the layers to depth 2, and the backward as its own row
    text = (run_dir / "flops/rank0_step3.txt").read_text()
    assert f"{total:,}" in text and "Sequential (model)" in text
    for name in forward:
        assert f"\n{name} " in text
    rows = {cells[0]: cells[1:] for cells in table_rows(text)}
    assert rows["backward, not attributed to a module"] == [
        "",
        "mm 100%",
        f"{backward:,}",
        f"{100 * backward / total:.1f}%",
    ]

    # AND throughput uses the undisturbed steps only: not 0-1 (start-up), 1-2 (traced), 3 (counted) nor 4
    # (after the counted step)
    lines = metrics(run_dir)
    assert lines[3]["flops"] == total and "tflops" not in lines[3]
    timed = lines[5:]
    for line in timed:
        assert line["tflops"] == total / (line["wall_ms"] / 1e3) / 1e12
        assert "mfu" not in line
    assert all("tflops" not in line for line in lines[:5])
    throughput = report["throughput"]
    median = statistics.median(line["wall_ms"] / 1e3 for line in timed)
    assert throughput["steps_timed"] == 6 and throughput["median_step_s"] == median
    assert throughput["tflops"] == total / median / 1e12
    assert throughput["q1_step_s"] <= median <= throughput["q3_step_s"]
    assert throughput["mfu"] is None and "this run is on the CPU" in throughput["no_mfu_reason"]


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_tflops_comes_from_enough_undisturbed_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN two windows (traced 3-4 and 8-9) and FLOPs counted at step 6, over 16 steps
    model = mlp()
    run_dir, _ = run(
        tmp_path, 16, model, train_step_for(model, True),
        wait=3, warmup=1, active=1, repeat=2, flop_counter_step=6, console=True,
    )  # fmt: skip
    # THEN the timed steps are the undisturbed ones: not 0 (start-up), 1 (after it), 3-4 and 8-9 (traced),
    # 5 and 10 (after a window), 6 (counted) nor 7 (after the counted step)
    undisturbed = [2, 11, 12, 13, 14, 15]
    lines = metrics(run_dir)
    assert [line["step"] for line in lines if "tflops" in line] == undisturbed[1:]  # (known once counted)
    report = json.loads((run_dir / "flops/rank0_step6.json").read_text())
    walls = [lines[step]["wall_ms"] / 1e3 for step in undisturbed]
    throughput = report["throughput"]
    assert throughput["steps_timed"] == 6 and throughput["median_step_s"] == statistics.median(walls)
    # AND the first figure waited for 5 of them (step 14), the final one took all 6
    assert [line["step"] for line in lines if "tflops_median" in line] == [14]
    out = " ".join(capsys.readouterr().err.split())  # the monitor prints on stderr
    first = out.index("stepscope: rank 0: achieved ")
    final = out.index("stepscope: rank 0 (final): achieved ")
    assert "(median of 5 undisturbed steps; the middle half took " in out[first:final]
    assert "(median of 6 undisturbed steps; the middle half took " in out[final:]
    assert out.count("no MFU: this run is on the CPU, and stepscope has no peak FLOP/s table for CPUs") == 1
    # AND the figure is printed with enough digits to read (a tiny CPU model: well below 0.01 TFLOP/s)
    assert f"achieved {fmt_tflops(throughput['tflops'])} = " in out and "achieved 0.00 " not in out
    assert throughput["tflops"] < 0.01 and "e-0" not in fmt_tflops(throughput["tflops"])
    page = (run_dir / "report.html").read_text()
    assert f"{fmt_tflops(throughput['tflops'])} (no MFU" in page and "0.00 TFLOP/s" not in page
    assert main(["analyze", str(run_dir)]) == 0
    analyzed = " ".join(capsys.readouterr().out.split())
    assert f"{fmt_tflops(throughput['tflops'])} over 6 steps" in analyzed


@pytest.mark.slow
def test_too_few_undisturbed_steps_give_no_tflops_and_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a short job: traced 1-3, counted at 4, 8 steps: only 6 and 7 are undisturbed
    model = mlp()
    run_dir, _ = run(
        tmp_path, 8, model, train_step_for(model, True),
        wait=1, warmup=1, active=2, flop_counter_step=4, console=True,
    )  # fmt: skip
    # THEN no TFLOP/s anywhere, and the console, the FLOP report and analyze say why
    reason = (
        "no TFLOP/s: 2 undisturbed steps, fewer than the 5 a median needs on a busy machine (undisturbed: "
        "outside the windows, neither the first, counted or comm-logged step nor the step after one of them or "
        "after a window); run more steps"
    )
    assert f"stepscope: rank 0 (final): {reason}" in " ".join(capsys.readouterr().err.split())
    report = json.loads((run_dir / "flops/rank0_step4.json").read_text())
    assert report["throughput"] is None and report["no_throughput_reason"] == reason
    assert reason in " ".join((run_dir / "flops/rank0_step4.txt").read_text().split())
    assert all("tflops_median" not in line for line in metrics(run_dir))
    assert main(["analyze", str(run_dir), "--json"]) == 0
    (flops,) = json.loads(capsys.readouterr().out)["run"]["flops"]
    assert flops["tflops"] is None and flops["reason"] == reason


@pytest.mark.slow
def test_peak_override_gives_mfu_with_formula_and_peak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = mlp()
    run_dir, _ = run(
        tmp_path, 12, model, train_step_for(model, True),
        wait=4, warmup=1, active=1, flop_counter_step=3, peak_tflops=0.5, console=True, flop_table_depth=1,
    )  # fmt: skip
    out = " ".join(capsys.readouterr().err.split())  # the monitor prints on stderr
    assert (
        "MFU = achieved TFLOP/s / peak TFLOP/s" in out
        and "peak 0.5 TFLOP/s (cpu fp32; peak_tflops option)" in out
    )
    lines = metrics(run_dir)
    # steps 4-5 are traced, 3 is counted and 6 follows the window: steps 7-11 carry a per-step figure
    assert [line["step"] for line in lines if "mfu" in line] == [7, 8, 9, 10, 11]
    assert lines[7]["mfu"] == lines[7]["tflops"] / 0.5
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


@pytest.mark.slow
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
    assert "Sequential (model)" in text and "\n0 " in text


# --- attribution: forward per module, the backward in one row ---------------------------------------------
BATCH, SEQ, D_MODEL, FF = 4, 16, 64, 128  # the encoder: TransformerEncoderLayer(64, 4, 128)


def encoder(dropout: float) -> Any:
    """A 2-layer TransformerEncoder inside a model, with a head: identical layers, one module deeper."""
    import torch
    from torch import nn

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layer = nn.TransformerEncoderLayer(D_MODEL, 4, FF, dropout=dropout, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
            self.head = nn.Linear(D_MODEL, 10)

        def forward(self, x: Any) -> Any:
            return self.head(self.enc(x))

    torch.manual_seed(0)
    torch.set_num_threads(1)
    return Encoder()


def encoder_step(model: Any) -> Any:
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        model(torch.randn(BATCH, SEQ, D_MODEL)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    return step


# dropout=0.0: Dropout returns its input, and torch's module tracker charged `layers.1.dropout2` with the rest
# of the backward (15.2 MFLOP against 12.6 for its own layer)
@pytest.mark.parametrize("dropout", [0.1, 0.0])
def test_identical_transformer_layers_get_identical_flops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, dropout: float
) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    # GIVEN the 2-layer encoder trained for 4 steps, FLOPs counted at step 1, the table 4 levels deep, printed
    # on an 80-column console
    monkeypatch.setenv("COLUMNS", "80")
    model = encoder(dropout)
    run_dir, _ = run(
        tmp_path,
        4,
        model,
        encoder_step(model),
        wait=10,
        flop_counter_step=1,
        flop_table_depth=4,
        console=True,
    )
    report = json.loads((run_dir / "flops/rank0_step1.json").read_text())
    rows = {m["name"]: m for m in report["modules"]}

    # THEN both layers, and each of their modules, have the same FLOPs: their forward, as FlopCounterMode counts
    # one layer's forward alone (2 FLOPs per multiply-add; on the CPU it sees no FLOPs in the fused attention
    # kernel that dropout=0 selects)
    import torch

    with FlopCounterMode(display=False) as one_layer:
        encoder(dropout).enc.layers[0](torch.randn(BATCH, SEQ, D_MODEL))
    layer_forward = one_layer.get_total_flops()
    assert rows["enc.layers.0"]["flops"] == rows["enc.layers.1"]["flops"] == layer_forward
    assert (
        rows["enc.layers.1.linear1"]["flops"]
        == 2 * BATCH * SEQ * D_MODEL * FF
        == rows["enc.layers.1.linear2"]["flops"]
    )
    for name, row in rows.items():
        if name.startswith("enc.layers.0"):
            twin = rows[name.replace("enc.layers.0", "enc.layers.1")]
            assert (row["flops"], row["ops"], row["type"]) == (twin["flops"], twin["ops"], twin["type"])
    assert rows["enc.layers"]["type"] == "ModuleList" and not any("dropout" in name for name in rows)
    # AND no child exceeds its parent
    for name, row in rows.items():
        if name:
            parent = name.rsplit(".", 1)[0] if "." in name else ""
            assert row["flops"] <= rows[parent]["flops"], (name, parent)
    # AND the backward is one row, and the rows add up to FlopCounterMode's total for the same step
    counter = FlopCounterMode(display=False)
    twin_model = encoder(dropout)
    with counter:
        encoder_step(twin_model)()
    assert report["total_flops"] == counter.get_total_flops()
    assert report["backward_flops"] > 0 and report["forward_outside_flops"] == 0
    assert rows[""]["flops"] + report["backward_flops"] == report["total_flops"]
    text_rows = {cells[0]: cells for cells in table_rows((run_dir / "flops/rank0_step1.txt").read_text())}
    assert text_rows["backward, not attributed to a module"][3] == f"{report['backward_flops']:,}"
    assert text_rows["enc.layers.0"][3] == text_rows["enc.layers.1"][3] == f"{layer_forward:,}"

    # AND at 80 columns the printed table fits, and a cell too long for it ends or breaks with an ellipsis
    # (the monitor prints on stderr; the report's path, printed at close, is a path, not a table)
    err = capsys.readouterr().err.splitlines()
    out = "\n".join(line for line in err if not line.startswith("stepscope: report: "))
    assert max(len(line) for line in out.splitlines()) <= 80
    labels = {m["label"] for m in rows.values()} | {"backward, not attributed to a module", "module"}
    types = {m["type"] for m in rows.values()} | {"", "type"}
    printed = [cells for cells in table_rows(out) if len(cells) >= 4]
    assert len(printed) == sum(m["depth"] <= 4 for m in rows.values()) + 1  # the modules, the backward
    for cells in printed:
        assert cells[0] in labels or "…" in cells[0], cells
        assert cells[1] in types or "…" in cells[1], cells
        assert all("…" not in cell for cell in cells[2:]), cells  # numbers are never shortened


@pytest.mark.slow
def test_lightning_rows_carry_the_lightning_modules_names(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning")
    import torch

    from stepscope.integrations.lightning import StepscopeCallback

    # GIVEN a LightningModule whose training_step calls its `net` (its own forward never runs)
    class Regression(L.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 32), torch.randn(32, 1))
    callback = StepscopeCallback(wait=10, flop_counter_step=1, console=False, report=False)
    trainer = L.Trainer(
        max_steps=3, accelerator="cpu", devices=1, logger=False, default_root_dir=str(tmp_path),
        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=8))
    # THEN the rows are the LightningModule's own modules, named and typed, under it
    assert callback.run_dir is not None
    report = json.loads((callback.run_dir / "flops/rank0_step1.json").read_text())
    assert [(m["label"], m["type"]) for m in report["modules"]] == [
        ("Regression (model)", "Regression"),
        ("net", "Sequential"),
        ("net.0", "Linear"),
        ("net.2", "Linear"),
    ]
    assert report["modules"][0]["flops"] == 2 * 8 * (32 * 64 + 64 * 1)  # the forward of one batch


@pytest.mark.parametrize("groups", [1, 4, 16])
def test_a_grouped_convolutions_backward_counts_each_gradient_once(groups: int) -> None:
    # GIVEN a convolution of 16 channels in `groups` groups (16: depthwise), its input and weight needing gradients
    import torch

    from stepscope.capture.collectors.flops import flop_counter

    x = torch.randn(2, 16, 20, 20, requires_grad=True)
    w = torch.randn(16, 16 // groups, 3, 3, requires_grad=True)
    y = torch.nn.functional.conv2d(x, w, padding=1, groups=groups)
    with flop_counter() as mode:
        torch.autograd.grad(y, (x, w), torch.randn_like(y))
    # THEN the backward is two forwards (the input's gradient and the weight's): 2 x 2·N·C_out·H·W·(C_in/g)·k²
    # (torch's own formula counts the weight's gradient `groups` times)
    forward = 2 * 2 * 16 * 20 * 20 * (16 // groups) * 9
    assert mode.get_total_flops() == 2 * forward
