"""The watch's windows compared with a plain window (analysis/run/anomaly.py), on ranks whose steps are made with
known answers: which rank's phase holds the extra time, who waited, what is said when the data cannot tell."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from stepscope.analysis.per_rank.steps import StepRow
from stepscope.analysis.run.anomaly import PlannedWindow, compare, fallback_reference, watch_windows
from stepscope.runfolder.payloads import WatchRecord

PHASES = ("dataloader_us", "forward_us", "backward_us", "optimizer_us")


@dataclass
class Rank:
    rank: int
    steps: list[StepRow]
    collectives: list[Any] = field(default_factory=list)
    top_kernels: list[Any] = field(default_factory=list)


@dataclass
class Result:
    ranks: list[Rank] = field(default_factory=list)


def step(number: int, rng: random.Random, extra: dict[str, float] | None = None) -> StepRow:
    """A CPU step of ~12 ms with some noise: 0.1 ms data loading, 1 / 1.5 / 0.5 ms forward / backward /
    optimizer, 3 ms communication, the rest other code; `extra` adds ms to a phase ("rest": the rest)."""
    extra = extra or {}
    parts = {"dataloader_us": 100.0, "forward_us": 1000.0, "backward_us": 1500.0, "optimizer_us": 500.0}
    parts = {k: v * rng.uniform(0.9, 1.1) + 1e3 * extra.get(k, 0.0) for k, v in parts.items()}
    comm = 3000.0 * rng.uniform(0.9, 1.1) + 1e3 * extra.get("comm_us", 0.0)
    rest = 6000.0 * rng.uniform(0.95, 1.05) + 1e3 * extra.get("rest", 0.0)
    dur = sum(parts.values()) + comm + rest
    return StepRow(number, 0.0, dur, None, comm, 0, **parts)


def window(ranks: int, steps: range, slow: dict[int, dict[int, dict[str, float]]], seed: int = 0) -> Result:
    """`slow`: step -> rank -> extra ms by phase."""
    rng = random.Random(seed)
    return Result([Rank(r, [step(s, rng, slow.get(s, {}).get(r)) for s in steps]) for r in range(ranks)])


PLANNED = PlannedWindow(
    first=320, last=322, why="3 slow steps in 3", decision="window", asked_by=2, ranks=[0, 1, 2, 3], late=[]
)


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_one_ranks_slow_data_loading_is_the_cause_and_the_others_waited(ranks: int) -> None:
    # GIVEN rank 1 loading data 50 ms longer in steps 320 and 321, the other ranks waiting as long at a collective
    slow = {
        s: {r: ({"dataloader_us": 50.0} if r == 1 else {"comm_us": 50.0}) for r in range(ranks)}
        for s in (320, 321)
    }
    anomaly = window(ranks, range(320, 323), slow, seed=ranks)
    reference = window(ranks, range(42, 45), {}, seed=ranks + 100)
    found = compare(PLANNED, anomaly.ranks, reference.ranks, [42, 44])
    # THEN the slow steps, the cause and who waited are recovered, with the injected 50 ms
    assert found.slow_steps == [320, 321]
    assert found.cause_ranks == [1] and found.cause_phase == "data_loader"
    assert found.cause_ms is not None and abs(found.cause_ms - 50.0) < 1.0
    assert found.waited == [r for r in range(ranks) if r != 1]
    assert found.extra_ms is not None and abs(found.extra_ms - 50.0) < 2.0
    assert found.factor is not None and 4.5 < found.factor < 5.5
    assert "rank 1's data loading (+50" in found.message and "on every rank" in found.message
    assert "they agree" in found.check


def test_slowness_of_every_ranks_own_code_names_every_rank() -> None:
    # GIVEN every rank running 30 ms of other code (a checkpoint, say) in step 300
    slow = {300: {r: {"rest": 30.0} for r in range(2)}}
    found = compare(
        PLANNED, window(2, range(300, 303), slow).ranks, window(2, range(42, 45), {}, 1).ranks, [42, 44]
    )
    assert found.slow_steps == [300] and found.cause_ranks in ([0, 1], [1, 0]) and found.cause_phase == "rest"
    assert found.waited == []
    assert "Step 300 took" in found.message and "one slow step" in found.check


def test_a_wait_inside_the_users_backward_region_is_waiting_not_the_cause() -> None:
    # GIVEN rank 1's forward 38 ms heavier, and rank 0 waiting as long at an all-reduce that runs inside its
    # backward region (DDP under `monitor.region("backward")`: the wait counts in backward and in communication)
    slow = {s: {0: {"backward_us": 38.0, "comm_us": 38.0}, 1: {"forward_us": 38.0}} for s in (231, 232, 233)}
    anomaly = window(2, range(231, 234), slow)
    # (the step's length: the wait once, not twice)
    for row in anomaly.ranks[0].steps:
        row.dur_us -= 38e3
    found = compare(PLANNED, anomaly.ranks, window(2, range(42, 45), {}, 4).ranks, [42, 44])
    # THEN rank 1's forward is the cause, and rank 0 waited
    assert found.cause_ranks == [1] and found.cause_phase == "forward", found.message
    assert found.waited == [0]
    assert "rank 1's forward (+38" in found.message


def test_causes_in_different_phases_are_each_named_with_their_own() -> None:
    slow = {300: {0: {"optimizer_us": 40.0}, 1: {"forward_us": 40.0}}}
    found = compare(
        PLANNED, window(2, range(300, 303), slow).ranks, window(2, range(42, 45), {}, 6).ranks, None
    )
    assert "rank 0's optimizer +40" in found.message and "rank 1's forward +40" in found.message, (
        found.message
    )


def test_many_cause_ranks_make_one_line_naming_the_largest_and_counting_the_rest() -> None:
    # GIVEN 64 ranks: ranks 0-39 each 40-79 ms longer in their forward, ranks 40-63 waiting at a collective
    ranks = 64
    slow = {
        s: {r: ({"forward_us": 40.0 + r} if r < 40 else {"comm_us": 60.0}) for r in range(ranks)}
        for s in (320, 321)
    }
    found = compare(
        PLANNED,
        window(ranks, range(320, 323), slow).ranks,
        window(ranks, range(42, 45), {}, 7).ranks,
        [42, 44],
    )
    assert sorted(found.cause_ranks) == list(range(40))
    # THEN the largest four causes are named, the other 36 counted, the waiting ranks said as one range
    assert "rank 39 +79" in found.message and "rank 36 +76" in found.message, found.message
    assert "rank 35 +" not in found.message and "and 36 more ranks" in found.message
    assert "the others waited" in found.message
    assert len(found.message) < 400


def test_waits_that_do_not_match_any_own_work_are_said_to_be_communication() -> None:
    slow = {s: {r: {"comm_us": 40.0} for r in range(4)} for s in (320, 321, 322)}
    found = compare(
        PLANNED, window(4, range(320, 323), slow).ranks, window(4, range(42, 45), {}, 3).ranks, [42, 44]
    )
    assert found.cause_ranks == [] and found.cause_phase is None
    assert "no rank's own work accounts for it" in found.message


def test_a_window_after_the_slowness_or_without_a_plain_window_says_so() -> None:
    calm = window(2, range(451, 454), {})
    found = compare(PLANNED, calm.ranks, window(2, range(42, 45), {}, 5).ranks, [42, 44])
    assert found.slow_steps == [] and "over before the window began" in found.message
    none = compare(PLANNED, calm.ranks, None, None)
    assert none.factor is None and "no plain window" in none.message


def record(rank: int, decision: str, window: tuple[int, int] | None, step: int = 0) -> WatchRecord:
    return WatchRecord(
        step=step, rank=rank, decision=decision, why=f"why {rank}", unix_time=0.0, window=window
    )


def test_the_records_give_each_window_once_its_asker_and_the_ranks_that_read_it_late() -> None:
    records = [
        record(0, "reference", (42, 44)),
        record(1, "reference", (42, 44)),
        record(2, "window", (203, 205)),
        record(1, "joined", (203, 205)),
        record(0, "joined", (207, 209)),  # read the claim late
        record(1, "planned", (300, 302)),
        record(0, "skipped", None),
        record(1, "window", (400, 402)),  # its trace was never written
    ]
    windows, reference = watch_windows(records, traced={44, 205, 209, 302})
    assert reference == [42, 44]
    assert [(w.first, w.last, w.asked_by, w.decision) for w in windows] == [
        (203, 205, 2, "window"),
        (300, 302, 1, "planned"),
    ]
    assert windows[0].ranks == [1, 2]
    assert windows[0].late == ["rank 0 recorded steps 207-209 (it read the request late)"]
    assert windows[0].also == [209]


def test_without_a_reference_record_the_last_plain_window_before_the_watchs_is_taken() -> None:
    windows, reference = watch_windows([record(0, "window", (203, 205))], traced={9, 150, 205, 260})
    assert reference is None
    spans = [(7, 9), (148, 150), (203, 205), (258, 260)]
    assert fallback_reference(windows, spans) == [148, 150]
    assert fallback_reference(windows, [(203, 205), (258, 260)]) == [258, 260]
    assert fallback_reference(windows, [(203, 205)]) is None


def test_the_collectives_and_kernels_that_grew_are_listed_per_step_of_the_window() -> None:
    # GIVEN rank 0 waiting 100 ms more at its all-reduce over a window of 3 steps, and a kernel 30 ms longer
    def coll(time: float, wait: float) -> Any:
        return SimpleNamespace(kind="all_reduce", group="0", time_ms=time, wait_ms=wait)

    def kernel(total_ms: float) -> Any:
        return SimpleNamespace(name="gemm", total_us=total_ms * 1e3)

    slow = {
        320: {0: {"comm_us": 50.0}, 1: {"dataloader_us": 50.0}},
        321: {0: {"comm_us": 50.0}, 1: {"dataloader_us": 50.0}},
    }
    anomaly = window(2, range(320, 323), slow)
    reference = window(2, range(42, 45), {}, 9)
    anomaly.ranks[0].collectives = [coll(109.0, 103.0)]
    reference.ranks[0].collectives = [coll(9.0, 3.0)]
    anomaly.ranks[0].top_kernels = [kernel(33.0)]
    reference.ranks[0].top_kernels = [kernel(3.0)]
    found = compare(PLANNED, anomaly.ranks, reference.ranks, [42, 44])
    # THEN per step of the window: the all-reduce +33.3 ms (its waiting too), the kernel +10 ms
    (rank0,) = [r for r in found.ranks if r.rank == 0]
    assert [(w.kind, w.name) for w in rank0.work] == [
        ("collective", "all_reduce, group 0"),
        ("kernel", "gemm"),
    ]
    assert rank0.work[0].extra_ms == pytest.approx(100 / 3, abs=0.01)
    assert rank0.work[0].wait_extra_ms == pytest.approx(100 / 3, abs=0.01)
    assert rank0.work[1].extra_ms == pytest.approx(10.0, abs=0.01)
    assert [r.work for r in found.ranks if r.rank == 1] == [[]]
