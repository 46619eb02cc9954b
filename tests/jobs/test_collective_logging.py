"""Collective logging: CommDebugMode files per recording rank, and collectives read from the traces."""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path

import pytest

import stepscope
from stepscope.capture.console import StepscopeWarning
from stepscope.runfolder import read_manifest

from ..support.jobs.spawned import spawn
from ..support.output import analyze_json
from ..support.train import make_training

ANSI = "\x1b["


@pytest.mark.slow
def test_ddp_collectives_per_rank(tmp_path: Path) -> None:
    # GIVEN a 2-rank gloo DDP job whose buckets hold one Linear each (3 all-reduces per backward),
    # recording on all ranks, comm_logger_step=2 (inside the window of steps 1-3: moved to 4), shapes recorded
    from ..support.jobs.collective_logging import worker

    spawn(worker, (), tmp_path, nprocs=2)
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    artifacts = read_manifest(run_dir).artifacts
    for rank in (0, 1):
        # THEN each rank wrote both files, indexed with their kinds
        debug = run_dir / f"comm/rank{rank}_step4.txt"
        log = run_dir / f"comm/rank{rank}_step4_comm_mode_log.json"
        indexed = {(a.kind, a.path, a.rank, a.step) for a in artifacts}
        assert ("comm_debug", f"comm/rank{rank}_step4.txt", rank, 4) in indexed
        assert ("comm_json", f"comm/rank{rank}_step4_comm_mode_log.json", rank, 4) in indexed
        assert ("comm_counts", f"comm/rank{rank}_step4.json", rank, 4) in indexed
        counts = json.loads((run_dir / f"comm/rank{rank}_step4.json").read_text())
        assert counts["totals"] == {"allreduce": 3} and counts["distributed"] is True
        assert counts["modules"]["0"] == {"forward": {}, "backward": {"allreduce": 1}}
        text = debug.read_text()
        assert ANSI not in text
        # AND the counts are what DDP issues: one all-reduce per bucket, all in backward, one per Linear
        rows = {
            line.split("│")[0].strip(): [c.strip() for c in line.split("│")[1:]]
            for line in text.splitlines()
            if "│" in line
        }
        assert rows["(all)"] == ["-", "allreduce x3"]
        assert rows["Sequential (model)"] == ["-", "allreduce x3"]
        assert rows["0"] == rows["2"] == rows["4"] == ["-", "allreduce x1"]
        assert "3 in all" in text
        # AND the JSON is CommDebugMode's module tree with the same counts
        tree = json.loads(log.read_text())
        assert tree["fqn"] == "Global"
        linears = list(_walk(tree, "class 'torch.nn.modules.linear.Linear'"))
        assert [node["collectives_backward"] for node in linears] == [[["c10d.allreduce_", 1]]] * 3
        assert all(node["collectives_forward"] == [] for node in linears)
    # AND analysis finds the window's collectives in each rank's trace: 3 all-reduces per step, on gloo
    result = analyze_json(run_dir)
    for rank in (0, 1):
        (all_reduce,) = result["ranks"][rank]["collectives"]
        assert all_reduce["kind"] == "all_reduce" and all_reduce["count"] == 2 * 3
        assert all_reduce["time_source"] == "cpu" and all_reduce["time_ms"] > 0
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted((m["rank"], m["collectives"]) for m in lines if "collectives" in m) == [(0, 3), (1, 3)]


def _walk(node: dict, module_type: str):  # type: ignore[no-untyped-def]
    if node.get("module_type") == module_type:
        yield node
    for child in node.get("children", []):
        yield from _walk(child, module_type)


def test_without_a_process_group_the_log_says_so(tmp_path: Path) -> None:
    # GIVEN one process, no process group, and the collective log asked for at the FLOP counter's step
    train_step, model = make_training()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = stepscope.performance_monitor(
            model, out_dir=str(tmp_path), wait=2, warmup=0, active=1, console=False,
            flop_counter_step=0, comm_logger_step=0,
        )  # fmt: skip
        step = monitor(train_step)
        for _ in range(5):
            step()
        monitor.close()
    messages = [str(w.message) for w in caught if issubclass(w.category, StepscopeWarning)]
    assert not [m for m in messages if "switched off" in m]
    # the warning points at the user's line (here, this test), not into stepscope or torch
    assert {w.filename for w in caught if issubclass(w.category, StepscopeWarning)} == {__file__}
    # THEN the two do not share a step: the log moves to step 1, and neither step is timed
    assert messages == [
        "stepscope: comm_logger_step=0 is the FLOP counter's step too, and the two cannot share one; "
        "collective logging runs at step 1 instead"
    ]
    run_dir = monitor.run_dir
    assert run_dir is not None
    text = (run_dir / "comm/rank0_step1.txt").read_text()
    assert "0 in all" in text and "torch.distributed is not initialized" in text
    assert json.loads((run_dir / "comm/rank0_step1_comm_mode_log.json").read_text())["fqn"] == "Global"
    counts = json.loads((run_dir / "comm/rank0_step1.json").read_text())
    assert counts["totals"] == {} and counts["distributed"] is False
    # every artifact, torch's own dump and the trace included, follows the umask (teammates can read them)
    umask = os.umask(0)
    os.umask(umask)
    modes = {
        p.relative_to(run_dir).as_posix(): stat.S_IMODE(p.stat().st_mode)
        for p in run_dir.rglob("*")
        if p.is_file()
    }
    assert any(name.startswith("traces/") for name in modes)
    assert {name: mode for name, mode in modes.items() if mode != 0o666 & ~umask} == {}
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # (0 counted, 1 logged, 2 traced, 3 after the window: only 4 is undisturbed)
    assert [m["step"] for m in lines if "tflops" in m] == [4]
    assert "flops" in lines[0] and lines[1]["collectives"] == 0
    # AND analysis finds no collective in the window's trace
    assert [r["collectives"] for r in analyze_json(run_dir)["ranks"]] == [[]]


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_the_logger_changes_nothing_a_model_computes_in_place(tmp_path: Path, wrapper: str) -> None:
    # GIVEN a 2-rank gloo job whose model adds to its layers' outputs in place (and the loop to the model's),
    # run once with the collective logger at step 1 and once with the monitor off
    from ..support.jobs.inplace_outputs import worker

    runs = {}
    for logged in (True, False):
        out = tmp_path / ("logged" if logged else "off")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            spawn(worker, (wrapper, logged), out, nprocs=2)
        runs[logged] = out
        assert not [w for w in caught if "BackwardHookFunction" in str(w.message)]
        for w in caught:  # (a run done again: said, not swallowed here)
            if w.category is RuntimeWarning and "run again" in str(w.message):
                warnings.warn(w.message, stacklevel=1)
    # THEN the job ran to its end both ways, every loss bit-identical on each rank
    for rank in (0, 1):
        logged_losses = (runs[True] / f"losses{rank}.txt").read_text()
        assert len(logged_losses.split()) == 6
        assert logged_losses == (runs[False] / f"losses{rank}.txt").read_text()
    # AND the logger still counted the step's collectives, those of the backward by module
    (run_dir,) = [p for p in runs[True].iterdir() if p.is_dir()]
    counts = json.loads((run_dir / "comm/rank0_step1.json").read_text())
    assert counts["distributed"] is True and sum(counts["totals"].values()) > 0
    backward = {m: sum(p["backward"].values()) for m, p in counts["modules"].items() if m != "(all)"}
    assert any(n > 0 for m, n in backward.items() if "layers" in m), counts["modules"]
