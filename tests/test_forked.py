"""The forked workers of the many-rank analysis: results in order, errors raised here with the child's
traceback, a lost child noticed, no child left behind; and the analysis the same whichever pool ran it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from stepscope.analysis import _forked, parallel
from stepscope.analysis.parallel import analyze_path
from tests._traces import SHARED_TRACES

pytestmark = pytest.mark.skipif(not _forked.available(), reason="no os.fork here")

ROOT = Path(__file__).resolve().parents[1]
BASE = SHARED_TRACES / "hta_trace_filter" / "sampled_rank-0.json.gz"


def _gone(pid: int) -> bool:
    """Whether child `pid` has been reaped (not running, not a zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_batches_come_back_in_order_from_several_children() -> None:
    batches = [[0, 1, 2], [3, 4], [5], [6], [7]]
    seen: list[int] = []
    out = _forked.run_forked(lambda i: (i * i, os.getpid()), batches, 3, lambda k, _: seen.append(k))
    assert [[v for v, _ in batch] for batch in out] == [[0, 1, 4], [9, 16], [25], [36], [49]]
    assert sorted(seen) == [0, 1, 2, 3, 4]
    pids = {pid for batch in out for _, pid in batch}
    assert os.getpid() not in pids and 1 <= len(pids) <= 3
    assert all(_gone(pid) for pid in pids)


def test_an_exception_in_a_child_is_raised_here_with_its_traceback() -> None:
    def fn(i: int) -> int:
        if i == 3:
            raise KeyError("rank 3 is odd")
        return i

    with pytest.raises(KeyError, match="rank 3 is odd") as info:
        _forked.run_forked(fn, [[0], [1], [2], [3], [4]], 2)
    assert isinstance(info.value.__cause__, _forked.ChildTraceback)
    assert "in fn" in str(info.value.__cause__)


def test_an_exception_that_does_not_pickle_arrives_by_name() -> None:
    class Local(Exception):  # (a local class: pickle cannot find it)
        pass

    def fn(i: int) -> int:
        raise Local("no way back")

    with pytest.raises(RuntimeError, match="Local: no way back"):
        _forked.run_forked(fn, [[0]], 1)


def _pids(log: Path) -> set[int]:
    return {int(line) for line in log.read_text().split()}


def test_a_child_that_dies_is_noticed_and_reaped(tmp_path: Path) -> None:
    log = tmp_path / "pids"

    def fn(i: int) -> int:
        with log.open("a") as fh:
            fh.write(f"{os.getpid()}\n")
        if i == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return i

    with pytest.raises(_forked.ChildLost):
        _forked.run_forked(fn, [[0], [1], [2], [3]], 2)
    assert len(_pids(log)) == 2
    assert all(_gone(pid) for pid in _pids(log))  # neither running nor a zombie


def test_an_error_here_stops_the_children(tmp_path: Path) -> None:
    log = tmp_path / "pids"

    def fn(i: int) -> int:
        with log.open("a") as fh:
            fh.write(f"{os.getpid()}\n")
        return i

    def done(k: int, values: list[int]) -> None:
        raise RuntimeError("the progress bar broke")

    with pytest.raises(RuntimeError, match="progress bar broke"):
        _forked.run_forked(fn, [[0], [1], [2], [3]], 2, done)
    assert _pids(log) and all(_gone(pid) for pid in _pids(log))


@pytest.fixture(scope="module")
def ranks6(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranks6")
    make = [
        sys.executable,
        str(ROOT / "benchmarks" / "make_big_trace.py"),
        "--ranks",
        "6",
        "--slow-ms",
        "100",
    ]
    subprocess.run([*make, "--base", str(BASE), "--out", str(out)], check=True, capture_output=True)
    return out


def test_a_lost_worker_means_the_ranks_are_analysed_here(
    ranks6: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = msgspec.json.encode(analyze_path(ranks6, jobs=1))
    parent = os.getpid()
    analyze_file = parallel.analyze_file

    def dies_in_a_child(path: str, hint: int | None, options: parallel.Options) -> parallel.FileResult:
        if os.getpid() != parent and path.endswith("rank4.json.gz"):
            os.kill(os.getpid(), signal.SIGKILL)
        return analyze_file(path, hint, options)

    monkeypatch.setattr(parallel, "analyze_file", dies_in_a_child)
    assert msgspec.json.encode(analyze_path(ranks6, jobs=2)) == one


def test_without_fork_a_spawned_pool_gives_the_same_result(
    ranks6: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = msgspec.json.encode(analyze_path(ranks6, jobs=1))
    monkeypatch.setattr(_forked, "available", lambda: False)
    assert msgspec.json.encode(analyze_path(ranks6, jobs=2)) == one


def test_the_collector_is_left_as_it_was() -> None:
    import gc

    assert gc.get_freeze_count() == 0
    _forked.run_forked(lambda i: i, [[0], [1]], 2)
    assert gc.get_freeze_count() == 0  # (frozen for the forks only)
