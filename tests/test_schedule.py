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
