from __future__ import annotations

import gzip
import json
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


@pytest.fixture
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip("../shared/traces is not present")
    return SHARED_TRACES
