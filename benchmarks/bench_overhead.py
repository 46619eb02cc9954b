"""Overhead of the monitor on the demo training step, measured side by side in one process.

    .venv/bin/python benchmarks/bench_overhead.py [--rounds 5] [--steps 30] [--small]
    .venv/bin/python benchmarks/bench_overhead.py --options [--rounds 4] [--steps 20] [--json-out F]

A first, uncounted round warms everything up. Variants, interleaved round by round so machine noise hits them alike: the bare step; the step decorated by a
monitor with enabled=False; a monitor in its wait phase; a monitor in an active window; raw torch.profiler
with the same options in an active window. Times are per step (the call plus the profiler's step()), medians
over all rounds; the export at the end of a window is not part of any timed step.

`--stall` measures the step that ends a window instead, `--calls-only` the per-call costs, and `--options` the
per-step cost of every capture option that works during steps (overhead_options.py).
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
from _results import write_markdown_result, write_result
from stepscope.capture.demo import build_demo, make_train_step
from stepscope.capture.schedule import MAX_ACTIVE


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


def small_model() -> tuple[Any, Any, Any]:
    """A ~1 ms training step on one thread: MLP 256x2, batch 32 (the demo's structure, smaller)."""
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(0)

    def make_batch() -> tuple[Any, Any]:
        return torch.randn(32, 256, generator=generator), torch.randint(0, 10, (32,), generator=generator)

    return model, optimizer, make_batch


def demo_round(
    round_index: int, steps: int, out_dir: str, results: dict[str, list[float]], small: bool = False
) -> None:
    """One round on a fresh demo model (or the ~1 ms one)."""
    model, optimizer, make_batch = small_model() if small else build_demo()
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


STALL_SCHEDULE = {"wait": 4, "warmup": 1, "active": 3}


def stall_model(blocks: int = 40, width: int = 256, batch: int = 32) -> tuple[Any, Callable[[Any], Any], Any]:
    """The window-end workload of issue #32: `blocks` x (Linear + LayerNorm + GELU), SGD, one fixed batch."""
    from torch import nn

    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(blocks):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()]
    model = nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return (
        model,
        make_train_step(model, optimizer),
        (torch.randn(batch, width), torch.randint(0, width, (batch,))),
    )


def window_end_stall(
    model: Any, plain: Callable[[Any], Any], batch: Any, rounds: int, windows: int, out_dir: str
) -> dict[str, Any]:
    """The stall of the step that ends a window: its time minus the median of the plain (wait-phase) steps of
    the same run, for the monitor (console table on, report off) and for raw torch.profiler exporting in
    on_trace_ready; rounds alternate which goes first. Medians over every window of every round, the ratio of
    the medians, and what the monitor's worker left at close (traces, summaries, tables per window)."""
    stalls: dict[str, list[float]] = {"monitor": [], "raw torch.profiler": []}
    written = {"windows": 0, "traces": 0, "summaries": 0, "tables": 0}
    for i in range(rounds):
        order = [_monitor_stall, _raw_stall] if i % 2 == 0 else [_raw_stall, _monitor_stall]
        for run in order:
            run(model, plain, batch, windows, out_dir, stalls, written)
    med = {name: statistics.median(values) for name, values in stalls.items()}
    return {
        "stall_ms": med,
        "ratio": med["monitor"] / med["raw torch.profiler"],
        "windows_per_variant": len(stalls["monitor"]),
        "written": written,
    }


def _stall_steps(times: list[float], first_step: int, windows: int) -> list[float]:
    """The window-end steps' times minus the median wait-phase step; times[j] is step first_step + j."""
    steps = range(first_step, first_step + len(times))
    base = statistics.median(
        t for s, t in zip(steps, times, strict=True) if s % CYCLE < STALL_SCHEDULE["wait"]
    )
    return [times[k * CYCLE + CYCLE - 1 - first_step] - base for k in range(windows)]


CYCLE = sum(STALL_SCHEDULE.values())


def _monitor_stall(
    model: Any,
    plain: Any,
    batch: Any,
    windows: int,
    out_dir: str,
    stalls: dict[str, list[float]],
    written: dict[str, int],
) -> None:
    import contextlib
    import io
    import re

    from stepscope.runfolder import read_manifest

    monitor = stepscope.performance_monitor(
        model, out_dir=out_dir, **STALL_SCHEDULE, repeat=windows, console=True, report=False
    )
    step = monitor(plain)
    tables = io.StringIO()
    with contextlib.redirect_stderr(tables):  # the worker prints each window's table on sys.stderr
        step(
            batch
        )  # starts the monitor (the run folder): not a steady-state step, outside the counted cycles
        times = [timed(lambda: step(batch)) for _ in range(CYCLE * windows)]
        monitor.close()
    stalls["monitor"] += _stall_steps(times, 1, windows)
    assert monitor.run_dir is not None
    artifacts = read_manifest(monitor.run_dir).artifacts
    written["windows"] += windows
    written["traces"] += sum(a.kind == "trace" for a in artifacts)
    written["summaries"] += sum(a.kind == "summary" for a in artifacts)
    # each window's table of host ops (a CUDA window adds a second one, of its kernels: ": kernels")
    written["tables"] += len(
        re.findall(r"top ops, rank 0, window ending at step \d+(?!\d|: kernels)", tables.getvalue())
    )


def _raw_stall(
    model: Any,
    plain: Any,
    batch: Any,
    windows: int,
    out_dir: str,
    stalls: dict[str, list[float]],
    written: dict[str, int],
) -> None:
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(
        activities=activities,
        schedule=schedule(**STALL_SCHEDULE, repeat=windows),
        on_trace_ready=lambda p: p.export_chrome_trace(f"{out_dir}/raw_stall.json"),
    )
    prof.start()
    times = [timed(lambda: plain(batch), prof.step) for _ in range(CYCLE * windows)]
    prof.stop()
    stalls["raw torch.profiler"] += _stall_steps(times, 0, windows)


def window_events(out_dir: str) -> int:
    """The events of the last window raw torch.profiler exported: the window's size."""
    import json

    with open(f"{out_dir}/raw_stall.json") as f:
        return len(json.load(f)["traceEvents"])


def stall_lines(result: dict[str, Any], rounds: int, windows: int, blocks: int = 40) -> list[str]:
    med, w = result["stall_ms"], result["written"]
    events = result.get("events_per_window")
    return [
        f"window-end stall: {blocks} x (Linear 256 + LayerNorm + GELU), batch 32, 1 thread"
        + (f" ({events:,} events a window)" if events else "")
        + f"; wait {STALL_SCHEDULE['wait']}, "
        f"warmup {STALL_SCHEDULE['warmup']}, active {STALL_SCHEDULE['active']}; {rounds} rounds x {windows} windows "
        "per variant, alternating",
        "",
        "| variant | median stall ms (window-end step - plain step) | ratio |",
        "|---|---:|---:|",
        f"| raw torch.profiler (export_chrome_trace in on_trace_ready) | {med['raw torch.profiler']:.1f} | 1.00x |",
        f"| monitor (console table on) | {med['monitor']:.1f} | {result['ratio']:.2f}x |",
        "",
        f"at close: {w['traces']} traces, {w['summaries']} summaries, {w['tables']} console tables for "
        f"{w['windows']} windows",
    ]


def call_cost_ns(out_dir: str, repeat: int = 7) -> dict[str, float]:
    """ns per call of a no-op function: bare, decorated by a disabled monitor, decorated by a monitor in its wait
    phase, and a no-op plus `monitor.step()` of a `with monitor:` in its wait phase. Each monitor variant runs
    interleaved with the bare call, repeat by repeat, best of `repeat` (one recording monitor at a time: torch runs
    one profiler per process)."""

    def noop() -> None:
        return None

    number = 1_000_000

    def best_of(fns: dict[str, Callable[[], Any]]) -> dict[str, float]:
        best = {name: float("inf") for name in fns}
        for _ in range(repeat):
            for name, fn in fns.items():
                best[name] = min(best[name], timeit.timeit(fn, number=number) / number * 1e9)
        return best

    out = best_of({"bare no-op call": noop, "disabled-monitor decorated call": stepscope.performance_monitor(
        enabled=False)(noop)})  # fmt: skip
    waiting = stepscope.performance_monitor(out_dir=out_dir, wait=10**9, warmup=1, active=1, console=False)
    wait_call = waiting(noop)
    wait_call()  # starts the monitor (creates the run folder): not a steady-state call
    both = best_of({"bare": noop, "wait-phase monitor decorated call": wait_call})
    waiting.close()
    out["wait-phase monitor decorated call"] = both["wait-phase monitor decorated call"] - both["bare"] + out[
        "bare no-op call"]  # fmt: skip

    def step_cost(key: str, **options: Any) -> None:
        """A no-op plus `monitor.step()` of a started `with monitor:`, over the bare call."""
        monitor = stepscope.performance_monitor(out_dir=out_dir, console=False, report=False, **options)
        monitor.start()
        step = monitor.step

        def step_loop() -> None:
            noop()
            step()

        both = best_of({"bare": noop, key: step_loop})
        monitor.close()
        out[key] = both[key] - both["bare"] + out["bare no-op call"]

    step_cost("wait-phase monitor, call + step()", wait=10**9, warmup=1, active=1)
    # inside a recording window: the per-step cost must not grow with the window's length (issue #47)
    for active in (10, 10**4, MAX_ACTIVE):  # (10^6, as issue #47 asked, is refused since: at most 10^5)
        out[f"recording monitor, call + step() inside a window of active={active:,}"] = _window_step_ns(
            out_dir, active
        ) - both["bare"] + out["bare no-op call"]  # fmt: skip
    # on_demand=True, waiting for a trigger: one stat() of the request file every trigger_poll_steps (10) steps
    step_cost("on-demand monitor waiting for a trigger, call + step()", on_demand=True)
    # watch=True, nothing slow (issue #45: <= 1 us over the wait phase): a comparison per step, and every
    # trigger_poll_steps steps a check (the steps learned, the slow bound refreshed, a stat() of the request file)
    step_cost("watching monitor, nothing slow, call + step()", wait=10**9, warmup=1, active=1, watch=True)
    return out


def _window_step_ns(out_dir: str, active: int, repeat: int = 7) -> float:
    """ns of a no-op plus `monitor.step()` at steps 2-8 of a window of `active` steps (wait and warmup 0), the
    median of each of `repeat` monitors, best of them (a window of 10 ends at step 9: all measure the same
    steps)."""

    def noop() -> None:
        return None

    best = float("inf")
    for _ in range(repeat):
        monitor = stepscope.performance_monitor(
            out_dir=out_dir, wait=0, warmup=0, active=active, repeat=1, console=False, report=False
        )
        monitor.start()
        times = []
        for _ in range(9):
            t0 = time.perf_counter_ns()
            noop()
            monitor.step()
            times.append(time.perf_counter_ns() - t0)
        monitor.close()
        best = min(best, statistics.median(times[2:9]))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--small", action="store_true", help="a ~1 ms step (MLP 256x2, batch 32) instead of the demo"
    )
    parser.add_argument(
        "--calls-only", action="store_true", help="only the per-call costs (no-op steps), not the step rounds"
    )
    parser.add_argument(
        "--stall",
        action="store_true",
        help="only the window-end stall (monitor vs raw torch.profiler), --rounds rounds of --windows windows",
    )
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument(
        "--blocks",
        type=int,
        default=40,
        help="with --stall: blocks of the model (more blocks, more events a window)",
    )
    parser.add_argument(
        "--options",
        action="store_true",
        help="only the option table: every capture option that works during steps, against its reference "
        "(overhead_options.py), --rounds rounds of --steps steps per variant",
    )
    parser.add_argument("--json-out", help="with --options: write the table as JSON to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    if args.options:
        run_option_table(args)
        return
    if args.stall:
        model, plain, batch = stall_model(blocks=args.blocks)
        with tempfile.TemporaryDirectory() as out_dir:
            window_end_stall(model, plain, batch, 1, 1, out_dir)  # warm-up, not counted
            result = window_end_stall(model, plain, batch, args.rounds, args.windows, out_dir)
            result["events_per_window"] = window_events(out_dir)
        lines = stall_lines(result, args.rounds, args.windows, args.blocks)
        print("\n".join(lines))
        write_markdown_result("bench_overhead_stall", "The step that ends a window", lines, figures=result)
        return
    if args.calls_only:
        record_call_costs()
        return
    results: dict[str, list[float]] = {k: [] for k in VARIANTS}
    with tempfile.TemporaryDirectory() as out_dir:
        # A first round warms up torch, the allocator and the profiler's own caches; it is not counted.
        demo_round(0, args.steps, out_dir, {k: [] for k in results}, args.small)
        for i in range(args.rounds):
            demo_round(i, args.steps, out_dir, results, args.small)
    med = {k: statistics.median(v) for k, v in results.items()}
    what = "small step (MLP 256x2, batch 32" if args.small else "demo step (MLP 512x4, batch 64"
    lines = [
        f"{what}, 1 thread), {args.rounds} rounds x {args.steps} steps per variant",
        "",
        "| variant | median ms/step | ratio | vs |",
        "|---|---:|---:|---|",
    ]
    for key in ("bare", "enabled=False", "monitor, wait phase"):
        lines.append(f"| {key} | {med[key]:.3f} | {med[key] / med['bare']:.3f}x | bare |")
    raw, active = med["raw torch.profiler, active"], med["monitor, active window"]
    lines.append(f"| raw torch.profiler, active | {raw:.3f} | {raw / med['bare']:.3f}x | bare |")
    lines.append(f"| monitor, active window | {active:.3f} | {active / raw:.3f}x | raw torch.profiler |")
    print("\n".join(lines) + "\n")
    write_markdown_result("bench_overhead", "Monitor overhead per step", lines, figures=med)
    record_call_costs()


def run_option_table(args: argparse.Namespace) -> None:
    """`--options`: the per-step cost of every capture option that works during steps, as a markdown table
    (and JSON with --json-out)."""
    import json
    import platform
    import sys

    from overhead_options import markdown, measure_options

    model, optimizer, make_batch = small_model() if args.small else build_demo()
    result = measure_options(model, make_train_step(model, optimizer), make_batch(), args.rounds, args.steps)
    what = "small step (MLP 256x2, batch 32" if args.small else "demo step (MLP 512x4, batch 64"
    result = {
        "command": " ".join(["benchmarks/bench_overhead.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "workload": f"{what}, 1 thread, CPU)",
        "rounds": args.rounds,
        "steps": args.steps,
        "versions": {"torch": str(torch.__version__), "python": platform.python_version()},
        "cuda": torch.cuda.is_available(),
        **result,
    }
    print(f"{result['workload']}: {args.rounds} rounds x {args.steps} steps per variant, shuffled\n")
    print(markdown(result))
    write_markdown_result(
        "bench_overhead_options", "Every option during steps", [markdown(result)], figures=result
    )
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
            fh.write("\n")


def record_call_costs() -> None:
    with tempfile.TemporaryDirectory() as out_dir:
        costs = call_cost_ns(out_dir)
    rows = []
    for name, ns in costs.items():
        over = ns - costs["bare no-op call"]
        print(
            f"- {name}: {ns:.0f} ns" + (f" ({over:+.0f} ns over bare)" if name != "bare no-op call" else "")
        )
        rows.append((name, f"{ns:.0f}", f"{over:+.0f}" if name != "bare no-op call" else "-"))
    columns = ("call", "ns per call", "ns over the bare call")
    write_result("bench_overhead_calls", "The cost of one call of a no-op step", columns, rows, figures=costs)


if __name__ == "__main__":
    main()
