"""What a window costs the steps after it: several gloo DDP ranks on this machine's cores, each timing its own
steps (the user's clock: the training step and `monitor.step()`), with the monitor on (every rank profiled), with
the window-end child as it ran before issue 48 (a process per window and rank, all at once, at niceness 10, BLAS
threads as the machine has: emulated here by replacing the child's command) and with the monitor off, interleaved round by round.

    .venv/bin/python benchmarks/bench_after_window.py [--ranks 3] [--rounds 2] [--windows 3]

For each rank and window: the median of the AFTER steps that follow the window's last step, against the median
of the BEFORE plain steps that precede its warm-up step (no window's work in flight then: they follow the
previous window by more than AFTER steps). The ratio is the slowdown a window's end work (torch's export on the
training thread, then the child that gzips the trace and writes the summary) leaves in the steps after it; the
same steps of the run with the monitor off say what the job's own noise gives. The window-end step itself (the
stall: torch's export) is reported apart. Every window's outputs must be in the manifest when the job ends.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import write_result

AFTER = 10  # steps after a window
BEFORE = 10  # plain steps before its warm-up
WAIT = 40  # a cycle's plain steps: the window before has long finished its work by the BEFORE steps
WARMUP = 1
ACTIVE = 3
WIDTHS = (512, 1024, 1024, 10)
BATCH = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


VARIANTS = ("monitor", "child as before", "monitor off")
# --controls: a child that answers each window at once (what is left is the rank's own part of a window's end),
# and one that first spins 100 ms of CPU at the lowest priority (what CPU time the child uses costs the ranks)
CONTROLS = ("child answering at once", "child spinning 100 ms")
_ANSWER = (
    "    print(json.dumps({'status': 0, 'result': {'json_bytes': 1, 'gz_bytes': 1, 'summary_error': None, "
    "'ops': [], 'kernels': []}}), flush=True)\n"
)
CONTROL_CHILDREN = {
    "child answering at once": "import sys, json\nfor line in sys.stdin:\n" + _ANSWER,
    "child spinning 100 ms": (
        "import sys, json, time\nfor line in sys.stdin:\n    t = time.process_time()\n"
        "    while time.process_time() - t < 0.1: pass\n" + _ANSWER
    ),
}
# the child as it was: a process per window (it answers one job, then exits), niceness 10, no turn to take
BEFORE_CHILD = (
    "import os, sys, msgspec\n"
    "os.nice(10)\n"
    "from stepscope.cli.window_end import Job, Reply, run_job\n"
    "from stepscope.errors import StepscopeError\n"
    "line = sys.stdin.buffer.readline()\n"
    "try:\n"
    "    reply = Reply(0, run_job(msgspec.json.decode(line, type=Job)))\n"
    "except StepscopeError as exc:\n"
    "    reply = Reply(2, error=str(exc))\n"
    "sys.stdout.buffer.write(msgspec.json.encode(reply) + b'\\n')\n"
)


def _rank_main(rank: int, world: int, port: int, steps: int, variant: str, out: str) -> None:
    import itertools

    import torch
    import torch.distributed as dist
    from torch import nn

    import stepscope
    from stepscope.capture.window import child

    if variant in CONTROL_CHILDREN:
        child.CHILD_COMMAND = (sys.executable, "-c", CONTROL_CHILDREN[variant])
    if variant == "child as before":
        child.CHILD_COMMAND = (sys.executable, "-c", BEFORE_CHILD)
        child.CHILD_ENV = {"STEPSCOPE_NO_CACHE": "1"}  # (BLAS threads as the machine has)
        child.lower_priority = lambda pid=0: None
    on = variant != "monitor off"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(WIDTHS)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(WIDTHS) - 2:
            layers.append(nn.ReLU())
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(BATCH, WIDTHS[0])
    monitor = stepscope.performance_monitor(
        model,
        enabled=on,
        out_dir=out,
        wait=WAIT,
        warmup=WARMUP,
        active=ACTIVE,
        repeat=0,
        profiled_ranks="all",
    )
    times: list[float] = []
    with monitor:
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            monitor.step()
            times.append((time.perf_counter() - t0) * 1e3)
    Path(out, f"times_{rank}.json").write_text(json.dumps(times))
    dist.destroy_process_group()


def run_job(world: int, steps: int, variant: str, out: str) -> list[list[float]]:
    import torch.multiprocessing as mp

    port = _free_port()
    # (the ranks' consoles: the per-window tables would flood this one)
    with open(Path(out, "ranks.log"), "ab") as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            mp.start_processes(
                _rank_main,
                args=(world, port, steps, variant, out),
                nprocs=world,
                start_method="spawn",
                join=True,
            )
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    return [json.loads(Path(out, f"times_{r}.json").read_text()) for r in range(world)]


def window_steps(windows: int) -> list[tuple[int, int]]:
    """(warm-up step, last active step) of each window, as the schedule places them (no skip_first)."""
    cycle = WAIT + WARMUP + ACTIVE
    return [(w * cycle + WAIT, w * cycle + WAIT + WARMUP + ACTIVE - 1) for w in range(windows)]


def ratios(times: list[float], windows: list[tuple[int, int]]) -> list[tuple[float, float, float]]:
    """(median before, median after, window-end step) of each window."""
    out = []
    for warm, last in windows:
        before = statistics.median(times[warm - BEFORE : warm])
        after = statistics.median(times[last + 1 : last + 1 + AFTER])
        out.append((before, after, times[last]))
    return out


def outputs(out: str) -> tuple[int, int]:
    """Traces and summaries the manifest indexes (the monitor-on runs of this folder)."""
    traces = summaries = 0
    for manifest in Path(out).glob("*/manifest.json"):
        doc = json.loads(manifest.read_text())
        kinds = [a["kind"] for a in doc.get("artifacts", [])]
        traces += kinds.count("trace")
        summaries += kinds.count("summary")
    return traces, summaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--controls", action="store_true", help=f"also the variants {', '.join(CONTROLS)}")
    args = parser.parse_args()
    variants = VARIANTS + (CONTROLS if args.controls else ())
    windows = window_steps(args.windows)
    steps = windows[-1][1] + 1 + AFTER + 2
    per_variant: dict[str, list[list[tuple[float, float, float]]]] = {v: [] for v in variants}
    produced: dict[str, list[tuple[int, int]]] = {v: [] for v in VARIANTS[:2]}
    for rnd in range(args.rounds):
        order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]  # (each goes first in turn)
        for variant in order:
            with tempfile.TemporaryDirectory(prefix="stepscope-after-") as out:
                all_times = run_job(args.ranks, steps, variant, out)
                per_variant[variant] += [ratios(t, windows) for t in all_times]
                if variant in produced:
                    produced[variant].append(outputs(out))
            print(f"round {rnd + 1}, {variant}: done", file=sys.stderr)
    rows = []
    figures: dict[str, Any] = {"windows": windows, "after": AFTER, "before": BEFORE, "outputs": produced}
    for variant in variants:
        triples = [w for per_rank in per_variant[variant] for w in per_rank]
        r = [after / before for before, after, _ in triples]
        end = [last / before for before, _, last in triples]
        figures[variant] = {
            "after_over_before": [round(x, 4) for x in r],
            "window_end_over_before": [round(x, 4) for x in end],
            "before_ms": [round(b, 3) for b, _, _ in triples],
        }
        rows.append(
            [
                variant,
                f"{statistics.median(b for b, _, _ in triples):.1f} ms",
                f"{statistics.median(r):.2f}x",
                f"{statistics.quantiles(r, n=4)[2]:.2f}x",
                f"{max(r):.2f}x",
                f"{statistics.median(end):.2f}x",
            ]
        )
    by_window = []
    for variant in variants:
        r = figures[variant]["after_over_before"]
        medians = [statistics.median(r[w :: args.windows]) for w in range(args.windows)]
        figures[variant]["by_window"] = [round(m, 4) for m in medians]
        by_window.append(f"{variant}: " + ", ".join(f"{m:.2f}x" for m in medians))
    expected = args.ranks * args.windows
    notes = [
        f"{args.ranks} gloo DDP ranks on {os.cpu_count()} cores, an MLP {'-'.join(map(str, WIDTHS))} at batch "
        f"{BATCH}, {args.windows} windows (warm-up {WARMUP}, active {ACTIVE}) each after {WAIT} plain steps, "
        f"{args.rounds} rounds; ratios per rank and window (median after / median before)",
        "by window (1st, 2nd, ...; median over ranks and rounds): " + "; ".join(by_window),
        "outputs indexed per run (traces, summaries): "
        + "; ".join(
            f"{v}: " + ", ".join(f"{t}/{expected} and {s}/{expected}" for t, s in p)
            for v, p in produced.items()
        ),
    ]
    write_result(
        "bench_after_window",
        "The steps after a window against the plain steps before it",
        ["variant", "plain step (median)", f"{AFTER} steps after / {BEFORE} before (median)", "third quartile",
         "worst", "window-end step / before"],
        rows,
        figures=figures,
        notes=notes,
    )  # fmt: skip
    for row in rows:
        print("  ".join(row))
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
