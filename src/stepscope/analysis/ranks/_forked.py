"""Batches of work on forked children: `run_forked(fn, batches, workers, done)`.

Each child is a fork of this process, so `fn` and everything it reads are already there: nothing is pickled on
the way out. The parent hands out batches one at a time over a pipe (the next batch to whichever child sends
results first); a child runs `fn(i)` for each item of its batch and sends the results back pickled over its own
pipe. The parent waits in `select` between results: no threads, no queues, and none of multiprocessing's or
concurrent.futures' modules to import (15 ms, in the serial start of every pooled analysis).

Only on Linux and the BSDs (`available()`): macOS has fork, but forking without exec is unsafe there. When the
pool fails (no fork or pipe to be had, a child killed or out of memory) PoolFailed says so, with the batches
already done; an exception in `fn` is raised again in the parent, the child's traceback as its cause. The
children are reaped whatever happens, a second Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import selectors
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ChildTraceback", "PoolFailed", "available", "run_forked"]

_LENGTH = struct.Struct("<Q")  # each message: its length, then the pickle
_INDEX = struct.Struct("<q")  # parent -> child: the batch to run, or _STOP
_STOP = -1
_PIPE_BYTES = 1 << 20  # Linux's default most for a pipe (/proc/sys/fs/pipe-max-size)


class PoolFailed(Exception):
    """The children could not do the work: `done` holds the results of the batches that came back."""

    def __init__(self, message: str, done: dict[int, list[Any]]) -> None:
        super().__init__(message)
        self.done = done


class ChildTraceback(Exception):
    """The traceback of an exception raised in a child (the cause of the same exception raised again here)."""


def available() -> bool:
    return hasattr(os, "fork") and sys.platform != "darwin"


class _Child:
    __slots__ = ("from_child", "pid", "received", "stopped", "to_child")

    def __init__(self, pid: int, to_child: int, from_child: int) -> None:
        self.pid = pid
        self.to_child = to_child  # fd: batch indices
        self.from_child = from_child  # fd: results
        self.received = bytearray()
        self.stopped = False


def run_forked(
    fn: Callable[[int], Any],
    batches: Sequence[Sequence[int]],
    workers: int,
    done: Callable[[int, list[Any]], None] | None = None,
) -> list[list[Any]]:
    """[fn(i) for i in batch] for every batch, in the order of `batches`, run on up to `workers` forked
    children; `done(k, results)` is called here as batch k comes back."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    children: list[_Child] = []
    results: dict[int, list[Any]] = {}
    try:
        _start(fn, batches, min(workers, len(batches)), children)
        with selectors.DefaultSelector() as selector:
            handed = 0
            for child in children:
                handed = _hand_out(child, handed, len(batches), results)
                selector.register(child.from_child, selectors.EVENT_READ, child)
            while len(results) < len(batches):
                for key, _ in selector.select():
                    child = key.data
                    messages = _receive(child, results)
                    for _ in messages:  # the child's next batch first, then the unpickling
                        handed = _hand_out(child, handed, len(batches), results)
                    if child.stopped:  # (its pipe's end is no news)
                        selector.unregister(child.from_child)
                    for message in messages:
                        k, values = _unpickle(message)
                        results[k] = values
                        if done is not None:
                            done(k, values)
        return [results[k] for k in range(len(batches))]
    finally:
        _reap(children)


def _start(
    fn: Callable[[int], Any],
    batches: Sequence[Sequence[int]],
    n: int,
    children: list[_Child],
) -> None:
    # The objects there are now, out of the children's collections: a collection writes to every object it
    # visits, and each page so written is copied in the child (slow on a VM that hands back free memory).
    # Not if the program froze some itself: unfreezing would undo that too.
    freeze = gc.get_freeze_count() == 0
    for stream in (sys.stdout, sys.stderr):  # else what they hold would be written by every child too
        with contextlib.suppress(Exception):
            stream.flush()
    if freeze:
        gc.freeze()
    try:
        for _ in range(n):
            children.append(_fork(fn, batches, children))
    except OSError as exc:  # no process or pipe to be had (a limit reached)
        raise PoolFailed(f"cannot start a worker process: {exc}", {}) from None
    finally:
        if freeze:
            gc.unfreeze()  # (in this process: back to the oldest generation)


def _fork(fn: Callable[[int], Any], batches: Sequence[Sequence[int]], siblings: list[_Child]) -> _Child:
    opened: list[int] = []
    try:
        down_r, down_w = os.pipe()
        opened += [down_r, down_w]
        up_r, up_w = os.pipe()
        opened += [up_r, up_w]
        _widen(up_w)
        pid = os.fork()
    except OSError:
        for fd in opened:
            os.close(fd)
        raise
    if pid == 0:  # the child: it never returns from here
        status = 1
        try:
            for fd in (down_w, up_r, *(f for s in siblings for f in (s.to_child, s.from_child))):
                os.close(fd)
            _serve(fn, batches, down_r, up_w)
            status = 0
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(status)
    os.close(down_r)
    os.close(up_w)
    return _Child(pid, down_w, up_r)


def _widen(fd: int) -> None:
    """Linux: a pipe that holds a batch's results, so that the child goes on without waiting for the parent to
    read them (64 KiB by default)."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass


def _serve(fn: Callable[[int], Any], batches: Sequence[Sequence[int]], down: int, up: int) -> None:
    with os.fdopen(down, "rb", buffering=0) as incoming, os.fdopen(up, "wb") as outgoing:
        while True:
            head = incoming.read(_INDEX.size)
            if len(head) < _INDEX.size:
                return  # the parent is gone
            (k,) = _INDEX.unpack(head)
            if k == _STOP:
                return
            try:
                payload = pickle.dumps((k, [fn(i) for i in batches[k]], None), pickle.HIGHEST_PROTOCOL)
            except BaseException as exc:  # whatever it is, the parent raises it again
                payload = _pickled_error(k, exc)
            outgoing.write(_LENGTH.pack(len(payload)))
            outgoing.write(payload)
            outgoing.flush()


def _pickled_error(k: int, exc: BaseException) -> bytes:
    import traceback

    text = "".join(traceback.format_exception(exc))
    try:
        payload = pickle.dumps((k, None, (exc, text)), pickle.HIGHEST_PROTOCOL)
        pickle.loads(payload)  # (an exception can pickle and still not load: its __init__ takes other args)
        return payload
    except Exception:  # one that does not make the trip: its name and message
        return pickle.dumps((k, None, (RuntimeError(f"{type(exc).__name__}: {exc}"), text)))


def _hand_out(child: _Child, handed: int, total: int, results: dict[int, list[Any]]) -> int:
    """The next batch to `child`, or the word to stop; the number of batches handed out after it."""
    try:
        if handed < total:
            os.write(child.to_child, _INDEX.pack(handed))
            return handed + 1
        if not child.stopped:
            os.write(child.to_child, _INDEX.pack(_STOP))
            child.stopped = True
    except BrokenPipeError:
        raise PoolFailed(f"worker process {child.pid} ended before its work was done", results) from None
    return handed


def _receive(child: _Child, results: dict[int, list[Any]]) -> list[bytes]:
    """The messages complete after one read from `child`."""
    chunk = os.read(child.from_child, _PIPE_BYTES)
    if not chunk:
        raise PoolFailed(f"worker process {child.pid} ended before sending its results", results)
    child.received += chunk
    out = []
    while len(child.received) >= _LENGTH.size:
        (n,) = _LENGTH.unpack_from(child.received)
        if len(child.received) < _LENGTH.size + n:
            break
        out.append(bytes(child.received[_LENGTH.size : _LENGTH.size + n]))
        del child.received[: _LENGTH.size + n]
    return out


def _unpickle(message: bytes) -> tuple[int, list[Any]]:
    k, values, error = pickle.loads(message)
    if error is not None:
        exc, text = error
        raise exc from ChildTraceback(text)
    return k, values


def _reap(children: list[_Child]) -> None:
    """Every child ended and waited for: those still at work (an error here) killed first, then all waited
    for, a Ctrl-C meanwhile raised only once they are."""
    import signal

    for child in children:
        for fd in (child.to_child, child.from_child):
            with contextlib.suppress(OSError):
                os.close(fd)  # a child still waiting for work reads the end of its pipe and leaves
    for child in children:
        if not child.stopped:  # its results are no longer wanted
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
    interrupted: KeyboardInterrupt | None = None
    for child in children:
        while True:
            try:
                os.waitpid(child.pid, 0)
            except ChildProcessError:
                pass
            except KeyboardInterrupt as exc:
                interrupted = exc
                continue
            break
    if interrupted is not None:
        raise interrupted
