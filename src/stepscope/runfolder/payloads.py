"""The typed payloads of the artifacts stepscope reads back: one msgspec Struct per format, named by a schema.

Capture encodes these; analysis decodes them (`load_run`). A field added later gets a default, so older files
still decode; a reader ignores fields it does not know. The schema name of each file is in its manifest entry
(and, for JSON documents, in the document).
"""

from __future__ import annotations

import msgspec

METRICS_SCHEMA = "stepscope.metrics/1"
MEMORY_LOG_SCHEMA = "stepscope.memory_log/1"
SYSTEM_SCHEMA = "stepscope.system/1"
FLOPS_SCHEMA = "stepscope.flops/3"
COMM_COUNTS_SCHEMA = "stepscope.comm_counts/1"
PROCESS_GROUPS_SCHEMA = "stepscope.process_groups/1"
PYTHON_SAMPLES_SCHEMA = "stepscope.python_samples/1"
HOST_MEMORY_SCHEMA = "stepscope.host_memory/1"
DEEPSPEED_SCHEMA = "stepscope.deepspeed/1"
DS_FLOPS_SCHEMA = "stepscope.ds_flops/1"
DS_COMMS_SCHEMA = "stepscope.ds_comms/1"
WATCH_SCHEMA = "stepscope.watch/1"


class StepMetrics(msgspec.Struct, omit_defaults=True):
    """One line of metrics.jsonl: one step of one recording rank."""

    step: int
    rank: int
    wall_ms: float
    phase: str  # none | warmup | record | record_and_save (the profiler's schedule at this step)
    # the training thread's time in stepscope once the step's own work returned (a window's stop and export at
    # its last step: the stall the job waits through; a FLOP count's report), beyond wall_ms; on the steps where
    # it took 1 ms or more
    monitor_ms: float | None = None
    flops: int | None = None  # FLOPs of the counted step (on that step only)
    tflops: float | None = None  # this step's FLOPs / its wall time (timed steps, once FLOPs are counted)
    mfu: float | None = None
    tflops_median: float | None = None  # a new median figure, on the step it was computed
    mfu_median: float | None = None
    collectives: int | None = None  # collectives of the comm-logged step (CommDebugMode)
    mem_rss_bytes: int | None = None  # memory fields on the steps the memory log samples
    mem_sys_used_bytes: int | None = None
    mem_sys_percent: float | None = None
    mem_cuda_allocated_bytes: int | None = None
    mem_cuda_reserved_bytes: int | None = None
    mem_cuda_peak_allocated_bytes: int | None = None
    mem_cuda_peak_reserved_bytes: int | None = None


class MemoryRow(msgspec.Struct, omit_defaults=True):
    """One line of a memory log: after step `step`; CUDA fields only where CUDA was in use.
    cuda_peak_* is the peak since the previous row (the allocator's peak is reset after each row)."""

    step: int
    unix_time: float
    rss_bytes: int
    sys_used_bytes: int
    sys_percent: float
    cuda_allocated_bytes: int | None = None
    cuda_reserved_bytes: int | None = None
    cuda_peak_allocated_bytes: int | None = None
    cuda_peak_reserved_bytes: int | None = None
    # a DeepSpeed engine's job: what DeepSpeed's see_memory_usage prints, read from its accelerator (on its CPU
    # accelerator allocated / reserved are the process RSS and their peaks its peak RSS since the previous row)
    ds_accelerator: str | None = None
    ds_allocated_bytes: int | None = None  # MA
    ds_peak_allocated_bytes: int | None = None  # Max_MA
    ds_reserved_bytes: int | None = None  # CA
    ds_peak_reserved_bytes: int | None = None  # Max_CA
    ds_vm_used_bytes: int | None = None  # CPU virtual memory used: total - available


class GpuSample(msgspec.Struct, omit_defaults=True):
    """One GPU in one system sample (NVML); a field the board does not report is absent."""

    index: int
    util_percent: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    temp_c: float | None = None
    util_mem_percent: float | None = (
        None  # the memory controller's busy share (nvidia-smi's utilization.memory)
    )
    mem_free_bytes: int | None = None


class SystemRow(msgspec.Struct, omit_defaults=True):
    """One line of a system log: a sample of the background sampler."""

    t_s: float  # seconds since the sampler started
    unix_time: float
    process_cpu_percent: float  # of one core (can exceed 100)
    system_cpu_percent: float  # of all cores
    rss_bytes: int
    sys_used_bytes: int
    sys_percent: float
    gpus: list[GpuSample] = []


class ModuleFlops(msgspec.Struct):
    """Forward FLOPs of one module, its descendants' included (stepscope.flops/2: forward + backward, as torch's
    module tracker charged them)."""

    name: str  # model-relative name ("" for the model itself)
    label: str
    type: str | None
    depth: int
    flops: int
    ops: dict[str, int]


class PeakInfo(msgspec.Struct):
    tflops: float
    device: str
    dtype: str | None
    source: str


class ThroughputInfo(msgspec.Struct):
    flops: int
    median_step_s: float
    steps_timed: int
    tflops: float
    mfu: float | None
    peak: PeakInfo | None
    no_mfu_reason: str | None
    formula: str
    q1_step_s: float | None = None  # the middle half of the timed steps lies between these (None before /3)
    q3_step_s: float | None = None
    spread_note: str | None = None  # a warning when the steps' times spread too widely to trust the median


# The rows of a FLOP table besides the modules (the console's, the text file's, the report's).
FLOPS_OUTSIDE_MODEL = "(outside the model), forward"
FLOPS_OUTSIDE_MODULES = "(outside every module), forward"
FLOPS_BACKWARD = "backward, not attributed to a module"


class FlopsReport(msgspec.Struct):
    """FLOPs of the counted step of one rank: the total (forward + backward), the forward per module, the backward
    as one figure (no module is charged with it: docs/flops.md), and the throughput so far."""

    rank: int
    step: int
    requested_step: int | None
    total_flops: int
    ops: dict[str, int]
    modules: list[ModuleFlops]
    device: str
    matmul_dtype: str | None
    peak_format: str | None
    note: str | None = None
    throughput: ThroughputInfo | None = None
    schema: str = FLOPS_SCHEMA
    model: str | None = None  # class of the model given to the monitor; None without one
    forward_outside_flops: int = (
        0  # forward FLOPs outside every module of the model (a loss head called apart)
    )
    backward_flops: int | None = None  # the backward's FLOPs, charged to no module (None before /3)
    backward_ops: dict[str, int] = {}
    no_throughput_reason: str | None = None  # why there is no throughput (too few undisturbed steps)


class CommCounts(msgspec.Struct):
    """Collectives of the comm-logged step of one rank, as CommDebugMode counted them.

    `modules`: module label -> "forward" / "backward" -> collective -> count ("(all)": the whole step)."""

    rank: int
    step: int
    totals: dict[str, int]
    modules: dict[str, dict[str, dict[str, int]]]
    distributed: bool
    schema: str = COMM_COUNTS_SCHEMA


class ProcessGroup(msgspec.Struct):
    """One process group a rank belongs to, as c10d knows it."""

    name: str  # c10d's group name: what record_param_comms shows as "Process Group Name"
    description: str  # "Process Group Description": default_pg, mesh_<dim>, undefined, or the job's own
    ranks: list[int]  # global ranks, in group-rank order
    backend: str  # gloo, nccl, ... ("unknown" when torch could not say)
    mesh_dim: str | None  # the DeviceMesh dimension this group is; None when it is none
    size: int
    # Linux thread ids of the group's gloo worker threads (pt_gloo_runloop) on this rank, as the trace's tids
    # name them; None when the group has no gloo backend here or its threads could not be told apart
    threads: list[int] | None = None


class GroupWindow(msgspec.Struct):
    """The collectives each process group issued during one profiling window (c10d's sequence number of the
    group at the window's last step less the one at its first)."""

    first_step: int
    last_step: int
    collectives: dict[str, int]  # group name -> collectives issued in the window


class PipelineStageRecord(msgspec.Struct):
    """One `torch.distributed.pipelining` stage this rank runs: its index, the pipeline's stage count, the
    process group its point-to-point messages go through, and the global rank of every stage (index -> rank):
    its neighbours, which the traces name only when recorded with shapes."""

    stage_index: int
    num_stages: int
    group: str | None  # the group's name (c10d's "Process Group Name"); null: unknown
    stage_ranks: list[int]  # stage_ranks[i]: the global rank that runs stage i


class Mesh(msgspec.Struct):
    """One DeviceMesh of the job (a root mesh, not a slice of one)."""

    device_type: str
    shape: list[int]
    dim_names: list[str] | None  # None: a mesh made without names (its groups' mesh_dim is dim_0, dim_1, ...)
    ranks: list[int]  # the mesh's global ranks, row-major over `shape`
    dim_groups: list[str]  # the name of this rank's group along each dimension


class ProcessGroups(msgspec.Struct, kw_only=True):
    """The process groups and device meshes of one rank (kind `process_groups`), rewritten when new ones appear.
    `notes`: what torch could not tell here (a private API it lacks), so that fewer facts never look complete."""

    schema: str = PROCESS_GROUPS_SCHEMA
    rank: int
    world_size: int
    groups: list[ProcessGroup]
    meshes: list[Mesh] = []
    notes: list[str] = []
    windows: list[GroupWindow] = []  # one per profiling window of this rank, in order
    pipeline_stages: list[PipelineStageRecord] = []  # the pipelining stages this rank runs


class PyFrame(msgspec.Struct, array_like=True):
    """One Python function as py-spy names it: its name, file and first line (`--function`)."""

    function: str
    file: str
    line: int


class PyStack(msgspec.Struct, array_like=True):
    """One folded stack: frame indices from the thread's root to the leaf, and its sample count."""

    thread: int  # index into PythonSamples.threads
    frames: list[int]  # indices into PythonSamples.frames, outermost first
    count: int


class PythonSamples(msgspec.Struct, kw_only=True):
    """py-spy's samples of one rank's process over one window (kind `python_samples`): all Python threads, idle
    ones left out, native frames off. `sampled_s` runs from py-spy's first sample to the window's end, so
    `sampled_s * rate_hz` samples of a thread is all its time; `training_thread` names the thread that steps."""

    schema: str = PYTHON_SAMPLES_SCHEMA
    rank: int
    first_step: int  # the first step sampled (the window's first warmup step) and its last active step
    last_step: int
    rate_hz: int
    sampled_s: float
    pid: int
    threads: list[str]  # "<native id> <name>", as py-spy names each thread
    training_thread: int | None  # index into threads; None when py-spy never sampled it
    frames: list[PyFrame]
    stacks: list[PyStack]
    errors: int = 0  # samples py-spy could not take
    notes: list[str] = []

    def __post_init__(self) -> None:
        """Every index points into its list (a file is input: one that does not is refused as it is read)."""
        threads, frames = len(self.threads), len(self.frames)
        if self.training_thread is not None and not 0 <= self.training_thread < threads:
            raise ValueError(f"training_thread {self.training_thread} is not one of the {threads} threads")
        for stack in self.stacks:
            if not 0 <= stack.thread < threads or stack.count < 0:
                raise ValueError(f"a stack of thread {stack.thread} (of {threads}) or count {stack.count}")
            if any(not 0 <= f < frames for f in stack.frames):
                raise ValueError(f"a stack names a frame outside the {frames} frames")


class MemorySite(msgspec.Struct, array_like=True):
    """One allocation site (tracemalloc, the innermost frame): bytes and blocks alive at a window's end, and
    their change since the window's start."""

    function: str
    file: str
    line: int
    size_bytes: int
    blocks: int
    growth_bytes: int
    growth_blocks: int


class HostMemory(msgspec.Struct, kw_only=True):
    """tracemalloc's view of one rank's Python heap over one window (kind `host_memory`): the top sites by size
    and by growth from the window's first traced step to its end; `traced_bytes`: all tracemalloc saw."""

    schema: str = HOST_MEMORY_SCHEMA
    rank: int
    start_step: int  # the step tracemalloc's first snapshot was taken before
    first_step: int  # the window's first and last active step
    last_step: int
    traced_bytes: int
    peak_bytes: int
    sites: list[MemorySite]
    snapshot_ms: float  # what the snapshots cost the training thread (taking them, not comparing them)
    notes: list[str] = []


class DeepSpeedEngineInfo(msgspec.Struct, kw_only=True):
    """A DeepSpeed engine's configuration on one rank (kind `deepspeed`), as the engine reports it.
    An offload device is None where nothing is offloaded; a size is None where the engine did not say."""

    schema: str = DEEPSPEED_SCHEMA
    rank: int
    deepspeed_version: str
    engine: str  # the engine's class (DeepSpeedEngine, PipelineEngine, ...)
    zero_stage: int
    offload_optimizer: str | None  # "cpu" | "nvme" | None
    offload_param: str | None
    world_size: int
    dp_size: int | None
    mp_size: int | None
    pp_size: int | None
    micro_batch: int | None  # train_micro_batch_size_per_gpu
    gradient_accumulation: int | None
    train_batch: int | None
    precision: str  # "bf16" | "fp16" | "fp32"
    optimizer: str | None  # the optimizer's class
    notes: list[str] = []


class DsModuleProfile(msgspec.Struct):
    """One module in DeepSpeed's flops profile: its parameters (on this rank) and its forward's MACs, FLOPs and
    latency over the counted step, its descendants' included."""

    name: str  # model-relative ("" for the model)
    type: str
    depth: int
    params: int
    macs: int
    flops: int
    latency_s: float


class DsFlopsProfile(msgspec.Struct, kw_only=True):
    """DeepSpeed's flops profiler over one optimizer step of one rank (kind `ds_flops`): every forward of its
    micro-batches. `flops_per_step` = forward FLOPs x (1 + bwd_factor), as DeepSpeed's own profile counts the
    backward (2x the forward)."""

    schema: str = DS_FLOPS_SCHEMA
    rank: int
    step: int
    micro_steps: int  # forwards of the model during the step
    params: int  # parameters held by this rank (ZeRO-3: its partition)
    fwd_macs: int
    fwd_flops: int
    fwd_latency_s: float
    bwd_factor: float
    flops_per_step: int
    step_s: float  # the step's wall time, profiler hooks included
    modules: list[DsModuleProfile]
    notes: list[str] = []  # what is known to be off in DeepSpeed's figures (ZeRO-3's linear layers)


class DsCommOp(msgspec.Struct):
    """One collective and message size in DeepSpeed's comms logger: count, latency (ms) and bandwidths (Gbps,
    DeepSpeed's algbw / busbw), means over the calls."""

    op: str
    msg_bytes: int
    count: int
    total_latency_ms: float
    mean_latency_ms: float
    algbw_gbps: float
    busbw_gbps: float


class DsCommsSummary(msgspec.Struct, kw_only=True):
    """DeepSpeed's comms logger over one window of one rank (kind `ds_comms`, named after its last step): the
    collectives DeepSpeed issued through deepspeed.comm."""

    schema: str = DS_COMMS_SCHEMA
    rank: int
    first_step: int
    last_step: int
    ops: list[DsCommOp]


class WatchRecord(msgspec.Struct, omit_defaults=True):
    """One decision of a rank's watch (capture/window/auto.py), a line of watch/rank{R}.jsonl.

    `decision`: "window" (this rank asked for a window: the anomaly's), "joined" (the window of another rank's
    watch: for an anomaly of its own too when `first` is set), "planned" (slow steps that recur: a window claimed
    ahead, from the next occurrence's first step), "reference" (an on-demand run's plain window, asked for once the
    watch has learned the job's steps, to compare the anomaly windows with), "requested" (a window a user asked
    for: `stepscope trigger`, SIGUSR2), "skipped" (`reason` says why no window was opened). `first`..`last`: the slow steps seen (the anomaly), `factor` the slowest of them over the
    median step `median_ms`; `window`: the active steps every profiled rank records, when one was planned."""

    step: int  # the step at whose end the watch decided
    rank: int
    decision: str
    why: str
    unix_time: float
    first: int | None = None
    last: int | None = None
    factor: float | None = None
    median_ms: float | None = None
    slow_ms: float | None = None  # the slow bound then: median + the margin the job's noise set
    window: tuple[int, int] | None = None
    reason: str | None = None


# Schema of each kind's payload, as the manifest records it.
KIND_SCHEMAS = {
    "metrics": METRICS_SCHEMA,
    "memory_log": MEMORY_LOG_SCHEMA,
    "system": SYSTEM_SCHEMA,
    "flops": FLOPS_SCHEMA,
    "comm_counts": COMM_COUNTS_SCHEMA,
    "process_groups": PROCESS_GROUPS_SCHEMA,
    "python_samples": PYTHON_SAMPLES_SCHEMA,
    "host_memory": HOST_MEMORY_SCHEMA,
    "deepspeed": DEEPSPEED_SCHEMA,
    "ds_flops": DS_FLOPS_SCHEMA,
    "ds_comms": DS_COMMS_SCHEMA,
    "watch": WATCH_SCHEMA,
}
