"""The one task runner (`stepscope.analysis.tasks.run_tasks`): every task's result whatever runs it, a task's own
error raised as it is (a file it cannot read: in its place), a lost worker's tasks run in this process, progress that only grows to the total."""

from __future__ import annotations

import os

import pytest

from stepscope.analysis.tasks import Failed, batches, run_tasks
from stepscope.errors import InputError

PARENT = os.getpid()


def square(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError(f"task {x} failed")
    return x


def unreadable_three(x: int) -> int:
    if x == 3:
        raise InputError(f"/data/rank{x}.json", "not valid JSON")
    return x


def die_in_a_worker(x: int) -> tuple[int, int]:
    if x == 5 and os.getpid() != PARENT:
        os._exit(9)  # a worker killed (the OOM killer, a signal)
    return x * x, os.getpid()


@pytest.mark.parametrize("workers", [1, 2])
def test_every_task_once_with_its_own_result(workers: int) -> None:
    got = dict(run_tasks(square, [(x,) for x in range(12)], workers=workers, weights=list(range(12))))
    assert {i: r[0] for i, r in got.items()} == {x: x * x for x in range(12)}
    pids = {r[1] for r in got.values()}
    assert (pids == {PARENT}) == (workers == 1)


def test_a_tasks_error_is_raised_as_it_is() -> None:
    with pytest.raises(ValueError, match="task 3 failed"):
        list(run_tasks(fail_on_three, [(x,) for x in range(8)], workers=2))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_file_a_task_cannot_read_comes_back_in_its_place(workers: int) -> None:
    # (every caller then skips it or raises it, as one file of a folder is skipped or named)
    got = dict(run_tasks(unreadable_three, [(x,) for x in range(8)], workers=workers))
    assert got[3] == Failed("/data/rank3.json", "not valid JSON")
    assert str(got[3].error()) == "/data/rank3.json: not valid JSON"
    assert {i: r for i, r in got.items() if i != 3} == {x: x for x in range(8) if x != 3}


def test_a_lost_worker_leaves_its_tasks_to_this_process() -> None:
    got = dict(run_tasks(die_in_a_worker, [(x,) for x in range(10)], workers=2))
    assert {i: r[0] for i, r in got.items()} == {x: x * x for x in range(10)}
    assert got[5][1] == PARENT


def test_progress_grows_to_the_total_in_batches() -> None:
    calls: list[tuple[int, int, str]] = []
    labels = [f"t{x}" for x in range(10)]
    list(
        run_tasks(
            square,
            [(x,) for x in range(10)],
            workers=2,
            weights=[10] * 10,
            labels=labels,
            progress=lambda done, total, label: calls.append((done, total, label)),
        )
    )
    done = [c[0] for c in calls]
    assert done == sorted(done) and calls[-1][:2] == (100, 100)
    assert len(calls) < 10  # one report per batch, not per task


def test_batches_are_guided_large_first_then_single() -> None:
    cut = batches(list(range(10)), 2)
    assert [len(b) for b in cut] == [2, 2, 1, 1, 1, 1, 1, 1]
    assert [i for b in cut for i in b] == list(range(10))
