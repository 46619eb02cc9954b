"""Where users train: the HF Trainer and Lightning callbacks (real frameworks, tiny models built here), and
`stepscope run` on an unmodified script, alone and under torchrun. Each runs the scripts of examples/ as a
user would, in a process of their own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.runfolder import read_manifest

from ..support.jobs import run_ranks
from ..support.output import load_chrome_trace, profiler_steps

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
STEPSCOPE = [sys.executable, "-m", "stepscope"]


def run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", PYTHONUNBUFFERED="1")
    return run_ranks(cmd, cwd, cwd=cwd, text=True, env=env, timeout=timeout)


def only_run_folder(parent: Path) -> Path:
    runs = [p for p in parent.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def metrics(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def traces(run_dir: Path) -> list[tuple[int | None, int | None]]:
    return sorted((a.rank, a.step) for a in read_manifest(run_dir).of_kind("trace"))


# --- HF Trainer --------------------------------------------------------------------------------------------
def test_hf_trainer_callback_profiles_optimizer_steps_and_logs_through_the_trainer(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "hf"
    done = run([sys.executable, str(EXAMPLES / "hf_trainer.py"), str(out), "--max-steps", "12"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = only_run_folder(out / "stepscope")  # under args.output_dir by default
    assert f"stepscope run folder: {run_dir}" in done.stdout
    # 12 optimizer steps (24 micro-batches with gradient accumulation 2), numbered as the Trainer logs them
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, 13))
    # wait 2, warmup 1, active 3 from step 1: active steps 4-6
    assert traces(run_dir) == [(0, 6)]
    assert profiler_steps(run_dir / "traces/rank0_step6.json.gz") == [4, 5, 6]
    assert (run_dir / "report.html").is_file()
    # the headline numbers reached TensorBoard, which report_to configured (not stepscope)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list(out.rglob("events.out.tfevents.*"))
    assert events, list(out.rglob("*"))
    tags = set()
    for event_file in events:
        acc = EventAccumulator(str(event_file))
        acc.Reload()
        tags.update(acc.Tags().get("scalars", []))
    assert "train/stepscope/step_ms" in tags, tags
    scalar = EventAccumulator(str(events[0]))
    scalar.Reload()
    (point,) = scalar.Scalars("train/stepscope/step_ms")
    assert point.step == 6 and point.value > 0


def test_hf_callback_values_reach_the_trainers_log_history(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import importlib.util

    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from stepscope.integrations.hf import StepscopeCallback

    spec = importlib.util.spec_from_file_location("hf_trainer_example", EXAMPLES / "hf_trainer.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    # GIVEN a real Trainer (the example's tiny GPT-2 on random tokens) logging every 4 steps, no logger at all
    training = TrainingArguments(
        output_dir=str(tmp_path), max_steps=8, per_device_train_batch_size=2, logging_steps=4,
        report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    callback = StepscopeCallback(wait=1, warmup=1, active=2, console=False, report=False)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=128, n_positions=32)
    trainer = Trainer(
        model=GPT2LMHeadModel(config), args=training, train_dataset=example.RandomTokens(16),
        callbacks=[callback],
    )  # fmt: skip
    trainer.train()
    # THEN the window's headline (steps 1-4: wait 1, warmup 1, active 3-4) is in the history the Trainer keeps,
    # in the entry of step 4 beside the Trainer's own loss (it was only in the loggers' copy of the logs)
    history = trainer.state.log_history
    (entry,) = [e for e in history if "stepscope/step_ms" in e]
    assert entry["step"] == 4 and "loss" in entry
    assert entry["stepscope/window_last_step"] == 4.0 and entry["stepscope/step_ms"] > 0
    lines = metrics(callback.run_dir)
    active = [m["wall_ms"] for m in lines if m["step"] in (3, 4)]
    assert entry["stepscope/step_ms"] == pytest.approx(sum(active) / 2)


def test_hf_callback_rejects_a_bad_option_when_built() -> None:
    pytest.importorskip("transformers")
    from stepscope.errors import ConfigError
    from stepscope.integrations.hf import StepscopeCallback

    with pytest.raises(ConfigError, match="activ"):
        StepscopeCallback(activ=3)


# --- Lightning ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("devices", [1, 2])
def test_lightning_callback_alone_and_under_ddp(tmp_path: Path, devices: int) -> None:
    pytest.importorskip("lightning")
    root = tmp_path / "pl"
    cmd = [sys.executable, str(EXAMPLES / "lightning_train.py"), str(root), "--devices", str(devices)]
    done = run(cmd, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = only_run_folder(root / "stepscope")  # one run folder for the DDP job
    manifest = read_manifest(run_dir)
    assert manifest.world_size == devices
    # trainer.global_step while the step runs: 0..11; wait 2, warmup 1, active 3 -> active 3-5
    assert traces(run_dir) == [(rank, 5) for rank in range(devices)]
    for rank in range(devices):
        trace = run_dir / f"traces/rank{rank}_step5.json.gz"
        assert profiler_steps(trace) == [3, 4, 5]
        if devices > 1:
            assert load_chrome_trace(trace)["distributedInfo"]["rank"] == rank
    lines = metrics(run_dir)
    for rank in range(devices):
        assert [m["step"] for m in lines if m["rank"] == rank] == list(range(12))
    # the headline reached the CSVLogger of the trainer, at the window's last step
    import csv

    (csv_file,) = list(root.rglob("metrics.csv"))
    rows = list(csv.DictReader(csv_file.open()))
    logged = [r for r in rows if r.get("stepscope/step_ms")]
    assert len(logged) == 1 and logged[0]["step"] == "5" and float(logged[0]["stepscope/step_ms"]) > 0


# --- stepscope run -----------------------------------------------------------------------------------------
SCHEDULE = ["--wait", "1", "--warmup", "1", "--active", "3", "--no-report"]


def test_stepscope_run_profiles_an_unmodified_script(tmp_path: Path) -> None:
    script = str(EXAMPLES / "plain_train.py")
    args = ["--steps", "12", "--workers", "2"]
    plain = run([sys.executable, script, *args], tmp_path)
    profiled = run([*STEPSCOPE, "run", *SCHEDULE, script, *args], tmp_path)
    assert plain.returncode == profiled.returncode == 0, profiled.stderr[-3000:]
    # the script's own output, argv and __main__ are unchanged; stepscope's tables go to stderr
    assert profiled.stdout == plain.stdout
    assert "argv ['--steps', '12', '--workers', '2'], module __main__" in profiled.stdout
    assert "top ops" in profiled.stderr
    assert f"stepscope: run folder: stepscope_runs{os.sep}" in profiled.stderr
    run_dir = only_run_folder(tmp_path / "stepscope_runs")
    # step 0 begins at the first optimizer step: 11 steps of 12 iterations; active steps 2-4
    assert [m["step"] for m in metrics(run_dir)] == list(range(11))
    assert traces(run_dir) == [(0, 4)]
    trace = load_chrome_trace(run_dir / "traces/rank0_step4.json.gz")["traceEvents"]
    assert profiler_steps(run_dir / "traces/rank0_step4.json.gz") == [2, 3, 4]
    # each optimizer step lies inside one ProfilerStep range (the boundary is made outside torch's range)
    spans = [
        (e["ts"], e["ts"] + e["dur"]) for e in trace if str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    optimizer_steps = [e for e in trace if str(e.get("name", "")).startswith("Optimizer.step#")]
    assert len(optimizer_steps) == 3
    for e in optimizer_steps:
        assert any(a <= e["ts"] and e["ts"] + e["dur"] <= b for a, b in spans), e


@pytest.mark.parametrize(
    ("extra", "status"), [(["--exit-code", "3"], 3), (["--fail"], 1)], ids=["exit-3", "exception"]
)
def test_stepscope_run_keeps_exit_status_and_traceback(tmp_path: Path, extra: list[str], status: int) -> None:
    script = str(EXAMPLES / "plain_train.py")
    args = ["--steps", "8", *extra]
    plain = run([sys.executable, script, *args], tmp_path)
    profiled = run([*STEPSCOPE, "run", *SCHEDULE, "--no-console", script, *args], tmp_path)
    assert plain.returncode == profiled.returncode == status
    assert profiled.stdout == plain.stdout
    if status == 1:
        tail = plain.stderr.strip().splitlines()[-1]
        assert tail == "RuntimeError: failing on purpose (--fail)"
        traceback = profiled.stderr[profiled.stderr.index("Traceback") :]
        assert traceback.startswith(plain.stderr[plain.stderr.index("Traceback") :].strip())
        # no frame of stepscope's own modules (the clone's folder may well be called stepscope)
        import stepscope

        assert os.path.dirname(stepscope.__file__) + os.sep not in traceback
    # the run folder is complete all the same
    assert traces(only_run_folder(tmp_path / "stepscope_runs")) == [(0, 4)]


def test_stepscope_run_module_form(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text((EXAMPLES / "plain_train.py").read_text())
    done = run([*STEPSCOPE, "run", *SCHEDULE, "--no-console", "-m", "pkg.train", "--steps", "8"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "argv ['--steps', '8'], module __main__" in done.stdout
    assert traces(only_run_folder(tmp_path / "stepscope_runs")) == [(0, 4)]


@pytest.mark.parametrize("launcher", ["torchrun", "nproc-per-node"])
def test_stepscope_run_under_torchrun_gives_one_run_folder(tmp_path: Path, launcher: str) -> None:
    script = str(EXAMPLES / "plain_train.py")
    options = [*SCHEDULE, "--no-console", "--profiled-ranks", "all"]
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        cmd += ["-m", "stepscope", "run", *options, script, "--steps", "10"]
    else:
        cmd = [*STEPSCOPE, "run", "--nproc-per-node", "2", *options, script, "--steps", "10"]
    done = run(cmd, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # (two processes share the pipe: their lines may interleave)
    assert sorted(re.findall(r"rank (\d): trained 10 steps", done.stdout)) == ["0", "1"]
    run_dir = only_run_folder(tmp_path / "stepscope_runs")
    assert read_manifest(run_dir).world_size == 2
    assert traces(run_dir) == [(0, 4), (1, 4)]
    for rank in (0, 1):
        trace = run_dir / f"traces/rank{rank}_step4.json.gz"
        assert profiler_steps(trace) == [2, 3, 4]
        assert any(
            str(e.get("name", "")).startswith("gloo:") for e in load_chrome_trace(trace)["traceEvents"]
        )


def test_stepscope_run_failing_script_under_torchrun_fails(tmp_path: Path) -> None:
    script = str(EXAMPLES / "plain_train.py")
    cmd = [*STEPSCOPE, "run", "--nproc-per-node", "2", *SCHEDULE, "--no-console", script, "--steps", "6"]
    done = run([*cmd, "--exit-code", "3"], tmp_path)
    plain = run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            script,
            "--steps",
            "6",
            "--exit-code",
            "3",
        ],
        tmp_path,
    )
    assert done.returncode == plain.returncode != 0


@pytest.mark.parametrize("command", ["run", "estimate"])
def test_an_unknown_option_before_the_script_is_a_usage_error(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepscope.cli import main

    # GIVEN a typo in an option of stepscope's, before an existing script
    monkeypatch.chdir(tmp_path)
    script = str(EXAMPLES / "plain_train.py")
    # WHEN it runs THEN it is a usage error naming the option and the one meant, and nothing ran
    assert main([command, "--wait", "5", "--actve", "3", script]) == 2
    err = capsys.readouterr().err
    assert "No such option '--actve'" in err and "'--active'" in err
    assert "no such file" not in err
    assert list(tmp_path.iterdir()) == []


def test_what_follows_the_script_or_module_is_the_scripts(tmp_path: Path) -> None:
    # GIVEN a script and a module that print their argv, and arguments that look like stepscope's options
    (tmp_path / "show_argv.py").write_text("import sys\nprint('argv', sys.argv[1:])\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "show.py").write_text("import sys\nprint('argv', sys.argv[1:])\n")
    theirs = ["--wait", "7", "--actve", "-h", "--", "--active=2"]
    options = ["--wait=1", "--no-console", "--no-report", "--out-dir", "runs"]
    # WHEN they run under stepscope run, after its options
    for target in (["show_argv.py"], ["-m", "pkg.show"], ["-mpkg.show"]):
        done = run([*STEPSCOPE, "run", *options, *target, *theirs], tmp_path)
        # THEN the script gets them unchanged
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip() == f"argv {theirs}"


def test_stepscope_run_bad_input_is_one_line(tmp_path: Path) -> None:
    done = run([*STEPSCOPE, "run", "missing.py"], tmp_path)
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == "stepscope: error: missing.py: no such file (give a Python script, or -m MODULE)"
    )
    done = run([*STEPSCOPE, "run", "--wait", "-1", str(EXAMPLES / "plain_train.py")], tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "wait" in done.stderr
    done = run([*STEPSCOPE, "run", "-m", "no_such_module_here"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "stepscope: error: no_such_module_here: no module of that name (give a module importable from here, or "
        "a script)"
    )
