"""Overhead of the monitor on the demo training step, measured side by side in one process.

    .venv/bin/python benchmarks/bench_overhead.py [--rounds 5] [--steps 30]

A first, uncounted round warms everything up. Variants, interleaved round by round so machine noise hits them alike: the bare step; the step decorated by a
monitor with enabled=False; a monitor in its wait phase; a monitor in an active window; raw torch.profiler
with the same options in an active window. Times are per step (the call plus the profiler's step()), medians
over all rounds; the export at the end of a window is not part of any timed step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import timeit
import warnings
from collections.abc import Callable
from typing import Any

import torch

import stepscope
from stepscope.capture.demo import build_demo, make_train_step


def timed(fn: Callable[[], Any], after: Callable[[], Any] | None = None) -> float:
    t0 = time.perf_counter_ns()
    fn()
    if after is not None:
        after()
    return (time.perf_counter_ns() - t0) / 1e6


VARIANTS = (
    "bare",
    "enabled=False",
    "monitor, wait phase",
    "monitor, active window",
    "raw torch.profiler, active",
)


def demo_round(round_index: int, steps: int, out_dir: str, results: dict[str, list[float]]) -> None:
    """One round on a fresh demo model."""
    model, optimizer, make_batch = build_demo()
    measure_round(
        round_index, steps, out_dir, results, model, make_train_step(model, optimizer), make_batch()
    )


def measure_round(
    round_index: int,
    steps: int,
    out_dir: str,
    results: dict[str, list[float]],
    model: Any,
    plain: Callable[[Any], Any],
    batch: Any,
) -> None:
    """One round of every variant on `plain(batch)` (also used by gpu_check.py). Variants without a running
    profiler alternate step by step; the two active-window variants (which record everything in the process)
    alternate block by block."""

    def bare() -> Any:
        return plain(batch)

    disabled = stepscope.performance_monitor(model, enabled=False)(plain)
    waiting = stepscope.performance_monitor(
        model, out_dir=out_dir, wait=10**6, warmup=1, active=1, console=False
    )
    wait_step = waiting(plain)
    wait_step(batch)  # the first call starts the monitor (creates the run folder): not a steady-state step
    variants: list[tuple[str, Callable[[], Any]]] = [
        ("bare", bare),
        ("enabled=False", lambda: disabled(batch)),
        ("monitor, wait phase", lambda: wait_step(batch)),
    ]
    for i in range(steps * len(variants)):
        name, fn = variants[(i + i // len(variants)) % len(variants)]  # rotate who goes first
        results[name].append(timed(fn))
    waiting.close()

    run_active = [_monitor_active, _raw_active]
    if round_index % 2:
        run_active.reverse()  # neither variant always runs first
    for run in run_active:
        run(model, plain, batch, steps, out_dir, results)


def _monitor_active(
    model: Any, plain: Any, batch: Any, steps: int, out_dir: str, results: dict[str, list[float]]
) -> None:
    # One warmup step, then `steps` timed active steps; the window's last (exporting) step and
    # the close are untimed.
    active = stepscope.performance_monitor(
        model, out_dir=out_dir, wait=0, warmup=1, active=steps + 1, repeat=1, console=False
    )
    active_step = active(plain)
    active_step(batch)
    results["monitor, active window"] += [timed(lambda: active_step(batch)) for _ in range(steps)]
    active_step(batch)
    active.close()


def _raw_active(
    model: Any, plain: Any, batch: Any, steps: int, out_dir: str, results: dict[str, list[float]]
) -> None:
    def bare() -> Any:
        return plain(batch)

    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]  # as the monitor's trace collector chooses them
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=1, active=steps + 1, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(f"{out_dir}/raw.json.gz"),
    )
    prof.start()
    plain(batch)
    prof.step()
    results["raw torch.profiler, active"] += [timed(bare, prof.step) for _ in range(steps)]
    plain(batch)
    prof.step()
    prof.stop()


def call_cost_ns() -> dict[str, float]:
    """ns per call of a no-op function: bare, and decorated by a disabled monitor."""

    def noop() -> None:
        return None

    decorated = stepscope.performance_monitor(enabled=False)(noop)
    number = 2_000_000
    bare = min(timeit.repeat(noop, number=number, repeat=5)) / number * 1e9
    dis = min(timeit.repeat(decorated, number=number, repeat=5)) / number * 1e9
    return {"bare no-op call": bare, "disabled-monitor decorated call": dis}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    results: dict[str, list[float]] = {k: [] for k in VARIANTS}
    with tempfile.TemporaryDirectory() as out_dir:
        # A first round warms up torch, the allocator and the profiler's own caches; it is not counted.
        demo_round(0, args.steps, out_dir, {k: [] for k in results})
        for i in range(args.rounds):
            demo_round(i, args.steps, out_dir, results)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"demo step (MLP 512x4, batch 64, 1 thread), {args.rounds} rounds x {args.steps} steps per variant\n"
    )
    print("| variant | median ms/step | ratio | vs |")
    print("|---|---:|---:|---|")
    for key in ("bare", "enabled=False", "monitor, wait phase"):
        print(f"| {key} | {med[key]:.3f} | {med[key] / med['bare']:.3f}x | bare |")
    print(
        f"| raw torch.profiler, active | {med['raw torch.profiler, active']:.3f} | "
        f"{med['raw torch.profiler, active'] / med['bare']:.3f}x | bare |"
    )
    print(
        f"| monitor, active window | {med['monitor, active window']:.3f} | "
        f"{med['monitor, active window'] / med['raw torch.profiler, active']:.3f}x | raw torch.profiler |"
    )
    print()
    for name, ns in call_cost_ns().items():
        print(f"- {name}: {ns:.0f} ns")


if __name__ == "__main__":
    main()
