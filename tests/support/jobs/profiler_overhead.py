"""A real CPU job whose profiled steps are much slower than its plain ones (tests/analysis/test_profiler_overhead.py): each
step runs OPS elementwise ops on tiny tensors, each a few microseconds, to which the profiler adds its own cost per
op (more with record_shapes: 1.6-1.8x the plain steps here, against the notice's 1.25x; without it 1.24-1.3x, a
loaded machine's plain steps then came too close).

    python tests/support/jobs/profiler_overhead.py OUT_DIR

PLAIN_BEFORE plain steps (after step 0), a window of warmup 1 and ACTIVE recorded steps, then PLAIN_AFTER plain
steps.
"""

from __future__ import annotations

import sys

OPS = 3000
PLAIN_BEFORE = 7  # steps 1-7 (step 0, the start-up, is not plain)
ACTIVE = 3
PLAIN_AFTER = 4


def run(out: str) -> None:
    import torch

    import stepscope

    torch.manual_seed(0)
    torch.set_num_threads(1)
    tiny = [torch.randn(4) for _ in range(8)]
    model = torch.nn.Linear(4, 4)
    wait = PLAIN_BEFORE + 1
    monitor = stepscope.performance_monitor(
        model, out_dir=out, console=False, wait=wait, warmup=1, active=ACTIVE, repeat=1, record_shapes=True
    )
    with monitor:
        for _ in range(wait + 1 + ACTIVE + PLAIN_AFTER):
            with monitor.region("forward"):
                acc = tiny[0]
                for i in range(OPS):
                    acc = acc * tiny[i % 8] + 0.5
            monitor.step()


if __name__ == "__main__":
    run(sys.argv[1])
