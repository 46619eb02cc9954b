from __future__ import annotations

import os
from pathlib import Path

import pytest

from .support.jobs import run_ddp_job
from .support.traces import SHARED_TRACES


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


@pytest.fixture(scope="session", autouse=True)
def own_cache_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The suite's kept tables and answers go to a folder of its own, empty at the start: never the user's, and
    never one a run of other code filled."""
    if "STEPSCOPE_CACHE_DIR" not in os.environ:
        os.environ["STEPSCOPE_CACHE_DIR"] = str(tmp_path_factory.mktemp("stepscope-cache"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # before the test's fixtures: one that builds on a shared trace must not run (and fail) without it
    if item.get_closest_marker("shared") is not None:
        require_shared_traces()


@pytest.fixture
def shared_traces() -> Path:
    return require_shared_traces()


@pytest.fixture(scope="session")
def ddp_two_buckets_all_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of `run_ddp_job` with every rank traced: rank 2 is 60 ms late in each step."""
    return run_ddp_job(tmp_path_factory.mktemp("ddp_two_buckets_all"), profiled_ranks="all")
