"""`stepscope estimate`: how big each window's trace will be for a config, from a short dry run of the script.

The script runs as under `stepscope run` (steps are the optimizer's), under a monitor that records one window
of MEASURED_STEPS active steps after one warmup step, with the config's trace options and no other collector,
in a temporary folder. Once that window is exported the script is stopped; the window is split into per-step
and fixed bytes (`measure_trace`) and extrapolated to the config's `active` steps.
"""

from __future__ import annotations

import contextlib
import gzip
import sys
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stepscope.capture.config import ProfileConfig
from stepscope.capture.monitor import PerformanceMonitor
from stepscope.capture.run_script import OptimizerSteps, print_user_traceback, run_as_main
from stepscope.capture.window.budget import DROPPABLE, MB, TraceSize, measure_trace, steps_fit
from stepscope.errors import StepscopeError
from stepscope.runfolder import read_manifest
from stepscope.units import fmt_mb

ESTIMATE_SCHEMA = "stepscope.estimate/1"
MEASURED_STEPS = 2
# The options that shape the trace; memory_timeline turns the first three on (capture/collectors/memory.py).
TRACE_OPTIONS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


class _Measured(BaseException):
    """Raised out of the script's optimizer step once the window is exported: ends the dry run. A BaseException,
    so that the script's own `except Exception` does not swallow it."""


@dataclass(frozen=True)
class TraceEstimate:
    """The expected trace of one window of `config.active` steps, from `size` measured on a dry run."""

    target: str
    config: ProfileConfig
    size: TraceSize

    @property
    def options(self) -> list[str]:
        return [option for option in TRACE_OPTIONS if getattr(self.config, option)]

    @property
    def window_json(self) -> float:
        return self.size.window_json(self.config.active)

    @property
    def window_gz(self) -> float:
        return self.size.window_gz(self.config.active)

    @property
    def budget_steps(self) -> int | None:
        """Active steps that fit in trace_budget_mb (None without a budget)."""
        budget = self.config.trace_budget_mb
        return None if budget is None else self.size.steps_within(budget * MB)

    def as_document(self) -> dict[str, Any]:
        size, budget = self.size, self.config.trace_budget_mb
        return {
            "schema": ESTIMATE_SCHEMA,
            "target": self.target,
            "measured_steps": size.steps,
            "active": self.config.active,
            "repeat": self.config.repeat,
            "options": self.options,
            "per_step": {
                "json_bytes": round(size.json_per_step),
                "gz_bytes": round(size.gz_per_step),
                "events": None if size.events_per_step is None else round(size.events_per_step),
            },
            "fixed": {"json_bytes": round(size.json_fixed), "gz_bytes": round(size.gz_fixed)},
            "window": {"json_bytes": round(self.window_json), "gz_bytes": round(self.window_gz)},
            "option_bytes_per_step": {k: round(v) for k, v in size.option_bytes.items()},
            "budget": None
            if budget is None
            else {
                "mb": budget,
                "fits": self.window_json <= budget * MB,
                "max_active": self.budget_steps,
            },
        }


def measuring_config(config: ProfileConfig, out_dir: str) -> ProfileConfig:
    """The dry run's config: the trace options of `config`, a short schedule, nothing else."""
    options = {option: getattr(config, option) for option in TRACE_OPTIONS}
    if config.memory_timeline:
        options.update(record_shapes=True, profile_memory=True, with_stack=True)
    return ProfileConfig(
        out_dir=out_dir,
        wait=0,
        warmup=1,
        active=MEASURED_STEPS,
        repeat=1,
        console=False,
        report=False,
        **options,
    )


def estimate_target(
    target: str, args: Sequence[str], *, module: bool, config: ProfileConfig
) -> TraceEstimate:
    """Dry-run `target` (a script path, or a module with `module=True`) until one measured window is exported,
    then stop it. The script's stdout goes to stderr, so that stdout holds only the estimate."""
    with tempfile.TemporaryDirectory(prefix="stepscope-estimate-") as tmp:
        monitor = PerformanceMonitor(None, config=measuring_config(config, tmp))
        window_end = monitor.schedule.first_window_end

        def stop_after_window() -> None:
            if monitor.steps_done > window_end:
                raise _Measured

        steps = OptimizerSteps(monitor, on_step=stop_after_window)
        steps.install()
        failed: BaseException | None = None
        try:
            with contextlib.redirect_stdout(sys.stderr):
                run_as_main(target, args, module=module)
        except _Measured:
            pass
        except SystemExit:
            pass
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            print_user_traceback(exc)
            failed = exc
        finally:
            steps.remove()
            with contextlib.suppress(Exception), warnings.catch_warnings():
                # a script too short for the dry run's schedule: said below, in terms of the script's steps
                warnings.filterwarnings("ignore", message="stepscope: the job ended after")
                monitor.close()
        traces = []
        if monitor.recording and monitor.run_dir is not None and monitor.steps_done > window_end:
            run_dir = monitor.run_dir
            traces = [run_dir / a.path for a in read_manifest(run_dir).of_kind("trace")]
        if not traces and not monitor.recording:
            raise StepscopeError(
                f"{target}: nothing was recorded (no optimizer step, or the script runs a stepscope monitor or "
                "torch.profiler of its own: one profiler at a time)"
            )
        if not traces:
            how = f"failed ({type(failed).__name__})" if failed is not None else "ended"
            raise StepscopeError(
                f"{target}: the script {how} after {monitor.steps_done} profiled step(s), before the measured "
                f"window completed: the estimate needs {window_end + 3} optimizer steps (the first starts the "
                f"monitor, then 1 warmup and {MEASURED_STEPS} measured steps)"
            )
        packed = traces[0].read_bytes()
        try:
            size = measure_trace(gzip.decompress(packed), gz_size=len(packed))
        except ValueError as exc:
            raise StepscopeError(f"{target}: cannot measure the recorded window ({exc})") from None
    return TraceEstimate(target=target, config=config, size=size)


def estimate_lines(estimate: TraceEstimate) -> list[str]:
    """The estimate as text: per step, per window, what each droppable option costs, the budget."""
    size, cfg = estimate.size, estimate.config
    rows = [
        (
            "per step",
            f"{fmt_mb(size.json_per_step)} of JSON, {fmt_mb(size.gz_per_step)} on disk"
            + (f", ~{size.events_per_step:.0f} events" if size.events_per_step is not None else ""),
        ),
        (
            "per window",
            f"{fmt_mb(estimate.window_json)} of JSON, {fmt_mb(estimate.window_gz)} on disk (.json.gz) for "
            f"active={cfg.active} (+ {fmt_mb(size.json_fixed)} once per trace)",
        ),
    ]
    if cfg.repeat > 1:
        rows.append(
            (
                "per run",
                f"{fmt_mb(estimate.window_json * cfg.repeat)} of JSON, {fmt_mb(estimate.window_gz * cfg.repeat)} "
                f"on disk for repeat={cfg.repeat}, per profiled rank",
            )
        )
    for option in DROPPABLE:
        cost = size.option_bytes.get(option)
        if getattr(cfg, option) and cost:
            share = 100.0 * cost / size.json_per_step if size.json_per_step else 0.0
            rows.append((option, f"{fmt_mb(cost)} per step ({share:.0f}% of it)"))
    if cfg.trace_budget_mb is not None:
        verdict = "fits" if estimate.window_json <= cfg.trace_budget_mb * MB else "over"
        rows.append(
            (
                "budget",
                f"trace_budget_mb={cfg.trace_budget_mb:g}: {verdict}; {steps_fit(estimate.budget_steps or 0)}",
            )
        )
    head = (
        f"stepscope estimate: {estimate.target} (trace options: {', '.join(estimate.options) or 'none'}; "
        f"{size.steps} steps measured)"
    )
    return [head] + [f"  {label:<16}{text}" for label, text in rows]
