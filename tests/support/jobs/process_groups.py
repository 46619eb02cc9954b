"""Tiny gloo jobs that create process groups, for the process-group recorder's tests:
`torchrun --standalone --nproc_per_node N tests/support/jobs/process_groups.py OUT_DIR MODE`.

MODE `groups` (2 ranks): the default group and `new_group([0, 1], group_desc="pair")`, an all-reduce on each;
after the window (step 1), a third group `new_group([1, 0], group_desc="late")`, which only the look at close sees.
MODE `mesh` (4 ranks): `init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))`, a 3-layer MLP with
ColwiseParallel / RowwiseParallel on "tp" and FSDP2's `fully_shard` on "dp".
MODE `bare_mesh` (4 ranks): the same mesh made before the monitor, no model; an all-reduce on each dimension.
MODE `no_private` (2 ranks): `groups` without traces (torch's profiler itself reads c10d's registry of group
names), where torch lacks that registry (`_world.pg_names`) while the monitor runs (restored before the job's
own teardown).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch import nn

import stepscope

STEPS = 4


class _WorldWithoutNames:
    """c10d's `_world` without its `pg_names` registry: a torch where that private API is gone."""

    def __init__(self, world: Any) -> None:
        object.__setattr__(self, "_inner", world)

    def __getattr__(self, name: str) -> Any:
        if name == "pg_names":
            raise AttributeError(name)
        return getattr(object.__getattribute__(self, "_inner"), name)


def main() -> None:
    out_dir, mode = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    monitor_options: dict[str, Any] = {
        "out_dir": out_dir,
        "wait": 1,
        "warmup": 0,
        "active": 1,
        "repeat": 1,
        "profiled_ranks": "all",
        "console": False,
        "report": False,
    }
    if mode in ("groups", "no_private"):
        pair = dist.new_group([0, 1], group_desc="pair")
        saved = None
        if mode == "no_private":
            monitor_options["trace"] = False
            saved = _remove_private()
        with stepscope.performance_monitor(**monitor_options) as monitor:
            for step in range(STEPS):
                x = torch.ones(4)
                dist.all_reduce(x)
                dist.all_reduce(x, group=pair)
                if step == 2 and mode == "groups":
                    late = dist.new_group([1, 0], group_desc="late")
                    dist.all_reduce(x, group=late)
                monitor.step()
        if saved is not None:
            _restore(saved)
    elif mode == "bare_mesh":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        with stepscope.performance_monitor(**monitor_options) as monitor:
            for _ in range(STEPS):
                x = torch.ones(4)
                dist.all_reduce(x, group=mesh.get_group("dp"))
                dist.all_reduce(x, group=mesh.get_group("tp"))
                monitor.step()
    elif mode == "mesh":
        train_dp_tp(monitor_options)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    dist.destroy_process_group()


def train_dp_tp(monitor_options: dict[str, Any]) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with stepscope.performance_monitor(model, **monitor_options) as monitor:
        for _ in range(STEPS):
            model(torch.randn(4, 16)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            monitor.step()


def _remove_private() -> Any:
    world = c10d._world
    c10d._world = _WorldWithoutNames(world)  # type: ignore[assignment]
    return world


def _restore(world: Any) -> None:
    c10d._world = world


if __name__ == "__main__":
    main()
