"""Run every CUDA path of capture on a real GPU and check what it wrote; without
CUDA, a dry run of each check's CPU fallback (GPU checks: "skipped: no CUDA").

    make gpu-check                       # .venv with the pinned torch
    make gpu-check GPU_PYTHON=python3    # a python3 that has a CUDA torch
    python benchmarks/gpu_check.py [--out DIR] [--json FILE] [--dry-run]

The workload: a small causal transformer trained in bf16 autocast with AdamW
and a DataLoader (every collector on), a square bf16 GEMM of known size (FLOPs
and MFU against perf_counter around each step), `stepscope ops` and `stepscope whatif` against timings
and a re-run of the job with the change, a deliberate OOM (the OOM snapshot), the
overhead of the monitor beside raw torch.profiler and the stall of the step that ends a window beside raw
torch.profiler's export. It prints one Markdown table
(check | result | figure, to paste into docs/gpu.md) and writes the same as
JSON. Exit status 1 when a check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import gzip
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

if importlib.util.find_spec("stepscope") is None:  # run from a checkout without installing (GPU_PYTHON=...)
    _SRC = str(Path(__file__).resolve().parents[1] / "src")
    sys.path.insert(0, _SRC)
    # and for the processes the monitor starts (a window's summary, the report at close): without it they
    # failed on a GPU machine's python ("No module named stepscope") and every window lost its summary
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_SRC, os.environ.get("PYTHONPATH")) if p)

import stepscope
from _gpu_whatif import Undecided, whatif_figure, whatif_phase
from _gpu_workload import (
    CPU_SIZES,
    GPU_SIZES,
    Gemm,
    Sizes,
    batches,
    build_training,
    make_train_step,
    run_monitored,
)
from bench_overhead import STALL_SCHEDULE, VARIANTS, measure_round, window_end_stall
from stepscope.capture.console import StepscopeWarning
from stepscope.capture.schedule import Schedule
from stepscope.devices import device_key, lookup_peak
from stepscope.runfolder import read_manifest
from stepscope.runfolder.atomic import atomic_write_text

SCHEMA = "stepscope.gpu_check/1"
PHASES = ("train", "gemm", "ops", "whatif", "oom", "overhead", "stall")
# The step that ends a window vs raw torch.profiler's export (issue #32): the target on CUDA; the dry mode's
# windows are tiny and few, there the check proves that the path runs and every window is written.
# the dry mode (CPU, windows of a few ms on a tiny model) checks the path, not the figure: a loose limit
STALL_LIMITS = {True: 1.25, False: 5.0}
NO_CUDA = "skipped: no CUDA"
TRAIN_SCHEDULE = {"wait": 3, "warmup": 1, "active": 3, "repeat": 2}
TRAIN_STEPS = 18  # windows [4, 6] and [11, 13]; steps 8, 9, 15-17 are undisturbed, timed for TFLOP/s
GEMM_STEPS = 12
NSYS_TIMEOUT_S = 400  # seen: 190 s for the capture alone
GEMM_TOLERANCE = {True: 0.05, False: 0.20}
# `stepscope ops` (issue #46): products of a good and a bad size, their rates from the trace against a timing
OPS_SIZES = {True: (4096, 4095), False: (512, 511)}
OPS_CALLS = 10
OPS_REPEATS = 5  # timings of OPS_CALLS products each; their median
# the 20% on CUDA; the dry mode's CPU products of a few ms beside other work: its path, not its figure
OPS_TOLERANCE = {True: 0.20, False: 0.50}  # CUDA: the 5%; CPU timers on a shared machine: 20%
# Allowed (wait phase / bare, active window / raw torch.profiler), medians of per-round paired ratios. On CUDA,
# docs/benchmarks.md's targets with a point of noise on the wait phase; the dry mode's CPU steps are tiny and
# its rounds few: there the check proves that the code path runs, not a figure.
OVERHEAD_LIMITS = {True: (1.03, 1.05), False: (1.5, 2.0)}
GEMM_KERNEL = re.compile(r"gemm|cutlass|nvjet|xmma", re.IGNORECASE)
ATTENTION_KERNEL = re.compile(r"flash|fmha|sdpa|attention", re.IGNORECASE)  # not softmax: the loss has one
# Warnings a healthy run gives; any other StepscopeWarning fails the "collectors" check.
EXPECTED_WARNINGS = ("memory_timeline=True needs",)
EXPECTED_WITHOUT_CUDA = ("snapshots need a GPU", "nsight=True needs CUDA")


# --- results ----------------------------------------------------------------------------------------
@dataclass
class Check:
    check: str
    result: str  # "pass", "FAIL" or "skipped: why"
    figure: str = ""


class Skip(Exception):
    """A check that cannot run here; the message says why."""


@dataclass
class Checks:
    cuda: bool
    rows: list[Check] = field(default_factory=list)

    def run(self, name: str, fn: Callable[[], tuple[bool, str]], gpu: bool = False) -> None:
        """Run one check; an exception inside it is that check's failure, never the script's."""
        if gpu and not self.cuda:
            self.rows.append(Check(name, NO_CUDA))
            return
        try:
            ok, figure = fn()
        except Skip as why:
            self.rows.append(Check(name, f"skipped: {why}"))
        except Exception as exc:
            self.rows.append(Check(name, "FAIL", f"{type(exc).__name__}: {exc}"))
        else:
            self.rows.append(Check(name, "pass" if ok else "FAIL", figure))

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.rows if c.result == "FAIL"]


# --- helpers ----------------------------------------------------------------------------------------
def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`stepscope ARGS` in a fresh process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "stepscope", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
    )


def cli_json(*args: str) -> Any:
    done = cli(*args, "--json")
    if done.returncode != 0:
        raise RuntimeError(
            f"stepscope {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-300:]}"
        )
    return json.loads(done.stdout)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(stepscope.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def artifacts(run_dir: Path, kind: str) -> list[tuple[int | None, Path]]:
    return [(a.step, run_dir / a.path) for a in read_manifest(run_dir).artifacts if a.kind == kind]


def trace_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)["traceEvents"]


def gib(n: float) -> str:
    return f"{n / 2**30:.3f} GiB"


def stepscope_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, StepscopeWarning)]


# --- phases: run the workloads, keep the evidence ---------------------------------------------------
@dataclass
class TrainRun:
    run_dir: Path
    schedule: Schedule
    peak_reads: dict[int, int]  # max_memory_allocated at the end of each step of the first window
    warnings: list[str]
    seconds: float


def train_phase(out: Path, s: Sizes, device: torch.device) -> TrainRun:
    """The transformer under a monitor with every collector on."""
    cuda = device.type == "cuda"
    schedule = Schedule(**TRAIN_SCHEDULE)
    first, last = schedule.windows()[0]
    t = build_training(s, device, TRAIN_STEPS)
    peaks: dict[int, int] = {}

    def before(i: int) -> None:
        if cuda and i == first:
            torch.cuda.reset_peak_memory_stats(device)

    def after(i: int) -> None:
        if cuda and first <= i <= last:
            peaks[i] = torch.cuda.max_memory_allocated(device)

    options = {
        **TRAIN_SCHEDULE,
        "out_dir": str(out / "train"),
        "flop_counter_step": 1,
        "comm_logger_step": 2,
        "memory_log_every": 2,
        "memory_snapshot": True,
        "memory_timeline": True,
        "system_sample_interval": 0.05,
        "nsight": True,
        "tensorboard": importlib.util.find_spec("tensorboard") is not None,
        "console": False,
    }
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = stepscope.performance_monitor(t.model, **options)
        run_dir = run_monitored(monitor, make_train_step(t, monitor, before, after), t, TRAIN_STEPS)
    return TrainRun(run_dir, schedule, peaks, stepscope_warnings(caught), time.perf_counter() - t0)


@dataclass
class GemmRun:
    run_dir: Path
    flops_per_step: int
    independent_s: list[float]  # perf_counter around each call from step GEMM_FIRST_TIMED on


GEMM_FIRST_TIMED = 3


def job_clock_steps(run: GemmRun) -> list[float]:
    """The calls' perf_counter times less what the job waited for stepscope after each step (metrics.jsonl's
    monitor_ms: the FLOP report of the counted step is written a few steps later). The monitor times the step
    alone (wall_ms, docs/capture.md); a call's clock also holds that wait. On an H200 it was 1.1-1.5 ms at one
    step of nine, which moved the median of the calls across the GPU's two speeds (below) by 8-11%."""
    waited = {
        int(line["step"]): float(line.get("monitor_ms") or 0.0)
        for line in map(json.loads, (run.run_dir / "metrics.jsonl").read_text().splitlines())
    }
    return [t - waited.get(GEMM_FIRST_TIMED + i, 0.0) / 1e3 for i, t in enumerate(run.independent_s)]


def gemm_phase(out: Path, s: Sizes, device: torch.device) -> GemmRun:
    """FLOPs counted at step 1, the other steps timed by the monitor and, independently, by perf_counter around
    each call (paired, so clocks and noise hit both alike). Nothing else runs between the calls: a decorated
    step runs from the previous call's return, so work there would be part of the step."""
    gemm = Gemm(s.gemm, s.gemm_reps, device)
    gemm()
    gemm()  # warm-up: cuBLAS heuristics, clocks
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no window completes in this phase: the monitor says so
        monitor = stepscope.performance_monitor(
            None,
            out_dir=str(out / "gemm"),
            wait=10**6,
            warmup=0,
            active=1,
            flop_counter_step=1,
            console=False,
        )
        step = monitor(gemm)
        independent = []
        try:
            for _ in range(GEMM_STEPS):
                t0 = time.perf_counter()
                step()
                independent.append(time.perf_counter() - t0)
        finally:
            monitor.close()
    assert monitor.run_dir is not None
    # as the monitor: not step 0, the counted step 1, nor step 2 right after it
    return GemmRun(monitor.run_dir, gemm.flops, independent[GEMM_FIRST_TIMED:])


@dataclass
class OpsRun:
    trace: Path
    sizes: tuple[int, int]
    timed_s: dict[int, float]  # n -> the median of a timed call of the n x n x n product


def ops_phase(out: Path, device: torch.device) -> OpsRun:
    """Products of a good and a bad size (bf16 on CUDA), OPS_CALLS each under torch.profiler with record_shapes
    (the trace `stepscope ops` reads), then each timed alone (synchronized) for the rates to agree with."""
    cuda = device.type == "cuda"
    sizes = OPS_SIZES[cuda]
    dtype = torch.bfloat16 if cuda else torch.float32
    mats = {n: (torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype))
            for n in sizes}  # fmt: skip

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def job() -> None:
        for _ in range(OPS_CALLS):
            for a, b in mats.values():
                torch.mm(a, b)
        sync()

    job()  # warm-up: the library's heuristics, clocks
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if cuda else []
    )
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        job()
    (out / "ops").mkdir(parents=True, exist_ok=True)
    trace = out / "ops" / "products.json"
    prof.export_chrome_trace(str(trace))
    timed: dict[int, float] = {}
    for n, (a, b) in mats.items():
        # OPS_CALLS products back to back between two synchronizations, per product: one product alone between
        # them carries the launch and the round trip of the synchronization (about 38 us seen on an H200, 18% of
        # a 4096^3 bf16 product's 175 us), which the kernel's own time in the trace rightly has not
        times = []
        for _ in range(OPS_REPEATS):
            sync()
            t0 = time.perf_counter()
            for _ in range(OPS_CALLS):
                torch.mm(a, b)
            sync()
            times.append((time.perf_counter() - t0) / OPS_CALLS)
        timed[n] = statistics.median(times)
    return OpsRun(trace, sizes, timed)


def ops_checks(c: Checks, run: OpsRun, cuda: bool) -> None:
    doc = (
        cli_json("ops", str(run.trace), "--json")
        if cuda
        else cli_json("ops", str(run.trace), "--json", "--peak-tflops", "1", "--peak-tbps", "0.05")
    )
    (rank,) = doc["ranks"]
    groups = {int(g["shapes"].split(",")[0].strip("[")): g for g in rank["groups"] if g["name"] == "aten::mm"}

    def counted() -> tuple[bool, str]:
        ok = all(groups[n]["flops"] == OPS_CALLS * 2 * n**3 for n in run.sizes)
        return ok, ", ".join(
            f"{n}: {groups[n]['flops']:.4g} FLOPs over {groups[n]['calls']} calls" for n in run.sizes
        )

    def rates() -> tuple[bool, str]:
        parts, ok = [], True
        for n in run.sizes:
            ours = groups[n]["tflops"]
            ref = 2 * n**3 / run.timed_s[n] / 1e12
            diff = abs(ours - ref) / ref
            ok = ok and diff <= OPS_TOLERANCE[cuda]
            parts.append(f"{n}: ops {ours:.3g} vs timed {ref:.3g} TFLOP/s ({100 * diff:.1f}%)")
        return ok, "; ".join(parts) + f" (limit {100 * OPS_TOLERANCE[cuda]:.0f}%)"

    def ranked() -> tuple[bool, str]:
        good, bad = (groups[n]["efficiency"] for n in run.sizes)
        if good is None or bad is None:
            raise Skip(f"no roof for {rank['device']!r}: {rank['roofline']['source']}")
        return good > bad, f"{run.sizes[0]}: {100 * good:.1f}% of the roof, {run.sizes[1]}: {100 * bad:.1f}%"

    c.run("ops: each product's FLOPs from its recorded shapes", counted)
    c.run("ops: achieved TFLOP/s agrees with a timing of the same product", rates)
    c.run(
        "ops: the badly sized product ranks lower in efficiency", ranked, gpu=True
    )  # (the dry mode's are alike)


@dataclass
class OomRun:
    run_dir: Path
    raised: str | None


def oom_phase(out: Path, device: torch.device) -> OomRun:
    """Step 1 asks for twice the card's memory inside an active window with memory_snapshot=True."""
    too_much = 2 * torch.cuda.get_device_properties(device).total_memory
    monitor = stepscope.performance_monitor(
        None, out_dir=str(out / "oom"), wait=0, warmup=1, active=2, memory_snapshot=True, console=False
    )

    @monitor
    def step(i: int) -> None:
        keep = torch.ones(1 << 20, device=device)
        if i == 1:
            torch.empty(too_much, dtype=torch.uint8, device=device)
        del keep

    raised = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step(0)
        try:
            step(1)
        except torch.cuda.OutOfMemoryError as exc:
            first = str(exc).splitlines()[0]
            raised = f"{type(exc).__name__}: {'. '.join(first.split('. ')[:2])[:160]}"
        monitor.close()
    assert monitor.run_dir is not None
    return OomRun(monitor.run_dir, raised)


@dataclass
class Overhead:
    """Median ms per step of each variant in each round (rounds alternate which active variant goes first)."""

    rounds: list[dict[str, float]]
    batch: int

    def ratios(self, variant: str, base: str) -> list[float]:
        """`variant` over `base`, paired round by round."""
        return [r[variant] / r[base] for r in self.rounds]

    def medians(self) -> dict[str, float]:
        return {k: statistics.median(r[k] for r in self.rounds) for k in VARIANTS}


def overhead_phase(
    out: Path, s: Sizes, device: torch.device, rounds: int, steps: int, batch: int
) -> Overhead:
    """bench_overhead's variants on the transformer step (a fixed batch of `batch` sequences, no DataLoader).

    On the GPU the default batch makes the step GPU-bound: at batch 16 the step is bound by kernel launches and
    its time moves by about 20% from block to block on the machines measured (docs/gpu.md), more than the
    limits; at 64 the same comparison repeats within 2%."""
    t = build_training(s, device, steps=1)
    tokens = torch.randint(0, s.vocab, (batch, s.seq + 1))
    plain = make_train_step(t)
    per_round = []
    with warnings.catch_warnings(), tempfile.TemporaryDirectory(dir=out) as tmp:
        warnings.simplefilter("ignore")
        measure_round(0, steps, tmp, {k: [] for k in VARIANTS}, t.model, plain, (tokens,))  # warm-up round
        for i in range(rounds):
            results: dict[str, list[float]] = {k: [] for k in VARIANTS}
            measure_round(i, steps, tmp, results, t.model, plain, (tokens,))
            per_round.append({k: statistics.median(v) for k, v in results.items()})
    return Overhead(per_round, batch)


def stall_phase(out: Path, s: Sizes, device: torch.device, rounds: int, batch: int) -> dict[str, Any]:
    """bench_overhead's window-end stall on the transformer step: the step that ends a window minus a plain
    step, the monitor (console table on) vs raw torch.profiler exporting in on_trace_ready, alternating."""
    t = build_training(s, device, steps=1)
    tokens = torch.randint(0, s.vocab, (batch, s.seq + 1))
    plain = make_train_step(t)
    with warnings.catch_warnings(), tempfile.TemporaryDirectory(dir=out) as tmp:
        warnings.simplefilter("ignore")
        window_end_stall(t.model, plain, (tokens,), 1, 1, tmp)  # warm-up, not counted
        return window_end_stall(t.model, plain, (tokens,), rounds, 2, tmp)


def stall_checks(c: Checks, r: dict[str, Any], cuda: bool) -> None:
    limit = STALL_LIMITS[cuda]

    def stall() -> tuple[bool, str]:
        med, w = r["stall_ms"], r["written"]
        all_written = w["traces"] == w["summaries"] == w["tables"] == w["windows"]
        return r["ratio"] <= limit and all_written, (
            f"monitor {med['monitor']:.1f} ms vs raw torch.profiler {med['raw torch.profiler']:.1f} ms: "
            f"{r['ratio']:.2f}x (limit {limit}x), {r['windows_per_variant']} windows each "
            f"(active {STALL_SCHEDULE['active']}); at close {w['traces']} traces, {w['summaries']} summaries, "
            f"{w['tables']} tables of {w['windows']} windows"
        )

    c.run("window end: stall vs raw torch.profiler's export", stall)


def nsys_workload(out: Path) -> None:
    """What runs under nsys: the transformer with nsight=True, one window of 3 active steps."""
    s, device = GPU_SIZES, torch.device("cuda", torch.cuda.current_device())
    t = build_training(s, device, 8)
    monitor = stepscope.performance_monitor(
        t.model, out_dir=str(out), wait=2, warmup=1, active=3, nsight=True, console=False
    )
    step = monitor(make_train_step(t, monitor))
    feed = batches(t.loader)
    for _ in range(8):
        step(next(feed))
    monitor.close()


def bounded(cmd: list[str], timeout: float) -> tuple[int | str, str]:
    """Run `cmd` (and what it starts) for at most `timeout` s: (exit code or "timeout", stdout + stderr)."""
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), start_new_session=True
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)  # nsys's own child (the workload) holds the GPU: end the whole group
            output, _ = proc.communicate()
            return "timeout", f"{output}\nno answer in {timeout:.0f} s"
    return proc.returncode, output


def find_nsys() -> str | None:
    found = shutil.which("nsys")
    if found:
        return found
    for pattern in (
        "/usr/local/cuda/bin/nsys",
        "/opt/nvidia/nsight-systems*/bin/nsys",
        "/opt/nvidia/nsight-systems/*/bin/nsys",
        "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
    ):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


# --- checks -----------------------------------------------------------------------------------------
def train_checks(c: Checks, run: TrainRun, device: torch.device) -> None:
    rd = run.run_dir
    windows = run.schedule.windows()
    traces = artifacts(rd, "trace")

    def collectors_on() -> tuple[bool, str]:
        expected = EXPECTED_WARNINGS + (() if device.type == "cuda" else EXPECTED_WITHOUT_CUDA)
        bad = [w for w in run.warnings if not any(e in w for e in expected)]
        return not bad, "; ".join(bad) or f"{TRAIN_STEPS} steps in {run.seconds:.1f} s, no unexpected warning"

    def spans() -> tuple[bool, str]:
        found = []
        for step, path in traces:
            # CPU-side spans only: on CUDA each step also has a gpu_user_annotation of the same name
            steps = sorted(
                int(m.group(1))
                for e in trace_events(path)
                if e.get("cat") != "gpu_user_annotation"
                and (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", "")))
            )
            found.append((step, steps))
        expected = [(last, list(range(first, last + 1))) for first, last in windows]
        return found == expected, f"steps per window: {found} (expected {expected})"

    def kernels() -> tuple[bool, str]:
        counts, elsewhere = [], 0
        for _, path in traces:
            ks = [e for e in trace_events(path) if e.get("cat") == "kernel"]
            counts.append(sum(1 for e in ks if e.get("args", {}).get("device") == device.index))
            elsewhere += sum(1 for e in ks if e.get("args", {}).get("device") != device.index)
        ok = bool(counts) and all(counts) and not elsewhere
        return ok, f"kernels on {device} per window: {counts}; elsewhere: {elsewhere}"

    def analyze_runs() -> tuple[bool, str]:
        doc = cli_json("analyze", str(rd))
        (rank,) = doc["ranks"]
        return rank["window"]["steps"] == TRAIN_SCHEDULE[
            "active"
        ], f"rank 0, {rank['window']['steps']} steps, {len(doc['findings'])} findings"

    def gpu_busy() -> tuple[bool, str]:
        (rank,) = cli_json("analyze", str(rd))["ranks"]
        busy = 100.0 - rank["temporal"]["idle_pct"]
        return busy > 0, f"GPU busy {busy:.1f}% of the window"

    def kernel_names() -> tuple[bool, str]:
        (rank,) = cli_json("analyze", str(rd), "--top", "30")["ranks"]
        names = [k["name"] for k in rank["top_kernels"]]
        wanted = {
            "matmul": any(GEMM_KERNEL.search(n) for n in names),
            "attention": any(ATTENTION_KERNEL.search(n) for n in names),
            "layer norm": any("layer_norm" in n.lower() or "layernorm" in n.lower() for n in names),
        }
        top = names[0][:60] if names else "-"
        return all(wanted.values()), f"{wanted}; top kernel: {top}"

    def summary_by_device() -> tuple[bool, str]:
        _, path = artifacts(rd, "summary")[-1]
        text = path.read_text()
        kernels = re.search(r"Top \d+ GPU kernels by total time", text)
        ok = kernels is not None and f"cuda:{device.index}: allocated" in text
        return ok, f"{text.splitlines()[0][:80]}: {kernels[0] if kernels else 'no kernel table'}"

    c.run("collectors: no unexpected warning", collectors_on)
    c.run("trace: one per window, ProfilerStep spans match the schedule", spans)
    c.run("trace: CUDA kernels on the model's device", kernels, gpu=True)
    c.run("analyze: runs on the run folder", analyze_runs)
    c.run("analyze: GPU busy > 0", gpu_busy, gpu=True)
    c.run("analyze: workload kernels (matmul, attention, layer norm)", kernel_names, gpu=True)
    c.run("summary: top GPU kernels, CUDA memory lines", summary_by_device, gpu=True)
    flop_checks(c, rd)
    memory_checks(c, run, device)
    system_checks(c, rd, run)


def flop_checks(c: Checks, rd: Path) -> None:
    def report() -> dict[str, Any]:
        ((_, js),) = [(s, p) for s, p in artifacts(rd, "flops") if p.suffix == ".json"]
        return json.loads(js.read_text())

    def autocast() -> tuple[bool, str]:
        r = report()
        ok = r["matmul_dtype"] == "torch.bfloat16" and r["peak_format"] == "bf16" and r["total_flops"] > 0
        return (
            ok,
            f"{r['total_flops'] / 1e9:.4g} GFLOP/step, matmul dtype {r['matmul_dtype']}, format {r['peak_format']}",
        )

    def train_mfu() -> tuple[bool, str]:
        t = report()["throughput"]
        if t is None:
            return False, "no throughput figure"
        ok = t["mfu"] is not None and 0 < t["mfu"] < 1
        return (
            ok,
            f"{t['tflops']:.1f} TFLOP/s, MFU {100 * (t['mfu'] or 0):.1f}% (peak {t['peak'] and t['peak']['tflops']})",
        )

    c.run("flops: bf16 autocast step counted as bf16", autocast)
    c.run("mfu: transformer step has an MFU", train_mfu, gpu=True)


def memory_checks(c: Checks, run: TrainRun, device: torch.device) -> None:
    rd = run.run_dir

    def log_rows() -> tuple[bool, str]:
        rows = _jsonl(artifacts(rd, "memory_log")[0][1])
        steps = [int(r["step"]) for r in rows]
        ok = steps == list(range(1, TRAIN_STEPS, 2)) and all(int(r["rss_bytes"]) > 0 for r in rows)
        return ok, f"rows after steps {steps}"

    def log_cuda() -> tuple[bool, str]:
        rows = _jsonl(artifacts(rd, "memory_log")[0][1])
        alloc = [int(r.get("cuda_allocated_bytes") or 0) for r in rows]
        peak = [int(r.get("cuda_peak_allocated_bytes") or 0) for r in rows]
        ok = all(alloc) and all(p >= a for p, a in zip(peak, alloc, strict=True))
        return ok, f"allocated {gib(min(alloc))}..{gib(max(alloc))}, interval peaks up to {gib(max(peak))}"

    def snapshot_peak() -> tuple[bool, str]:
        first, last = run.schedule.windows()[0]
        snaps = dict(artifacts(rd, "memory_snapshot"))
        if last not in snaps:
            return False, f"no snapshot for the window ending at step {last}: {sorted(snaps)}"
        doc = cli_json("memory", str(snaps[last]))
        dev = next(d for d in doc["devices"] if d["device"] == device.index)
        torch_peak = max(run.peak_reads.values())
        diff = abs(dev["peak_allocated"] - torch_peak) / torch_peak
        size = snaps[last].stat().st_size
        return diff <= 0.01, (
            f"snapshot peak {gib(dev['peak_allocated'])} vs max_memory_allocated {gib(torch_peak)} over steps "
            f"{first}-{last} ({100 * diff:.2f}%); {dev['trace_entries']} entries, {size / 2**20:.1f} MiB"
        )

    def timeline() -> tuple[bool, str]:
        _, last = run.schedule.windows()[0]
        raws = dict(artifacts(rd, "memory_timeline"))
        htmls = [p for _, p in artifacts(rd, "memory_timeline_html")]
        doc = cli_json("memory", str(raws[last]))
        peak = max(d["peak_allocated"] for d in doc["devices"])
        ok = len(raws) == len(htmls) == TRAIN_SCHEDULE["repeat"] and peak > 0
        figure = f"{len(raws)} raw + {len(htmls)} html; `stepscope memory`: peak {gib(peak)}"
        if run.peak_reads:  # the raw timeline names no device: its size tells CUDA memory from host memory
            torch_peak = max(run.peak_reads.values())
            diff = abs(peak - torch_peak) / torch_peak
            ok = ok and diff <= 0.10
            figure += f", {100 * diff:.1f}% from max_memory_allocated over the same window (limit 10%)"
        return ok, figure

    c.run("memory log: a row every N steps", log_rows)
    c.run("memory log: CUDA allocated / peak columns", log_cuda, gpu=True)
    c.run("memory snapshot: written, parsed, peak within 1% of torch's", snapshot_peak, gpu=True)
    timeline_device = f"cuda:{device.index}" if device.type == "cuda" else "cpu"
    c.run(f"memory timeline on {timeline_device}: raw + html, parsed", timeline)


def system_checks(c: Checks, rd: Path, run: TrainRun) -> None:
    def rows() -> list[dict[str, Any]]:
        return _jsonl(artifacts(rd, "system")[0][1])

    def base() -> tuple[bool, str]:
        r = rows()
        ok = len(r) >= 3 and all(float(x["rss_bytes"]) > 0 for x in r)
        return ok, f"{len(r)} samples over {run.seconds:.1f} s"

    def nvml() -> tuple[bool, str]:
        r = rows()
        gpu0 = [x["gpus"][0] for x in r if x.get("gpus")]
        if not gpu0:
            return False, f"no GPU in the samples ({', '.join(r[0])[:80]})"
        cols = ("util_percent", "mem_used_bytes", "power_w")
        filled = {k: [float(g[k]) for g in gpu0 if g.get(k) is not None] for k in cols}
        ok = all(filled.values()) and max(filled["util_percent"]) > 0
        return ok, (
            f"util max {max(filled['util_percent']):.0f}%, mem max {gib(max(filled['mem_used_bytes']))}, "
            f"power max {max(filled['power_w']):.0f} W"
        )

    def other_collectors() -> tuple[bool, str]:
        kinds = {a.kind for a in read_manifest(rd).artifacts}
        wanted = {
            "comm_counts",
            "comm_debug",
            "comm_json",
            "flops",
            "summary",
            "trace",
            "memory_log",
            "memory_timeline",
            "system",
        }
        if run.peak_reads:  # CUDA
            wanted.add("memory_snapshot")
        if importlib.util.find_spec("tensorboard") is not None:
            wanted.add("tensorboard")
        return wanted <= kinds, f"manifest kinds: {', '.join(sorted(kinds))}"

    c.run("system sampler: CPU / RSS samples", base)
    c.run("system sampler: NVML util, memory, power", nvml, gpu=True)
    c.run("run folder: every collector's artifacts indexed", other_collectors)


def nsight_checks(c: Checks, run: TrainRun, out: Path, nsys: bool) -> None:
    def profiler_api() -> tuple[bool, str]:
        names = [e.get("name", "") for _, p in artifacts(run.run_dir, "trace") for e in trace_events(p)]
        starts = sum(n == "cudaProfilerStart" for n in names)
        stops = sum(n == "cudaProfilerStop" for n in names)
        bad = [w for w in run.warnings if "nsight" in w]
        windows = len(run.schedule.windows())
        figure = f"in the traces: {starts} cudaProfilerStart, {stops} cudaProfilerStop ({windows} windows)"
        return not bad and starts == stops == windows, "; ".join([figure, *bad])

    def under_nsys() -> tuple[bool, str]:
        if not nsys:
            raise Skip("--no-nsys")
        exe = find_nsys()
        if exe is None:
            raise Skip("nsys not found")
        rep = out / "nsys" / "train"
        rep.parent.mkdir(parents=True, exist_ok=True)
        report = rep.with_suffix(".nsys-rep")
        for stale in (report, rep.with_suffix(".sqlite"), rep.with_suffix(".qdstrm")):
            stale.unlink(missing_ok=True)  # a report of an earlier run must not pass for this one's
        cmd = [exe, "profile", "--trace=cuda,nvtx", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
               "--force-overwrite=true", "-o", str(rep), sys.executable, __file__, "--nsys-workload",
               "--out", str(out / "nsys")]  # fmt: skip
        code, output = bounded(cmd, NSYS_TIMEOUT_S)
        if not report.exists():
            tail = output.strip().splitlines()[-1:] or ["no output"]
            raise Skip(f"{exe} wrote no report (exit {code}: {tail[0][:120]})")
        code, output = bounded([exe, "stats", "--force-export=true", "--report", "nvtx_sum", "--format", "csv",
                                str(report)], NSYS_TIMEOUT_S)  # fmt: skip
        ranges = sorted(set(re.findall(r"stepscope step (\d+)", output)), key=int)
        return ranges == ["3", "4", "5"], f"NVTX ranges in the capture: {ranges}"

    c.run("nsight: one cudaProfilerStart/Stop per window, NVTX calls ran", profiler_api, gpu=True)
    c.run("nsight: nsys capture holds the window's NVTX ranges", under_nsys, gpu=True)


def gemm_checks(c: Checks, run: GemmRun, cuda: bool, s: Sizes) -> None:
    tolerance = GEMM_TOLERANCE[cuda]

    def agree() -> tuple[bool, str]:
        ((_, js),) = [(st, p) for st, p in artifacts(run.run_dir, "flops") if p.suffix == ".json"]
        r = json.loads(js.read_text())
        t = r["throughput"]
        ours = t["tflops"]
        # the steps the monitor timed, by the job's clock less what it waited for stepscope. The 8192^3 GEMM
        # runs at two speeds on an H200 (11.2 and 12.8 ms per step: its clocks fall after some seconds of
        # full load), so a median sits near the edge between them: timed alike, or it jumps by 10%
        ref = run.flops_per_step / statistics.median(job_clock_steps(run)) / 1e12
        diff = abs(ours - ref) / ref
        counted = r["total_flops"] == run.flops_per_step
        mfu = f", MFU {100 * t['mfu']:.1f}%" if t["mfu"] is not None else ""
        return counted and diff <= tolerance, (
            f"{s.gemm}^3 x{s.gemm_reps} bf16: stepscope {ours:.1f} vs perf_counter {ref:.1f} TFLOP/s "
            f"({100 * diff:.2f}%, limit {100 * tolerance:.0f}%){mfu}; FLOPs counted {'exactly' if counted else r['total_flops']}"
        )

    def peak() -> tuple[bool, str]:
        name = torch.cuda.get_device_name()
        found = lookup_peak(name, "bf16")
        if found is None:
            return False, f"{name!r} is not in the peak table (key {device_key(name)})"
        return True, f"{name!r} -> {found.device} bf16 {found.tflops:g} TFLOP/s"

    c.run("mfu: GEMM TFLOP/s agrees with an independent timing", agree)
    c.run("mfu: device name maps to a peak", peak, gpu=True)


def oom_checks(c: Checks, run: OomRun | None) -> None:
    def oom() -> tuple[bool, str]:
        assert run is not None
        snaps = [p for _, p in artifacts(run.run_dir, "memory_snapshot") if p.name.endswith("_oom.pickle")]
        if not snaps:
            return False, f"no OOM snapshot; the error was {'re-raised' if run.raised else 'not raised'}"
        doc = cli_json("memory", str(snaps[0]))
        ooms = [o for d in doc["devices"] for o in d["ooms"]]
        ok = run.raised is not None and len(ooms) >= 1
        return (
            ok,
            f"{snaps[0].name} ({len(ooms)} oom event(s), asked {gib(ooms[0]['requested']) if ooms else '-'}); re-raised: {run.raised}",
        )

    c.run("memory snapshot: OOM dumps a snapshot and re-raises", oom, gpu=True)


def overhead_checks(c: Checks, o: Overhead, cuda: bool) -> None:
    wait_limit, active_limit = OVERHEAD_LIMITS[cuda]
    med = o.medians()

    def spread(ratios: list[float]) -> str:
        return f"{statistics.median(ratios):.3f}x (rounds {min(ratios):.3f}-{max(ratios):.3f})"

    def wait() -> tuple[bool, str]:
        ratios = o.ratios("monitor, wait phase", "bare")
        return statistics.median(ratios) <= wait_limit, (
            f"batch {o.batch}: bare {med['bare']:.3f} ms; enabled=False {spread(o.ratios('enabled=False', 'bare'))}; "
            f"wait phase {spread(ratios)}; limit {wait_limit}x, {len(ratios)} paired rounds"
        )

    def active() -> tuple[bool, str]:
        ratios = o.ratios("monitor, active window", "raw torch.profiler, active")
        return statistics.median(ratios) <= active_limit, (
            f"batch {o.batch}: raw torch.profiler {med['raw torch.profiler, active']:.3f} ms "
            f"({spread(o.ratios('raw torch.profiler, active', 'bare'))} bare); monitor active {spread(ratios)} "
            f"raw; limit {active_limit}x"
        )

    c.run("overhead: wait phase vs bare step", wait)
    c.run("overhead: active window vs raw torch.profiler", active)


def report_check(c: Checks, run: TrainRun) -> None:
    import re

    def report() -> tuple[bool, str]:
        at_close = run.run_dir / "report.html"
        html = run.run_dir.parent / "gpu_check_report.html"
        done = cli("report", str(run.run_dir), "-o", str(html))
        text = html.read_text() if html.exists() else ""
        sections = dict(re.findall(r'<section id="([a-z-]+)">(.*?)</section>', text, flags=re.S))
        wanted = ("gpu", "ops", "flops", "memory", "system")
        empty = [s for s in wanted if 'class="empty"' in sections.get(s, 'class="empty"')]
        charts = {
            s: sections.get(s, "").count('class="chart"') for s in ("overview", "gpu", "memory", "system")
        }
        ok = done.returncode == 0 and at_close.is_file() and not empty and all(charts.values())
        return ok, (
            f"written at close: {at_close.is_file()}; {html.name} {len(text) / 1e6:.2f} MB, exit "
            f"{done.returncode}; charts per section {charts}; sections without data: {empty or 'none'}"
        )

    c.run("report: renders the GPU sections", report, gpu=True)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# --- the run ----------------------------------------------------------------------------------------
def environment(cuda: bool) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "torch_cuda": torch.version.cuda,
        "stepscope": stepscope.__version__,
        "platform": platform.platform(),
        "mode": "gpu" if cuda else "dry (no CUDA)",
    }
    if cuda:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env.update(
            device=props.name,
            capability=f"{props.major}.{props.minor}",
            memory=gib(props.total_memory),
            multiprocessors=props.multi_processor_count,
            driver=_driver(),
        )
    return env


def _driver() -> str | None:
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    return None


def markdown(rows: list[Check]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| check | result | figure |", "|---|---|---|"]
    lines += [f"| {cell(r.check)} | {cell(r.result)} | {cell(r.figure)} |" for r in rows]
    return "\n".join(lines)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {value})")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("gpu_check_out"), help="Folder for the run folders.")
    parser.add_argument(
        "--json", type=Path, default=None, help="Where the JSON goes (default OUT/gpu_check.json)."
    )
    parser.add_argument("--dry-run", action="store_true", help="The CPU path even where CUDA is available.")
    parser.add_argument(
        "--require-cuda", action="store_true", help="Exit 2 instead of a dry run without CUDA."
    )
    parser.add_argument(
        "--rounds", type=_positive, default=None, help="Overhead rounds (default 6 GPU, 2 dry)."
    )
    parser.add_argument(
        "--steps", type=_positive, default=None, help="Steps per overhead block (default 10 GPU, 8 dry)."
    )
    parser.add_argument(
        "--batch",
        type=_positive,
        default=None,
        help="Batch of the transformer in every phase (default: GPU 16, and 64 for the overhead; dry 4).",
    )
    parser.add_argument("--no-nsys", action="store_true", help="Skip the run under nsys.")
    parser.add_argument(
        "--only", action="append", choices=PHASES, help="Run only these phases (repeatable; default all)."
    )
    parser.add_argument("--nsys-workload", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.nsys_workload:
        nsys_workload(args.out)
        return 0
    if args.dry_run and torch.cuda.is_available():
        # The collectors ask torch.cuda.is_available() themselves: hide the GPU from a fresh process.
        os.execve(
            sys.executable,
            [sys.executable, __file__, *(sys.argv[1:] if argv is None else argv)],
            {**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        )
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        why = "a CPU build of torch" if torch.version.cuda is None else "torch sees no CUDA device"
        if args.require_cuda:
            print(f"gpu_check: --require-cuda: {why} ({torch.__version__})", file=sys.stderr)
            return 2
        print(f"gpu_check: no CUDA here ({why}, {torch.__version__}): dry mode, the GPU checks are skipped")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    s = GPU_SIZES if cuda else CPU_SIZES
    if args.batch:
        s = dataclasses.replace(s, batch=args.batch, overhead_batch=args.batch)
    if not cuda:
        torch.set_num_threads(1)
    env = environment(cuda)
    print(
        f"stepscope gpu-check ({env['mode']}): torch {env['torch']}, {env.get('device', 'CPU')}", flush=True
    )
    json_path = args.json or args.out / "gpu_check.json"
    json_path.unlink(missing_ok=True)  # a JSON of an earlier run must not pass for this one's
    c = Checks(cuda)
    doc: dict[str, Any] = {"schema": SCHEMA, "environment": env, "sizes": asdict(s), "phase_seconds": {}}
    t0 = time.perf_counter()
    try:
        run_phases(c, args, s, device, doc)
    finally:  # also after a workload raised or Ctrl-C: what was checked is kept
        doc["seconds"] = round(time.perf_counter() - t0, 1)
        doc["checks"] = [asdict(r) for r in c.rows]
        atomic_write_text(json_path, json.dumps(doc, indent=2) + "\n")
        print()
        print(markdown(c.rows))
        counts = {k: sum(r.result.split(":")[0] == k for r in c.rows) for k in ("pass", "FAIL", "skipped")}
        print(f"\n{counts['pass']} passed, {counts['FAIL']} failed, {counts['skipped']} skipped in "
              f"{doc['seconds']} s; JSON: {json_path}")  # fmt: skip
    return 1 if c.failed else 0


def _decided(figure: Callable[..., tuple[bool, str]], *args: Any) -> tuple[bool, str]:
    """A figure whose data cannot decide is a skipped check that says why, neither a pass nor a failure."""
    try:
        return figure(*args)
    except Undecided as why:
        raise Skip(str(why)) from None


def run_phases(
    c: Checks, args: argparse.Namespace, s: Sizes, device: torch.device, doc: dict[str, Any]
) -> None:
    """Each phase runs its workload, then its checks; a workload that raises is one FAIL row, and the
    phases after it still run."""
    cuda = device.type == "cuda"
    only = set(args.only or PHASES)

    @contextlib.contextmanager
    def phase(name: str) -> Any:
        print(f"- {name}", flush=True)
        start = time.perf_counter()
        try:
            yield
        except Exception as exc:
            c.rows.append(Check(f"{name}: the workload ran", "FAIL", f"{type(exc).__name__}: {exc}"))
        finally:
            doc["phase_seconds"][name] = round(time.perf_counter() - start, 1)

    train = None
    if "train" in only:
        with phase("train: the transformer with every collector on"):
            train = train_phase(args.out, s, device)
            doc.update(train_run=str(train.run_dir), warnings=train.warnings)
            train_checks(c, train, device)
    if train is not None:
        with phase("nsight: NVTX and cudaProfilerStart/Stop, nsys"):
            nsight_checks(c, train, args.out, nsys=not args.no_nsys)
            report_check(c, train)
    if "gemm" in only:
        with phase("gemm: FLOPs and TFLOP/s against an independent timing"):
            gemm = gemm_phase(args.out, s, device)
            doc["gemm"] = {"run": str(gemm.run_dir), "independent_ms": [1e3 * t for t in gemm.independent_s]}
            gemm_checks(c, gemm, cuda, s)
    if "ops" in only:
        with phase("ops: products of a good and a bad size on the roofline, against a timing"):
            ops_checks(c, ops_phase(args.out, device), cuda)
    if "whatif" in only:
        with phase("whatif: a prediction against the job re-run with the change"):
            whatif = whatif_phase(args.out, s, device, cli_json)
            doc["whatif"] = asdict(whatif)
            c.run(
                "whatif: predicted step against the re-run job", lambda: _decided(whatif_figure, whatif, cuda)
            )
    if "oom" in only:
        with phase("oom: a deliberate out-of-memory step"):
            oom_checks(c, oom_phase(args.out, device) if cuda else None)
    if "overhead" in only:
        with phase("overhead: monitor off, waiting, active vs raw torch.profiler"):
            rounds, steps = args.rounds or (6 if cuda else 2), args.steps or (10 if cuda else 8)
            overhead = overhead_phase(args.out, s, device, rounds, steps, s.overhead_batch)
            doc["overhead_ms_per_step"] = overhead.rounds
            overhead_checks(c, overhead, cuda)
    if "stall" in only:
        with phase("stall: the step that ends a window vs raw torch.profiler's export"):
            stall = stall_phase(args.out, s, device, args.rounds or (4 if cuda else 2), s.overhead_batch)
            doc["window_end_stall"] = stall
            stall_checks(c, stall, cuda)


if __name__ == "__main__":
    sys.exit(main())
