"""Every column label of the reports, in one place: the terminal and the pages build their tables from these."""

from __future__ import annotations

from stepscope.report.model import Column

RANK = Column("rank", "int")
STEPS = Column("steps", "int")
CALLS = Column("calls", "int")
TOTAL = Column("total", "us")
MEAN = Column("mean", "us")
SHARE = Column("share", "pct")

# top kernels and ops (summary, the report's "Kernels and ops")
KERNEL = Column("kernel", "name")
OP = Column("op", "name")
SELF = Column("self", "us")
MEAN_SELF = Column("mean self", "us")
PCT_KERNEL_TIME = Column("% of kernel time", "pct")
PCT_SELF_TIME = Column("% of self time", "pct")
PCT_GPU_TIME = Column("% of GPU time", "pct")  # of the summed duration of all GPU activity (analyze)

# the overview's step categories
CATEGORY = Column("category")
PER_STEP = Column("per step", "us")

# GPU time of a rank
GPU_SPAN = Column("GPU span", "us")
COMPUTING = Column("computing", "pct")
OTHER_GPU_WORK = Column("other GPU work", "pct")
IDLE = Column("idle", "pct")
COMM_HIDDEN = Column("communication hidden", "pct")

# kernel types of a rank (HTA's definitions)
KERNEL_TYPE = Column("kernel type")
BUSY = Column("busy", "us")  # wall time with at least one such kernel running
PCT_OF_SPAN = Column("% of span", "pct")

# idle time of each GPU stream (the report's chart names the same parts)
STREAM = Column("device:stream")
EVENTS = Column("events", "int")
IDLE_US = Column("idle", "us")
HOST_WAIT = Column("waiting on the host", "us")
LAUNCH_GAP = Column("launch gap", "us")
OTHER_IDLE = Column("other", "us")

# profiled steps of a rank (phases named as in diff and the compare page)
STEP_TEXT = Column("step")
STEP_TIME = Column("step time", "us")
GPU_BUSY = Column("GPU busy", "pct")
DATA_LOADER = Column("data loader", "us")
FORWARD = Column("forward", "us")
BACKWARD = Column("backward", "us")
OPTIMIZER = Column("optimizer", "us")
COMMUNICATION = Column("communication", "us")

# step times of a run folder (metrics.jsonl)
PLAIN_STEPS = Column("plain steps", "int")
MEDIAN_STEP = Column("median", "ms")
P90_STEP = Column("p90", "ms")
IN_WINDOWS = Column("in windows", "ms")  # the median traced step
TREND = Column("trend", figure=True)

# the memory log and the system samples of a run folder
LOGGED_STEPS = Column("logged steps", figure=True)  # first-last
PEAK_RSS = Column("peak RSS", "bytes")
RSS_PER_STEP = Column("RSS growth per step", "bytes")  # a least-squares slope
PEAK_CUDA_ALLOCATED = Column("peak CUDA allocated", "bytes")
CUDA_PER_STEP = Column("CUDA growth per step", "bytes")
SAMPLES = Column("samples", "int")
SAMPLED_FOR = Column("sampled for", "us")
PROCESS_CPU_MEAN = Column("process CPU mean", "pct")  # of one core
PROCESS_CPU_MAX = Column("process CPU max", "pct")
GPU_UTILISATION = Column("GPU utilisation", figure=True)

# collectives
COLLECTIVE = Column("collective")
GROUP = Column("group")
BYTES = Column("bytes", "bytes")
TIME_MS = Column("time", "ms")
WAITING_MS = Column("waiting", "ms")
TRANSFER_MS = Column("transfer", "ms")
BUS_GBPS = Column("bus GB/s", "gbps")
TIMED_ON = Column("timed on")

# communication by parallel dimension (the report's Parallelism section)
DIMENSION = Column("dimension")
GROUPS = Column("groups")
TIME_PER_STEP_MS = Column("time / step", "ms")
EXPOSED_PER_STEP_MS = Column("exposed / step", "ms")
EXPOSED_PCT = Column("exposed", "pct")
PCT_OF_STEP = Column("% of step", "pct")

# ranks compared
MEAN_STEP = Column("mean step", "us")
COLLECTIVES_PER_STEP = Column("collectives / step", "us")
WAITING_PER_STEP = Column("waiting / step", "us")
ARRIVED_LAST = Column("arrived last", "int")

# stragglers by process group
PROCESS_GROUP = Column("group")
STRAGGLER_RANK = Column("straggler", "int")
OTHERS_WAIT_MS = Column("wait / step", "ms")
LAST_IN = Column("last in")
WHY = Column("cause, or waits for")

# pipeline stages
STAGE = Column("stage")
PREV_RANK = Column("from")  # the rank a stage receives activations from
NEXT_RANK = Column("to")
BUBBLE = Column("bubble", "pct")  # of the step
BUBBLE_PER_STEP = Column("bubble / step", "ms")
COMPUTE_PER_STEP = Column("compute / step", "ms")
P2P_PER_STEP = Column("send+recv / step", "ms")

# FLOPs per module
MODULE = Column("module", "name")
MODULE_TYPE = Column("type")
DEPTH = Column("depth", "int")
FLOPS = Column("FLOPs", "flops")

# memory files of a run folder, and the memory page
FILE = Column("file")
RANK_TEXT = Column("rank")
DEVICE = Column("device")
PEAK_ALLOCATED = Column("peak allocated", "bytes")
PEAK_RESERVED = Column("peak reserved", "bytes")
OOMS = Column("OOMs", "int")
FIGURE = Column("")  # the first column of a table whose rows are figures
RAW_BYTES = Column("bytes", "int")
SIZE = Column("size", "bytes")
BLOCKS = Column("blocks", "int")
LIVE = Column("live", "bytes")
REQUESTED = Column("requested", "bytes")
FREE_ON_DEVICE = Column("free on device", "bytes")
SITE = Column("site")
ALLOCATED_AT = Column("allocated at")
WHEN = Column("when", figure=True)  # a time, or an entry of the trace
ADDRESS = Column("address")
STACK = Column("stack")

# two runs compared (diff, the compare page)
RUN = Column("run")
MEDIAN_MS = Column("median", "ms")
QUARTILES = Column("quartiles", figure=True)
FAST_P10_MS = Column("fast (p10)", "ms")
STEPS_COMPARED = Column("steps compared")
PHASE = Column("phase")
BASE_MS = Column("base", "ms")
TEST_MS = Column("test", "ms")
CHANGE_MS = Column("change", "ms")
CHANGE_PCT = Column("%", "pct")
INTERVAL_95 = Column("95% interval", figure=True)
SIGNIFICANT = Column("significant", "flag")
HOLDS_ZERO = Column("~", figure=True)  # the terminal's mark of a change that is not significant
FINDING = Column("finding")
WHAT_CHANGED = Column("what changed")
MESSAGE = Column("message")
STATUS = Column("status")
BASE_CALLS = Column("base calls", "int")
TEST_CALLS = Column("test calls", "int")
BASE_TOTAL = Column("base total", "us")
TEST_TOTAL = Column("test total", "us")
CHANGE_PER_STEP = Column("change per step", "us")
MEAN_RATIO = Column("mean ratio", "ratio")
ABOVE_THRESHOLD = Column("above threshold", "flag")
# the terminal's diff: compact forms of the page's columns
NAME = Column("name", "name")  # a kernel or an op
CALLS_CHANGE = Column("calls", figure=True)  # 'new 3', 'gone 2', '6', '6->8'
CHANGE_IN_CALLS = Column("change", "int")
BASE_MEAN = Column("base mean", "us")
TEST_MEAN = Column("test mean", "us")
GATE = Column("gate")
RESULT = Column("result")

# Python samples (py-spy) and host memory (tracemalloc)
PY_FUNCTION = Column("function", "name")
PY_WHERE = Column("file:line")
PY_SELF = Column("self", "pct")  # of the training thread's sampled time
PY_INCLUSIVE = Column("inclusive", "pct")
PY_SAMPLES = Column("samples", "int")
SITE_SIZE = Column("alive at the end", "bytes")
SITE_GROWTH = Column("growth per step", "bytes")
WINDOWS_GROWN = Column("windows grown", figure=True)  # 'n of m'
# FSDP units (each figure per step of the window; the caption says so)
FSDP_UNIT = Column("unit", "name")
ALL_GATHERS_PER_STEP = Column("all-gathers", "int")
ALL_GATHER_BYTES_PER_STEP = Column("gathered", "bytes")
ALL_GATHER_MS_PER_STEP = Column("all-gather", "ms")
EXPOSED_ALL_GATHER_MS_PER_STEP = Column("exposed", "ms")
REDUCE_SCATTERS_PER_STEP = Column("reduce-scatters", "int")
REDUCE_SCATTER_MS_PER_STEP = Column("reduce-scatter", "ms")
# a DeepSpeed engine's job (report/_deepspeed.py): its settings, DeepSpeed's flops profile, comms logger, memory
DS_SETTING = Column("setting")
DS_VALUE = Column("value", figure=True)
DS_MODULE = Column("module", "name")
DS_TYPE = Column("type")
DS_PARAMS = Column("params", "int")
DS_MACS = Column("fwd MACs", "int")
DS_FLOPS = Column("fwd FLOPs", "flops")
DS_LATENCY = Column("fwd latency", "ms")
DS_WINDOW = Column("steps", figure=True)
DS_COMM_OP = Column("collective", "name")
DS_MSG = Column("message", "bytes")
DS_COUNT = Column("count", "int")
DS_TOTAL_LATENCY = Column("total latency", "ms")
DS_MEAN_LATENCY = Column("mean latency", "ms")
DS_ALGBW = Column("algbw Gbps", "gbps")
DS_BUSBW = Column("busbw Gbps", "gbps")
DS_ACCELERATOR = Column("accelerator")
DS_MA = Column("MA", "bytes")
DS_MAX_MA = Column("Max_MA", "bytes")
DS_CA = Column("CA", "bytes")
DS_MAX_CA = Column("Max_CA", "bytes")
DS_VM_USED = Column("CPU virtual memory used", "bytes")

# the windows the watch opened (analyze's "Windows the watch opened"): each rank over the slow steps
ROLE = Column("role")
PLAIN_WINDOW_STEP = Column("plain", "ms")
SLOW_STEP = Column("slow", "ms")
EXTRA_MS = Column("extra", "ms")
OWN_PHASE = Column("own phase")
OWN_PHASE_EXTRA = Column("+own", "ms")
COMM_EXTRA = Column("+comm", "ms")

# ops against the device's roofline (stepscope ops; the report's "Ops against the roofline")
OP_SHAPES = Column("input shapes", figure=True)
OP_SHAPES_FORMAT = Column("input shapes, format")  # (a text the terminal may shorten: --json has it whole)
# (the stacks table: shapes that name a group beside its stack, shortened like a name where the terminal is
# narrow; a backward's six shapes kept whole took the whole width and squeezed out the op and its stack)
OP_SHAPES_TEXT = Column("input shapes")
OP_FAMILY = Column("family")
OP_FORMAT = Column("format")
OP_FLOPS = Column("FLOPs", "flops")
OP_BYTES = Column("bytes", "bytes")
OP_TFLOPS = Column("TFLOP/s", "rate")
OP_TBPS = Column("TB/s", "rate")
OP_INTENSITY = Column("FLOP/byte", "rate")
OP_BOUND = Column("bound", figure=True)  # (one word: kept whole, beside the figures)
OP_EFFICIENCY = Column("of roof", "pct")
OP_SAVING = Column("saving", "us")
OP_STACK = Column("issued from (innermost frame first)")
OP_USER = Column("own code", "flag")
MODULE = Column("module")
MODULE_FORWARD = Column("forward", "us")
MODULE_BACKWARD = Column("backward", "us")
