"""On-demand windows: a monitor started with `on_demand=True` records nothing until asked.

The request is a file, `trigger.json` in the run folder, created exclusively (so one request is pending at a
time) by `stepscope trigger` or by the SIGUSR2 handler of any profiled rank. Every profiled rank looks for it
every `trigger_poll_steps` steps: one `stat()`, nothing else. The first rank that sees a request claims it by
creating `.trigger-<id>.json` exclusively, with the step at which the window starts; the others read that
claim, so every rank records the same steps. The start lies one poll interval past the step of the claim, so a
rank that polled just before the request arrived still sees it in time. The first profiled rank removes the
request once its window is exported; the next request can then be made. Each rank removes the claims of the
requests it saw when it closes.

While it listens, each profiled rank keeps `.listening-rank<R>.json` in the run folder (its pid and host), removed
when its monitor closes: `stepscope trigger` tells a running job from a finished one (or a killed one, whose
process is gone) by these files, and asks nothing of a job that cannot answer.

No torch here.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from stepscope.capture.collector import NEVER, Collector, RunContext, Window
from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.capture.schedule import MAX_ACTIVE, Schedule
from stepscope.errors import InputError
from stepscope.runfolder.atomic import atomic_write_bytes, create_exclusive
from stepscope.runfolder.files import read_regular
from stepscope.runfolder.layout import LISTENER_TEMPLATE

TRIGGER_NAME = "trigger.json"
CLAIM_TEMPLATE = ".trigger-{id}.json"
TRIGGER_FILE_BYTES = 1 << 16  # a request, a claim, a listener: about 100 bytes each
WATCH_SOURCE = "the watch of rank"  # a request's source when a rank's watch made it (capture/window/auto.py)
REFERENCE_SOURCE = (
    "(a reference)"  # ... ending a request for a plain window (no anomaly: no cool-down after it)
)


class TriggerRequest(msgspec.Struct, omit_defaults=True):
    """What `stepscope trigger` (or SIGUSR2) asks for: a window of `active` steps (None: the config's)."""

    id: str
    requested: float  # unix time
    source: str = "cli"
    active: int | None = None


class TriggerClaim(msgspec.Struct):
    """The window every profiled rank records for one request: warmup from `start`, then `active` steps."""

    id: str
    start: int
    warmup: int
    active: int
    claimed_by: int  # the rank that set the start

    def schedule(self) -> Schedule:
        return Schedule(wait=0, warmup=self.warmup, active=self.active, repeat=1, skip_first=self.start)


class TriggerListener(msgspec.Struct):
    """A profiled rank that listens for requests: the process and host that run it, and since when (unix time)."""

    rank: int
    pid: int
    host: str
    since: float


def read_listeners(run_dir: Path) -> list[TriggerListener]:
    """The listener files of the run folder, by rank (unreadable ones left out)."""
    found = []
    for path in sorted(run_dir.glob(LISTENER_TEMPLATE.format(rank="*"))):
        with contextlib.suppress(InputError, msgspec.DecodeError):
            found.append(msgspec.json.decode(_read_small(path, "a listener file"), type=TriggerListener))
    return sorted(found, key=lambda listener: listener.rank)


def never_schedule(base: Schedule) -> Schedule:
    """The schedule of an on-demand monitor before any request: nothing is ever traced."""
    return Schedule(wait=0, warmup=base.warmup, active=base.active, repeat=1, skip_first=NEVER)


def request_window(
    run_dir: Path, active: int | None = None, source: str = "cli"
) -> tuple[bool, TriggerRequest]:
    """Ask the profiled ranks of the run in `run_dir` for one window. Returns (made, request): made is False
    when a request was already pending (it is returned instead; a second one is not queued)."""
    request = TriggerRequest(id=uuid.uuid4().hex[:12], requested=time.time(), source=source, active=active)
    path = run_dir / TRIGGER_NAME
    if create_exclusive(path, msgspec.json.encode(request)):
        return True, request
    pending = read_request(path)
    return False, pending if pending is not None else request


def _read_small(path: Path, what: str) -> bytes:
    """A request, claim or listener file: a few hundred bytes. InputError when it is missing, not a regular
    file (a FIFO would block, /dev/zero never end) or longer than TRIGGER_FILE_BYTES."""
    return read_regular(path, what, limit=TRIGGER_FILE_BYTES)


def read_request(path: Path) -> TriggerRequest | None:
    """The pending request, None when there is none or it does not decode (being written); InputError when
    something else than a regular file of a few KB is in its place."""
    try:
        return msgspec.json.decode(_read_small(path, "a trigger request file"), type=TriggerRequest)
    except msgspec.DecodeError:
        return None
    except InputError:
        if not path.exists() and not path.is_symlink():
            return None  # removed since (the window was recorded)
        raise


def read_claim(run_dir: Path, request_id: str) -> TriggerClaim | None:
    """The claim of a request, None when there is none yet; InputError as read_request."""
    path = run_dir / CLAIM_TEMPLATE.format(id=request_id)
    try:
        return msgspec.json.decode(_read_small(path, "a trigger claim file"), type=TriggerClaim)
    except msgspec.DecodeError:
        return None
    except InputError:
        if not path.exists() and not path.is_symlink():
            return None
        raise


class TriggerCollector(Collector):
    """Polls for requests on a profiled rank of an on-demand monitor and plans the requested window."""

    name = "trigger"

    def __init__(self, ctx: RunContext, replan: Callable[[Schedule], None], profiled: int) -> None:
        super().__init__(ctx)
        self.path = ctx.run_dir / TRIGGER_NAME
        self.listener_path = ctx.run_dir / LISTENER_TEMPLATE.format(rank=ctx.rank)
        self.poll = ctx.config.trigger_poll_steps
        self._replan = replan
        self._profiled = profiled
        self._seen: set[str] = set()
        self._last_stat: tuple[int, int, int] | None = None
        self.busy_until = -1  # last step of the planned window: no polling before it is over
        self._current: str | None = None  # the request whose window is planned or recording
        self._planned = 0  # windows planned so far
        self.polled_by_watch = False  # the watch looks for requests at its checks (capture/window/auto.py)
        self._done: str | None = None  # the request whose window the first profiled rank exported last
        self._remove_at: int | None = None  # the step from which that request is removed (the watch's)

    def start(self) -> None:
        # The handler first: once the listener file says the job listens, a SIGUSR2 may come at any moment.
        if not _listen_for_sigusr2(self.ctx.run_dir):
            warn_user(
                "stepscope: on_demand: the monitor was made and started off the main thread, where no signal "
                "handler can be installed; SIGUSR2 would end the job, ask with `stepscope trigger RUN_DIR` "
                "instead",
                StepscopeWarning,
            )
        listener = TriggerListener(self.ctx.rank, os.getpid(), socket.gethostname(), time.time())
        atomic_write_bytes(self.listener_path, msgspec.json.encode(listener))

    def next_busy(self, step: int) -> int:
        if self.polled_by_watch:
            return NEVER
        step = max(step, self.busy_until + 1)
        return -(-step // self.poll) * self.poll

    def before_step(self, step: int) -> None:
        if self.polled_by_watch or step % self.poll or step <= self.busy_until:
            return
        self.look(step, step + 1)

    def look(self, step: int, earliest: int) -> TriggerRequest | None:
        """Look for a request (one stat()) at `step` and plan its window, starting at `earliest` at the soonest
        (step + 1 from before_step: the step has begun; `step` itself from the watch, between two steps). The
        request whose window was planned, None when none was."""
        if step <= self.busy_until:
            return None
        if self._remove_at is not None and step >= self._remove_at:
            self._remove_request()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._last_stat:
            return None
        self._last_stat = key
        request = read_request(self.path)
        if request is None or request.id in self._seen:
            return None
        if request.source.startswith(WATCH_SOURCE):
            # a watch's request: the rank that asked sets the start (the slow steps may last a few steps only)
            claim = read_claim(self.ctx.run_dir, request.id)
            if claim is None:
                self._last_stat = None  # (not claimed yet: look again at the next look)
                return None
            self._take(request, step, earliest, claim.start, claim.warmup)
            return request
        self._take(request, step, earliest, step + (1 if self._profiled <= 1 else self.poll + 1))
        return request

    def ask(self, step: int, start: int, warmup: int, source: str) -> TriggerClaim | None:
        """The watch's request (capture/window/auto.py), made at `step` (between two steps: the window may begin
        at `step`) for a window whose warmup begins at `start`: the claim every profiled rank follows, which
        is another rank's when one claimed first; None when a request already seen is still pending."""
        _, request = request_window(self.ctx.run_dir, source=source)
        if request.id in self._seen:
            return None
        self._last_stat = None
        return self._take(request, step, step, start, warmup)

    def _take(
        self, request: TriggerRequest, step: int, earliest: int, start: int, warmup: int | None = None
    ) -> TriggerClaim:
        self._seen.add(request.id)
        claim = self._claim(request, start, warmup)
        schedule = claim.schedule()
        note = ""
        if claim.start < earliest:
            note = (
                f"rank {self.ctx.rank} saw the request {request.id} at step {step}, after the agreed start "
                f"{claim.start}; its window starts at {earliest} instead"
            )
            warn_user(f"stepscope: {note}", StepscopeWarning)
            schedule = Schedule(
                wait=0, warmup=claim.warmup, active=claim.active, repeat=1, skip_first=earliest
            )
        self.busy_until = schedule.first_window_end
        self._current = request.id
        self._replan(schedule)
        self._note_window(schedule, note, request.source)
        return claim

    def _note_window(self, schedule: Schedule, note: str, source: str) -> None:
        """The planned window as a note of the manifest (the first profiled rank's), after a late rank's note.
        The manifest's schedule stays the run's own: a window's schedule there would hide the windows before
        it (the steps' phases in metrics.jsonl and these notes list them all)."""
        self._planned += 1
        first, last = schedule.windows()[0]
        notes = [note] if note else []
        if self.ctx.is_first_profiled_rank:
            kind = "on-demand window" if self.ctx.config.on_demand else "requested window"
            warmup = f"warmup from step {schedule.skip_first}, " if schedule.warmup else "no warmup, "
            notes.append(f"{kind} {self._planned}: {warmup}active steps {first}-{last} (asked by {source})")
        if notes:
            with contextlib.suppress(Exception):  # the notes say which window; the traces are what matter
                self.ctx.writer.update(notes=notes)

    def _claim(self, request: TriggerRequest, start: int, warmup: int | None) -> TriggerClaim:
        config = self.ctx.config
        mine = TriggerClaim(
            id=request.id,
            start=start,
            warmup=config.warmup if warmup is None else warmup,
            active=_bounded(request.active, config.active, f"the request {request.id}"),
            claimed_by=self.ctx.rank,
        )
        path = self.ctx.run_dir / CLAIM_TEMPLATE.format(id=request.id)
        if create_exclusive(path, msgspec.json.encode(mine)):
            return mine
        theirs = read_claim(self.ctx.run_dir, request.id)
        if theirs is None:
            return mine
        theirs.active = _bounded(
            theirs.active, config.active, f"the claim of request {request.id}", quiet=True
        )
        theirs.warmup = _bounded(theirs.warmup, config.warmup, "", quiet=True, low=0)
        return theirs

    def on_window(self, window: Window) -> None:
        if self._current is None or window.last_step < self.busy_until:
            return
        done, self._current = self._current, None
        if not self.ctx.is_first_profiled_rank:
            return
        self._done = done
        if self.polled_by_watch:
            # A watch's window starts at once, so a rank that saw no slow step itself reads the request at its
            # next check only: it stays two checks longer (removed at a look, or at close)
            self._remove_at = window.last_step + 2 * self.poll
        else:
            self._remove_request()

    def _remove_request(self) -> None:
        """The request whose window is done, once (a newer request in its place stays)."""
        self._remove_at = None
        pending = read_request(self.path)
        if pending is not None and pending.id == self._done:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener_path.unlink()
        if self._remove_at is not None:
            with contextlib.suppress(InputError, OSError):
                self._remove_request()
        # The claims only agree the ranks on a window while its request is pending; none is read after the job
        # (`stepscope trigger --wait` reads one while the job runs), so none is left in the run folder.
        for request_id in self._seen:
            with contextlib.suppress(OSError):
                (self.ctx.run_dir / CLAIM_TEMPLATE.format(id=request_id)).unlink()
        with contextlib.suppress(ValueError):
            _listening.remove(self.ctx.run_dir)


def _bounded(value: int | None, default: int, what: str, *, quiet: bool = False, low: int = 1) -> int:
    """`value` (None: `default`) within [low, MAX_ACTIVE]: a request or claim file is written by hand or by
    another process, and a window of 10^9 steps would never end. Out of range: the nearest bound, said once
    (the rank that claims says it; the others, `quiet`, read the same claim)."""
    if value is None:
        return default
    kept = min(max(value, low), MAX_ACTIVE)
    if kept != value and not quiet:
        warn_user(
            f"stepscope: on_demand: {what} asks for {value:,} active steps; a window records {low} to "
            f"{MAX_ACTIVE:,}: recording {kept:,}",
            StepscopeWarning,
        )
    return kept


# --- SIGUSR2 --------------------------------------------------------------------------------------
# The run folders of this process's on-demand monitors that listen now. The handler stays installed once it
# is (a SIGUSR2 after the monitors closed, or between two of them, is ignored rather than killing the job).
_listening: list[Path] = []
_handler_installed = False


# A handler runs in the main thread between two of the job's bytecodes: a stream of SIGUSR2 (a script sending one
# every 2 ms) made each write its request (a temp file, a link, an unlink) and left the job no time of its own on
# a loaded machine (a test job that takes seconds had not ended after 300 s). One request per this interval is
# enough: a second within it finds the first still pending, unclaimed until the ranks' next poll.
SIGUSR2_INTERVAL_S = 0.1
_last_sigusr2 = float("-inf")


def _on_sigusr2(signum: int, frame: Any) -> None:
    global _last_sigusr2
    now = time.monotonic()
    if now - _last_sigusr2 < SIGUSR2_INTERVAL_S:
        return
    _last_sigusr2 = now
    for run_dir in list(_listening):
        with contextlib.suppress(Exception):
            request_window(run_dir, source="SIGUSR2")


def install_sigusr2_handler() -> bool:
    """Install the SIGUSR2 handler (once per process) where SIGUSR2 still has its default action, which would
    kill the process; a handler of the job's own is never replaced. Only the main thread can install one:
    False when it is not there (and not installed before)."""
    global _handler_installed
    sigusr2 = getattr(signal, "SIGUSR2", None)
    if _handler_installed or sigusr2 is None:
        return _handler_installed or sigusr2 is None
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(sigusr2) is signal.SIG_DFL:
        signal.signal(sigusr2, _on_sigusr2)
        atexit.register(_ignore_sigusr2_at_exit)
    _handler_installed = True  # ours, or the job's own: either way a SIGUSR2 does not kill the job
    return True


def _ignore_sigusr2_at_exit() -> None:
    """At interpreter exit, SIGUSR2 is ignored instead of ours. Python's finalization puts SIG_DFL back for
    every signal with a Python handler, and SIG_DFL kills the process: a `stepscope trigger` (or kill -USR2)
    landing in a finished job's teardown made it exit 140. An ignored signal is left ignored there."""
    sigusr2 = getattr(signal, "SIGUSR2", None)
    with contextlib.suppress(ValueError, OSError):  # (not the main thread: nothing to do)
        if sigusr2 is not None and signal.getsignal(sigusr2) is _on_sigusr2:
            signal.signal(sigusr2, signal.SIG_IGN)


def _listen_for_sigusr2(run_dir: Path) -> bool:
    """SIGUSR2 asks for a window, as `stepscope trigger` does; False when no handler could be installed (the
    monitor was made and started off the main thread), so that a SIGUSR2 would kill the job."""
    _listening.append(run_dir)
    return install_sigusr2_handler()


__all__ = [
    "LISTENER_TEMPLATE",
    "TRIGGER_NAME",
    "TriggerClaim",
    "TriggerCollector",
    "TriggerListener",
    "TriggerRequest",
    "never_schedule",
    "read_claim",
    "read_listeners",
    "read_request",
    "request_window",
]
