"""Write a comm-heavy Kineto trace with a known layout, for the benchmarks that check every analysis stays linear in
events and collectives (nothing it writes is committed).

A data-parallel step as torch.profiler records it on one NCCL rank: forward then backward compute ops on the main
thread (`aten::mm` -> `cudaLaunchKernel` -> a GEMM kernel on stream 7), and in the backward, every
--compute-per-collective ops, one gradient all-reduce (`c10d::allreduce_` around `record_param_comms` and
`nccl:all_reduce`, its `cudaLaunchKernel` and an `ncclDevKernel_AllReduce` on stream 20, which starts once both
its launch and the stream's previous collective are done). --functional makes every Nth collective a functional
one (`_c10d_functional::all_reduce`, as DTensor issues them). 5 events per collective, 3 per compute op:

    .venv/bin/python benchmarks/make_comm_trace.py --collectives 100000 --out /tmp/comm/1e5.json
    .venv/bin/python benchmarks/make_comm_trace.py --collectives 20000 --ranks 8 --out /tmp/comm/ranks8

--ranks N writes one gzipped file per rank (rank0.json.gz, ...): the same steps, each rank's clock offset, and rank
--slow-rank (default N // 2) whose compute runs --slow-pct longer; the others' NCCL kernels start when they are
launched and end together with the slow rank's (they wait). Deterministic for a given --seed.
"""

from __future__ import annotations

import argparse
import gzip
import random
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

PID, MAIN, COMPUTE, COMM = 4242, 4243, 7, 20
_ENC = msgspec.json.Encoder()


def rank_events(args: argparse.Namespace, rank: int, slow: int | None) -> tuple[list[dict[str, Any]], int]:
    """(events, collectives) of one rank."""
    rng = random.Random(args.seed * 7919 + 13)  # the same program on every rank
    jitter = random.Random(args.seed * 104_729 + rank)
    per_step = max(args.collectives // args.steps, 1)
    slower = 1.0 + (args.slow_pct / 100.0 if rank == slow else 0.0)
    ev: list[dict[str, Any]] = []
    corr = ext = 0
    t = 1_000_000.0 + (rank * 37.0 if slow is not None else 0.0)  # host clock, µs
    gpu_free = {COMPUTE: t, COMM: t}
    collectives = 0

    def host(name: str, ts: float, dur: float, cat: str = "cpu_op", **a: Any) -> dict[str, Any]:
        nonlocal ext
        ext += 1
        return {
            "ph": "X", "cat": cat, "name": name, "pid": PID, "tid": MAIN, "ts": round(ts, 3),
            "dur": round(dur, 3), "args": {"External id": ext, **a},
        }  # fmt: skip

    def launch(name: str, ts: float, stream: int, dur: float, wait_until: float = 0.0) -> tuple[float, float]:
        nonlocal corr
        corr += 1
        ev.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": MAIN,
             "ts": round(ts, 3), "dur": 4.0, "args": {"correlation": corr, "External id": ext}}
        )  # fmt: skip
        start = max(ts + 6.0, gpu_free[stream])
        end = max(start + dur, wait_until)
        gpu_free[stream] = end
        ev.append(
            {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": round(start, 3),
             "dur": round(end - start, 3),
             "args": {"device": 0, "stream": stream, "correlation": corr, "External id": ext,
                      "grid": [128, 1, 1], "block": [256, 1, 1]}}
        )  # fmt: skip
        return start, end

    gemms = [
        f"sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize{s}x128x32_stage3_warpsize2x2x1" for s in (64, 128)
    ]
    for step in range(args.steps):
        step_start = t
        step_row = len(ev)
        ev.append({})  # the ProfilerStep, filled in at the step's end
        for phase, ops in (("forward", per_step * args.compute_per_collective // 2), ("backward", per_step)):
            for i in range(ops):
                n_compute = 1 if phase == "forward" else args.compute_per_collective
                for _ in range(n_compute):
                    dur = rng.uniform(8.0, 40.0)
                    ev.append(host("aten::mm", t, 12.0, **{"Sequence number": ext}))
                    launch(gemms[i % 2], t + 5.0, COMPUTE, dur * slower * jitter.uniform(0.98, 1.02))
                    t += 14.0 + rng.uniform(0.0, 4.0)
                if phase == "backward":
                    functional = args.functional and collectives % args.functional == 0
                    n = rng.choice((262_144, 1_048_576, 4_194_304))
                    op = host("_c10d_functional::all_reduce" if functional else "c10d::allreduce_", t, 40.0)
                    params = host(
                        "record_param_comms", t + 2.0, 30.0,
                        **{"Collective name": "allreduce", "dtype": "Float", "In msg nelems": n,
                           "Out msg nelems": n, "Group size": args.world, "Process Group Name": "0",
                           "Process Group Description": "default_pg",
                           "Process Group Ranks": str(list(range(args.world)))},
                    )  # fmt: skip
                    annot = host("nccl:all_reduce", t + 4.0, 20.0, cat="user_annotation")
                    ev.extend((op, params, annot))
                    transfer = n * 4 / 50e3  # µs at 50 GB/s
                    # the slow rank's own kernel ends `transfer` after it starts; the others' end when the slow
                    # rank's would (an estimate: its compute, hence its launches, run later by its extra share)
                    lag = (
                        (t - step_start) * (args.slow_pct / 100.0)
                        if slow is not None and rank != slow
                        else 0.0
                    )
                    launch(
                        f"ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)_{i % 3}",
                        t + 8.0, COMM, transfer, wait_until=t + 14.0 + lag + transfer,
                    )  # fmt: skip
                    collectives += 1
                    t += 44.0
        ev.append(host("Optimizer.step#SGD.step", t, 50.0, cat="user_annotation"))
        t = max(t + 60.0, gpu_free[COMPUTE], gpu_free[COMM]) + 20.0
        ev[step_row] = {
            "ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": PID, "tid": MAIN,
            "ts": round(step_start, 3), "dur": round(t - step_start - 1.0, 3), "args": {"External id": 0},
        }  # fmt: skip
    return ev, collectives


def header(rank: int, world: int) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_100_000_000,
                              "computeMajor": 8, "computeMinor": 0, "numSms": 108}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world,
                            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                           "pg_size": world, "ranks": list(range(world))}]},
    }  # fmt: skip


def write(path: Path, rank: int, world: int, events: list[dict[str, Any]]) -> int:
    head = _ENC.encode(header(rank, world))[:-1]
    meta = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": MAIN, "args": {"name": "thread 1 (python)"}},
    ]
    body = b",\n".join(_ENC.encode(e) for e in meta + events)
    data = head + b',"traceEvents":[\n' + body + b"\n]}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if path.name.endswith(".gz"):
        tmp.write_bytes(gzip.compress(data, compresslevel=1))
    else:
        tmp.write_bytes(data)
    tmp.replace(path)
    return len(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--collectives", type=int, default=20_000, help="all-reduces in all (per rank)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--compute-per-collective", type=int, default=2, help="backward compute ops between two collectives"
    )
    parser.add_argument(
        "--functional", type=int, default=0, help="every Nth collective a functional one (0: none)"
    )
    parser.add_argument(
        "--ranks", type=int, default=0, help="write this many rank files into --out (a folder)"
    )
    parser.add_argument("--slow-rank", type=int, default=None)
    parser.add_argument("--slow-pct", type=float, default=10.0, help="how much longer the slow rank computes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.ranks:
        args.world = args.ranks
        slow = args.ranks // 2 if args.slow_rank is None else args.slow_rank
        total = events = 0
        for rank in range(args.ranks):
            ev, coll = rank_events(args, rank, slow)
            total += write(args.out / f"rank{rank}.json.gz", rank, args.ranks, ev)
            events += len(ev)
        print(f"{args.out}: {args.ranks} ranks, {coll:,} collectives and {events // args.ranks:,} events each, "
              f"{total / 1e6:,.1f} MB of JSON, {time.perf_counter() - started:.1f} s")  # fmt: skip
    else:
        args.world = 8
        ev, coll = rank_events(args, 0, None)
        size = write(args.out, 0, 8, ev)
        print(f"{args.out}: {coll:,} collectives, {len(ev):,} events, {size / 1e6:,.1f} MB of JSON, "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
