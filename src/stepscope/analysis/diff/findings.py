"""Findings of two runs side by side (for diff.py): matched by id and rank, or by id and the ranks they hold on,
and what changed: appeared, disappeared, another severity, another price."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from stepscope.analysis.findings.rules import Finding

# The phase whose time a finding measures: its change says whether the finding moved or only its share of the step.
FINDING_PHASES = {
    "data_loader_stall": "data_loader",
    "optimizer_bound": "optimizer",
    "comm_bound": "communication",
    "python_overhead": "other",  # time with no torch op, most of it outside the annotated phases
}


class FindingChange(msgspec.Struct):
    """A finding in one run and not the other, or in both with another severity or price."""

    id: str
    rank: int | None  # test's; base's when it disappeared
    status: str  # "appeared" (only in test), "disappeared" (only in base), "changed"
    severity: str  # in test; in base when it disappeared
    base_severity: str | None  # null when it appeared
    base_cost_ms: float | None
    test_cost_ms: float | None
    message: str  # test's; base's when it disappeared
    ranks: list[int] = []  # the ranks it holds on (test's; base's when it disappeared)
    phase: str | None = None  # the phase whose time the finding measures (FINDING_PHASES)
    phase_significant: bool | None = None  # that phase changed significantly; null: unknown or too few values


def finding_ranks(f: Finding) -> frozenset[int | None]:
    """The ranks a finding holds on: its `ranks` where findings carry them, else its one rank."""
    ranks = getattr(f, "ranks", None)
    return frozenset(ranks) if ranks else frozenset({f.rank})


def match_findings(
    base: Sequence[Finding], test: Sequence[Finding]
) -> list[tuple[Finding | None, Finding | None]]:
    """Pair each finding of `base` with the finding of `test` that has its id and shares a rank with it (the
    one sharing the most ranks first); (f, None): only in base, (None, f): only in test. Findings with one rank
    match by (id, rank); findings grouped over ranks match when their rank sets overlap."""
    pairs: list[tuple[Finding | None, Finding | None]] = []
    unmatched = list(test)
    for bf in base:
        candidates = [
            (len(finding_ranks(bf) & finding_ranks(tf)), i)
            for i, tf in enumerate(unmatched)
            if tf.id == bf.id and finding_ranks(bf) & finding_ranks(tf)
        ]
        if candidates:
            _, i = max(candidates, key=lambda c: (c[0], -c[1]))
            pairs.append((bf, unmatched.pop(i)))
        else:
            pairs.append((bf, None))
    pairs.extend((None, tf) for tf in unmatched)
    return pairs


def finding_changes(
    base: list[Finding],
    test: list[Finding],
    threshold_us: float,
    phase_moved: dict[str, bool | None],
    rank_moved: dict[tuple[str, int], bool | None] | None = None,
) -> list[FindingChange]:
    """Findings that appeared, disappeared, changed severity, or changed price by at least `threshold_us`;
    `phase_moved`: whether each phase changed significantly over the ranks pooled (None: too few values to
    tell); `rank_moved`: the same per (phase, rank), which a finding on ranks present there is judged by (moved
    on any of its ranks) rather than by the pooled ranks."""
    out = []
    for bf, tf in match_findings(base, test):
        shown = tf if tf is not None else bf
        assert shown is not None
        phase_name = FINDING_PHASES.get(shown.id)
        moved = phase_moved.get(phase_name) if phase_name else None
        if phase_name and rank_moved:
            per_rank = [
                rank_moved[phase_name, r]
                for r in finding_ranks(shown)
                if r is not None and (phase_name, r) in rank_moved
            ]
            if per_rank:
                moved = True if any(per_rank) else (False if all(m is False for m in per_rank) else None)
        if bf is None:
            status = "appeared"
        elif tf is None:
            status = "disappeared"
        else:
            status = "changed"
            cost_moved = (
                bf.cost_ms_per_step is not None
                and tf.cost_ms_per_step is not None
                and abs(tf.cost_ms_per_step - bf.cost_ms_per_step) * 1e3 >= threshold_us
            )
            if bf.severity == tf.severity and not cost_moved:
                continue
        out.append(
            FindingChange(
                id=shown.id,
                rank=shown.rank,
                status=status,
                severity=shown.severity,
                base_severity=bf.severity if bf is not None else None,
                base_cost_ms=bf.cost_ms_per_step if bf is not None else None,
                test_cost_ms=tf.cost_ms_per_step if tf is not None else None,
                message=shown.message,
                ranks=sorted(r for r in finding_ranks(shown) if r is not None),
                phase=phase_name,
                phase_significant=moved,
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
