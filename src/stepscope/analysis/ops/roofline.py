"""Each op against its device's roofline: the calls of one op with one set of input shapes grouped, their
achieved FLOP/s and bytes/s, their bound, their efficiency and what they would save at a realistic one.

The roofline of a number format: the peak dense FLOP/s (devices.PEAK_TFLOPS) and the memory's bandwidth
(devices.PEAK_TBPS); an op of arithmetic intensity I (FLOPs per byte) can run at min(peak, bandwidth x I) at
best. Below the ridge (peak / bandwidth) it is memory-bound. The compute families (GEMMs, convolutions,
attention) are judged against that roof in their number format; the others, whose work is moving bytes,
against the bandwidth alone. Efficiency is the achieved rate over the roof at the op's intensity.

What the model cannot know shows as it is: a GEMM in fp32 that ran on TF32 tensor cores exceeds 100% of the fp32
roof (efficiency over 1 is kept, never clipped); a fused kernel serving several ops is timed on the op that
launched it; bytes are the least an op must move (caches and re-reads are not seen).
"""

from __future__ import annotations

import collections
import math
import re

import msgspec

from stepscope.analysis.ops.calls import OpCall, TraceOps
from stepscope.analysis.ops.families import COMPUTE_FAMILIES
from stepscope.analysis.ops.model import DTYPE_BYTES
from stepscope.analysis.ops.views import STACK_GROUPS, ModuleRow, StackRow, module_tree, top_stacks
from stepscope.devices import PEAK_SOURCES, PEAK_TFLOPS, device_key, lookup_bandwidth
from stepscope.units import fmt_us, significant

__all__ = ["OPS_SCHEMA", "OpFinding", "OpGroup", "RankOps", "Roofline", "rank_ops", "roofline_for"]

OPS_SCHEMA = "stepscope.ops/1"
# The efficiencies called realistic, against which savings are priced: well-shaped large GEMMs and convolutions
# reach about 70% of the dense peak on current GPUs, streaming kernels about 80% of the memory's bandwidth.
TARGET = {"compute": 0.7, "memory": 0.8}
FINDING_SHARE = 0.03  # a finding where an op group would save at least this share of the counted op time
FINDINGS = 5
# multiples of these sizes let tensor cores tile a GEMM / convolution / attention without padding (bytes of
# the format -> elements): 16-bit formats 8, 8-bit 16, fp32 (TF32) 4
ALIGN = {1: 16, 2: 8, 4: 4}
# a call that would take less at the roof leaves most of the device idle (launches, tails)
SMALL_CALL_S = 10e-6
UNLAUNCHED_SHARE = 0.05  # device work without a launch in the trace is said from this share of it on
UNEVEN_CALLS = 3.0  # a group's slowest call this many times its median is said to weigh on its efficiency
OUTLIER_STEP = 3.0  # a profiled step this many times the median is said to weigh on the figures


class Roofline(msgspec.Struct, frozen=True):
    """The device's roof: peak dense TFLOP/s per number format, the memory's TB/s and where they came from."""

    device: str | None
    peak_tflops: dict[str, float]
    tbps: float | None
    source: str

    def ridge(self, fmt: str | None) -> float | None:
        """FLOPs per byte at which the format's peak is reached."""
        peak = self.peak_tflops.get(fmt or "") or self.peak_tflops.get("*")
        return peak / self.tbps if peak and self.tbps else None


class OpGroup(msgspec.Struct):
    """The calls of one op with one set of input shapes."""

    name: str
    family: str
    shapes: str  # the tensor inputs' shapes, as recorded
    dtype: str | None  # the number format of its FLOPs (compute families)
    calls: int
    time_us: float
    share: float  # of the rank's counted op time
    flops: float | None
    bytes: float
    intensity: float | None  # FLOPs per byte
    tflops: float | None  # achieved
    tbps: float  # achieved
    bound: str | None  # "compute" / "memory"; None without a roof
    roof_tflops: float | None  # the roof at its intensity (compute families)
    efficiency: float | None  # achieved / roof (compute families) or / bandwidth (the others); may exceed 1
    saving_us: float | None  # at the realistic efficiency (TARGET)
    causal: bool = False
    call_us: tuple[float, float, float] = (0.0, 0.0, 0.0)  # one call's time: least, median, most


# what a replay of a trace that marks no ProfilerStep prices (its steps are the whole trace, as one step)
WHOLE_TRACE = "the whole trace, taken as one step (it marks no ProfilerStep)"


class OpFinding(msgspec.Struct):
    """An op group far below its roof with a share of the time worth having, priced, with one action."""

    name: str
    shapes: str
    message: str
    action: str
    saving_us: float  # of the counted ops' time, at the realistic efficiency
    saving_per_step_us: float | None
    how_priced: str
    # what the same change saves of the rank's median step in a replay of its steps (the op's other work, the
    # host, other streams and waiting take the time it frees); None where no replay priced it (replay_note: why)
    step_saving_us: float | None = None
    replay_note: str | None = None


class RankOps(msgspec.Struct):
    """A rank's ops against its roofline."""

    rank: int
    path: str
    device: str | None
    roofline: Roofline
    steps: int
    op_time_us: float  # the counted calls' time (device time on a GPU trace, wall time on a CPU one)
    time_kind: str  # "device" / "wall"
    # the counted time's share of all the device's work (a GPU trace) or of the profiled steps' wall time (a CPU
    # trace with ProfilerSteps): how much of the time the model speaks for; None where there is nothing to divide
    coverage: float | None
    groups: list[OpGroup]
    families: dict[str, float]  # time per family, us
    findings: list[OpFinding]
    stacks: list[StackRow]  # the stacks that issued the costliest op groups (with_stack)
    modules: list[
        ModuleRow
    ]  # time and FLOPs by module instance, a tree (the nn.Module frames with_stack records)
    module_types: list[ModuleRow]  # the same with a module's instances as one (its class)
    notes: list[str]


def roofline_for(
    device: str | None, memory: int | None, peak_tflops: float | None, tbps: float | None
) -> Roofline:
    """The roof of `device` from the peak table, or the user's figures (`peak_tflops` for every format)."""
    key = device_key(device) if device else None
    peaks: dict[str, float] = dict(PEAK_TFLOPS.get(key, {})) if key else {}
    sources = []
    if peaks and key:
        sources.append(f"{key}: {PEAK_SOURCES[key]}")
    if peak_tflops is not None:
        peaks = {"*": peak_tflops}  # ("*": every number format)
        sources.insert(0, f"peak {peak_tflops:g} TFLOP/s given, for every number format")
    bandwidth = lookup_bandwidth(device, memory) if device else None
    if tbps is not None:
        bandwidth = tbps
        sources.insert(0, f"bandwidth {tbps:g} TB/s given")
    if not peaks and bandwidth is None:
        what = f"{device!r} is not in the peak table" if device else "a CPU trace has no peak table"
        sources.append(f"none: {what} (--peak-tflops and --peak-tbps give one)")
    return Roofline(device, peaks, bandwidth, "; ".join(sources))


# short names of the dtypes a group of a memory-bound op names where its tensors are not all float32
_SHORT_DTYPES = {
    "float": "fp32",
    "double": "fp64",
    "c10::BFloat16": "bf16",
    "c10::Half": "fp16",
    "long int": "int64",
    "long": "int64",
    "int": "int32",
    "short int": "int16",
    "signed char": "int8",
    "unsigned char": "uint8",
}


def _shapes(call: OpCall) -> str:
    """The group's input shapes: a product's as `A x B` (its format is a column of its own); a memory-bound
    op's listed, each with its dtype where they are not all float32 (a bf16 add and an fp32 add of the same
    shapes are two groups, and say so)."""
    parts, dtypes = [], []
    # (a tensor list's members' dtype is not recorded: taken from a tensor beside it, else float32, said so)
    guessed = not any(t in DTYPE_BYTES for t in call.inputs.types)
    for d, t in zip(call.inputs.dims, call.inputs.types, strict=False):
        if isinstance(d, list) and d and all(isinstance(x, list) for x in d):
            # (no parentheses: a narrow terminal drops a parenthesis as it drops a kernel's parameter list)
            parts.append(
                f"{len(d)} tensors" + (", fp32 taken: their dtype is not recorded" if guessed else "")
            )
            dtypes.append("")
        elif isinstance(d, list) and t in DTYPE_BYTES:
            parts.append("[" + ", ".join(map(str, d)) + "]")
            dtypes.append(_SHORT_DTYPES.get(t, t))
    if call.cost.family in COMPUTE_FAMILIES:
        return " x ".join(parts)
    # (an empty tensor, as cuDNN's reserve space, decides nothing)
    kinds = {t for p, t in zip(parts, dtypes, strict=True) if t and "0" not in p.strip("[]").split(", ")}
    if kinds <= {"fp32"}:
        return ", ".join(parts)
    if len(kinds) == 1:
        return f"{', '.join(parts)} {kinds.pop()}"
    return ", ".join(f"{p} {t}".rstrip() for p, t in zip(parts, dtypes, strict=True))


def _causal_name(name: str, causal: bool) -> str:
    return f"{name} (causal)" if causal else name


def rank_ops(
    ops: TraceOps, rank: int, *, peak_tflops: float | None = None, tbps: float | None = None
) -> RankOps:
    """A rank's counted calls grouped by op and shapes, each against the roof."""
    roof = roofline_for(ops.device, ops.device_memory, peak_tflops, tbps)
    grouped: dict[tuple[str, str, str | None, bool], list[OpCall]] = collections.defaultdict(list)
    for call in ops.calls:
        grouped[(call.name, _shapes(call), call.cost.dtype, call.cost.causal)].append(call)
    total = sum(c.time_us for c in ops.calls)
    groups = [_group(key, calls, total, roof) for key, calls in grouped.items()]
    groups.sort(key=lambda g: -g.time_us)
    families: dict[str, float] = {}
    for g in groups:
        families[g.family] = families.get(g.family, 0.0) + g.time_us
    notes = _notes(ops, roof)
    findings = _findings(groups, total, ops.steps, roof)
    stacks = top_stacks(  # (a causal attention's stacks apart from the same op's without a mask)
        ops.calls,
        lambda c: (_causal_name(c.name, c.cost.causal), _shapes(c)),
        [(_causal_name(g.name, g.causal), g.shapes) for g in groups[:STACK_GROUPS]],
    )
    modules = module_tree(ops.calls)
    module_types = module_tree(ops.calls, by_type=True)
    if ops.calls and not stacks:
        notes.append("no Python stacks in this trace: with_stack=True records the stacks that issued each op")
    if ops.calls and not modules:
        notes.append("no nn.Module frames in this trace: with_stack=True records them (time by module)")
    return RankOps(
        rank=rank,
        path=ops.path,
        device=ops.device,
        roofline=roof,
        steps=ops.steps,
        op_time_us=total,
        time_kind="device" if ops.device else "wall",
        coverage=_coverage(ops, total),
        groups=groups,
        families=dict(sorted(families.items(), key=lambda kv: -kv[1])),
        findings=findings,
        stacks=stacks,
        modules=modules,
        module_types=module_types,
        notes=notes,
    )


def _group(
    key: tuple[str, str, str | None, bool], calls: list[OpCall], total: float, roof: Roofline
) -> OpGroup:
    name, shapes, dtype, causal = key
    family = calls[0].cost.family
    time_us = sum(c.time_us for c in calls)
    flops = None if calls[0].cost.flops is None else sum(c.cost.flops or 0.0 for c in calls)
    moved = sum(c.cost.bytes for c in calls)
    seconds = time_us * 1e-6
    tflops = flops / seconds / 1e12 if flops is not None and seconds > 0 else None
    tbps = moved / seconds / 1e12 if seconds > 0 else 0.0
    intensity = flops / moved if flops is not None and moved > 0 else None
    bound = roof_tflops = efficiency = saving = None
    if family in COMPUTE_FAMILIES:
        peak = roof.peak_tflops.get(dtype or "") or roof.peak_tflops.get("*")
        if peak and intensity is not None and tflops is not None:
            slope = roof.tbps * intensity if roof.tbps else math.inf
            roof_tflops = min(peak, slope)
            # (without the memory's bandwidth the roof is the peak, and the bound cannot be told)
            bound = None if not roof.tbps else "compute" if slope >= peak else "memory"
            efficiency = tflops / roof_tflops
            saving = time_us * max(0.0, 1.0 - efficiency / TARGET["compute"])
    elif roof.tbps and family != "transfer":  # (a host copy runs at the host link's speed: not judged)
        bound = "memory"
        efficiency = tbps / roof.tbps
        saving = time_us * max(0.0, 1.0 - efficiency / TARGET["memory"])
    return OpGroup(
        name=name,
        family=family,
        shapes=shapes,
        dtype=dtype,
        calls=len(calls),
        time_us=time_us,
        share=time_us / total if total > 0 else 0.0,
        flops=flops,
        bytes=moved,
        intensity=intensity,
        tflops=tflops,
        tbps=tbps,
        bound=bound,
        roof_tflops=roof_tflops,
        efficiency=efficiency,
        saving_us=saving,
        causal=causal,
        call_us=_spread(sorted(c.time_us for c in calls)),
    )


def _spread(times: list[float]) -> tuple[float, float, float]:
    return (times[0], times[len(times) // 2], times[-1]) if times else (0.0, 0.0, 0.0)


def _coverage(ops: TraceOps, total: float) -> float | None:
    whole = ops.device_us - ops.unlaunched_us if ops.device else sum(us for _, us in ops.step_us)
    return total / whole if whole > 0 else None


def _notes(ops: TraceOps, roof: Roofline) -> list[str]:
    notes = []
    if ops.device and ops.unlaunched_us > UNLAUNCHED_SHARE * ops.device_us:
        notes.append(
            f"{ops.unlaunched_us / 1e3:.1f} ms of the device's work ({ops.unlaunched_us / ops.device_us:.0%}) has "
            "no launch in the trace (queued before it began): no op is timed by it"
        )
    durations = sorted(us for _, us in ops.step_us)
    if len(durations) >= 3:
        median = durations[len(durations) // 2]
        name, longest = max(ops.step_us, key=lambda s: s[1])
        if median > 0 and longest > OUTLIER_STEP * median:
            notes.append(
                f"{name} took {longest / 1e3:.1f} ms, {longest / median:.0f}x the median step "
                f"({median / 1e3:.1f} ms): the op times and savings include it (a first step's warm-up, or a "
                "stall); profile more steps, or a window after it"
            )
    if ops.shaped == 0:
        notes.append(
            f"{ops.path}: no op has recorded shapes: profile with record_shapes=True (stepscope's option of that "
            "name, or --profiler-record-shapes) to get FLOPs and bytes per op"
        )
    if ops.shaped and not ops.calls and not ops.uncounted:
        held = ", ".join(f"{name} x{n:,}" for name, n in ops.shaped_names.items())
        notes.append(
            f"none of the {ops.shaped:,} ops with recorded shapes is of a family the model counts (products, "
            f"convolutions, attention, norms, elementwise, reductions, copies, ...): {held}"
        )
    if ops.calls and ops.unmodelled:
        held = ", ".join(f"{name} x{n:,}" for name, n in ops.unmodelled.items())
        notes.append(f"ops the model does not count, not in the table (the commonest): {held}")
    for name, n in sorted(ops.uncounted.items(), key=lambda kv: -kv[1])[:5]:
        notes.append(f"{n:,} calls of {name} have no cost: the trace lacks {ops.missing.get(name, 'shapes')}")
    if not roof.peak_tflops and roof.tbps is None:
        notes.append(f"no roof: {roof.source.removeprefix('none: ')}")
    return notes


def _findings(groups: list[OpGroup], total: float, steps: int, roof: Roofline) -> list[OpFinding]:
    """The op groups that would save the most at a realistic efficiency; an op whose every shape saves too
    little alone but whose shapes together save enough is one finding over its shapes."""
    candidates = [g for g in groups if g.saving_us is not None and g.efficiency is not None]
    found = [g for g in candidates if (g.saving_us or 0.0) >= FINDING_SHARE * total]
    named = {(g.name, g.dtype) for g in found}
    pooled: dict[tuple[str, str | None], list[OpGroup]] = collections.defaultdict(list)
    for g in candidates:
        if (g.name, g.dtype) not in named:
            pooled[(g.name, g.dtype)].append(g)
    for parts in pooled.values():
        saving = sum(g.saving_us or 0.0 for g in parts)
        if len(parts) > 1 and saving >= FINDING_SHARE * total:
            found.append(_pool(parts, saving, total))
    out = [_finding(g, total, steps, roof) for g in found]
    out.sort(key=lambda f: -f.saving_us)
    return out[:FINDINGS]


def _pool(parts: list[OpGroup], saving: float, total: float) -> OpGroup:
    """One op's shapes as one group: their time, work and saving summed, the efficiency time-weighted."""
    time_us = sum(g.time_us for g in parts)
    lead = max(parts, key=lambda g: g.time_us)
    efficiency = sum((g.efficiency or 0.0) * g.time_us for g in parts) / time_us if time_us else None
    low = min(g.efficiency or 0.0 for g in parts)
    high = max(g.efficiency or 0.0 for g in parts)
    one_bound = len({g.bound for g in parts}) == 1  # (else neither the lead's bound nor its roof is theirs)
    return msgspec.structs.replace(
        lead,
        bound=lead.bound if one_bound else None,
        roof_tflops=lead.roof_tflops if one_bound else None,
        shapes=f"{len(parts)} input shapes (from {low:.0%} to {high:.0%} of their roofs)",
        calls=sum(g.calls for g in parts),
        time_us=time_us,
        flops=None if lead.flops is None else sum(g.flops or 0.0 for g in parts),
        bytes=sum(g.bytes for g in parts),
        share=time_us / total if total else 0.0,
        efficiency=efficiency,
        saving_us=saving,
    )


def _finding(g: OpGroup, total: float, steps: int, roof: Roofline) -> OpFinding:
    kind = "compute" if g.family in COMPUTE_FAMILIES else "memory"
    eff = _pct(g.efficiency or 0.0)
    if kind == "compute" and g.roof_tflops is None:  # shapes of different bounds, as one finding
        where = f"{eff} of their roofs (some compute-bound, some memory-bound; {g.dtype})"
    elif kind == "compute":
        bound = f", {g.bound}-bound" if g.bound else ""
        where = f"{eff} of its roof ({significant(g.roof_tflops or 0.0, 3)} TFLOP/s{bound}, {g.dtype})"
    else:
        where = f"{eff} of the memory's bandwidth ({roof.tbps:g} TB/s)"
    unseen = (
        "tensor-core use, algorithms that skip FLOPs (Winograd, FFT) and fused kernels are not seen"
        if roof.device
        else "the library's algorithms (some skip FLOPs) and fused kernels are not seen"
    )
    saving = g.saving_us or 0.0
    per_step = saving / steps if steps else None
    least, median, most = g.call_us
    uneven = ""
    if g.calls >= 3 and median > 0 and most > UNEVEN_CALLS * median:
        uneven = (
            f"; its calls took {fmt_us(least)} to {fmt_us(most)} (median {fmt_us(median)}): something besides the "
            "op (the host busy, a stall) slowed some of them, and its efficiency includes them"
        )
    return OpFinding(
        name=g.name,
        shapes=g.shapes,
        message=(
            f"{g.name} with {g.shapes} runs at {where} over {g.calls:,} calls, {g.share:.0%} of the op time{uneven}"
        ),
        action=_action(g, roof.device is not None),
        saving_us=saving,
        saving_per_step_us=per_step,
        how_priced=(
            f"the time over what {TARGET[kind]:.0%} of its roof would take, of the {total / 1e3:.1f} ms the "
            f"counted ops took{f' over {steps} step' + ('s' if steps > 1 else '') if steps else ''}; modelled "
            f"from the recorded shapes: {unseen}"
        ),
    )


def _pct(share: float) -> str:
    """A share as a percentage: one decimal below 10%, as the table shows it."""
    return f"{100 * share:.1f}%" if share < 0.1 else f"{share:.0%}"


def _odd_sizes(g: OpGroup, align: int) -> list[int]:
    """The sizes tensor cores tile that are not multiples of `align`: a GEMM's inner and output sizes (the last
    dimension of each operand; both of a matrix), a convolution's channels, attention's head sizes."""
    shapes = [[int(x) for x in re.findall(r"\d+", part)] for part in re.findall(r"\[[^\]]*\]", g.shapes)]
    sizes: list[int] = []
    if g.family == "conv":
        # every tensor's second dimension (activations: their channels; the weight: its inputs per group), and
        # the weight's first (its outputs); the weight is the last tensor, forward and backward
        spatial = [s for s in shapes if len(s) >= 3]
        sizes = [s[1] for s in spatial] + ([spatial[-1][0]] if spatial else [])
    for s in shapes:
        if g.family != "conv" and len(s) >= 2:
            sizes.extend(s if len(s) == 2 and g.family == "gemm" else s[-1:])
    return sorted({n for n in sizes if n % align and n > 1})


def _action(g: OpGroup, on_device: bool) -> str:
    if g.family in COMPUTE_FAMILIES:
        align = ALIGN[{"fp8": 1, "bf16": 2, "fp16": 2, "fp32": 4}.get(g.dtype or "", 2)]
        odd = _odd_sizes(g, align)
        if odd and (on_device or g.family == "gemm"):
            units = "tensor cores" if on_device else "the vector units"
            return (
                f"pad the sizes that are not multiples of {align} ({', '.join(map(str, odd[:4]))}) so that "
                f"{units} tile them"
            )
        if g.bound == "memory":
            if g.family == "conv":
                return (
                    "too little work per byte at these channels (a depthwise or narrow convolution): its time "
                    "is moving activations; fusing it with the ops around it (torch.compile) saves that traffic"
                )
            if g.family == "attention":
                return (
                    "at these sequence lengths attention moves about as many bytes as it computes: longer "
                    "sequences (or several packed into one) raise its work per byte"
                )
            return "too little work per byte (a skinny product): batch these calls into one larger product"
        if g.dtype == "fp32" and on_device:
            return "run it in bf16 / fp16 (autocast), or allow TF32 where the device has it"
        per_call_s = (g.flops or 0.0) / max(g.calls, 1) / ((g.roof_tflops or math.inf) * 1e12)
        if per_call_s < SMALL_CALL_S:
            graph = ", or capture them in a CUDA graph" if on_device else ""
            return f"each call is too small to fill the device: batch the calls{graph}"
        return (
            "the library's kernel reaches this share of the peak on these sizes: compare the kernels it picks "
            "(torch.compile with mode='max-autotune' tries others)"
        )
    if g.family == "optimizer":
        return "use the optimizer's fused implementation (fused=True): one kernel over every parameter"
    if g.name in ("aten::fill_", "aten::zero_"):
        return (
            "a fill only writes memory: leave it out where the values are written again anyway (torch.empty "
            "for torch.zeros; zero_grad(set_to_none=True) for gradients)"
        )
    return "fuse it with the ops around it (torch.compile), so that its tensors are read and written once"
