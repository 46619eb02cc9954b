"""What-if selectors: `SELECTOR=FACTOR`, SELECTOR one of the phases (`data_loader`, `forward`, `backward`,
`optimizer`), `communication`, `sync`, `kernel:REGEX` or `op:REGEX`, optionally followed by `@RANKS` (`@2`,
`@0-3`, `@0,2`); FACTOR a number >= 0 (0 removes the work, 0.5 halves it).

What each selects on a rank (docs/analysis.md, "Critical path and what-if"):

- a phase: the host time in it (steps.assign_phases) and the GPU activities launched in it;
- `op:REGEX`: the host time inside CPU ops whose name matches (searched) and the GPU activities launched there;
- `kernel:REGEX`: GPU activities whose name matches (searched);
- `communication`: communication GPU activities and a CPU backend's collectives (cpu_comm.py): their transfer;
  the waiting for other ranks follows from their arrivals; with a CPU backend, also the host time inside the
  calls that issue them (`c10d::allreduce_`: on gloo, the call itself can take milliseconds);
- `sync`: the synchronizations' time (waiting and own).
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv
from stepscope.analysis.codes import unique_inverse
from stepscope.analysis.per_rank.comm.collectives import communication_intervals
from stepscope.analysis.per_rank.kernels import COMMUNICATION
from stepscope.analysis.per_rank.steps import PHASES, assign_phases, region_union
from stepscope.analysis.whatif.graph import RankGraph
from stepscope.analysis.whatif.replay import Scaling

KINDS = (*PHASES, "communication", "sync")
ISSUE_RE = re.compile(r"^(c10d|_c10d_functional)::")  # the host's calls that issue collectives
_RANK = re.compile(r"[0-9]{1,9}")  # (ASCII digits: str.isdigit takes '²', which int() refuses)
# A factor beyond this scales a step past anything a replay can stand behind (and ns durations times 10^12
# overflow int64); a slowdown of 1,000x is already a different job
MAX_FACTOR = 1000.0


class SelectorError(ValueError):
    """A selector or factor that cannot be used; the message says which and why."""


class Selector(msgspec.Struct, frozen=True):
    text: str  # as given
    kind: str  # a phase, "communication", "sync", "kernel" or "op"
    pattern: re.Pattern[str] | None
    ranks: tuple[tuple[int, int], ...] | None  # (first, last) rank ranges; None: every rank
    factor: float

    def applies_to(self, rank: int) -> bool:
        return self.ranks is None or any(first <= rank <= last for first, last in self.ranks)


def parse_selector(text: str) -> Selector:
    """`SELECTOR[@RANKS]=FACTOR` (see the module's doc); SelectorError when it is not one."""
    what, sep, number = text.rpartition("=")
    if not sep or not what:
        raise SelectorError(f"{text!r}: expected SELECTOR=FACTOR, e.g. data_loader=0 or kernel:gemm=0.5")
    try:
        factor = float(number)
    except ValueError:
        raise SelectorError(f"{text!r}: the factor {number!r} is not a number") from None
    if not 0 <= factor <= MAX_FACTOR:
        raise SelectorError(
            f"{text!r}: the factor must be a number from 0 to {MAX_FACTOR:,.0f} (0 removes, 0.5 halves, 2 doubles)"
        )
    ranks: tuple[tuple[int, int], ...] | None = None
    at = re.search(r"@([^@]*)$", what)
    # (after kernel: or op:, an @ is part of the regex unless what follows it reads as ranks: digits of any
    # script, commas, dashes, spaces; ranks of other digits than ASCII are then refused, not searched for)
    if at is not None and (not what.startswith(("kernel:", "op:")) or _reads_as_ranks(at.group(1))):
        what, spec = what[: at.start()], at.group(1)
        ranks = _ranks(text, spec)
    if what.startswith(("kernel:", "op:")):
        kind, _, regex = what.partition(":")
        if not regex:
            raise SelectorError(f"{text!r}: {kind}: needs a regular expression")
        try:
            pattern = re.compile(regex)
        except re.error as exc:
            raise SelectorError(f"{text!r}: bad regular expression {regex!r}: {exc}") from None
        return Selector(text, kind, pattern, ranks, factor)
    if what not in KINDS:
        raise SelectorError(
            f"{text!r}: unknown selector {what!r}; one of {', '.join(KINDS)}, kernel:REGEX, op:REGEX"
        )
    return Selector(text, what, None, ranks, factor)


def _reads_as_ranks(spec: str) -> bool:
    return any(c.isdigit() for c in spec) and all(c.isdigit() or c in ",- \t" for c in spec)


def _ranks(text: str, spec: str) -> tuple[tuple[int, int], ...]:
    """The (first, last) ranges of `@RANKS`, as given (never expanded: @0-999999999 is two numbers)."""
    out: list[tuple[int, int]] = []
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not _RANK.fullmatch(lo) or (dash and not _RANK.fullmatch(hi)):
            raise SelectorError(
                f"{text!r}: bad ranks {spec!r}; e.g. @2, @0-3, @0,2 (ranks of up to 9 digits)"
            )
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise SelectorError(f"{text!r}: bad rank range {part.strip()!r}")
        out.append((first, last))
    return tuple(out)


def scaling_for(graph: RankGraph, selectors: list[Selector]) -> Scaling:
    """The changes `selectors` make on one rank's graph."""
    scaling = Scaling(matched={})
    gpu = graph.gpu
    factor = np.ones(len(gpu))
    assert graph.data is not None, "a graph without its trace cannot be scaled"
    data = graph.data
    table = data.table
    for sel in selectors:
        if not sel.applies_to(graph.rank):
            continue
        took = np.zeros(len(gpu), dtype=bool)  # the GPU activities this selector takes
        if sel.kind == "sync":
            scaling.sync *= sel.factor
            scaling.matched[sel.text] = scaling.matched.get(sel.text, 0) + len(graph.syncs)
            continue
        host: iv.Intervals | None = None
        if sel.kind in PHASES:
            host = assign_phases(table).get(sel.kind)
        elif sel.kind == "op":
            assert sel.pattern is not None
            host = region_union(table, sel.pattern)
        elif sel.kind == "kernel":
            assert sel.pattern is not None
            if len(gpu):  # each distinct name searched once (thousands of kernels have a few dozen names)
                names, search = graph.names, sel.pattern.search
                codes, which = unique_inverse(gpu.name)
                hit = np.array([search(names[c]) is not None for c in codes.tolist()], dtype=bool)
                took |= hit[which]
        elif sel.kind == "communication":
            took |= gpu.kind == COMMUNICATION
            if not len(gpu):
                host = communication_intervals(data)
            elif not len(data.gpu):
                # a CPU backend's collectives (cpu_comm.py): the host's calls that issue them go with them
                host = region_union(table, ISSUE_RE)
        host_ranges = 0
        if host is not None and len(host[0]):
            scaling.host.append((host[0], host[1], sel.factor))
            at = np.searchsorted(host[0], gpu.launch, side="right") - 1
            took |= (at >= 0) & (gpu.launch < host[1][np.maximum(at, 0)])
            host_ranges = len(host[0])
        factor[took] *= sel.factor
        scaling.matched[sel.text] = scaling.matched.get(sel.text, 0) + int(took.sum()) + host_ranges
    scaling.gpu = factor if (factor != 1.0).any() else None
    return scaling
