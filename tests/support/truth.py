"""Ground truth: Kineto traces of multi-rank NCCL jobs whose answer is known, for property tests that the analyses
recover what was put in.

A job of N ranks on one shared clock (each rank's trace then shifted by its own clock offset, as on separate hosts)
runs `steps` ProfilerSteps of `collectives` rounds. In a round, each rank's host runs `aten::mm` and launches a GEMM
(stream 7, `compute_us`), waits for it, then spends its host time in `aten::nonzero` (a few us, plus its
jitter, plus the lateness injected on a straggler), then issues an all-reduce as torch does (`c10d::allreduce_` around
`record_param_comms` with the process group's args and `nccl:all_reduce`, a `cudaLaunchKernel`) whose NCCL
kernel on stream 20 starts when the rank arrives, carries the args real kernels carry, and ends `transfer_us`
after the last rank arrived, on every rank. The next round starts once it ended. So every rank's wait at every
collective is known exactly: the last rank's arrival less its own; the rest of the kernel is transfer.

Lateness: `late` maps a straggler to (extra host us, chance per round); `jitter_us` is every rank's exponential
jitter (the same law on every rank: no rank is slower); `burst` is the chance per round that a rank drawn at random
is held up `burst_us` for the next `burst_rounds` rounds (a preempted process: noise that persists, the same law
on every rank). Traces are written with benchmarks/make_comm_trace.py's writer (its header: an A100, distributedInfo with the process group).
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from make_comm_trace import COMM, COMPUTE, MAIN, PID
from make_comm_trace import write as write_rank

T0 = 1_000_000.0  # us
ELEMENTS = 1 << 20  # floats per all-reduce
KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@dataclass
class Job:
    """What is put in (the module doc)."""

    ranks: int = 4
    steps: int = 8
    collectives: int = 6  # rounds per step
    compute_us: float = 2000.0
    transfer_us: float = 100.0
    jitter_us: float = 50.0
    late: dict[int, tuple[float, float]] = field(default_factory=dict)  # rank -> (extra us, chance per round)
    burst: float = 0.0
    burst_us: float = 5000.0
    burst_rounds: int = 3
    seed: int = 0


@dataclass
class Truth:
    """What the analyses must find: per round (step-major) and rank, the arrival on the shared clock (us)."""

    job: Job
    arrival: np.ndarray  # rounds x ranks
    step_us: np.ndarray  # per step, the same on every rank (us)

    @property
    def wait_us(self) -> np.ndarray:
        """rounds x ranks: each rank's wait for the last to arrive."""
        return self.arrival.max(axis=1, keepdims=True) - self.arrival

    def wait_per_step_us(self) -> np.ndarray:
        """Per rank, its waiting per step (mean over the steps)."""
        return self.wait_us.sum(axis=0) / self.job.steps

    def delay_share(self) -> dict[int, float]:
        """Per rank waited for, its share of the others' waiting (0..1): at each round the last rank is charged the
        other ranks' mean wait."""
        last = self.arrival.argmax(axis=1)
        charged = self.wait_us.sum(axis=1) / (self.job.ranks - 1)
        total = charged.sum()
        return {int(r): float(charged[last == r].sum() / total) for r in np.unique(last)}


def simulate(job: Job) -> tuple[Truth, dict[int, list[dict[str, Any]]], dict[int, float]]:
    """The truth, each rank's events (on its own clock) and each rank's clock offset (us)."""
    rng = random.Random(job.seed)
    n, rounds = job.ranks, job.steps * job.collectives
    offset = {r: (0.0 if r == 0 else rng.uniform(-5e6, 5e6)) for r in range(n)}
    events: dict[int, list[dict[str, Any]]] = {r: [] for r in range(n)}
    arrival = np.zeros((rounds, n))
    held = np.zeros(n, dtype=np.int64)  # rounds left of a burst, per rank
    corr = dict.fromkeys(range(n), 0)
    t = T0
    step_us = []
    for step in range(job.steps):
        step_start = t
        rows = {r: len(events[r]) for r in range(n)}
        for r in range(n):
            events[r].append({})  # the ProfilerStep, filled in at the step's end
        for c in range(job.collectives):
            i = step * job.collectives + c
            if job.burst and rng.random() < job.burst:
                held[rng.randrange(n)] = job.burst_rounds
            host = [5.0 + rng.expovariate(1.0 / job.jitter_us) for _ in range(n)]
            for r, (extra, chance) in job.late.items():
                host[r] += extra if rng.random() < chance else 0.0
            for r in np.flatnonzero(held).tolist():
                host[r] += job.burst_us
            held = np.maximum(held - 1, 0)
            for r in range(n):
                arrival[i, r] = t + 10.0 + job.compute_us + host[r] + 16.0
            end = float(arrival[i].max()) + job.transfer_us
            for r in range(n):
                corr[r] += 2
                events[r] += _round(r, t, host[r], float(arrival[i, r]), end, job, corr[r], offset[r])
            t = end + 5.0
        t += 60.0
        step_us.append(t - step_start)
        for r in range(n):
            events[r][rows[r]] = _host(f"ProfilerStep#{step}", step_start, t - step_start - 1.0, offset[r])
            events[r][rows[r]]["cat"] = "user_annotation"
    return Truth(job, arrival, np.array(step_us)), events, offset


def write_job(job: Job, folder: Path) -> Truth:
    """Simulate `job` and write one trace per rank (rank{R}.json.gz) into `folder`."""
    truth, events, _ = simulate(job)
    for rank, ev in events.items():
        write_rank(folder / f"rank{rank}.json.gz", rank, job.ranks, ev)
    return truth


def _host(
    name: str, ts: float, dur: float, offset: float, cat: str = "cpu_op", **args: Any
) -> dict[str, Any]:
    return {
        "ph": "X", "cat": cat, "name": name, "pid": PID, "tid": MAIN, "ts": round(ts + offset, 3),
        "dur": round(dur, 3), "args": args,
    }  # fmt: skip


def _round(
    rank: int, t: float, host: float, arrive: float, end: float, job: Job, corr: int, offset: float
) -> list[dict[str, Any]]:
    """One rank's events of one round (the module doc)."""
    group = {
        "Process Group Name": "0", "Process Group Description": "default_pg",
        "Process Group Ranks": str(list(range(job.ranks))), "Group size": job.ranks,
    }  # fmt: skip
    message = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": ELEMENTS,
               "Out msg nelems": ELEMENTS, **group}  # fmt: skip
    issue = arrive - 14.0
    gemm_end = t + 10.0 + job.compute_us
    gemm = {
        "device": 0,
        "stream": COMPUTE,
        "correlation": corr - 1,
        "grid": [128, 1, 1],
        "block": [256, 1, 1],
    }
    nccl = {
        "device": 0,
        "stream": COMM,
        "correlation": corr,
        "grid": [8, 1, 1],
        "block": [512, 1, 1],
        **message,
    }
    return [
        _host("aten::mm", t, 9.0, offset),
        {**_host("cudaLaunchKernel", t + 5.0, 3.0, offset, "cuda_runtime"), "args": {"correlation": corr - 1}},
        {**_host("ampere_sgemm_128x64_tn", t + 10.0, job.compute_us, offset, "kernel"), "pid": 0,
         "tid": COMPUTE, "args": gemm},
        _host("aten::nonzero", gemm_end, host, offset),
        _host("c10d::allreduce_", issue, 12.0, offset),
        _host("record_param_comms", issue + 1.0, 10.0, offset, **message),
        _host("nccl:all_reduce", issue + 2.0, 8.0, offset, "user_annotation"),
        {**_host("cudaLaunchKernel", issue + 4.0, 4.0, offset, "cuda_runtime"), "args": {"correlation": corr}},
        {**_host(KERNEL, arrive, end - arrive, offset, "kernel"), "pid": 0, "tid": COMM, "args": nccl},
    ]  # fmt: skip
