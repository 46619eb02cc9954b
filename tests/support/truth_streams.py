"""Ground truth for the replay: one rank's steps on two streams whose critical path is known, with or without the
records of their stream waits (issue 43, item 5).

Each step the host launches, 3 us apart, `rounds` pairs: a computation kernel on stream 7, then (after an event
recorded on stream 7 and a `cudaStreamWaitEvent` on stream 20) a communication kernel on stream 20 that waits for
it; the next computation kernel waits the same way for that communication kernel. So the GPU runs one chain,
computation and communication in turn, each starting WAIT_US after the one before ended (or LAUNCH_US after its
launch, if later). The host then synchronizes the device and runs `tail_us` of optimizer. Everything is simulated
from the durations, so a change (communication kernels `scale` times as long) has a known step: `Streams.step_us`.
`records=False` leaves out the `cuda_sync` events that name each wait's event, as older Kineto does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .traces import Event, cpu, kernel, launched, runtime, step, write_trace

LAUNCH_US = 5.0  # a kernel's start after its launch, at the earliest
WAIT_US = 2.0  # a kernel's start after the kernel it waits for ends
COMPUTE = "sm90_xmma_gemm_f16f16_f32"
COMM = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@dataclass
class Streams:
    compute_us: list[float]  # per round
    comm_us: list[float]
    steps: int = 3
    tail_us: float = 100.0
    tails_us: list[float] | None = None  # each step's tail (the host's optimizer), where they differ
    wait_us: float = WAIT_US  # a kernel's start after the kernel it waits for ends
    graph: bool = False  # each step's kernels are one CUDA graph, launched at once by one cudaGraphLaunch

    def tail(self, k: int) -> float:
        return self.tails_us[k] if self.tails_us is not None else self.tail_us

    def step_us(self, comm_scale: float = 1.0) -> float:
        """The (mean) step's length with the communication kernels `comm_scale` times as long."""
        _, end = self._kernels(0.0, comm_scale)
        tails = self.tails_us if self.tails_us is not None else [self.tail_us]
        return end + LAUNCH_US + sum(tails) / len(tails)

    def _kernels(
        self, t0: float, comm_scale: float = 1.0
    ) -> tuple[list[tuple[str, float, float, float]], float]:
        """(kind, launch, start, duration) of each kernel of a step starting at t0, and when the last one ends."""
        out, done, launch = [], t0, t0 + 10.0
        for c, m in zip(self.compute_us, self.comm_us, strict=True):
            for kind, dur in (("compute", c), ("comm", m * comm_scale)):
                start = max(launch + LAUNCH_US, done + self.wait_us if out else launch + LAUNCH_US)
                out.append((kind, launch, start, dur))
                done = start + dur
                if not self.graph:  # (a graph's kernels are all launched by its one call)
                    launch += 3.0 * 3  # (the launch, an event record and a stream wait, 3 us each)
        return out, done


OLD_CATEGORIES = {"cpu_op": "Operator", "cuda_runtime": "Runtime", "kernel": "Kernel"}


def write_streams(job: Streams, path: Path, *, records: bool = True, schema: str = "new") -> Streams:
    """One trace of `job.steps` steps; see the module's doc. `schema` "2021": the categories older Kineto wrote
    (Operator, Runtime, Kernel; no cuda_sync events, so no records)."""
    events: list[Event] = []
    corr = 0
    t0 = 0.0
    records = records and schema != "2021"
    for k in range(job.steps):
        kernels, end = job._kernels(t0)
        length = end + LAUNCH_US + job.tail(k) - t0
        events.append(step(k + 1, t0, length))
        if job.graph:
            corr += 1
            events.append(runtime("cudaGraphLaunch", kernels[0][1], 5.0, corr))
            for kind, _, start, dur in kernels:
                stream = 7 if kind == "compute" else 20
                events.append(
                    kernel(COMPUTE if kind == "compute" else COMM, start, dur, stream=stream, corr=corr)
                )
        else:
            corr = _launches(events, kernels, corr, records)
        corr += 1
        sync_at = kernels[-1][1] + 6.0
        events.append(runtime("cudaDeviceSynchronize", sync_at, end + LAUNCH_US - sync_at, corr))
        events.append(cpu("optimizer", end + LAUNCH_US, job.tail(k) - 1, cat="user_annotation"))
        t0 += length
    if schema == "2021":
        for event in events:
            event["cat"] = OLD_CATEGORIES.get(event["cat"], event["cat"])
    write_trace(path, events, 0, world_size=1)
    return job


def _launches(
    events: list[Event], kernels: list[tuple[str, float, float, float]], corr: int, records: bool
) -> int:
    """Each kernel's launch, the event recorded after it and the next kernel's wait for that event."""
    record_corr = None
    for kind, launch, start, dur in kernels:
        stream = 7 if kind == "compute" else 20
        if record_corr is not None:
            corr += 1
            events.append(runtime("cudaStreamWaitEvent", launch - 3.0, 1, corr))
            if records:
                events.append(_wait_event(launch - 3.0, corr, stream, 20 if stream == 7 else 7, record_corr))
        corr += 1
        events += launched(COMPUTE if kind == "compute" else COMM, launch, start, dur, corr, stream=stream)
        corr += 1
        record_corr = corr
        events.append(runtime("cudaEventRecord", launch + 1.5, 1, corr))
    return corr


def _wait_event(ts: float, corr: int, stream: int, on: int, record: int) -> dict[str, Any]:
    """The `cuda_sync` "Stream Wait Event" newer Kineto writes beside a wait, naming the event's record call."""
    return kernel(
        "Stream Wait Event", ts, 1, stream=stream, corr=corr, cat="cuda_sync",
        cuda_sync_kind="Stream Wait Event", wait_on_stream=on, wait_on_cuda_event_record_corr_id=record,
    )  # fmt: skip
