"""The forked workers of the many-rank analysis: results in order, errors raised here with the child's
traceback, a lost child noticed, no child or file descriptor left behind; and the analysis the same whichever
pool ran it."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from stepscope.analysis.ranks import _forked, parallel
from stepscope.analysis.ranks.parallel import analyze_path
from tests._traces import SHARED_TRACES

pytestmark = pytest.mark.skipif(not _forked.available(), reason="no safe os.fork here")

ROOT = Path(__file__).resolve().parents[1]
BASE = SHARED_TRACES / "hta_trace_filter" / "sampled_rank-0.json.gz"


def _gone(pid: int) -> bool:
    """Whether child `pid` has been reaped (not running, not a zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def _logging(log: Path, fn=lambda i: i):  # type: ignore[no-untyped-def]
    """`fn` that first notes the pid of the process running it in `log`."""

    def logged(i: int):  # type: ignore[no-untyped-def]
        with log.open("a") as fh:
            fh.write(f"{os.getpid()}\n")
        return fn(i)

    return logged


def _pids(log: Path) -> set[int]:
    return {int(line) for line in log.read_text().split()}


def test_batches_come_back_in_order_from_several_children() -> None:
    def fn(i: int) -> tuple[int, int]:
        if i == 0:
            time.sleep(0.3)  # the first batch comes back last
        return i * i, os.getpid()

    batches = [[0, 1, 2], [3, 4], [5], [6], [7]]
    seen: list[int] = []
    out = _forked.run_forked(fn, batches, 3, lambda k, _: seen.append(k))
    assert [[v for v, _ in batch] for batch in out] == [[0, 1, 4], [9, 16], [25], [36], [49]]
    assert sorted(seen) == [0, 1, 2, 3, 4] and seen[-1] == 0
    pids = {pid for batch in out for _, pid in batch}
    assert os.getpid() not in pids and 2 <= len(pids) <= 3
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


class TwoArgs(Exception):
    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")


def test_exceptions_that_do_not_make_the_trip_arrive_by_name() -> None:
    class Local(Exception):  # (a local class: pickle cannot find it)
        pass

    def unpicklable(i: int) -> int:
        raise Local("no way back")

    def unloadable(i: int) -> int:
        raise TwoArgs("rank0.json", "odd")  # pickles, but its __init__ wants two arguments to load

    with pytest.raises(RuntimeError, match="Local: no way back"):
        _forked.run_forked(unpicklable, [[0]], 1)
    # (TwoArgs itself where a loaded package makes exceptions load, as dask's tblib does; never a TypeError)
    with pytest.raises((RuntimeError, TwoArgs), match=r"rank0\.json: odd") as info:
        _forked.run_forked(unloadable, [[0]], 1)
    assert "in unloadable" in str(info.value.__cause__)


def test_a_child_that_dies_is_noticed_and_reaped(tmp_path: Path) -> None:
    log = tmp_path / "pids"

    def fn(i: int) -> int:
        if i == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return i

    with pytest.raises(_forked.PoolFailed) as info:
        _forked.run_forked(_logging(log, fn), [[0], [1], [2], [3]], 2)
    assert set(info.value.done) <= {0, 1, 3} and all(info.value.done[k] == [k] for k in info.value.done)
    assert 1 <= len(_pids(log)) <= 2 and os.getpid() not in _pids(log)
    assert all(_gone(pid) for pid in _pids(log))  # neither running nor a zombie


def test_an_error_here_stops_the_children_at_once(tmp_path: Path) -> None:
    log = tmp_path / "pids"

    def fn(i: int) -> int:
        if i == 1:
            time.sleep(60)
        return i

    def done(k: int, values: list[int]) -> None:
        raise RuntimeError("the progress bar broke")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="progress bar broke"):
        _forked.run_forked(_logging(log, fn), [[0], [1], [2], [3]], 2, done)
    assert time.monotonic() - started < 30  # the sleeping child was killed, not waited for
    assert _pids(log) and all(_gone(pid) for pid in _pids(log))


def test_no_process_to_be_had_leaves_no_descriptor_open(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fork() -> int:
        raise BlockingIOError("Resource temporarily unavailable")

    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    monkeypatch.setattr(os, "fork", no_fork)
    for _ in range(3):
        with pytest.raises(_forked.PoolFailed, match="cannot start a worker process"):
            _forked.run_forked(lambda i: i, [[0], [1]], 2)
    if before is not None:
        assert len(os.listdir("/proc/self/fd")) == before
    with pytest.raises(ValueError):
        _forked.run_forked(lambda i: i, [[0]], 0)


def test_the_collector_is_left_as_it_was() -> None:
    assert gc.get_freeze_count() == 0
    _forked.run_forked(lambda i: i, [[0], [1]], 2)
    assert gc.get_freeze_count() == 0  # (frozen for the forks only)
    keep = [object() for _ in range(10)]  # a program that froze objects itself keeps them frozen
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        _forked.run_forked(lambda i: i, [[0], [1]], 2)
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
    del keep


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


@pytest.mark.shared  # ranks6 repeats a real trace of ../shared/traces
def test_the_batches_of_a_lost_worker_are_analysed_here(
    ranks6: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = msgspec.json.encode(analyze_path(ranks6, jobs=1))
    parent = os.getpid()
    analyze_file = parallel.analyze_file
    ran: list[str] = []

    def dies_in_a_child(path: str, hint: int | None, options: parallel.Options) -> parallel.FileResult:
        if os.getpid() != parent and path.endswith("rank4.json.gz"):
            os.kill(os.getpid(), signal.SIGKILL)
        if os.getpid() == parent:
            ran.append(Path(path).name)
        return analyze_file(path, hint, options)

    monkeypatch.setattr(parallel, "analyze_file", dies_in_a_child)
    calls: list[int] = []
    two = analyze_path(ranks6, jobs=2, progress=lambda done, total, name: calls.append(done))
    assert msgspec.json.encode(two) == one
    assert "rank4.json.gz" in ran and len(ran) < 6  # only what the children did not bring back
    assert calls == sorted(calls)  # progress never goes back


@pytest.mark.shared
def test_without_a_safe_fork_a_spawned_pool_gives_the_same_result(
    ranks6: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = msgspec.json.encode(analyze_path(ranks6, jobs=1))
    monkeypatch.setattr(_forked, "available", lambda: False)
    spawned: list[object] = []
    run_spawned = parallel._run_spawned

    def counted(*args):  # type: ignore[no-untyped-def]
        spawned.append(result := run_spawned(*args))
        return result

    monkeypatch.setattr(parallel, "_run_spawned", counted)
    assert msgspec.json.encode(analyze_path(ranks6, jobs=2)) == one
    assert spawned and spawned[0] is not None  # the spawned pool ran (None: it could not)
