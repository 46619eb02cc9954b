"""Synthetic traces whose every figure is known, shared by several test modules: two GPU steps worked out by
hand (`two_step_trace`), a rank with a data loader of a given length (`rank_trace`), events of every kind the
loader reads (`RICH_EVENTS`), one GPU step with a synchronize (`gpu_step`), and the reference self times of a
stack walk (`self_times_by_stack`)."""

from __future__ import annotations

from pathlib import Path

from .traces import cpu, kernel, launched, runtime, step, write_trace

T0 = 1_700_000_000_000  # us, a realistic trace clock


NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


PAGEABLE = "Memcpy HtoD (Pageable -> Device)"


def two_step_trace() -> list[dict]:
    """Two 1000 us steps. Stream 7: A[100,300) B[300,400) memcpy[600,650) C[660,700) D[800,900) | E[1100,1300).
    Stream 20 (NCCL): [250,450) | [1200,1400). Launch times pick the idle cause of each gap on stream 7:
    memcpy launched at 500 > 400 (host wait 200), C queued at 550 < 650 with a 10 us gap (kernel wait), D queued
    at 560 < 700 with a 100 us gap (other), E launched at 1010 > 900 (host wait 200)."""
    t = T0
    ev = [step(1, t + 0, 1000), step(2, t + 1000, 1000)]
    ev += launched("gemm_A", t + 10, t + 100, 200, 1)
    ev += launched("elementwise_B", t + 20, t + 300, 100, 2)
    ev += launched(NCCL, t + 30, t + 250, 200, 3, stream=20)
    ev += launched(PAGEABLE, t + 500, t + 600, 50, 4, cat="gpu_memcpy", bytes=4096)
    ev += launched("gemm_C", t + 550, t + 660, 40, 5)
    ev += launched("gemm_D", t + 560, t + 800, 100, 6)
    ev += launched("gemm_A", t + 1010, t + 1100, 200, 7)
    ev += launched(NCCL, t + 1020, t + 1200, 200, 8, stream=20)
    # CPU regions of step 1 (nested forward annotations count once); a with_stack frame that must be ignored
    ev += [
        cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t + 0, 5, cat="user_annotation"),
        cpu("## forward ##", t + 5, 195, cat="user_annotation"),
        cpu("## forward:embed ##", t + 10, 40, cat="user_annotation"),
        cpu("## backward ##", t + 200, 400, cat="user_annotation"),
        cpu("Optimizer.step#SGD.step", t + 600, 100, cat="user_annotation"),
        cpu("train.py(12): forward", t + 0, 900, cat="python_function"),
        cpu("aten::_flash_attention_forward", t + 5, 50),
    ]
    return ev


LOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def rank_trace(loader_us: float, *, shift_us: float = 0.0, steps: int = 3) -> list[dict]:
    """One rank of a data-parallel job, 10 ms steps: the DataLoader for `loader_us`, a 1 ms GEMM, then an
    all-reduce that ends 9.5 ms into the step on every rank (the rank that loads longest arrives last).
    `shift_us` moves the rank's whole clock."""
    ev: list[dict] = []
    for i in range(steps):
        t = T0 + 10_000 * i + shift_us
        ev.append(step(i + 1, t, 10_000))
        ev.append(cpu(LOADER, t, loader_us, cat="user_annotation"))
        ev += launched("gemm", t + loader_us, t + loader_us + 5, 1000, 2 * i + 1)
        arrive = t + loader_us + 1150
        kernel = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
        ev += launched(kernel, arrive - 5, arrive, t + 9500 - arrive, 2 * i + 2, stream=20)
    return ev


RICH_EVENTS = [
    {"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "args": {"name": "python"}},
    {"ph": "M", "name": "thread_name", "pid": 100, "tid": 101, "args": {"name": "main"}},
    step(1, 1000.5, 500.25),
    cpu("aten::mm", 1001, 10.001, **{"External id": 7}),
    cpu("cudaLaunchKernel", 1002, 3, cat="cuda_runtime", correlation=55, **{"External id": 7}),
    kernel("sgemm", 1010.123, 4.5, corr=55, **{"External id": 7}),
    kernel("Memcpy HtoD (Pageable -> Device)", 1020, 2, cat="gpu_memcpy", bytes=4096, corr=56),
    {"ph": "s", "id": 55, "pid": 100, "tid": 101, "ts": 1002, "cat": "ac2g", "name": "ac2g"},
    {"ph": "f", "id": 55, "pid": 0, "tid": 7, "ts": 1010.123, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    {"ph": "i", "s": "t", "name": "[memory]", "pid": 100, "tid": 101, "ts": 1003, "args": {"Bytes": 512}},
    cpu(
        "record_param_comms",
        1030,
        5,
        **{
            "Collective name": "allreduce",
            "dtype": "Float",
            "Process Group Name": "0",
            "In msg nelems": 1024,
            "Out msg nelems": 1024,
            "Group size": 2,
        },
    ),
    {"ph": "X", "name": "no category", "pid": 100, "tid": 101, "ts": 1040},
    {"ph": "C", "name": "counter", "pid": 100, "ts": 1050, "args": {"value": 3}},
    {"ph": "XX", "name": "bad phase is skipped", "ts": 1},
]


def gpu_step(tmp_path: Path, *, sync: bool = True) -> Path:
    """One step (1000 us): forward launches A (600 us) then B (200 us); a device synchronize waits for them
    (it returns 10 us after B ends); then the optimizer's 150 us of host work."""
    events = [
        step(1, 0, 1000),
        cpu("forward", 0, 100, cat="user_annotation"),
        *launched("gemm_A", 10, 20, 600, corr=1),
        *launched("gemm_B", 20, 620, 200, corr=2),
        cpu("optimizer", 840, 150, cat="user_annotation"),
    ]
    if sync:
        events.append(runtime("cudaDeviceSynchronize", 110, 720, corr=3))
    return write_trace(tmp_path / "gpu.json", events)


def self_times_by_stack(events: list[dict]) -> list[int]:
    """Self time in ns per event by the definition: on each thread, events in order of start (longest first,
    then as given), a stack of the open ones; an event's parent is the top of the stack once the events that
    ended by its start are popped; a child takes from its parent the part of it before the parent's end."""
    spans = [(round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in events]
    order = sorted(range(len(events)), key=lambda i: (events[i]["tid"], spans[i][0], -spans[i][1], i))
    children = [0] * len(events)
    stack: list[int] = []
    thread = None
    for i in order:
        if events[i]["tid"] != thread:
            thread, stack = events[i]["tid"], []
        while stack and spans[stack[-1]][1] <= spans[i][0]:
            stack.pop()
        if stack:
            parent = stack[-1]
            children[parent] += min(spans[i][1], spans[parent][1]) - spans[i][0]
        stack.append(i)
    return [max(end - start - children[i], 0) for i, (start, end) in enumerate(spans)]


def nesting_only(events: list[dict]) -> list[dict]:
    """The events but those crossing an earlier event of their thread: what is left nests."""
    kept: list[dict] = []
    for e in events:
        s, t = e["ts"], e["ts"] + e["dur"]
        if all(
            t <= k["ts"]
            or s >= k["ts"] + k["dur"]
            or (k["ts"] <= s and t <= k["ts"] + k["dur"])
            or (s <= k["ts"] and k["ts"] + k["dur"] <= t)
            for k in kept
            if k["tid"] == e["tid"]
        ):
            kept.append(e)
    return kept
