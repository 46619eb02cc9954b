"""Does the system sampler slow training steps? Step time of an MLP with and without the sampler thread.

Blocks of steps with the sampler off and on (at each interval) are interleaved over several rounds in one
process, so that drift of a shared machine affects all variants alike; the result is the ratio of median
step times (on / off).

    .venv/bin/python benchmarks/bench_system_sampler.py            # ~30 s
    .venv/bin/python benchmarks/bench_system_sampler.py --rounds 6 --steps 20 --intervals 0.1
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from _results import write_result
from stepscope.capture.collectors.system import SystemSampler


def make_step(width: int, depth: int, batch: int):  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, width)

    def step() -> None:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def time_block(step, steps: int) -> list[float]:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="steps per block")
    parser.add_argument(
        "--rounds", type=int, default=24, help="rounds of (off, on at each interval), shuffled"
    )
    parser.add_argument("--intervals", type=float, nargs="+", default=[1.0, 0.1, 0.01], help="seconds")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    step = make_step(512, 4, 64)
    time_block(step, 20)  # warm up allocator and kernels
    variants = ["off", *(f"{i:g} s" for i in args.intervals)]
    results: dict[str, list[float]] = {v: [] for v in variants}
    off_halves: tuple[list[float], list[float]] = ([], [])
    rng = random.Random(0)
    samples: dict[str, int] = {v: 0 for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        order = list(zip(variants, [None, *args.intervals], strict=True))
        for r in range(args.rounds):
            rng.shuffle(order)  # no variant always runs first in a round
            for variant, interval in order:
                sampler = None
                if interval is not None:
                    sampler = SystemSampler(Path(tmp) / f"{r}_{interval}.csv", interval)
                    sampler.start()
                block = time_block(step, args.steps)
                results[variant] += block
                if variant == "off":
                    off_halves[r % 2].extend(block)
                if sampler is not None:
                    sampler.stop()
                    samples[variant] += sampler.samples
        # Cost of one sample on the sampler thread (what it can take from training, at most, per interval).
        probe = SystemSampler(Path(tmp) / "probe.csv", 1000.0)
        probe.start()
        t0 = time.perf_counter()
        for _ in range(200):
            probe._sample()
        per_sample = (time.perf_counter() - t0) / 200
        probe.stop()
    base = statistics.median(results["off"])
    print(
        f"MLP 512x4, batch 64, {args.threads} thread(s); {args.rounds} rounds x {args.steps} steps per variant"
    )
    print(f"{'sampler':>10} {'median ms':>10} {'ratio':>7} {'samples':>8}")
    rows = []
    for variant in variants:
        median = statistics.median(results[variant])
        print(f"{variant:>10} {median * 1e3:10.3f} {median / base:7.3f} {samples[variant]:8d}")
        rows.append((variant, f"{median * 1e3:.3f}", f"{median / base:.3f}", samples[variant]))
    noise = statistics.median(off_halves[0]) / statistics.median(off_halves[1])
    notes = [
        f"MLP 512x4, batch 64, {args.threads} thread(s); {args.rounds} rounds x {args.steps} steps per variant.",
        f"Noise: 'off' in even vs odd rounds {noise:.3f} (ratios closer to 1 than this are not resolved).",
        f"One sample: {per_sample * 1e6:.0f} us on the sampler thread "
        f"(NVML: {bool(probe.nvml and not probe.nvml.problem)}).",
    ]
    print("\n".join(notes[1:]))
    columns = ("sampler interval", "median ms/step", "ratio to off", "samples")
    write_result("bench_system_sampler", "The system sampler's cost per step", columns, rows, notes=notes)


if __name__ == "__main__":
    main()
