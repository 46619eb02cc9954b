"""The overhead benchmark's option table covers every capture option (issue #32 item 4), and an option that
works only inside windows or on CUDA leaves the other steps quiet."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import stepscope
from stepscope import ProfileConfig

from ..support.train import make_training

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


@pytest.fixture(scope="module")
def option_table() -> ModuleType:
    """benchmarks/overhead_options.py, the list bench_overhead.py --options measures."""
    spec = importlib.util.spec_from_file_location("overhead_options", BENCHMARKS / "overhead_options.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("overhead_options", module)
    spec.loader.exec_module(module)
    return module


def test_every_config_option_has_a_row_in_the_overhead_table_or_a_reason_it_is_idle(
    option_table: ModuleType,
) -> None:
    fields = set(ProfileConfig.model_fields)
    measured = {f for row in option_table.OPTION_ROWS for f in row.fields}
    idle = set(option_table.IDLE_DURING_STEPS)
    assert not fields - measured - idle, "options neither measured nor listed as idle during steps"
    assert not (measured | idle) - fields, "names in the table that are not options"
    assert not measured & idle, "an option both measured and listed as idle"
    assert all(reason.strip() for reason in option_table.IDLE_DURING_STEPS.values())


def test_every_row_names_what_it_measures_and_its_reference(option_table: ModuleType) -> None:
    variants = {v.name for v in option_table.VARIANTS}
    one_step = {row.measured for row in option_table.OPTION_ROWS} - variants
    # a one-step sample is "<run>: <which steps>" of one of the one-step runs
    assert {name.split(":")[0] for name in one_step} <= set(option_table.ONE_STEP_RUNS)
    for row in option_table.OPTION_ROWS:
        assert row.measured != row.reference
        assert row.reference in variants or row.reference.split(":")[0] in option_table.ONE_STEP_RUNS
        for option, value in next(
            (v.options for v in option_table.VARIANTS if v.name == row.measured), {}
        ).items():
            assert option in ProfileConfig.model_fields or option in option_table.PROFILER_OPTIONS, option
            assert value is not None


def test_the_documented_option_table_lists_every_measured_option(option_table: ModuleType) -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### Every option during steps") :]
    section = section[: section.index("\n## ")]
    for row in option_table.OPTION_ROWS:
        assert row.label in section, row.label
    for field in option_table.IDLE_DURING_STEPS:
        assert f"`{field}`" in section, field


def busy_steps(tmp_path: Path, steps: int, **options: Any) -> list[int]:
    """The steps at which some collector worked (a step listener hears only those)."""
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(
        model, out_dir=str(tmp_path), console=False, report=False, **options
    )
    heard: list[int] = []
    monitor.add_step_listener(lambda line: heard.append(line.step))
    step = monitor(train_step)
    for _ in range(steps):
        step()
    monitor.close()
    return heard


@pytest.mark.filterwarnings("ignore::stepscope.capture.console.StepscopeWarning")
def test_memory_snapshot_without_cuda_leaves_every_step_as_it_was(tmp_path: Path) -> None:
    # GIVEN a CPU job with one window (warmup step 3, active steps 4-5), with and without memory_snapshot
    schedule = {"wait": 3, "warmup": 1, "active": 2, "repeat": 1}
    without = busy_steps(tmp_path / "a", 12, **schedule)
    with_snapshot = busy_steps(tmp_path / "b", 12, memory_snapshot=True, **schedule)
    # THEN the same steps are worked at: the window's (CUDA history needs a GPU; the option does nothing here)
    assert without == [3, 4, 5]
    assert with_snapshot == without


@pytest.mark.parametrize("warmup", [0, 1])
def test_memory_snapshot_with_cuda_records_each_window_and_leaves_the_wait_steps_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warmup: int
) -> None:
    # GIVEN CUDA's memory history faked (this machine has no GPU), windows of active steps 4-5 and 10-11
    import torch

    from stepscope.capture.collectors import memory as capture_memory

    calls: list[tuple[str, int]] = []
    heard: list[int] = []

    # the step at work: history turns on in a step's after_step (steps_done is that step), and the snapshot
    # and the off come once the window's last step is counted
    def record(enabled: Any = "all", **kwargs: Any) -> None:
        calls.append(("on", monitor.steps_done) if enabled else ("off", monitor.steps_done - 1))

    def dump(filename: str) -> None:
        calls.append(("dump", monitor.steps_done - 1))
        Path(filename).write_bytes(b"\x80\x04}\x94.")  # an empty pickled dict

    monkeypatch.setattr(capture_memory, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", record)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump)
    schedule = {"wait": 4 - warmup, "warmup": warmup, "active": 2, "repeat": 2}
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(
        model, out_dir=str(tmp_path), console=False, report=False, memory_snapshot=True, **schedule
    )
    monitor.add_step_listener(lambda line: heard.append(line.step))
    step = monitor(train_step)
    for _ in range(14):
        step()
    monitor.close()
    # THEN the history runs from the step before each window (the step that turns it on) to the window's end
    assert calls == [("on", 3), ("dump", 5), ("off", 5), ("on", 9), ("dump", 11), ("off", 11)]
    # AND the steps worked at are those of the windows and the step before each: none of the other wait steps
    traced = [s for w in (4, 10) for s in range(w - warmup, w + 2)]
    assert heard == sorted({*traced, 3, 9})
