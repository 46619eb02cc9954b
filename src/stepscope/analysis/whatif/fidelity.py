"""How far a replay lands from what the trace measured, and what its graph is known to miss: the replay's own error,
which every use of it reports (`whatif`, analyze's critical path, the findings it prices).

Replaying a rank with nothing changed must give back its measured steps: the graph keeps the delays the trace
shows (a kernel that started late for a reason the trace does not name starts as late), so on every shared trace
the replay lands on the measured steps. Where it does not (a wait the graph cannot express, collectives released
before all their ranks arrived, a step whose work spills into the next), its predictions and its critical path
inherit that error, and are labelled approximate beyond REPLAY_TRUST_PCT. The error is per step, replayed less
measured over measured, and per rank the mean step's; what the graph is known to miss (its notes: stream waits
without an event record, ...) is the reason given.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import msgspec
import numpy as np

if TYPE_CHECKING:
    from stepscope.analysis.whatif.graph import RankGraph

REPLAY_TRUST_PCT = 5.0  # beyond this error of its mean step, a rank's replay is approximate
OVERLAP_TOLERANCE_NS = 1_000  # a stream's activities overlapping by less are the clocks' rounding


class ReplayFidelity(msgspec.Struct):
    """One rank's replay with nothing changed against its measured steps."""

    rank: int
    error_pct: float | None  # (mean replayed step - mean measured step) / mean measured step
    step_error_pct: list[float]  # the same per step, in step order
    approximate: bool  # |error_pct| > REPLAY_TRUST_PCT
    reasons: list[str] = []  # what the rank's graph is known to miss, in short


def fidelity(
    rank: int, measured_ns: np.ndarray, replayed_ns: np.ndarray, notes: Iterable[str]
) -> ReplayFidelity:
    """The replay's error on one rank from its measured and replayed step lengths (same steps, same order) and
    its graph's notes."""
    measured = np.asarray(measured_ns, dtype=np.float64)
    replayed = np.asarray(replayed_ns, dtype=np.float64)
    n = min(len(measured), len(replayed))
    measured, replayed = measured[:n], replayed[:n]
    ok = measured > 0
    steps = [round(float(x), 3) for x in 100.0 * (replayed[ok] - measured[ok]) / measured[ok]]
    mean = float(measured.mean()) if n else 0.0
    error = round(100.0 * (float(replayed.mean()) - mean) / mean, 3) if mean > 0 else None
    approximate = error is not None and abs(error) > REPLAY_TRUST_PCT
    return ReplayFidelity(rank, error, steps, approximate, short_reasons(notes) if approximate else [])


def limits(graph: RankGraph) -> list[str]:
    """What the rank's graph is known to miss or to read differently from the trace: its notes, and the GPU
    activities that overlap the one before them on their stream (the replay runs a stream's work one at a time,
    so it lengthens what the trace shows overlapped)."""
    out = list(graph.notes)
    gpu = graph.gpu
    if len(gpu) and not graph.cpu_backend:
        prev = gpu.prev
        has = prev >= 0
        overlapping = int(
            (gpu.start[has] < gpu.start[prev[has]] + gpu.dur[prev[has]] - OVERLAP_TOLERANCE_NS).sum()
        )
        if overlapping:
            out.append(
                f"{overlapping} GPU activities start before the one before them on their stream ends: the replay "
                "runs a stream's work one at a time"
            )
    return out


def short_reasons(notes: Iterable[str]) -> list[str]:
    """Each of the graph's notes up to its first colon (what is missing, not what the replay does about it); a
    general reason where it has none."""
    out = [note.split(":")[0].strip() for note in notes if note.strip()]
    return out or [
        "the trace leaves out what held some work back (an untraced thread, a wait it records no edge for)"
    ]


def approximate_text(f: ReplayFidelity) -> str:
    """'the replay of rank 3 is +17.0% off its measured steps (412 of 425 stream waits ... have no ...)'."""
    why = "; ".join(f.reasons)
    return f"the replay of rank {f.rank} is {f.error_pct:+.1f}% off its measured steps ({why})"
