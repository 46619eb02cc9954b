from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

from ._traces import SHARED_TRACES


def load_chrome_trace(path: Path) -> dict[str, Any]:
    """Open a written trace the way a user's viewer would: gzip + JSON with traceEvents."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    assert isinstance(data, dict) and isinstance(data.get("traceEvents"), list), path
    return data


def profiler_steps(path: Path) -> list[int]:
    """The N of every ProfilerStep#N span in a written trace, sorted."""
    events = load_chrome_trace(path)["traceEvents"]
    return sorted(
        int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
    )


def require_shared_traces() -> Path:
    """The shared trace set, `../shared/traces` beside the clone. Where it is absent (a fresh clone elsewhere), a
    test that needs it is skipped, saying so; under CI (CI=true), which has the set, its absence is a failure:
    a broken path must not pass as a skip."""
    if SHARED_TRACES.is_dir():
        return SHARED_TRACES
    where = os.path.normpath(SHARED_TRACES)
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(f"CI=true but the shared trace set {where} (../shared/traces) is absent", pytrace=False)
    pytest.skip(f"needs the shared trace set ../shared/traces ({where}), absent here")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # before the test's fixtures: one that builds on a shared trace must not run (and fail) without it
    if item.get_closest_marker("shared") is not None:
        require_shared_traces()


@pytest.fixture
def shared_traces() -> Path:
    return require_shared_traces()
