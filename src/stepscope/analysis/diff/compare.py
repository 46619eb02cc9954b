"""What changed between two runs: the step time, the profiled window's phases per step, the findings, step and
GPU totals, per-op and per-kernel deltas (pure compute).

Each side may be a trace, a folder of traces or a run folder; all its ranks are pooled.

- **Step time** (diff_steps.py): run folders compare every *plain* step (metrics.jsonl), else the profiled steps;
  the change is the Hodges-Lehmann shift with its 95% interval (_shift.py), significant when it excludes zero.
- **Phases** of the profiled window (`analyze`'s per-step table): one value per rank and step on each side,
  compared the same way; the medians are shown.
- **Findings** are matched by id and rank (or the ranks they hold on, `match_findings`).
- **Ops and kernels**: ops by self time (see summary.py), kernels by total time, both per profiled step when both
  runs have steps; the DataLoader's iterators (`_SingleProcessDataLoaderIter`, `_MultiProcessingDataLoaderIter`,
  ...) count as one op, DATALOADER_OP. Rows are ranked by the absolute change per step and listed when it is at
  least the threshold (MIN_CHANGE_US or MIN_CHANGE_PCT of the base step, whichever is larger): a window holds too
  few steps to test each name, so this is a size, not a test. A kernel or op whose mean duration changed by
  `factor` or more (either way) is flagged only when its change is above the threshold.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from stepscope.analysis.analyze import AnalysisResult, analyze
from stepscope.analysis.diff.findings import FindingChange, finding_changes
from stepscope.analysis.diff.findings import match_findings as match_findings  # public here too
from stepscope.analysis.diff.phases import Phase, phase_changes
from stepscope.analysis.diff.steps import StepComparison, compare_step_times
from stepscope.analysis.findings.rules import Finding
from stepscope.analysis.options import AnalysisOptions, with_changes
from stepscope.analysis.per_rank.steps import DATALOADER_RE
from stepscope.analysis.per_rank.totals import Counts, RankTotals, add_counts, rank_totals
from stepscope.analysis.read.table import TraceTable
from stepscope.analysis.run.folder import Run

DIFF_SCHEMA = "stepscope.diff/3"
DEFAULT_FACTOR = 5.0
MIN_CHANGE_US = 50.0  # ops and kernels: a change under 50 us per step is not listed ...
MIN_CHANGE_PCT = 1.0  # ... nor one under 1% of the base run's profiled step
DATALOADER_OP = "DataLoader (any iterator)"
# How the reports name the step time and each phase.
PHASE_LABELS = {
    "step_time": "step time",
    "profiled_step": "step (profiled)",
    "data_loader": "data loader",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "communication": "communication",
    "gpu_idle": "GPU idle",
    "other": "other (outside phases)",
}


class Side(msgspec.Struct):
    """Totals of one run's traces (all its ranks together)."""

    path: str
    ranks: list[int]
    steps: int  # ProfilerStep spans, all ranks
    step_mean_us: float | None  # mean duration of those spans
    cpu_self_us: float  # self time of all CPU ops
    kernel_total_us: float  # sum of kernel durations
    gpu_busy_us: float  # union of kernel, memcpy and memset intervals, summed over ranks
    gpu_span_us: float  # first to last GPU activity, summed over ranks
    gpu_busy_pct: float | None
    findings: dict[str, int] = {}  # analyze's findings by severity ("high", "medium", "low", "info")


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
    flagged: bool  # mean_ratio >= factor or <= 1 / factor, and the change is above the threshold
    delta_per_step_us: float = (
        0.0  # test total per step - base total per step (totals when a run has no steps)
    )
    above_threshold: bool = False  # |delta_per_step_us| >= the diff's min_change_us


class Gate(msgspec.Struct):
    """A `--fail-on` condition and whether the test run breaches it (diff_gates.py)."""

    expression: str
    metric: str
    base: float | None  # ms per step; new_high: HIGH findings in base
    test: float | None  # ms per step; new_high: HIGH findings in test
    change_pct: float | None
    breached: bool
    delta_ms: float | None = None  # the change and its 95% interval (ms per step)
    low_ms: float | None = None
    high_ms: float | None = None
    reason: str = ""  # why it is breached, passed or undecided, in words
    outcome: str = "pass"  # "pass", "breach" (exit 3) or "undecided" (exit 4): the data cannot decide
    rank: int | None = (
        None  # the rank that breached (the largest change), or is undecided; null: the pooled ranks
    )
    ranks: list[int] = []  # every rank that breached (or, undecided, could not be decided)


class Diff(msgspec.Struct):
    schema: str
    factor: float
    min_change_us: float  # per step: ops and kernels with smaller changes are not listed
    base: Side
    test: Side
    step_time: StepComparison
    phases: list[Phase]  # of the profiled window, PHASES order
    findings: list[FindingChange]  # appeared, then disappeared, then changed; by cost
    kernels: list[Delta]  # every kernel whose count or total changed, by |delta_per_step_us|
    ops: list[Delta]  # same for CPU ops (self time)
    notices: list[str]
    gates: list[Gate] = []


def diff_paths(
    base: Any,
    test: Any,
    options: AnalysisOptions | None = None,
    *,
    factor: float = DEFAULT_FACTOR,
    progress: Callable[[], Any] | None = None,
    **changes: Any,
) -> Diff:
    """Compare two paths (a trace, a folder of traces or a run folder each) analysed with `options` (or the
    defaults with `changes`: AnalysisOptions' fields), each run folder's config.yaml patterns added to its side's
    `comm_patterns`: `step` picks the window of run folders; a run folder's
    metrics.jsonl gives the step time over its plain steps. Each side is analysed as `analyze_path` analyses it
    (`jobs`, `executor`, `scheduler`: where its ranks are analysed), one side after the other; `progress()`,
    where given, opens a context that gives each side's progress callback."""
    from stepscope.analysis.parallel import analyze_input
    from stepscope.analysis.read.source import as_source
    from stepscope.analysis.run.folder import load_run

    options = with_changes(options, changes)
    base, test = as_source(base), as_source(test)

    def side(path: Any) -> _Facts:
        # (a diff shows no critical path: the ranks' joint replay is a tenth of a side's time); each side with its
        # own run folder's communication patterns before the command line's
        mine = options.but(comm_patterns=path.comm_patterns(options.comm_patterns))
        if progress is None:
            done = analyze_input(path, mine, totals=True, critical_path=False)
        else:
            with progress() as bar:
                done = analyze_input(path, mine, progress=bar, totals=True, critical_path=False)
        totals = {rank: x.totals for rank, x in done.ranks.items() if x.totals is not None}
        return _facts_of(done.result, totals, done.notices, str(path))

    # one side at a time: what a diff keeps of a side is its analysis and its totals, never its rows
    base_facts = side(base)
    test_facts = side(test)
    return _compare(
        base_facts,
        test_facts,
        factor,
        load_run(base) if base.is_run_folder else None,
        load_run(test) if test.is_run_folder else None,
    )


def diff_tables(
    base: TraceTable,
    test: TraceTable,
    *,
    base_path: str = "base",
    test_path: str = "test",
    factor: float = DEFAULT_FACTOR,
    comm_patterns: Sequence[str] = (),
    base_run: Run | None = None,
    test_run: Run | None = None,
) -> Diff:
    """Compare two loaded runs; `base_run` / `test_run`: their run folders, for the step time of plain steps."""
    return _compare(
        _facts(base, base_path, comm_patterns),
        _facts(test, test_path, comm_patterns),
        factor,
        base_run,
        test_run,
    )


# Records of results: compared and printed by identity (see analyze.RankPart).
@dataclass(eq=False, repr=False)
class _Facts:
    """What a diff needs of one run, small: its side, its analysis, its kernels and ops by name, its notices."""

    side: Side
    result: AnalysisResult
    kernels: _Totals
    ops: _Totals
    notices: list[str]


def _facts(table: TraceTable, path: str, comm_patterns: Sequence[str]) -> _Facts:
    totals = rank_totals(table)
    table.derived.clear()  # (the analysis makes what it needs itself)
    return _facts_of(analyze(table, comm_patterns=comm_patterns), totals, list(table.notices), path)


def _facts_of(result: AnalysisResult, totals: dict[int, RankTotals], notices: list[str], path: str) -> _Facts:
    """A side from its ranks' totals (added up in ns, rounded once)."""
    steps = [ns for t in totals.values() for ns in t.step_ns]
    busy = sum(t.gpu_busy_ns for t in totals.values())
    span = sum(t.gpu_span_ns for t in totals.values())
    kernels: Counts = {}
    ops: Counts = {}
    for t in totals.values():
        add_counts(kernels, t.kernels)
        add_counts(ops, t.ops)
    side = Side(
        path=path,
        ranks=sorted(totals),
        steps=len(steps),
        step_mean_us=_us(sum(steps) / len(steps)) if steps else None,
        cpu_self_us=_us(sum(t.cpu_self_ns for t in totals.values())),
        kernel_total_us=_us(sum(t.kernel_ns for t in totals.values())),
        gpu_busy_us=_us(busy),
        gpu_span_us=_us(span),
        gpu_busy_pct=round(100.0 * busy / span, 2) if span else None,
    )
    return _Facts(
        side,
        result,
        {name: (calls, _us(ns)) for name, (calls, ns) in kernels.items()},
        _op_totals(ops),
        notices,
    )


def _compare(base: _Facts, test: _Facts, factor: float, base_run: Run | None, test_run: Run | None) -> Diff:
    b, t = base.side, test.side
    notices = [f"base: {n}" for n in base.notices] + [f"test: {n}" for n in test.notices]
    notices += [f"base: {n}" for n in (base_run.notes if base_run else [])]
    notices += [f"test: {n}" for n in (test_run.notes if test_run else [])]
    if b.steps != t.steps and b.steps and t.steps:
        notices.append(
            f"the runs have {b.steps} and {t.steps} profiler steps: op and kernel totals are per step"
        )
    if len(b.ranks) != len(t.ranks):
        notices.append(f"the runs have {len(b.ranks)} and {len(t.ranks)} ranks: totals pool all ranks")
    threshold = max(MIN_CHANGE_US, MIN_CHANGE_PCT / 100 * (b.step_mean_us or 0.0))
    base_result, test_result = base.result, test.result
    b.findings, t.findings = _by_severity(base_result.findings), _by_severity(test_result.findings)
    phases = phase_changes(base_result, test_result)
    per_step = (b.steps or 1, t.steps or 1) if b.steps and t.steps else (1, 1)
    return Diff(
        schema=DIFF_SCHEMA,
        factor=factor,
        min_change_us=round(threshold, 3),
        base=b,
        test=t,
        step_time=compare_step_times(base_result, test_result, base_run, test_run),
        phases=phases,
        findings=finding_changes(
            base_result.findings,
            test_result.findings,
            threshold,
            {p.name: None if p.low_ms is None else p.significant for p in phases},
            {
                (p.name, r.rank): None if r.low_ms is None else r.significant
                for p in phases
                for r in p.by_rank
            },
        ),
        kernels=_deltas(base.kernels, test.kernels, factor, per_step, threshold),
        ops=_deltas(base.ops, test.ops, factor, per_step, threshold),
        notices=notices,
    )


def _by_severity(findings: list[Finding]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in findings:
        out[f.severity] = out.get(f.severity, 0) + 1
    return out


def _round(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 4)


_Totals = dict[str, tuple[int, float]]  # name -> (count, total us)


def _op_totals(ops: Counts) -> _Totals:
    """Ops by name, the DataLoader's iterator variants as one (DATALOADER_OP), in us (each name's sum rounded
    first, as the op table shows it)."""
    out: _Totals = {}
    for name, (calls, self_ns) in sorted(ops.items(), key=lambda item: (-item[1][1], item[0])):
        key = DATALOADER_OP if _LOADER_OP.search(name) else name
        count, total = out.get(key, (0, 0.0))
        out[key] = (count + calls, round(total + _us(self_ns), 3))
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
        above = abs(per_step) >= floor_us
        flagged = above and ratio is not None and (ratio >= factor or ratio <= 1.0 / factor)
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
                above,
            )
        )
    out.sort(key=lambda d: (-abs(d.delta_per_step_us), -abs(d.delta_count), d.name))
    return out


def _ratio(new: float, old: float | None) -> float | None:
    return round(new / old, 4) if old else None


def _us(ns: float) -> float:
    return round(ns / 1000.0, 3)
