"""What changed between two runs: the step and its phases per step, the findings, step and GPU totals, per-op and
per-kernel deltas (pure compute).

Each side may be a trace, a folder of traces or a run folder; all its ranks are pooled. Phases are per-step means
over every rank's steps (`analyze`'s per-step table). Ops are compared by self time (see summary.py), kernels by
total time, both per step when both runs have steps; the DataLoader's iterators (`_SingleProcessDataLoaderIter`,
`_MultiProcessingDataLoaderIter`, ...) count as one op, DATALOADER_OP. Rows are ranked by the absolute change per
step. A change is *significant* when it moves at least the noise floor per step: NOISE_FLOOR_US or
NOISE_FLOOR_PCT of the base step, whichever is larger; a kernel or op whose mean duration changed by `factor` or
more (either way) is flagged only when its change is significant.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec
import numpy as np

from stepscope.analysis import _intervals as iv
from stepscope.analysis.analyze import AnalysisResult, analyze
from stepscope.analysis.findings import Finding
from stepscope.analysis.steps import DATALOADER_RE, find_steps
from stepscope.analysis.summary import (
    CPU_OP_CATEGORIES,
    KernelStat,
    OpStat,
    kernel_stats,
    op_stats,
    self_times,
)
from stepscope.analysis.table import GPU_CATEGORIES, TraceTable

DIFF_SCHEMA = "stepscope.diff/2"
DEFAULT_FACTOR = 5.0
NOISE_FLOOR_US = 50.0  # a change under 50 us per step is noise ...
NOISE_FLOOR_PCT = 1.0  # ... as is one under 1% of the base run's step
DATALOADER_OP = "DataLoader (any iterator)"
# The phases of the per-step comparison, in print order; step_time first.
PHASES = (
    "step_time",
    "data_loader",
    "forward",
    "backward",
    "optimizer",
    "communication",
    "gpu_idle",
    "other",
)
# How the reports name each phase.
PHASE_LABELS = {
    "step_time": "step time",
    "data_loader": "data loader",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "communication": "communication",
    "gpu_idle": "GPU idle",
    "other": "other (outside phases)",
}


class Side(msgspec.Struct):
    """Totals of one run (all its ranks together)."""

    path: str
    ranks: list[int]
    steps: int  # ProfilerStep spans, all ranks
    step_mean_us: float | None  # mean duration of those spans
    cpu_self_us: float  # self time of all CPU ops
    kernel_total_us: float  # sum of kernel durations
    gpu_busy_us: float  # union of kernel, memcpy and memset intervals, summed over ranks
    gpu_span_us: float  # first to last GPU activity, summed over ranks
    gpu_busy_pct: float | None


class Delta(msgspec.Struct):
    """One op or kernel name in both runs. Means are None where the name does not occur."""

    name: str
    status: str  # "added" (only in test), "removed" (only in base), "changed"
    base_count: int
    test_count: int
    delta_count: int
    base_total_us: float
    test_total_us: float
    delta_total_us: float
    base_mean_us: float | None
    test_mean_us: float | None
    mean_ratio: float | None  # test mean / base mean
    flagged: bool  # mean_ratio >= factor or <= 1 / factor, and the change is significant
    delta_per_step_us: float = (
        0.0  # test total per step - base total per step (totals when a run has no steps)
    )
    significant: bool = False  # |delta_per_step_us| >= the noise floor


class Phase(msgspec.Struct):
    """One phase of the step, mean ms per step in each run (null where a run does not show it)."""

    name: str  # one of PHASES
    base_ms: float | None
    test_ms: float | None
    delta_ms: float | None
    change_pct: float | None  # of the base value
    significant: bool  # |delta| >= the noise floor


class FindingChange(msgspec.Struct):
    """A finding (id, rank) in one run and not the other, or in both with a different price."""

    id: str
    rank: int | None
    status: str  # "appeared" (only in test), "disappeared" (only in base), "changed"
    severity: str  # in test; in base when it disappeared
    base_cost_ms: float | None
    test_cost_ms: float | None
    message: str  # test's; base's when it disappeared


class Gate(msgspec.Struct):
    """A `--fail-on` condition and whether the test run breaches it."""

    expression: str
    metric: str
    base: float | None
    test: float | None
    change_pct: float | None
    breached: bool


class Diff(msgspec.Struct):
    schema: str
    factor: float
    noise_floor_us: float  # per step
    base: Side
    test: Side
    step_delta_us: float | None
    step_ratio: float | None
    phases: list[Phase]  # per step, PHASES order
    findings: list[FindingChange]  # appeared, then disappeared, then changed; by cost
    kernels: list[Delta]  # every kernel whose count or total changed, by |delta_per_step_us|
    ops: list[Delta]  # same for CPU ops (self time)
    notices: list[str]
    gates: list[Gate] = []


def diff_tables(
    base: TraceTable,
    test: TraceTable,
    *,
    base_path: str = "base",
    test_path: str = "test",
    factor: float = DEFAULT_FACTOR,
    comm_patterns: Sequence[str] = (),
) -> Diff:
    """Compare two loaded runs."""
    base_self, test_self = self_times(base), self_times(test)
    b, t = _side(base, base_self, base_path), _side(test, test_self, test_path)
    notices = [f"base: {n}" for n in base.notices] + [f"test: {n}" for n in test.notices]
    if b.steps != t.steps and b.steps and t.steps:
        notices.append(
            f"the runs have {b.steps} and {t.steps} profiler steps: op and kernel totals are per step"
        )
    if len(b.ranks) != len(t.ranks):
        notices.append(f"the runs have {len(b.ranks)} and {len(t.ranks)} ranks: totals pool all ranks")
    step_delta = step_ratio = None
    if b.step_mean_us is not None and t.step_mean_us is not None:
        step_delta = round(t.step_mean_us - b.step_mean_us, 3)
        step_ratio = _ratio(t.step_mean_us, b.step_mean_us)
    floor = max(NOISE_FLOOR_US, NOISE_FLOOR_PCT / 100 * (b.step_mean_us or 0.0))
    base_result = analyze(base, comm_patterns=comm_patterns)
    test_result = analyze(test, comm_patterns=comm_patterns)
    per_step = (b.steps or 1, t.steps or 1) if b.steps and t.steps else (1, 1)
    return Diff(
        schema=DIFF_SCHEMA,
        factor=factor,
        noise_floor_us=round(floor, 3),
        base=b,
        test=t,
        step_delta_us=step_delta,
        step_ratio=step_ratio,
        phases=_phases(base_result, test_result, floor),
        findings=_finding_changes(base_result.findings, test_result.findings, floor),
        kernels=_deltas(_by_name(kernel_stats(base)), _by_name(kernel_stats(test)), factor, per_step, floor),
        ops=_deltas(
            _op_totals(op_stats(base, base_self)),
            _op_totals(op_stats(test, test_self)),
            factor,
            per_step,
            floor,
        ),
        notices=notices,
    )


def _phase_means(result: AnalysisResult) -> dict[str, float | None]:
    """Mean ms per step of every phase over every rank's steps (None where the run never shows it)."""
    rows = [(r, s) for r in result.ranks for s in r.steps]
    if not rows:
        return dict.fromkeys(PHASES)

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return round(sum(known) / len(known) / 1e3, 4) if known else None

    out: dict[str, float | None] = {
        "step_time": mean([s.dur_us for _, s in rows]),
        "data_loader": mean([s.dataloader_us for _, s in rows]),
        "forward": mean([s.forward_us for _, s in rows]),
        "backward": mean([s.backward_us for _, s in rows]),
        "optimizer": mean([s.optimizer_us for _, s in rows]),
        "communication": mean([s.comm_us for _, s in rows]),
        "gpu_idle": mean(
            [s.dur_us * (1 - s.gpu_busy_pct / 100) if s.gpu_busy_pct is not None else None for _, s in rows]
        ),
    }
    if out["communication"] is None:
        # CPU backends: the collectives' time per step, from the per-rank collectives table
        times = [
            sum(c.time_ms or 0.0 for c in r.collectives) / r.window.steps
            for r in result.ranks
            if r.collectives and r.window.steps
        ]
        out["communication"] = round(sum(times) / len(times), 4) if times else None
    step = out["step_time"] or 0.0
    named = sum(out[p] or 0.0 for p in ("data_loader", "forward", "backward", "optimizer"))
    out["other"] = round(max(step - named, 0.0), 4)
    return out


def _phases(base: AnalysisResult, test: AnalysisResult, floor_us: float) -> list[Phase]:
    b, t = _phase_means(base), _phase_means(test)
    out = []
    for name in PHASES:
        bv, tv = b[name], t[name]
        if bv is None and tv is None:
            continue
        delta = round((tv or 0.0) - (bv or 0.0), 4)
        change = round(100.0 * delta / bv, 2) if bv else None
        out.append(Phase(name, bv, tv, delta, change, abs(delta) * 1e3 >= floor_us))
    return out


def _finding_changes(base: list[Finding], test: list[Finding], floor_us: float) -> list[FindingChange]:
    """Findings (by id and rank) that appeared, disappeared, or changed price by at least the noise floor."""
    b = {(f.id, f.rank): f for f in base}
    t = {(f.id, f.rank): f for f in test}
    out = []
    for key in t.keys() - b.keys():
        f = t[key]
        out.append(FindingChange(f.id, f.rank, "appeared", f.severity, None, f.cost_ms_per_step, f.message))
    for key in b.keys() - t.keys():
        f = b[key]
        out.append(
            FindingChange(f.id, f.rank, "disappeared", f.severity, f.cost_ms_per_step, None, f.message)
        )
    for key in b.keys() & t.keys():
        bf, tf = b[key], t[key]
        if bf.cost_ms_per_step is None or tf.cost_ms_per_step is None:
            continue
        if abs(tf.cost_ms_per_step - bf.cost_ms_per_step) * 1e3 >= floor_us:
            out.append(
                FindingChange(
                    tf.id,
                    tf.rank,
                    "changed",
                    tf.severity,
                    bf.cost_ms_per_step,
                    tf.cost_ms_per_step,
                    tf.message,
                )
            )
    order = {"appeared": 0, "disappeared": 1, "changed": 2}
    out.sort(
        key=lambda c: (
            order[c.status],
            -max(c.base_cost_ms or 0.0, c.test_cost_ms or 0.0),
            c.id,
            c.rank if c.rank is not None else -1,
        )
    )
    return out


def _side(table: TraceTable, self_ns: np.ndarray, path: str) -> Side:
    gpu = (table.ph == ord("X")) & table.cat_mask(*GPU_CATEGORIES)
    busy = span = 0
    step_durations: list[int] = []
    for rank in table.rank_ids():
        in_rank = table.rank == rank
        spans = find_steps(table.select(in_rank))
        step_durations += (spans.end - spans.start).tolist()
        rows = gpu & in_rank
        if rows.any():
            start, end = table.ts[rows], table.ts[rows] + table.dur[rows]
            busy += iv.length(iv.merge(start, end))
            span += int(end.max() - start.min())
    ops = (table.ph == ord("X")) & table.cat_mask(*CPU_OP_CATEGORIES)
    kernels = (table.ph == ord("X")) & table.cat_mask("kernel")
    return Side(
        path=path,
        ranks=table.rank_ids(),
        steps=len(step_durations),
        step_mean_us=_us(sum(step_durations) / len(step_durations)) if step_durations else None,
        cpu_self_us=_us(int(self_ns[ops].sum())),
        kernel_total_us=_us(int(table.dur[kernels].sum())),
        gpu_busy_us=_us(busy),
        gpu_span_us=_us(span),
        gpu_busy_pct=round(100.0 * busy / span, 2) if span else None,
    )


_Totals = dict[str, tuple[int, float]]  # name -> (count, total us)


def _by_name(stats: list[KernelStat]) -> _Totals:
    return {s.name: (s.count, s.total_us) for s in stats}


def _op_totals(stats: list[OpStat]) -> _Totals:
    """Ops by name, the DataLoader's iterator variants as one (DATALOADER_OP)."""
    out: _Totals = {}
    for s in stats:
        name = DATALOADER_OP if _LOADER_OP.search(s.name) else s.name
        count, total = out.get(name, (0, 0.0))
        out[name] = (count + s.count, round(total + s.self_us, 3))
    return out


_LOADER_OP = re.compile(r"^enumerate\(DataLoader\)#|" + DATALOADER_RE.pattern + r".*__next__")


def _deltas(
    base: _Totals, test: _Totals, factor: float, steps: tuple[int, int] = (1, 1), floor_us: float = 0.0
) -> list[Delta]:
    out = []
    for name in base.keys() | test.keys():
        bc, bt = base.get(name, (0, 0.0))
        tc, tt = test.get(name, (0, 0.0))
        if (bc, bt) == (tc, tt):
            continue
        bm = round(bt / bc, 3) if bc else None
        tm = round(tt / tc, 3) if tc else None
        ratio = _ratio(tm, bm) if bm is not None and tm is not None else None
        per_step = round(tt / steps[1] - bt / steps[0], 3)
        significant = abs(per_step) >= floor_us
        flagged = significant and ratio is not None and (ratio >= factor or ratio <= 1.0 / factor)
        status = "added" if not bc else "removed" if not tc else "changed"
        out.append(
            Delta(
                name,
                status,
                bc,
                tc,
                tc - bc,
                bt,
                tt,
                round(tt - bt, 3),
                bm,
                tm,
                ratio,
                flagged,
                per_step,
                significant,
            )
        )
    out.sort(key=lambda d: (-abs(d.delta_per_step_us), -abs(d.delta_count), d.name))
    return out


def _ratio(new: float, old: float | None) -> float | None:
    return round(new / old, 4) if old else None


def _us(ns: float) -> float:
    return round(ns / 1000.0, 3)


GATE_RE = re.compile(r"^\s*([a-z_]+)\s*([<>])\s*([+-]?\d+(?:\.\d+)?)\s*(%|ms|us|s)?\s*$")
GATE_METRICS = (*PHASES, "new_high")
_UNIT_MS = {"ms": 1.0, "us": 1e-3, "s": 1e3}


def parse_gate(expression: str) -> tuple[str, str, float, str | None]:
    """`step_time>+5%` -> ("step_time", ">", 5.0, "%"). Raises ValueError with the reason when malformed."""
    m = GATE_RE.match(expression)
    if m is None:
        raise ValueError(
            f"{expression!r} is not METRIC>+N% / METRIC>+Nms / METRIC<-N% / new_high>N (e.g. 'step_time>+5%', "
            "'forward>+2ms', 'new_high>0'); repeat --fail-on for several gates"
        )
    metric, op, number, unit = m.group(1), m.group(2), float(m.group(3)), m.group(4)
    if metric not in GATE_METRICS:
        raise ValueError(f"{expression!r}: unknown metric {metric!r} (one of {', '.join(GATE_METRICS)})")
    if metric == "new_high":
        if unit is not None or op != ">":
            raise ValueError(f"{expression!r}: new_high takes a count, as in 'new_high>0'")
    elif unit is None:
        raise ValueError(
            f"{expression!r}: give the change in % or in ms / us / s, e.g. '{metric}{op}{'+' if op == '>' else '-'}"
            f"{m.group(3).lstrip('+-')}%'"
        )
    sign = m.group(3)[0]
    if (op == ">" and sign == "-") or (op == "<" and sign == "+"):
        # the sign may be left out ('step_time>5%' is 'step_time>+5%'), but never contradict the comparison
        raise ValueError(f"{expression!r}: '>' takes an increase (+N), '<' a decrease (-N)")
    return metric, op, abs(number), unit


def evaluate_gates(diff: Diff, expressions: Sequence[str]) -> list[Gate]:
    """Each `--fail-on` expression against the diff (see parse_gate); a metric neither run shows is not
    breached (its base and test are null)."""
    phases = {p.name: p for p in diff.phases}
    gates = []
    for expression in expressions:
        metric, op, number, unit = parse_gate(expression)
        if metric == "new_high":
            count = sum(1 for f in diff.findings if f.status == "appeared" and f.severity == "high")
            gates.append(Gate(expression, metric, 0.0, float(count), None, count > number))
            continue
        phase = phases.get(metric)
        base = phase.base_ms if phase else None
        test = phase.test_ms if phase else None
        if base is None or test is None:
            gates.append(Gate(expression, metric, base, test, None, False))
            continue
        change_pct = round(100.0 * (test - base) / base, 2) if base else None
        if unit == "%":
            limit = base * (1 + number / 100) if op == ">" else base * (1 - number / 100)
        else:
            step = number * _UNIT_MS[unit or "ms"]
            limit = base + step if op == ">" else base - step
        breached = test > limit if op == ">" else test < limit
        gates.append(Gate(expression, metric, base, test, change_pct, breached))
    return gates
