"""The critical path on the real traces of ../shared/traces: what docs/analysis.md's comparison with HTA relies on
(#29): our path walks back from each step's end, so its kinds add up to the step."""

from __future__ import annotations

import pytest

from stepscope.analysis.read.loader import load_trace
from stepscope.analysis.whatif import whatif

from ._traces import SHARED_TRACES


def test_each_steps_critical_path_adds_up_to_the_step_on_every_shared_trace() -> None:
    if not SHARED_TRACES.is_dir():
        pytest.skip("../shared/traces is absent")
    checked = 0
    for path in sorted(SHARED_TRACES.rglob("*.json*")):
        try:
            table = load_trace(path)
        except Exception:
            continue  # the bad-input traces of the set
        for rank in whatif(table).ranks:
            for step in rank.critical_path:
                # rounded to the us kind by kind: at most one us per kind apart
                assert sum(step.by_kind_ms.values()) == pytest.approx(step.step_ms, abs=0.008), (path, step)
                assert all(ms >= 0 for ms in step.by_kind_ms.values()), (path, step)
                checked += 1
    assert checked >= 40
