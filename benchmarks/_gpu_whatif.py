"""gpu_check's `whatif` phase: a prediction of `stepscope whatif` against the job re-run with the change.

The transformer's training step is profiled twice, alternating, in two jobs: as it is, and without the
optimizer's update. `stepscope whatif RUN --scale optimizer=0` on the first job's window predicts the second's
step; the second job's window measures it. Both are profiled steps (the profiler's cost is in both); the
measured step is the mean of the window's steps, as whatif's own baseline is. Gradients are still set to None
in the changed job (the optimizer region's `zero_grad`, a few Python calls), which the prediction removes too.
"""

from __future__ import annotations

import dataclasses
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import stepscope
from _gpu_workload import Sizes, build_training, make_train_step, run_monitored

WHATIF_SCHEDULE = {"wait": 3, "warmup": 1, "active": 5}
WHATIF_STEPS = 10  # the window is steps 4-8
WHATIF_ROUNDS = 3  # job pairs, alternating
# the predicted step against the re-run one: the CPU jobs' 10% (docs/analysis.md) on CUDA; the dry mode's steps
# of a few ms on a loaded CPU: the path, not the figure
WHATIF_TOLERANCE = {True: 0.10, False: 0.50}


@dataclass
class WhatifRun:
    predicted_ms: list[float] = field(default_factory=list)  # per round: whatif on the unchanged job
    baseline_ms: list[float] = field(default_factory=list)  # per round: the unchanged job's window, measured
    changed_ms: list[float] = field(default_factory=list)  # per round: the changed job's window, measured
    replay_error_pct: list[float] = field(
        default_factory=list
    )  # per round: whatif's replay of the unchanged job

    def errors(self) -> list[float]:
        return [abs(p - m) / m for p, m in zip(self.predicted_ms, self.changed_ms, strict=True)]


def _job(out: Path, s: Sizes, device: torch.device, optimizer_step: bool) -> Path:
    t = build_training(s, device, WHATIF_STEPS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = stepscope.performance_monitor(
            t.model, out_dir=str(out), **WHATIF_SCHEDULE, console=False, report=False
        )
        return run_monitored(
            monitor, make_train_step(t, monitor, optimizer_step=optimizer_step), t, WHATIF_STEPS
        )


def whatif_phase(out: Path, s: Sizes, device: torch.device, cli_json: Callable[..., Any]) -> WhatifRun:
    # at the overhead phase's batch: on a GPU the step is then bound by the device and repeats within 2%; at
    # batch 16 it is bound by launches and moved by 28% between two jobs on an H200 (17.2 and 22.8 ms), more
    # than the change it is to show
    s = dataclasses.replace(s, batch=s.overhead_batch)
    run = WhatifRun()
    for i in range(WHATIF_ROUNDS):
        order = (True, False) if i % 2 == 0 else (False, True)  # which job runs first alternates
        jobs = {step: _job(out / "whatif", s, device, optimizer_step=step) for step in order}
        unchanged, changed = jobs[True], jobs[False]
        predicted = cli_json("whatif", str(unchanged), "--scale", "optimizer=0")
        measured = cli_json("whatif", str(changed))
        run.predicted_ms.append(predicted["predicted_step_ms"])
        run.baseline_ms.append(predicted["baseline_step_ms"])
        run.replay_error_pct.append(predicted["replay_error_pct"])
        run.changed_ms.append(measured["baseline_step_ms"])
    return run


class Undecided(Exception):
    """The unchanged job's rounds disagree by more than the limit: no prediction can be judged at that noise."""


def whatif_figure(run: WhatifRun, cuda: bool) -> tuple[bool, str]:
    limit = WHATIF_TOLERANCE[cuda]
    spread = (max(run.baseline_ms) - min(run.baseline_ms)) / statistics.median(run.baseline_ms)
    if spread > limit:
        raise Undecided(
            f"undecided: the unchanged job's step moved by {100 * spread:.0f}% between rounds "
            f"({', '.join(f'{b:.2f}' for b in run.baseline_ms)} ms), over the {100 * limit:.0f}% to be judged"
        )
    err = statistics.median(run.errors())
    saving_pred = statistics.median(b - p for b, p in zip(run.baseline_ms, run.predicted_ms, strict=True))
    saving_meas = statistics.median(b - c for b, c in zip(run.baseline_ms, run.changed_ms, strict=True))
    rounds = "; ".join(
        f"{b:.2f} -> predicted {p:.2f}, re-run {c:.2f} ms"
        for b, p, c in zip(run.baseline_ms, run.predicted_ms, run.changed_ms, strict=True)
    )
    return err <= limit, (
        f"optimizer=0: {rounds} (step error {100 * err:.1f}% median of {len(run.errors())} rounds, limit "
        f"{100 * limit:.0f}%); saving predicted {saving_pred:.2f} vs measured {saving_meas:.2f} ms; replay error "
        f"{max(run.replay_error_pct):.1f}%; the unchanged job's rounds within {100 * spread:.1f}%"
    )
