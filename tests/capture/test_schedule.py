from __future__ import annotations

import pytest

from stepscope.capture.schedule import Phase, Schedule
from stepscope.errors import ConfigError

SETTINGS = [
    dict(wait=0, warmup=0, active=1, repeat=1, skip_first=0),
    dict(wait=1, warmup=1, active=2, repeat=2, skip_first=0),
    dict(wait=2, warmup=1, active=3, repeat=3, skip_first=4),
    dict(wait=5, warmup=2, active=3, repeat=0, skip_first=1),
    dict(wait=0, warmup=2, active=1, repeat=0, skip_first=0),
]


@pytest.mark.parametrize("kw", SETTINGS)
def test_phases_match_torch_profiler_schedule(kw: dict[str, int]) -> None:
    # GIVEN torch's own schedule as the oracle
    from torch.profiler import ProfilerAction, schedule

    torch_fn = schedule(**kw)
    ours = Schedule(**kw)
    names = {
        ProfilerAction.NONE: Phase.NONE,
        ProfilerAction.WARMUP: Phase.WARMUP,
        ProfilerAction.RECORD: Phase.RECORD,
        ProfilerAction.RECORD_AND_SAVE: Phase.RECORD_AND_SAVE,
    }
    # THEN every step of the first 60 has the same phase
    assert [ours.phase(s) for s in range(60)] == [names[torch_fn(s)] for s in range(60)]


def test_windows_and_first_window_end() -> None:
    s = Schedule(wait=2, warmup=1, active=3, repeat=2, skip_first=4)
    assert s.windows() == [(7, 9), (13, 15)]
    assert s.first_window_end == 9
    assert s.last_step() == 15
    assert [st for st in range(20) if s.is_active(st)] == [7, 8, 9, 13, 14, 15]
    assert s.first_untraced_step_from(6) == 10
    assert Schedule(repeat=0).last_step() is None


@pytest.mark.parametrize("kw", SETTINGS)
def test_window_end_is_the_last_active_step_of_each_traced_step(kw: dict[str, int]) -> None:
    s = Schedule(**kw)
    for first, last in s.windows(limit=4):
        for step in range(first - s.warmup, last + 1):
            assert s.window_end(step) == last


@pytest.mark.parametrize(
    ("kw", "option"),
    [
        ({"active": 0}, "active"),
        ({"wait": -1}, "wait"),
        ({"repeat": -2}, "repeat"),
        ({"skip_first": 1.5}, "skip_first"),
    ],
)
def test_invalid_schedule_names_the_option(kw: dict[str, object], option: str) -> None:
    with pytest.raises(ConfigError, match=f"'{option}'"):
        Schedule(**kw)  # type: ignore[arg-type]


def test_next_window_start_is_the_first_window_start_a_walk_finds() -> None:
    # GIVEN every small schedule, and the walk step by step that next_window_start replaces
    import itertools

    from stepscope.capture.schedule import NEVER_STEP

    def walk(s: Schedule, step: int) -> int:
        while (step := s.next_traced_step(step)) != NEVER_STEP:
            if s.is_active(step) and not (step > 0 and s.phase(step - 1) is Phase.RECORD):
                return step
            step += 1
        return NEVER_STEP

    for wait, warmup, active, repeat, skip in itertools.product(
        range(3), range(3), range(1, 4), range(3), range(3)
    ):
        s = Schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip)
        # THEN both give the same step from every step of the first 40
        assert [s.next_window_start(k) for k in range(40)] == [walk(s, k) for k in range(40)]
    # AND a window of 100,000 steps costs no walk: the answer from its middle is the next cycle's
    big = Schedule(wait=1, warmup=0, active=100_000, repeat=0)
    assert big.next_window_start(50_000) == 100_002


def test_active_is_bounded_with_its_reason() -> None:
    from stepscope.capture.schedule import MAX_ACTIVE

    Schedule(active=MAX_ACTIVE)
    with pytest.raises(ConfigError, match=r"'active': must be an integer from 1 to 100,000 \(got 1000000\)"):
        Schedule(active=1_000_000)
