"""The tables that the terminal and the HTML report both show, built once from the analysis' results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stepscope.report import columns as col
from stepscope.report.model import Table, pct_cell, table, us_cell
from stepscope.units import fmt_members, fmt_us

if TYPE_CHECKING:
    from stepscope.analysis.analyze import RankAnalysis
    from stepscope.analysis.cross_rank.dimensions import Dimensions
    from stepscope.analysis.cross_rank.distributed import CrossRank
    from stepscope.analysis.cross_rank.straggler import GroupStraggler
    from stepscope.analysis.ops import OpFinding, OpGroup, RankOps, Roofline
    from stepscope.analysis.per_rank.breakdown import Temporal
    from stepscope.analysis.per_rank.comm.stats import CollectiveStats
    from stepscope.analysis.per_rank.summary import RankSummary
    from stepscope.analysis.run.anomaly import AnomalyWindow


def kernel_table(ranks: Sequence[RankSummary], *, top: int, title: str = "") -> Table:
    """The top GPU kernels by total time of each rank (a rank column where there are several)."""
    multi = len(ranks) > 1
    return table(
        "top-kernels",
        [*([col.RANK] if multi else []), col.KERNEL, col.CALLS, col.TOTAL, col.MEAN, col.PCT_KERNEL_TIME],
        (
            [*([r.rank] if multi else []), k.name, k.count, k.total_us, k.mean_us, k.pct]
            for r in ranks
            for k in r.kernels
        ),
        caption=f"GPU kernels by total time (top {top} per rank). Click a name for all of it.",
        title=title,
    )


def op_table(ranks: Sequence[RankSummary], *, top: int, title: str = "") -> Table:
    """The top CPU ops by self time of each rank (a rank column where there are several)."""
    multi = len(ranks) > 1
    return table(
        "top-ops",
        [
            *([col.RANK] if multi else []),
            col.OP,
            col.CALLS,
            col.SELF,
            col.TOTAL,
            col.MEAN_SELF,
            col.PCT_SELF_TIME,
        ],
        (
            [*([r.rank] if multi else []), o.name, o.count, o.self_us, o.total_us, o.mean_self_us, o.self_pct]
            for r in ranks
            for o in r.ops
        ),
        caption=f"CPU ops by self time (top {top} per rank).",
        title=title,
    )


def gpu_time_table(ranks: Sequence[RankAnalysis], *, title: str = "") -> Table:
    """Where each rank's GPU time went over the window."""
    return table(
        "gpu-temporal",
        [col.RANK, col.GPU_SPAN, col.COMPUTING, col.OTHER_GPU_WORK, col.IDLE, col.COMM_HIDDEN],
        (
            [
                r.rank,
                r.temporal.span_us,
                r.temporal.compute_pct,
                r.temporal.non_compute_pct,
                r.temporal.idle_pct,
                r.overlap_pct,
            ]
            for r in ranks
            if r.temporal is not None
        ),
        caption="Where each rank's GPU time went over the window; 'communication hidden': the share of "
        "communication that overlapped computation.",
        filter=False,
        title=title,
    )


def gpu_time_split_table(temporal: Temporal, *, title: str = "") -> Table:
    """One rank's GPU time as gpu_time_table splits it (HTA's definitions): a row of times, a row of shares."""
    t = temporal
    return table(
        "gpu-time-split",
        [col.FIGURE, col.GPU_SPAN, col.COMPUTING, col.OTHER_GPU_WORK, col.IDLE],
        [
            ["time", t.span_us, us_cell(t.compute_us), us_cell(t.non_compute_us), us_cell(t.idle_us)],
            ["share", pct_cell(100.0), t.compute_pct, t.non_compute_pct, t.idle_pct],
        ],
        filter=False,
        title=title,
    )


def collectives_table(stats: Sequence[CollectiveStats], *, title: str = "") -> Table:
    """Every kind of collective of every rank: calls, bytes, time and how it splits."""
    return table(
        "collectives",
        [
            col.RANK,
            col.COLLECTIVE,
            col.GROUP,
            col.CALLS,
            col.BYTES,
            col.TIME_MS,
            col.WAITING_MS,
            col.TRANSFER_MS,
            col.BUS_GBPS,
            col.TIMED_ON,
        ],
        (
            [
                c.rank,
                c.kind,
                c.group or None,
                c.count,
                c.bytes,
                c.time_ms,
                c.wait_ms,
                c.transfer_ms,
                c.busbw_gbps,
                c.time_source or None,
            ]
            for c in stats
        ),
        caption="'waiting': time the rank spent waiting for the last rank to arrive.",
        title=title,
    )


def rank_steps_table(cross: CrossRank, *, title: str = "") -> Table:
    """The ranks side by side: mean step, collectives and waiting per step, how often each arrived last."""
    return table(
        "rank-steps",
        [
            col.RANK,
            col.STEPS,
            col.MEAN_STEP,
            col.COLLECTIVES_PER_STEP,
            col.WAITING_PER_STEP,
            col.ARRIVED_LAST,
        ],
        (
            [rc.rank, rc.steps, rc.step_us, rc.comm_us, rc.comm_wait_us, rc.last_arrivals]
            for rc in cross.ranks
        ),
        title=title,
    )


def stragglers_table(stragglers: Sequence[GroupStraggler], *, title: str = "") -> Table:
    """Per process group ("tp {2, 3}"), the rank its other members wait for, how long per step, and its own
    cause or the rank it waits for itself in another group."""

    def label(group: str | None, dim: str | None, ranks: list[int]) -> str:
        return f"{dim or group or 'unknown'} {fmt_members(ranks)}"

    def why(g: GroupStraggler) -> str:
        if g.waits_for is not None:
            w = g.waits_for
            return f"rank {w.rank} in {label(w.group, w.dim, w.ranks)}"
        if g.cause is None:
            return ""
        return f"{g.cause.name or g.cause.phase.replace('_', ' ')} +{g.cause.excess_ms_per_step:.1f} ms"

    return table(
        "stragglers",
        [col.PROCESS_GROUP, col.STRAGGLER_RANK, col.OTHERS_WAIT_MS, col.PCT_OF_STEP, col.LAST_IN, col.WHY],
        (
            [
                label(g.group, g.dim, g.ranks),
                g.rank,
                g.delay_ms_per_step,
                g.delay_pct,
                f"{g.last_in_steps}/{g.steps}",
                why(g),
            ]
            for g in stragglers
        ),
        caption="Stragglers by process group: in each group, the rank its other members wait for (wait / step: "
        "theirs, averaged over them); its own cause, or the rank it waits for itself in another group (its "
        "lateness passed on).",
        title=title,
    )


def dimensions_table(dims: Dimensions, *, title: str = "") -> Table:
    """Communication per step by parallel dimension: the job's rows (rank "job"), then each rank's."""
    rows = [("job", d) for d in dims.job] if len(dims.ranks) > 1 else []
    rows += [(str(r.rank), d) for r in dims.ranks for d in r.dims]
    return table(
        "dimensions",
        [
            col.RANK_TEXT,
            col.DIMENSION,
            col.GROUPS,
            col.CALLS,
            col.BYTES,
            col.TIME_PER_STEP_MS,
            col.EXPOSED_PER_STEP_MS,
            col.EXPOSED_PCT,
            col.PCT_OF_STEP,
        ],
        (
            [
                rank,
                d.dim,
                ", ".join(g or "?" for g in d.groups),
                d.count,
                d.bytes,
                d.time_ms_per_step,
                d.exposed_ms_per_step,
                d.exposed_pct,
                d.step_pct,
            ]
            for rank, d in rows
        ),
        caption="Collectives by the mesh dimension of their process group (else its description, else unknown): "
        "time per step is a union in time; 'exposed': not overlapped by other work of the rank; job rows "
        "average the ranks and sum their calls and bytes.",
        title=title,
    )


def anomaly_table(window: AnomalyWindow) -> Table:
    """Each rank over the slow steps of a window the watch opened, against the run's plain window: its step, the
    extra time, its largest phase other than communication and its extra communication."""
    short = {"rest": "other code"}

    def own(phases: Sequence[Any]) -> Any:
        return max((p for p in phases if p.phase != "communication"), key=lambda p: p.extra_ms)

    def comm(phases: Sequence[Any]) -> float:
        return next(p.extra_ms for p in phases if p.phase == "communication")

    return table(
        f"anomaly-{window.last}",
        [col.RANK, col.ROLE, col.PLAIN_WINDOW_STEP, col.SLOW_STEP, col.EXTRA_MS, col.OWN_PHASE,
         col.OWN_PHASE_EXTRA, col.COMM_EXTRA],
        (
            [r.rank, r.role, r.reference_ms, r.slow_ms, r.extra_ms, short.get(own(r.phases).phase, own(r.phases).phase.replace('_', ' ')),
             own(r.phases).extra_ms, comm(r.phases)]
            for r in window.ranks
        ),
        caption=(
            f"Steps {window.first}-{window.last}, opened by the watch: each rank's mean slow step (slow: steps "
            f"{', '.join(map(str, window.slow_steps))}) against its median step in the plain window (plain"
            + ("" if window.reference is None else f": steps {window.reference[0]}-{window.reference[1]}")
            + "), both profiled; extra: their difference, +own: in the rank's largest phase other than "
            "communication, +comm: in communication (ms per step)"
        ),
        title=f"Window {window.first}-{window.last}, opened by the watch",
    )  # fmt: skip


def ops_table(rank: RankOps, *, top: int, title: str = "", terminal: bool = False) -> Table:
    """A rank's op groups (an op with one set of input shapes) against the roofline, by time. `terminal`: the
    columns a console has room for (the format beside the shapes; no FLOPs or bytes, which --json has)."""
    groups = rank.groups[:top] if top else rank.groups
    time = "device time" if rank.time_kind == "device" else "wall time (a CPU trace)"
    columns = [
        col.OP,
        col.OP_SHAPES,
        col.OP_FORMAT,
        col.CALLS,
        col.TOTAL,
        col.SHARE,
        col.OP_FLOPS,
        col.OP_BYTES,
    ]
    if terminal:
        columns = [col.OP, col.OP_SHAPES_FORMAT, col.CALLS, col.TOTAL, col.SHARE]
    columns += [col.OP_TFLOPS, col.OP_TBPS, col.OP_BOUND, col.OP_EFFICIENCY, col.OP_SAVING]

    def row(g: OpGroup) -> list[Any]:
        name = g.name + (" (causal)" if g.causal else "")
        if terminal:
            first = [name, g.shapes + (f" {g.dtype}" if g.dtype else ""), g.calls, g.time_us, 100 * g.share]
        else:
            first = [name, g.shapes, g.dtype, g.calls, g.time_us, 100 * g.share, g.flops, g.bytes]
        efficiency = None if g.efficiency is None else 100 * g.efficiency
        return [*first, g.tflops, g.tbps, g.bound, efficiency, g.saving_us]

    return table(
        "ops-roofline",
        columns,
        (row(g) for g in groups),
        caption=(
            f"Ops grouped by name and input shapes, by {time} (top {len(groups)} of {len(rank.groups)}). "
            "'of roof': the achieved rate over the roofline at the op's FLOPs per byte (GEMMs, convolutions, "
            "attention) or over the memory's bandwidth (the others); 'saving': the time over what a realistic "
            "efficiency would take."
        ),
        title=title,
    )


STACK_FRAMES = 3  # the innermost frames a stack row shows (JSON has them all)


def op_stacks_table(rank: RankOps, *, title: str = "") -> Table:
    """The stacks that issued the costliest op groups: the user's own frames, innermost first."""
    return table(
        "ops-stacks",
        [col.OP, col.OP_SHAPES_TEXT, col.CALLS, col.TOTAL, col.SHARE, col.OP_USER, col.OP_STACK],
        (
            [
                s.name,
                s.shapes,
                s.calls,
                s.time_us,
                100 * s.share,
                s.user,
                " <- ".join(reversed(s.frames[-STACK_FRAMES:])),
            ]
            for s in rank.stacks
        ),
        caption=(
            "The stacks that issued the costliest op groups, by their time; frames of Python and of the "
            "libraries (torch, transformers, ...) left out where the stack has the user's own ('own code': no "
            "means it has none, and its innermost frames are shown)."
        ),
        title=title,
    )


MODULE_ROWS = 60  # rows of the module tree a table shows (the JSON has every module)
INDENT = "\u00a0\u00a0"  # (no-break spaces: a page keeps them where it would collapse plain ones)


def module_table(rank: RankOps, *, depth: int, title: str = "") -> Table:
    """Time and FLOPs by module type (a module's instances as one), as a tree down to `depth` levels, its first
    MODULE_ROWS rows in tree order."""
    rows = [m for m in rank.module_types if m.depth < depth][:MODULE_ROWS]
    return table(
        "ops-modules",
        [col.MODULE, col.CALLS, col.MODULE_FORWARD, col.MODULE_BACKWARD, col.OP_FLOPS],
        ([INDENT * m.depth + m.name, m.calls, m.forward_us, m.backward_us, m.flops] for m in rows),
        caption=(
            f"The counted ops' time and FLOPs by nn.Module type (the stack's module frames; the instances of a module as "
            f"one), a tree of {depth} levels: a module holds its submodules' ops; backward ops take the module of "
            "the forward op that made their autograd node. --json has every instance too."
        ),
        title=title,
    )


def roof_text(roof: Roofline) -> str:
    """The roof in words: its peaks per number format (or one for every format) and its bandwidth."""
    if "*" in roof.peak_tflops:
        peaks = f"peak {roof.peak_tflops['*']:g} TFLOP/s (every format)"
    elif roof.peak_tflops:
        peaks = "peak TFLOP/s " + ", ".join(f"{fmt} {v:g}" for fmt, v in roof.peak_tflops.items())
    else:
        peaks = "no peak"
    return f"{peaks} · memory {'-' if roof.tbps is None else f'{roof.tbps:g} TB/s'}"


def coverage_text(rank: RankOps) -> str:
    """How much of the time the counted ops speak for, in words (empty where it cannot be told)."""
    if rank.coverage is None:
        return ""
    whole = "the device work launched in the trace" if rank.time_kind == "device" else "the profiled steps"
    return f" ({100 * rank.coverage:.0f}% of {whole})"


def saving_text(f: OpFinding) -> str:
    """What an ops finding saves: of the step where a replay priced it, of the op time in any case."""
    per_step = "" if f.saving_per_step_us is None else f", {fmt_us(f.saving_per_step_us)} per step"
    op_time = f"{fmt_us(f.saving_us)} of op time{per_step}"
    if f.step_saving_us is None:
        return f"{op_time} (step time not priced: {f.replay_note})" if f.replay_note else op_time
    from stepscope.analysis.ops.roofline import WHOLE_TRACE

    step = "the whole trace" if WHOLE_TRACE in (f.replay_note or "") else "the median step"
    return f"{fmt_us(f.step_saving_us)} of {step} ({f.replay_note}); {op_time}"
