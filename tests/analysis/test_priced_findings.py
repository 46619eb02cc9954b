"""Findings priced by replay (#29 item 5): each finding's saving is what removing its work saves in a replay of its
rank's steps, so that savings naming the same time are not counted twice, work hidden behind other work saves
nothing, and findings are ranked by that saving."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.analysis.analyze import analyze

from ..support.traces import SHARED_TRACES, cpu, kernel, launched, load, runtime, step, write_trace

STEPSCOPE = [sys.executable, "-m", "stepscope"]
LOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def _cli(*args: str) -> str:
    done = subprocess.run([*STEPSCOPE, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def overlap_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real CPU job of tests/support/jobs/priced_findings.py: the optimizer's region sleeps SLEEP_S without a torch op."""
    from ..support.jobs import priced_findings as jobs

    out = tmp_path_factory.mktemp("price")
    subprocess.run([sys.executable, jobs.__file__, str(out)], check=True, timeout=240, capture_output=True)
    return next(p.parent for p in out.rglob("manifest.json"))


def test_the_optimizers_python_is_priced_once_and_said_to_be_python(overlap_run: Path) -> None:
    from ..support.jobs.priced_findings import SLEEP_S

    # GIVEN a real job whose optimizer region sleeps without a torch op
    doc = json.loads(_cli("analyze", str(overlap_run), "--json"))
    found = {f["id"]: f for f in doc["findings"]}
    opt = found["optimizer_bound"]
    sleep_ms = SLEEP_S * 1000
    # THEN optimizer_bound prices the region, by the replay with its work removed (on a CPU rank, the host time
    # removed: the rule's price), and says the time is Python, not a matter of a fused optimizer
    assert opt["saving_from"] == "replay"
    assert opt["saving_ms_per_step"] >= sleep_ms * 0.9
    assert opt["saving_ms_per_step"] == pytest.approx(opt["cost_ms_per_step"], rel=0.05)
    assert opt["whatif"] == ["optimizer@0=0"]
    assert opt["evidence"]["outside_ops_pct"] >= 50 and "python_sampling=True" in opt["action"]
    assert "fused" not in opt["message"]
    # AND the sleep is not priced again: python_overhead, where the rest of the step has some, leaves it out
    python = found.get("python_overhead")
    assert python is None or python["cost_ms_per_step"] < sleep_ms / 2
    # AND the findings are ranked by their saving
    priced = [f["saving_ms_per_step"] for f in doc["findings"] if f["saving_ms_per_step"] is not None]
    assert priced == sorted(priced, reverse=True)
    # AND `stepscope whatif` with the finding's selector predicts the same saving (its mean step, not the median)
    whatif = json.loads(_cli("whatif", str(overlap_run), "--scale", *opt["whatif"], "--json"))
    assert whatif["saving_ms"] == pytest.approx(opt["saving_ms_per_step"], rel=0.2)
    # AND the terminal never says that two findings name the same time
    text = " ".join(_cli("analyze", str(overlap_run)).split())
    assert "saves" in text and "per step (replay)" in text
    assert "they name the same time" not in text


def _hidden_copy_steps() -> list[dict]:
    """Three 1000 us steps, each: the DataLoader for 100 us with the GPU idle; then the forward launches a 50 us
    GEMM and a 300 us copy from pageable memory on a stream of its own, and works on the host (an 830 us op)
    until it launches a last 10 us kernel: the copy runs while the host bounds the step."""
    ev: list[dict] = []
    for i in range(3):
        t, c = 1000.0 * i, 10 * i
        ev += [
            step(i + 1, t, 1000),
            cpu(LOADER, t, 100, cat="user_annotation"),
            cpu("forward", t + 100, 890, cat="user_annotation"),
            *launched("gemm", t + 110, t + 120, 50, c + 1),
            runtime("cudaMemcpyAsync", t + 130, 5, c + 2),
            kernel("Memcpy HtoD (Pageable -> Device)", t + 140, 300, stream=8, corr=c + 2, cat="gpu_memcpy"),
            cpu("aten::host_work", t + 140, 830),
            *launched("gemm", t + 975, t + 980, 10, c + 3),
        ]
    return ev


def test_a_copy_hidden_behind_host_work_saves_nothing_and_ranks_last(tmp_path: Path) -> None:
    # GIVEN copies from pageable memory that the rule prices at their GPU time (300 us a step), which run while
    # the host bounds the step, and a DataLoader stall of 100 us a step with the GPU idle
    result = analyze(load(write_trace(tmp_path / "t.json", _hidden_copy_steps())))
    found = {f.id: f for f in result.findings}
    copies, loader = found["pageable_copies"], found["data_loader_stall"]
    assert copies.cost_ms_per_step == pytest.approx(0.3)
    assert loader.cost_ms_per_step == pytest.approx(0.1)
    # THEN the replay without the copies ends each step as before: they save nothing
    assert (copies.saving_from, copies.saving_ms_per_step) == ("replay", 0.0)
    assert copies.whatif == ["kernel:HtoD.*Pageable|Pageable.*HtoD@0=0"]
    # AND the loader's 100 us come off every step
    assert (loader.saving_from, loader.saving_ms_per_step) == ("replay", pytest.approx(0.1))
    # AND the loader ranks before the copies, which their rule's price ranked first
    ids = [f.id for f in result.findings]
    assert ids.index("data_loader_stall") < ids.index("pageable_copies")
    # AND removing the host's op as well makes the copies the bound: removed together, the three findings save
    # more than their savings added up
    savings = result.ranks[0].replay_savings
    assert savings is not None and set(savings.findings) == {
        "host_bound",
        "data_loader_stall",
        "pageable_copies",
    }
    assert savings.combined_ms_per_step > savings.sum_ms_per_step
    # AND the report shows each finding's saving beside its rule's price, and what they save together
    page = tmp_path / "t.html"
    _cli("report", str(tmp_path / "t.json"), "-o", str(page))
    html = page.read_text()
    assert '<span class="saving">saves 0 us per step (replay)</span>' in html
    assert '<span class="saving">saves 100 us per step (replay)</span>' in html
    assert "removed together" in html and "removing one exposes the work of others" in html


@pytest.mark.shared
def test_on_a_real_gpu_trace_pageable_copies_hidden_by_the_host_save_little() -> None:
    """The ResNet-50 trace (old Kineto schema): the GPU waits for the host (launch_bound), so the copies'
    2.96 ms of GPU time per step is mostly hidden; launch_bound's fix changes the kernels: its rule's price."""
    path = SHARED_TRACES / "kineto_resnet50_num_workers_4" / "worker0.1623212756351.pt.trace.json.gz"
    if not path.is_file():
        pytest.skip("../shared/traces is absent")
    found = {f.id: f for f in analyze(load(path)).findings}
    copies, launch = found["pageable_copies"], found["launch_bound"]
    assert copies.saving_from == "replay" and copies.cost_ms_per_step is not None
    assert (copies.saving_ms_per_step or 0.0) < copies.cost_ms_per_step / 10
    assert launch.saving_from == "rule" and launch.saving_ms_per_step == launch.cost_ms_per_step
    assert "changes the kernels" in launch.saving_note


def test_beyond_the_costliest_findings_of_a_rank_the_rule_prices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepscope.analysis.findings import replayed

    # GIVEN replays bounded to the costliest finding of a rank by its rule's price (host_bound: the GPU waits
    # 570 us a step for the host's op)
    monkeypatch.setattr(replayed, "REPLAY_MAX_FINDINGS", 1)
    result = analyze(load(write_trace(tmp_path / "t.json", _hidden_copy_steps())))
    found = {f.id: f for f in result.findings}
    assert found["host_bound"].saving_from == "replay"
    assert found["host_bound"].whatif == ["op:^aten::host_work$@0=0"]
    # THEN the loader stall and the copies keep their rule's price and say why
    for id_ in ("data_loader_stall", "pageable_copies"):
        f = found[id_]
        assert (f.saving_from, f.saving_ms_per_step) == ("rule", f.cost_ms_per_step)
        assert "only the 1 costliest findings of a rank are replayed" in f.saving_note
    savings = result.ranks[0].replay_savings
    assert savings is not None and savings.findings == ["host_bound"]
