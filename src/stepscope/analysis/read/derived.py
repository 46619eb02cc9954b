"""What analyses derive from a table's rows, typed, computed once and kept with the table (`TraceTable.derived`).

Lifetime: a table's derived values live as long as the table, except where an analysis says otherwise, in one
place each: `analyze` keeps only the op trees once a rank's per-rank analyses are done (`keep_only_op_trees`: on a
big trace the rest is a hundred MB or more), and `diff` drops them all before it loads the other run (`clear`).
A table made by `TraceTable.select` starts with none (its rows differ). Every array here is read-only: it is
shared by every caller.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec
import numpy as np

from stepscope.analysis import intervals as iv

__all__ = ["THREAD_KEYS", "DerivedRows", "OpTree", "is_constant", "new_thread_mask"]

THREAD_KEYS = ("rank", "pid", "tid")  # the columns that tell one thread from another


# Records of arrays: compared and printed by identity (a field-wise == of arrays raises, and their repr
# would print the arrays); generating __eq__ and __repr__ cost ~0.15 ms of every start.
class OpTree(msgspec.Struct, eq=False, frozen=True):
    """The complete events of some categories in thread order (by thread, then start, longest first), with each
    one's innermost enclosing event among them (what one pass with a stack of the open events gives, thread by
    thread); built by rank.summary.op_tree."""

    rows: np.ndarray  # table rows, in that order
    parent: np.ndarray  # position in `rows` of the enclosing event, -1 for none
    nested: bool = False  # every thread's events nest (each inside its parent, siblings apart)

    def new_thread(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """True where a thread's events begin in `rows` (`columns`: the table's)."""
        new = new_thread_mask([], len(self.rows))
        for (
            k
        ) in THREAD_KEYS:  # (one column at a time, none that is constant: each is tens of MB on a big trace)
            if not is_constant(columns[k]):
                key = columns[k][self.rows]
                new[1:] |= key[1:] != key[:-1]
        return new


def new_thread_mask(keys: list[np.ndarray], n: int) -> np.ndarray:
    """True where a thread's events begin among `n` events grouped by thread (`keys`: the thread columns)."""
    new = np.zeros(n, dtype=bool)
    if n:
        new[0] = True
        for key in keys:
            new[1:] |= key[1:] != key[:-1]
    return new


def is_constant(column: np.ndarray) -> bool:
    return len(column) == 0 or bool(column.min() == column.max())


class DerivedRows(msgspec.Struct, eq=False):
    """The values derived from one table's rows, by what they are; keys are the categories (or the region
    pattern) each was computed for."""

    complete_rows: dict[tuple[str, ...], np.ndarray] = msgspec.field(
        default_factory=dict
    )  # TraceTable.complete_rows
    self_times: dict[tuple[str, ...], np.ndarray] = msgspec.field(
        default_factory=dict
    )  # rank.summary.self_times
    op_trees: dict[tuple[str, ...], OpTree] = msgspec.field(default_factory=dict)  # rank.summary.op_tree
    region_spans: dict[re.Pattern[str], iv.Intervals | None] = msgspec.field(
        default_factory=dict
    )  # rank.steps
    region_unions: dict[re.Pattern[str], iv.Intervals | None] = msgspec.field(
        default_factory=dict
    )  # rank.steps
    phases: dict[str, iv.Intervals] | None = None  # rank.steps.assign_phases
    collective_rows: list[tuple[int, str, str]] | None = None  # rank.comm.collectives.cpu_rows

    def keep_only_op_trees(self, *category_sets: tuple[str, ...]) -> None:
        """Drop everything but the op trees of `category_sets`."""
        kept = {key: self.op_trees[key] for key in category_sets if key in self.op_trees}
        self.clear()
        self.op_trees.update(kept)

    def clear(self) -> None:
        self.complete_rows.clear()
        self.self_times.clear()
        self.op_trees.clear()
        self.region_spans.clear()
        self.region_unions.clear()
        self.phases = None
        self.collective_rows = None
