"""The per-step cost of every capture option that works during steps: `bench_overhead.py --options`.

`OPTION_ROWS` is the table: each row names the `ProfileConfig` fields it measures, what it measures and the
reference it is divided by. `IDLE_DURING_STEPS` names the fields that do no work during a step, each with the
reason; tests/capture/test_option_overhead.py checks that every field of the config is in one of the two, so an option
added later (`PLANNED` names those announced) fails that test until it has its row.

Every variant runs as a block of steps on one fresh monitor (torch runs one profiler per process, and a sampler
thread or a sink would slow whatever ran beside it). Each round takes the rows in a shuffled order and runs each
row's measured block and reference block back to back, alternating which goes first, so that both see the same
load of the machine; a one-step row times one step of a run (the FLOP-counted step, the comm-logged step, the
step that measures a step for the trace budget, the step that writes the buffered metrics lines) against the
plain steps of the same run, or of the run beside it. The ratio is the median of the rounds' ratios (each the
ratio of the two blocks' medians); "noise" is the bare step against itself.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import stepscope

BARE, WAIT, WINDOW, RAW = "bare", "wait", "window", "raw"
PROFILER_OPTIONS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
TIMELINE_OPTIONS = {"record_shapes": True, "profile_memory": True, "with_stack": True}  # memory_timeline's
SAMPLE_INTERVAL_S = 0.1
WARM_STEPS = 3  # untimed steps at the start of a wait block (the first starts the monitor)


@dataclass(frozen=True)
class Variant:
    """A block of steps run one way: no monitor (bare), a monitor waiting (wait) or in an active window
    (window), raw torch.profiler in an active window (raw); `options` go to the monitor or the profiler."""

    name: str
    kind: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    """One line of the table: `measured` (a variant or a one-step sample) over `reference`."""

    fields: tuple[str, ...]  # the ProfileConfig fields this row measures
    label: str
    measured: str
    reference: str
    note: str = ""


VARIANTS: tuple[Variant, ...] = (
    Variant("bare", BARE),
    Variant("bare (again)", BARE),
    Variant("enabled=False", WAIT, {"enabled": False}),
    Variant("monitor, wait phase", WAIT),
    Variant("rank not profiled", WAIT, {"profiled_ranks": [1]}),
    Variant("on_demand, waiting", WAIT, {"on_demand": True}),
    Variant("watch, nothing slow", WAIT, {"watch": True}),
    Variant("memory_log_every=1", WAIT, {"memory_log_every": 1, "console": True}),
    Variant("memory_log_every=1, console=False", WAIT, {"memory_log_every": 1}),
    Variant(
        f"system_sample_interval={SAMPLE_INTERVAL_S}", WAIT, {"system_sample_interval": SAMPLE_INTERVAL_S}
    ),
    Variant("memory_snapshot", WAIT, {"memory_snapshot": True}),
    Variant("tensorboard", WAIT, {"tensorboard": True}),
    Variant("wandb (offline)", WAIT, {"wandb": True}),
    Variant("raw torch.profiler", RAW),
    Variant("monitor, active window", WINDOW),
    *(Variant(f"raw torch.profiler, {o}", RAW, {o: True}) for o in PROFILER_OPTIONS),
    *(Variant(f"monitor, {o}", WINDOW, {o: True}) for o in PROFILER_OPTIONS),
    Variant("raw torch.profiler, " + " + ".join(TIMELINE_OPTIONS), RAW, dict(TIMELINE_OPTIONS)),
    Variant("monitor, memory_timeline", WINDOW, {"memory_timeline": True}),
    Variant("monitor, nsight", WINDOW, {"nsight": True}),
    Variant("monitor, python_sampling", WINDOW, {"python_sampling": True}),
    Variant("monitor, host_memory", WINDOW, {"host_memory": True}),
    Variant("trace=False, steps of the windows", WINDOW, {"trace": False}),
)

# One-step runs: their samples are "<run>: <which steps>".
FLOP, COMM, BUDGET, NO_BUDGET, FLUSH = "flop", "comm", "budget", "no budget", "flush"
ONE_STEP_RUNS = (FLOP, COMM, BUDGET, NO_BUDGET, FLUSH)

OPTION_ROWS: tuple[Row, ...] = (
    Row((), "noise: the bare step against itself", "bare (again)", "bare"),
    Row(("enabled",), "enabled=False (the decorator returns the function)", "enabled=False", "bare"),
    Row(
        ("wait", "skip_first", "repeat"),
        "a monitor outside its windows (wait phase)",
        "monitor, wait phase",
        "bare",
    ),
    Row(("profiled_ranks",), "a rank that does not record", "rank not profiled", "bare"),
    Row(
        ("on_demand", "trigger_poll_steps"),
        "on_demand, waiting: a stat() every 10 steps",
        "on_demand, waiting",
        "monitor, wait phase",
    ),
    Row(
        ("watch", "watch_windows_per_hour", "watch_cooldown_steps", "watch_max_mb"),
        "watch=True, nothing slow: a comparison per step, a check (a stat()) every 10 steps",
        "watch, nothing slow",
        "monitor, wait phase",
    ),
    Row(
        ("memory_log_every", "console"),
        "memory_log_every=1: psutil reading, memory log line, console line",
        "memory_log_every=1",
        "monitor, wait phase",
        "console line on stderr (/dev/null here)",
    ),
    Row(
        ("memory_log_every",),
        "memory_log_every=1, console=False",
        "memory_log_every=1, console=False",
        "monitor, wait phase",
    ),
    Row(
        ("system_sample_interval",),
        f"system_sample_interval={SAMPLE_INTERVAL_S}: the sampler thread",
        f"system_sample_interval={SAMPLE_INTERVAL_S}",
        "monitor, wait phase",
    ),
    Row(
        ("memory_snapshot",),
        "memory_snapshot outside windows",
        "memory_snapshot",
        "monitor, wait phase",
        "without CUDA: one warning at the start, nothing per step; with CUDA: the allocator's history "
        "from the step before each window to its end",
    ),
    Row(
        ("tensorboard",),
        "tensorboard=True: every step's scalars to a SummaryWriter",
        "tensorboard",
        "monitor, wait phase",
    ),
    Row(
        ("wandb",),
        "wandb=True (WANDB_MODE=offline)",
        "wandb (offline)",
        "monitor, wait phase",
        "logs only the FLOP throughput and each window's top ops: no step of its own",
    ),
    Row(("warmup", "active"), "monitor, active window", "monitor, active window", "raw torch.profiler"),
    *(
        row
        for o in PROFILER_OPTIONS
        for row in (
            Row((o,), f"{o}: torch.profiler's own cost", f"raw torch.profiler, {o}", "raw torch.profiler"),
            Row((o,), f"{o}: monitor, active window", f"monitor, {o}", f"raw torch.profiler, {o}"),
        )
    ),
    Row(
        ("memory_timeline",),
        "memory_timeline: monitor, active window (turns on " + ", ".join(TIMELINE_OPTIONS) + ")",
        "monitor, memory_timeline",
        "raw torch.profiler, " + " + ".join(TIMELINE_OPTIONS),
        "its export is at the window's end",
    ),
    Row(
        ("nsight",),
        "nsight: monitor, active window",
        "monitor, nsight",
        "monitor, active window",
        "without CUDA: one warning, nothing per step; with CUDA: an NVTX range per active step",
    ),
    Row(
        ("python_sampling",),
        "python_sampling: monitor, active window (py-spy at 100 Hz, --nonblocking)",
        "monitor, python_sampling",
        "monitor, active window",
        "py-spy is a child process launched at the window's warmup; the step pays for its reads of the "
        "process's memory",
    ),
    Row(
        ("host_memory",),
        "host_memory: monitor, active window (tracemalloc, 1 frame)",
        "monitor, host_memory",
        "monitor, active window",
        "every Python allocation of the active steps is traced; the last active step takes the end snapshot",
    ),
    Row(
        ("trace",),
        "trace=False: the steps of the windows",
        "trace=False, steps of the windows",
        "monitor, wait phase",
    ),
    Row(
        ("flop_counter_step", "flop_table_depth"),
        "flop_counter_step: the counted step (FlopCounterMode)",
        "flop: counted step",
        "flop: plain steps",
        "the plain steps of the same runs",
    ),
    Row(
        ("flop_counter_step", "peak_tflops", "peak_dtype"),
        "flop_counter_step: the other steps (tflops, mfu)",
        "flop: plain steps",
        "monitor, wait phase",
    ),
    Row(
        ("comm_logger_step", "comm_noise_level"),
        "comm_logger_step: the logged step (CommDebugMode)",
        "comm: logged step",
        "comm: plain steps",
        "1-rank gloo group; the step all-reduces its loss",
    ),
    Row(
        ("trace_budget_mb",),
        "trace_budget_mb: the warmup step that measures a step",
        "budget: warmup step",
        "no budget: warmup step",
        "a profiler records the step alone and exports it",
    ),
    Row(
        ("trace_budget_mb",),
        "trace_budget_mb: the first active step",
        "budget: first active step",
        "no budget: first active step",
    ),
    Row(
        (),
        "metrics.jsonl (always): the step that writes 256 buffered lines",
        "flush: writing step",
        "flush: plain steps",
    ),
)

# Fields that do no work during a step, and why (the test checks every config field is here or in a row).
IDLE_DURING_STEPS: dict[str, str] = {
    "out_dir": "where the run folder is made, at the first step",
    "top_n": "rows of the console table a window-end worker prints, off the training thread",
    "report": "report.html is written at close",
    "comm_patterns": "read by the analysis only",
    "process_groups": "looked at the first step, after each window and at close; never at a quiet step",
}

# Options that do not exist yet: their rows go into OPTION_ROWS (and VARIANTS) when they land.
PLANNED: tuple[str, ...] = ()


def timed(fn: Callable[[], Any], after: Callable[[], Any] | None = None) -> float:
    t0 = time.perf_counter_ns()
    fn()
    if after is not None:
        after()
    return (time.perf_counter_ns() - t0) / 1e6


@dataclass
class Workload:
    model: Any
    plain: Callable[[Any], Any]
    batch: Any
    out_dir: str
    steps: int
    comm_step: Callable[[Any], Any] | None = None  # plain + an all_reduce of the loss (with a process group)


def _monitor(w: Workload, **options: Any) -> Any:
    base: dict[str, Any] = {"out_dir": w.out_dir, "console": False, "report": False}
    return stepscope.performance_monitor(w.model, **{**base, **options})


def run_block(variant: Variant, w: Workload) -> list[float]:
    """`w.steps` timed steps of `variant`."""
    if variant.kind == RAW:
        return _raw_block(w, variant.options)
    if variant.kind == BARE:
        for _ in range(WARM_STEPS):
            w.plain(w.batch)
        return [timed(lambda: w.plain(w.batch)) for _ in range(w.steps)]
    if variant.kind == WAIT:
        monitor = _monitor(w, wait=10**6, warmup=1, active=1, **variant.options)
        step = monitor(w.plain)
        for _ in range(WARM_STEPS):  # the first starts the monitor (the run folder, a collector's start)
            step(w.batch)
        times = [timed(lambda: step(w.batch)) for _ in range(w.steps)]
        monitor.close()
        return times
    # an active window: one warmup step, the timed active steps, the window's last (exporting) step untimed
    monitor = _monitor(w, wait=0, warmup=1, active=w.steps + 1, repeat=1, **variant.options)
    step = monitor(w.plain)
    step(w.batch)
    times = [timed(lambda: step(w.batch)) for _ in range(w.steps)]
    step(w.batch)
    monitor.close()
    return times


def _raw_block(w: Workload, options: dict[str, Any]) -> list[float]:
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]  # as the monitor's trace collector chooses them
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(
        activities=activities, schedule=schedule(wait=0, warmup=1, active=w.steps + 1, repeat=1), **options
    )
    prof.start()
    w.plain(w.batch)
    prof.step()
    times = [timed(lambda: w.plain(w.batch), prof.step) for _ in range(w.steps)]
    w.plain(w.batch)
    prof.step()
    prof.stop()
    return times


def run_one_step(run: str, w: Workload) -> dict[str, list[float]]:
    """One run whose named steps are samples: {"<run>: <which steps>": [ms, ...]}."""
    if run in (FLOP, COMM):
        option = "flop_counter_step" if run == FLOP else "comm_logger_step"
        fn = w.plain if run == FLOP else w.comm_step
        assert fn is not None
        extra = {"peak_tflops": 100.0} if run == FLOP else {}  # a peak, so that every step's mfu is computed
        counted = 3
        monitor = _monitor(w, wait=10**6, warmup=1, active=1, **{option: counted}, **extra)
        step = monitor(fn)
        times = [timed(lambda: step(w.batch)) for _ in range(counted + 3 + w.steps)]
        monitor.close()
        which = "counted step" if run == FLOP else "logged step"
        # the step after the instrumented one pays for what it left; the first starts the monitor
        return {f"{run}: {which}": [times[counted]], f"{run}: plain steps": times[counted + 3 :]}
    if run in (BUDGET, NO_BUDGET):
        wait = 6
        extra = {"trace_budget_mb": 10_000.0} if run == BUDGET else {}
        monitor = _monitor(w, wait=wait, warmup=1, active=2, repeat=1, **extra)
        step = monitor(w.plain)
        times = [timed(lambda: step(w.batch)) for _ in range(wait + 2)]
        step(w.batch)  # the window's end
        monitor.close()
        return {
            f"{run}: warmup step": [times[wait]],
            f"{run}: first active step": [times[wait + 1]],
            f"{run}: plain steps": times[1:wait],
        }
    assert run == FLUSH
    monitor = _monitor(w, wait=10**6, warmup=1, active=1)
    step = monitor(w.plain)
    step(w.batch)
    assert monitor.run_dir is not None
    metrics = Path(monitor.run_dir) / "metrics.jsonl"
    times, flushed = [], None
    while flushed is None or len(times) < flushed + 4:
        times.append(timed(lambda: step(w.batch)))
        if flushed is None and metrics.stat().st_size:
            flushed = len(times) - 1
        if len(times) > 1000:
            raise RuntimeError("metrics.jsonl was not written in 1000 steps")
    monitor.close()
    return {
        "flush: writing step": [times[flushed]],
        "flush: plain steps": times[:flushed] + times[flushed + 1 :],
    }


@contextlib.contextmanager
def quiet_stderr(devnull: Any) -> Any:
    """stderr to /dev/null, Python's (console lines, tables, warnings) and fd 2's (kineto's own log lines)."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(devnull.fileno(), 2)
    try:
        with contextlib.redirect_stderr(devnull):
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def one_rank_group() -> str | None:
    """A 1-rank gloo process group in this process (for comm_logger_step); the reason when there is none."""
    import torch.distributed as dist

    if not dist.is_available():
        return "torch.distributed is not available in this build"
    if dist.is_initialized():
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    except Exception as exc:
        return f"a 1-rank gloo group could not start ({type(exc).__name__}: {exc})"
    return None


def with_all_reduce(plain: Callable[[Any], Any]) -> Callable[[Any], Any]:
    import torch.distributed as dist

    def step(batch: Any) -> Any:
        loss = plain(batch)
        value = torch.tensor([float(loss)])
        dist.all_reduce(value)  # the collective the logged step records
        return float(value)

    return step


def source(sample: str) -> Variant | str:
    """The variant, or the one-step run, whose block gives `sample`."""
    for variant in VARIANTS:
        if variant.name == sample:
            return variant
    run = sample.split(":")[0]
    assert run in ONE_STEP_RUNS, sample
    return run


def collect(run: Variant | str, w: Workload, devnull: Any) -> dict[str, list[float]]:
    with quiet_stderr(devnull):
        return {run.name: run_block(run, w)} if isinstance(run, Variant) else run_one_step(run, w)


def measure_options(
    model: Any, plain: Callable[[Any], Any], batch: Any, rounds: int, steps: int, seed: int = 0
) -> dict[str, Any]:
    """`rounds` rounds (after one that warms up and is not kept); in each, the rows in a shuffled order, and for
    each row its measured block and its reference block back to back (which goes first alternates), so that
    both see the same load. The table's rows as data."""
    skipped: dict[str, str] = {}
    problem = one_rank_group()
    if problem:
        skipped["comm_logger_step"] = problem
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    rows = [r for r in OPTION_ROWS if not set(r.fields) & set(skipped)]
    pairs: dict[str, list[tuple[list[float], list[float]]]] = {r.label: [] for r in rows}
    with tempfile.TemporaryDirectory() as out_dir, open(os.devnull, "w") as devnull:
        os.environ["WANDB_DIR"] = out_dir
        w = Workload(model, plain, batch, out_dir, steps, None if problem else with_all_reduce(plain))
        for round_index in range(rounds + 1):
            order = list(rows)
            random.Random(seed + round_index).shuffle(order)
            for i, row in enumerate(order):
                runs = [source(row.measured), source(row.reference)]
                if runs[0] == runs[1]:
                    runs.pop()
                elif (round_index + i) % 2:
                    runs.reverse()
                got: dict[str, list[float]] = {}
                for run in runs:
                    got.update(collect(run, w, devnull))
                if round_index:  # round 0 warms up
                    pairs[row.label].append((got[row.measured], got[row.reference]))
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return {
        "rows": [_row_result(row, pairs[row.label]) for row in rows],
        "skipped": [
            {"label": r.label, "fields": list(r.fields), "why": skipped[f]}
            for r in OPTION_ROWS
            for f in r.fields[:1]
            if f in skipped
        ],
        "idle_during_steps": IDLE_DURING_STEPS,
        "planned": list(PLANNED),
    }


def _row_result(row: Row, pairs: list[tuple[list[float], list[float]]]) -> dict[str, Any]:
    """Pooled medians of the measured and the reference steps; the ratio and the difference are the medians of
    the rounds' (each of two blocks run back to back)."""
    med = statistics.median(t for m, _ in pairs for t in m)
    ref = statistics.median(t for _, r in pairs for t in r)
    per_round = [statistics.median(m) / statistics.median(r) for m, r in pairs]
    over = statistics.median(statistics.median(m) - statistics.median(r) for m, r in pairs)
    return {
        "fields": list(row.fields),
        "label": row.label,
        "reference": row.reference,
        "median_ms": round(med, 4),
        "reference_ms": round(ref, 4),
        "over_reference_ms": round(over, 4),
        "ratio": round(statistics.median(per_round), 4),
        "round_ratios": [round(x, 4) for x in per_round],
        "samples": sum(len(m) for m, _ in pairs),
        "note": row.note,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| option(s) | what is timed | median ms/step | reference | reference ms | over it, ms | ratio | "
        "rounds' ratios | note |",
        "|---|---|---:|---|---:|---:|---:|---|---|",
    ]
    for r in result["rows"]:
        fields = ", ".join(f"`{f}`" for f in r["fields"]) or "(none)"
        rng = f"{min(r['round_ratios']):.2f}-{max(r['round_ratios']):.2f}"
        lines.append(
            f"| {fields} | {r['label']} | {r['median_ms']:.3f} | {r['reference']} | {r['reference_ms']:.3f} | "
            f"{r['over_reference_ms']:+.3f} | {r['ratio']:.3f}x | {rng} | {r['note']} |"
        )
    for s in result["skipped"]:
        lines.append(
            f"| {', '.join(f'`{f}`' for f in s['fields'])} | {s['label']} | not measured: {s['why']} |"
        )
    lines.append("")
    lines.append(
        "No work during steps: " + "; ".join(f"`{k}` ({v})" for k, v in result["idle_during_steps"].items())
    )
    if result["planned"]:
        lines.append("Not options yet (rows to add when they land): " + ", ".join(result["planned"]))
    return "\n".join(lines)
