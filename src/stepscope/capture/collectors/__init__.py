"""The collectors a recording rank runs beside the trace: FLOPs and MFU (`flops`, with `flop_split`, `mfu`;
the peak table is `stepscope.devices`), collectives (`comm`), py-spy's Python samples (`pysampling`), tracemalloc's host memory (`hostmem`), a DeepSpeed engine (`deepspeed`: its configuration and comms logger;
`ds_flops`: its flops profiler), the job's process groups and device meshes (`process_groups`), memory (`memory`: periodic log, timelines, CUDA history and snapshots), the
system sampler (`system`), Nsight ranges (`nsight`) and the sinks beyond metrics.jsonl (`sinks`: TensorBoard,
Weights & Biases). `_instrument` holds what the collectors that instrument one step share.

`collector_classes(config)` names those a config asks for; each module is imported only then, so a monitor
pays only for the collectors it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

if TYPE_CHECKING:
    from stepscope.capture.collector import Collector
    from stepscope.capture.collectors.comm import CommCollector
    from stepscope.capture.collectors.deepspeed import DeepSpeedCollector
    from stepscope.capture.collectors.ds_flops import DeepSpeedFlopsCollector
    from stepscope.capture.collectors.flops import FlopCollector
    from stepscope.capture.collectors.hostmem import HostMemoryCollector
    from stepscope.capture.collectors.memory import (
        MemoryLogCollector,
        MemorySnapshotCollector,
        MemoryTimelineCollector,
    )
    from stepscope.capture.collectors.nsight import NsightCollector, nvtx_region
    from stepscope.capture.collectors.process_groups import ProcessGroupCollector
    from stepscope.capture.collectors.pysampling import PythonSamplingCollector
    from stepscope.capture.collectors.sinks import SinkCollector
    from stepscope.capture.collectors.system import SystemCollector
    from stepscope.capture.config import ProfileConfig

_EXPORTS = {
    "CommCollector": "comm",
    "DeepSpeedCollector": "deepspeed",
    "DeepSpeedFlopsCollector": "ds_flops",
    "FlopCollector": "flops",
    "HostMemoryCollector": "hostmem",
    "MemoryLogCollector": "memory",
    "MemorySnapshotCollector": "memory",
    "MemoryTimelineCollector": "memory",
    "NsightCollector": "nsight",
    "ProcessGroupCollector": "process_groups",
    "PythonSamplingCollector": "pysampling",
    "SinkCollector": "sinks",
    "SystemCollector": "system",
    "nvtx_region": "nsight",
}

__all__ = [
    "CommCollector",
    "DeepSpeedCollector",
    "DeepSpeedFlopsCollector",
    "FlopCollector",
    "HostMemoryCollector",
    "MemoryLogCollector",
    "MemorySnapshotCollector",
    "MemoryTimelineCollector",
    "NsightCollector",
    "ProcessGroupCollector",
    "PythonSamplingCollector",
    "SinkCollector",
    "SystemCollector",
    "collector_classes",
    "nvtx_region",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)


def collector_classes(config: ProfileConfig, deepspeed: bool = False) -> list[type[Collector]]:
    """The collectors a recording rank runs for `config` besides the trace collector (which the monitor drives
    itself: first before a step, last after it, so that what the others do falls inside the step's span).
    Their order does not matter: each returns its own fields of the step's metrics line. With a DeepSpeed engine
    (`deepspeed`), DeepSpeed's flops profiler counts the FLOPs and the engine's collector records its
    configuration and its comms logger over each window."""
    wanted = [
        (config.memory_log_every, "MemoryLogCollector"),
        (config.memory_timeline, "MemoryTimelineCollector"),
        (config.memory_snapshot, "MemorySnapshotCollector"),
        (config.system_sample_interval, "SystemCollector"),
        (config.nsight, "NsightCollector"),
        (config.flop_counter_step is not None and not deepspeed, "FlopCollector"),
        (config.flop_counter_step is not None and deepspeed, "DeepSpeedFlopsCollector"),
        (deepspeed, "DeepSpeedCollector"),
        (config.comm_logger_step is not None, "CommCollector"),
        (config.tensorboard or config.wandb, "SinkCollector"),
        (config.process_groups, "ProcessGroupCollector"),
        (config.python_sampling, "PythonSamplingCollector"),
        (config.host_memory, "HostMemoryCollector"),
    ]
    return [__getattr__(name) for on, name in wanted if on]
