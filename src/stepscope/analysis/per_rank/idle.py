"""Idle time per GPU stream, split by cause (HTA's idle-time breakdown is the reference).

A stream is idle in the gap before each of its activities (from the end of everything earlier on the stream).
The gap is *host_wait* when the CPU launched the activity only after the stream had gone idle (the GPU waited on
the host), *kernel_wait* when the activity was already queued and the gap is shorter than KERNEL_WAIT_MAX_NS
(launch latency between back-to-back kernels), and *other* otherwise (e.g. waiting on an event of another stream).
"""

from __future__ import annotations

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.codes import unique_inverse
from stepscope.analysis.per_rank.kernels import MISSING_TS, GpuEvents
from stepscope.analysis.per_rank.steps import ns_to_us
from stepscope.analysis.per_rank.summary import thread_order

# Gaps shorter than this between an already-queued activity and the previous one are launch overhead. HTA's
# default is 30 in trace units (its docstring says ns, but HTA compares against microsecond timestamps).
KERNEL_WAIT_MAX_NS = 30_000


class StreamIdle(msgspec.Struct):
    """Busy and idle time of one GPU stream (between its first and last activity in the window)."""

    device: int
    stream: int
    events: int
    busy_us: float
    idle_us: float
    host_wait_us: float
    kernel_wait_us: float
    other_us: float


def idle_by_stream(gpu: GpuEvents) -> list[StreamIdle]:
    """One row per (device, stream), streams in order of their busy time (largest first)."""
    if len(gpu) == 0:
        return []
    # (device, stream) as one code, ordered as the pairs are
    devices, device_code = unique_inverse(gpu.device)
    streams, stream_code = unique_inverse(gpu.stream)
    uniq, inverse = unique_inverse(device_code * len(streams) + stream_code)
    del devices, device_code, streams, stream_code
    order = thread_order([inverse], gpu.start, gpu.start)  # grouped by stream, by start inside a stream
    bounds = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
    rows = []
    for k in range(len(uniq)):
        sel = order[bounds[k] : bounds[k + 1]]
        device, stream = int(gpu.device[sel[0]]), int(gpu.stream[sel[0]])
        rows.append(_one_stream(device, stream, gpu.start[sel], gpu.end[sel], gpu.launch[sel]))
    rows.sort(key=lambda r: (-r.busy_us, r.device, r.stream))
    return rows


def _one_stream(
    device: int, stream: int, start: np.ndarray, end: np.ndarray, launch: np.ndarray
) -> StreamIdle:
    """Idle split of one stream; the activities come sorted by start."""
    reach = np.maximum.accumulate(end)  # the stream is busy until everything earlier on it has finished
    prev_end = reach[:-1]
    gap = np.maximum(start[1:] - prev_end, 0)
    nxt_launch = launch[1:]
    host = (nxt_launch != MISSING_TS) & (nxt_launch > prev_end)
    kernel = ~host & (gap < KERNEL_WAIT_MAX_NS)
    other = ~host & ~kernel
    busy = iv.length(iv.merge(start, end))
    return StreamIdle(
        device=device,
        stream=stream,
        events=len(start),
        busy_us=ns_to_us(busy),
        idle_us=ns_to_us(int(gap.sum())),
        host_wait_us=ns_to_us(int(gap[host].sum())),
        kernel_wait_us=ns_to_us(int(gap[kernel].sum())),
        other_us=ns_to_us(int(gap[other].sum())),
    )
