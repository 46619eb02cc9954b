"""What names and args say about communication: collective kinds, NCCL algorithms, element sizes, bus bandwidth.

Pure functions over strings and numbers; the rules are documented in docs/analysis.md ("Communication").
"""

from __future__ import annotations

import re

# Bytes per element: torch ScalarType names (record_param_comms `dtype`) and C++ type names.
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "c10::half": 2,
    "bfloat16": 2, "c10::bfloat16": 2, "long": 8, "long int": 8, "int64": 8, "int": 4, "int32": 4,
    "short": 2, "short int": 2, "int16": 2, "char": 1, "signed char": 1, "int8": 1, "byte": 1,
    "unsigned char": 1, "uint8": 1, "bool": 1, "complexfloat": 8, "complexdouble": 16,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
}  # fmt: skip

# Canonical kinds, keyed by the name with underscores removed.
_KINDS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
    "sendrecv": "send_recv",
    "barrier": "barrier",
}
_NOT_COLLECTIVES = {"wait", "init", "split", "monitoredbarrier", ""}
# The range a backend opens around each collective: `nccl:all_reduce`, `gloo:broadcast`.
BACKEND_RANGE = re.compile(r"^(nccl|gloo|ucc|mpi|xccl|hccl|rccl):(.+)$")
# Backends whose range on the CPU is the collective itself (not an enqueue for a GPU).
CPU_BACKENDS = frozenset({"gloo", "mpi", "ucc"})
# Functional collectives (DTensor, tensor parallel, torch.compile): `_c10d_functional::all_reduce`, ...; their
# `wait_tensor` is the wait, not a collective.
FUNCTIONAL_PREFIXES = ("_c10d_functional::", "c10d_functional::", "_c10d_functional_autograd::")
# Collectives a backend runs as another kind: (issued kind, the backend range's kind). gloo has no
# reduce-scatter of one tensor: `c10d::_reduce_scatter_base_` runs as a `gloo:all_reduce` range.
RUN_AS = frozenset({("reduce_scatter", "all_reduce")})
KNOWN_KINDS = frozenset(_KINDS.values())
NCCL_KERNEL = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)
# NCCL's algorithm and protocol, as its kernel names spell them (`..._RING_LL`, `..._TREE_SIMPLE`).
NCCL_ALGORITHM = re.compile(r"(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|NVLS_TREE|NVLS|PAT)_(LL128|LL|SIMPLE)")


# Expert parallel: DeepEP (`deep_ep::`) and its forks (`<ns>::ep::`, e.g. `dpsk::ep::internode::combine`) run the
# MoE all-to-all as their own kernels, in a namespace per transport (DeepEP's legacy:: and elastic:: included);
# the kernel's name says its phase. Matched against the lowercased name; the first qualified name in it is the
# kernel's own (its parameter types come after).
EP_KERNEL = re.compile(
    r"(?:^|[^a-z0-9_])(?:deep_?ep|[a-z0-9_]+::ep)::(?:legacy::)?"
    r"(internode_ll|internode|intranode|low_latency|elastic)::((?:[a-z0-9_]+::)*[a-z0-9_]+)"
)
EP_PHASES = ("notify", "dispatch", "combine", "barrier")  # notify first: `notify_dispatch` is notify
# Async tensor parallel (torch.distributed._symmetric_memory, inductor's micro-pipeline TP): ops that run a
# matmul and its all-gather / reduce-scatter at once, as `symm_mem::<op>` ops and `<op>` ranges.
ASYNC_TP_OPS = (
    "fused_all_gather_matmul",
    "fused_all_gather_scaled_matmul",
    "fused_matmul_reduce_scatter",
    "fused_scaled_matmul_reduce_scatter",
)
ASYNC_TP_RANGE = re.compile(r"^(?:symm_mem::)?(" + "|".join(ASYNC_TP_OPS) + r")$")


def ep_kernel(name: str) -> tuple[str, str] | None:
    """(transport, phase) of a DeepEP-style expert-parallel kernel: transport `intranode`, `internode`,
    `low_latency` (DeepEP's `internode_ll`) or `elastic`; phase `notify` (notify_dispatch, cached_notify*: the
    exchange of token counts), `dispatch`, `combine` or `barrier`. None for any other kernel, DeepEP's local
    ones included (layout, buffer cleaning)."""
    low = name.lower()
    if "ep::" not in low:
        return None
    match = EP_KERNEL.search(low)
    if match is None:
        return None
    function = match.group(2).rsplit("::", 1)[-1]
    phase = next((p for p in EP_PHASES if p in function), None)
    if phase is None:
        return None
    transport = match.group(1)
    return ("low_latency" if transport == "internode_ll" else transport), phase


def async_tp_op(name: str) -> str | None:
    """The fused async-TP op (`fused_all_gather_matmul`, ...) of a CPU range's name, else None."""
    match = ASYNC_TP_RANGE.match(name)
    return match.group(1) if match is not None else None


def collective_kind(raw: str) -> str | None:
    """Canonical kind of a collective name from any source (`allreduce`, `_allgather_base_`, `AllReduce`)."""
    name = raw.strip().lower().strip("_")
    for suffix in ("_coalesced", "_into_tensor", "_tensor", "_base", "_single"):
        name = name.replace(suffix, "")
    key = name.replace("_", "")
    if key in _NOT_COLLECTIVES:
        return None
    return _KINDS.get(key, name or None)


def cpu_collective(name: str) -> tuple[str, str] | None:
    """(source, kind) of a CPU-side collective event by its name: `record_param_comms` (kind "" until its args
    say), a c10d op (`c10d::allreduce_`) or functional collective (`_c10d_functional::all_reduce`, source
    "c10d_op" too: both are what the job issued) or a backend range (`gloo:all_reduce`); None for anything
    else."""
    if name == "record_param_comms":
        return ("record_param_comms", "")
    if name.startswith("c10d::"):
        kind = collective_kind(name[len("c10d::") :])
        return ("c10d_op", kind) if kind else None
    for prefix in FUNCTIONAL_PREFIXES:
        if name.startswith(prefix):
            kind = collective_kind(name[len(prefix) :])
            return ("c10d_op", kind) if kind in KNOWN_KINDS else None
    match = BACKEND_RANGE.match(name)
    if match is not None:
        kind = collective_kind(match.group(2))
        return ("backend_range", kind) if kind else None
    return None


def kernel_collective(name: str) -> str | None:
    """Kind of an NCCL/RCCL kernel by its name (`ncclDevKernel_AllReduce_Sum_f32_RING_LL` -> all_reduce)."""
    match = NCCL_KERNEL.match(name)
    return collective_kind(match.group(1)) if match is not None else None


def nccl_algorithm(name: str) -> str | None:
    """`RING_LL`, `TREE_SIMPLE`, ... from an NCCL kernel name; None when it names none."""
    match = NCCL_ALGORITHM.search(name)
    return f"{match.group(1)}_{match.group(2)}" if match is not None else None


def element_bytes(dtype: str | None) -> int | None:
    return DTYPE_BYTES.get(dtype.lower()) if dtype else None


def bus_factor(kind: str, ranks: int) -> float | None:
    """nccl-tests' bus bandwidth factor: busbw = algbw x factor, with n ranks in the group.

    all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, send, recv,
    send_recv 1. None for kinds without a definition (barrier, gather, scatter) or n < 1."""
    if ranks < 1:
        return None
    if kind == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    if kind in ("broadcast", "reduce", "send", "recv", "send_recv"):
        return 1.0
    return None


def algorithm_bytes(kind: str, in_bytes: int | None, out_bytes: int | None, ranks: int | None) -> int | None:
    """The size S that nccl-tests divides by the time: the whole buffer of the collective.

    all_gather: the gathered output (the input times the ranks when the output size is not recorded);
    reduce_scatter: the whole input; every other kind: the input message."""
    if kind == "all_gather":
        if out_bytes is not None and out_bytes > 0:
            return out_bytes
        return in_bytes * ranks if in_bytes is not None and ranks else None
    if kind == "reduce_scatter" and in_bytes is None:
        return out_bytes * ranks if out_bytes is not None and ranks else None
    return in_bytes
