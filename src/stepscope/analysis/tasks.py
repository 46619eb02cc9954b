"""The one way analysis runs work in other processes: `run_tasks(fn, tasks, ...)`.

Every use (the loader decoding several files, one big file read in stretches, `analyze --jobs` with one task
per rank file, Dask) goes through it, with one scheduling policy, one progress report and one failure model:

- scheduling: the tasks, heaviest first, are cut into batches a worker takes one at a time, half of each
  worker's share of the tasks left (guided scheduling): large batches first, single tasks at the end, so the
  workers end together while a batch's round trip (its results pickled and piped back) is paid a few times,
  not once per task;
- executors: a local process pool (`concurrent.futures.ProcessPoolExecutor`; fork where fork is safe, that is
  Linux and the BSDs, so the children inherit what the parent loaded; spawn elsewhere), or any
  `concurrent.futures.Executor` the caller gives (Dask's `client.get_executor()`);
- failures: a task's InputError (a file it cannot read: the one way analysis says so) comes back as a `Failed`
  result in its place, the file and the problem, for the caller to skip or raise (an exception with arguments
  of its own does not always pickle). Any other exception raised by the task itself is raised here, as it would
  be in this process. A local
  pool that cannot start or loses a worker (killed, out of memory) is not an error: the tasks it did not bring
  back run in this process. A caller's executor that fails raises ExecutorError (its tasks may need the
  cluster's storage, so they are not rerun here);
- progress: `progress(done, total, label)` in task weights (bytes of JSON) as batches come back.

Results come back as an iterator of (task index, result) in the order they finish; a caller that stops early
(an error it will raise) closes it, and the tasks not yet started are cancelled.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from stepscope.errors import InputError

if TYPE_CHECKING:  # (concurrent.futures and the logging it imports: only where there is a pool)
    from concurrent.futures import Executor, Future

__all__ = [
    "ExecutorError",
    "Failed",
    "ProgressCallback",
    "batches",
    "cpu_count",
    "fork_is_safe",
    "local_pool",
    "run_tasks",
]

# JSON (estimated) below which a command's files are read here, one after the other, when `jobs` is not given: the
# pool's start (its modules, the fork, each worker's first calls) costs more than a second CPU saves. 2 x 1.7 MB
# (hta_trace_filter) on 2 cores: 60 ms here against 80-100 ms with 2 workers.
POOL_MIN_BYTES = 8 << 20
ProgressCallback = Callable[[int, int, str], None]  # (weight done, weight in all, label of the task at work)
_POLL_S = 0.2  # how often `poll` is called while waiting for results


class Failed(NamedTuple):
    """What comes back in place of a task's result when it raised InputError: the file and the problem."""

    path: str
    problem: str

    def error(self) -> InputError:
        return InputError(self.path, self.problem)


def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """`fn(*args)`, or its InputError as a Failed result."""
    try:
        return fn(*args)
    except InputError as exc:
        return Failed(str(exc.path), exc.problem)


class ExecutorError(Exception):
    """An executor given by the caller could not run the tasks (Dask missing, a scheduler unreachable, a worker
    lost for good)."""


def cpu_count() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def fork_is_safe() -> bool:
    """Fork without exec is safe on Linux and the BSDs; macOS has fork, but its system libraries break in the
    child."""
    return hasattr(os, "fork") and sys.platform != "darwin"


def local_pool(workers: int) -> Executor | None:
    """A pool of `workers` local processes (forked where safe, else spawned); None when none can start."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if fork_is_safe() else "spawn"
    try:
        return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method))
    except (OSError, RuntimeError, ValueError):
        return None


def batches(order: Sequence[int], workers: int) -> list[list[int]]:
    """The tasks in `order` cut into the calls a worker takes one at a time: half of each worker's share of the
    tasks left."""
    out = []
    at = 0
    while at < len(order):
        size = max(1, (len(order) - at) // (2 * workers))
        out.append(list(order[at : at + size]))
        at += size
    return out


def _run_batch(fn: Callable[..., Any], tasks: list[tuple[Any, ...]]) -> list[Any]:
    return [_call(fn, args) for args in tasks]


def run_tasks(
    fn: Callable[..., Any],
    tasks: Sequence[tuple[Any, ...]],
    *,
    workers: int,
    weights: Sequence[int] | None = None,
    labels: Sequence[str] | None = None,
    progress: ProgressCallback | None = None,
    executor: Executor | None = None,
    poll: Callable[[], None] | None = None,
) -> Iterator[tuple[int, Any]]:
    """(i, fn(*tasks[i])) for every task, as they finish, on `workers` local processes or on `executor`; a
    `Failed` in place of the result of a task that raised InputError.

    `fn` and the tasks' arguments must pickle (a module-level function) unless the work runs here. `workers` 1
    without an executor runs everything in this process, in order. `weights` (default 1 each) order the tasks,
    heaviest first, and measure progress; `labels` name them in it. `poll` is called about every 0.2 s while
    waiting (for progress that the tasks report some other way)."""
    n = len(tasks)
    weight = list(weights) if weights is not None else [1] * n
    report = _Progress(weight, labels, progress)
    if executor is None and (workers <= 1 or n <= 1):
        yield from _here(fn, tasks, range(n), report)
        report.finish()
        return
    order = sorted(range(n), key=lambda i: -weight[i])
    own = executor is None
    pool = executor or local_pool(min(workers, n))
    if pool is None:
        yield from _here(fn, tasks, order, report)
        report.finish()
        return
    work = batches(order, max(1, workers)) if own else [[i] for i in order]
    left = {k: batch for k, batch in enumerate(work)}
    finished = False
    futures: dict[Future[Any], int] = {}
    try:
        for k, batch in left.items():
            futures[pool.submit(_run_batch, fn, [tasks[i] for i in batch])] = k
        for k, results in _completed(futures, poll, own):
            batch = left.pop(k)
            yield from zip(batch, results, strict=True)
            report.done(*batch)
        finished = True
    except _PoolLost:
        pass  # the batches not brought back run here
    finally:
        if own:
            pool.shutdown(wait=finished, cancel_futures=not finished)
        elif not finished:
            for future in futures:
                future.cancel()
    for k in sorted(left):
        yield from _here(fn, tasks, left[k], report)
    report.finish()


class _PoolLost(Exception):
    """The local pool cannot go on (a worker died, no process to be had)."""


def _completed(
    futures: dict[Future[Any], int], poll: Callable[[], None] | None, own: bool
) -> Iterator[tuple[int, list[Any]]]:
    """(batch, results) as batches finish; a task's own exception is raised as it is."""
    from concurrent.futures import FIRST_COMPLETED, wait
    from concurrent.futures.process import BrokenProcessPool

    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=_POLL_S if poll else None, return_when=FIRST_COMPLETED)
        if poll is not None:
            poll()
        for future in done:
            try:
                results = future.result()
            except BrokenProcessPool:
                if own:
                    raise _PoolLost from None
                raise ExecutorError("the executor's worker processes were lost") from None
            except OSError as exc:
                if own and exc.filename is None:  # a pipe to the workers, not a file of the task
                    raise _PoolLost from None
                raise
            except Exception as exc:
                if own or not _is_cluster_failure(exc):
                    raise
                raise ExecutorError(
                    f"the task failed on the executor ({type(exc).__name__}: {exc})"
                ) from None
            yield futures[future], results


def _is_cluster_failure(exc: Exception) -> bool:
    """A failure of a remote executor rather than of the task: Dask's KilledWorker, a lost connection."""
    return type(exc).__name__ in {"KilledWorker", "CommClosedError", "FutureCancelledError", "CancelledError"}


def _here(
    fn: Callable[..., Any], tasks: Sequence[tuple[Any, ...]], order: Sequence[int], report: _Progress
) -> Iterator[tuple[int, Any]]:
    for i in order:
        report.start(i)
        yield i, _call(fn, tasks[i])
        report.done(i)


class _Progress:
    def __init__(
        self, weights: list[int], labels: Sequence[str] | None, callback: ProgressCallback | None
    ) -> None:
        self.weights, self.labels, self.callback = weights, labels, callback
        self.total = max(sum(weights), 1)
        self.completed = 0

    def _label(self, i: int) -> str:
        return self.labels[i] if self.labels is not None else ""

    def start(self, i: int) -> None:
        if self.callback is not None:
            self.callback(min(self.completed, self.total), self.total, self._label(i))

    def done(self, *tasks: int) -> None:
        self.completed += sum(self.weights[i] for i in tasks)
        if self.callback is not None:
            self.callback(min(self.completed, self.total), self.total, self._label(tasks[-1]))

    def finish(self) -> None:
        if self.callback is not None:
            self.callback(self.total, self.total, "")
