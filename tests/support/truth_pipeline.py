"""Ground truth for the pipeline view: Kineto traces of a GPipe pipeline on NCCL whose bubble per stage is known.

`p` stages (rank s runs stage s, all in one group of `p`), `m` micro-batches a step: every forward, then every
backward, in micro-batch order. A stage's forward of micro-batch i starts once its forward of i - 1 is done and
the activation of i from the stage before has arrived (`transfer_us` after that stage's forward ended), plus
COPY_US to take it in; the backward the same way from the stage after. The step ends when stage 0's last
backward does (the gradients reach it last): every rank's ProfilerStep is that long (and ISSUE_US either side, in
which the host issues the first op), and steps follow one another.

Each compute is a GEMM kernel on stream 7; each receive a SendRecv kernel on stream 20 that runs from the moment
the stage is ready for the message (its previous compute done, or the step's start) until it has taken it in, so
the stage's time outside compute is all receiving: its bubble is the step less its compute (`Pipe.bubble`), what
analyze must recover. A stage's tail after its last compute (it waits for the next step's first message) is a
receive too. Sends are SendRecv kernels on stream 21, `transfer_us` long, from the end of the compute that made
the message. Every kernel is launched by a c10d op whose recorded inputs name the peer as a rank of the group
(`peers=False`: recorded without shapes, as the monitor's defaults record them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .traces import Event, cpu, launched, step, write

COPY_US = 2.0  # a receive's own time once its message has arrived
ISSUE_US = 1.0  # the ops of a step start this long after its ProfilerStep (the host issues the first one)
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_f16f16_f32"


@dataclass
class Pipe:
    """What is put in: per stage its forward and backward time per micro-batch (us)."""

    forward_us: list[float]
    backward_us: list[float]
    micro_batches: int = 4
    transfer_us: float = 20.0
    steps: int = 3
    span_us: float = 0.0  # set by simulate: from the first op of a step to its last
    step_us: float = 0.0  # the ProfilerStep: the span and ISSUE_US either side (the host issues the first op)
    ops: dict[int, list[tuple[str, float, float, int]]] = field(default_factory=dict)  # per step 0, set too

    @property
    def stages(self) -> int:
        return len(self.forward_us)

    def bubble(self, stage: int) -> float:
        """The share of the step the stage spends outside compute: waiting on its neighbours."""
        compute = self.micro_batches * (self.forward_us[stage] + self.backward_us[stage])
        return (self.span_us - compute) / self.step_us


def simulate(pipe: Pipe) -> Pipe:
    """One step's kernels per stage, (kind, start us, duration us, peer stage), and the step's length."""
    p, m, x = pipe.stages, pipe.micro_batches, pipe.transfer_us
    ops: dict[int, list[tuple[str, float, float, int]]] = {s: [] for s in range(p)}
    free = [0.0] * p  # when each stage is done with its previous compute
    fwd_end = [[0.0] * m for _ in range(p)]
    for i in range(m):
        for s in range(p):
            fwd_end[s][i] = _compute(ops[s], free, s, s - 1, fwd_end[s - 1][i] + x if s else None,
                                     pipe.forward_us[s], x, s + 1 if s + 1 < p else None)  # fmt: skip
    bwd_end = [[0.0] * m for _ in range(p)]
    for i in range(m):
        for s in reversed(range(p)):
            arrive = bwd_end[s + 1][i] + x if s + 1 < p else None
            bwd_end[s][i] = _compute(
                ops[s], free, s, s + 1, arrive, pipe.backward_us[s], x, s - 1 if s else None
            )
    pipe.span_us = max(free)
    pipe.step_us = pipe.span_us + 2 * ISSUE_US
    for s in range(p):
        if free[s] < pipe.span_us and s:
            # (the next step's first activation: the stage waits for it from here on)
            ops[s].append(("recv", free[s], pipe.span_us - free[s], s - 1))
    pipe.ops = ops
    return pipe


def _compute(
    ops: list[tuple[str, float, float, int]],
    free: list[float],
    s: int,
    source: int,
    arrive: float | None,
    dur: float,
    x: float,
    target: int | None,
) -> float:
    """A compute of stage s after receiving from `source` (arrival `arrive`, None: nothing to receive), then its
    send to `target`; the compute's end."""
    start = free[s]
    if arrive is not None:
        taken = max(arrive, start) + COPY_US
        ops.append(("recv", start, taken - start, source))
        start = taken
    ops.append(("compute", start, dur, -1))
    end = start + dur
    if target is not None:
        ops.append(("send", end, x, target))
    free[s] = end
    return end


def write_pipe(pipe: Pipe, folder: Path, *, peers: bool = True) -> Pipe:
    """Simulate and write one trace per stage (rank) into `folder`."""
    simulate(pipe)
    p = pipe.stages
    for rank in range(p):
        events: list[Event] = []
        corr = 0
        for k in range(pipe.steps):
            t0 = k * pipe.step_us
            events.append(step(k + 1, t0, pipe.step_us))
            for kind, ts, dur, peer in pipe.ops[rank]:
                corr += 1
                ts += t0 + ISSUE_US
                if kind == "compute":
                    events += launched(GEMM, ts - 1, ts, dur, corr)
                    continue
                args: dict[str, Any] = {"Concrete Inputs": ["", "", str(peer), "0"]} if peers else {}
                name = "c10d::send" if kind == "send" else "c10d::recv_"
                events.append(cpu(name, ts - 0.5, 1.5, **args))
                events += launched(SENDRECV, ts - 0.4, ts, dur, corr, stream=21 if kind == "send" else 20)
        group = {"pg_name": "0", "pg_desc": "default_pg", "pg_size": p, "ranks": list(range(p))}
        info = {"backend": "nccl", "rank": rank, "world_size": p, "pg_count": 1, "pg_config": [group]}
        write(
            folder / f"rank{rank}.json", {"schemaVersion": 1, "traceEvents": events, "distributedInfo": info}
        )
    return pipe
