"""`stepscope trigger`: ask a running on-demand job for one profiling window."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import click

from stepscope.capture.schedule import MAX_ACTIVE
from stepscope.errors import InputError
from stepscope.units import plain


def _on_demand_config(run_dir: Path) -> dict | None:
    from stepscope.analysis.read.records import read_config
    from stepscope.runfolder import CONFIG_NAME

    config = read_config(run_dir / CONFIG_NAME, [])
    # a watching run (watch=True) listens too: its windows come from requests as an on-demand run's do
    return config if config.get("on_demand") or config.get("watch") else None


def not_listening(run_dir: Path) -> str | None:
    """Why no profiled rank of the run can take a request (the job has finished, or was killed), or None while
    one listens. A rank on another host is taken to listen: its process cannot be looked at from here."""
    from stepscope.capture.window.trigger import read_listeners

    listeners = read_listeners(run_dir)
    if not listeners:
        return "the job has finished (no profiled rank listens for a trigger any more)"
    here = socket.gethostname()
    if any(listener.host != here or _runs(listener.pid, listener.since) for listener in listeners):
        return None
    gone = ", ".join(f"rank {listener.rank} pid {listener.pid}" for listener in listeners)
    return f"the job has ended without closing its monitor (the processes of {gone} are gone)"


def _runs(pid: int, since: float) -> bool:
    """Whether process `pid` runs and is the one that began to listen at `since` (not a later one that was
    given the same pid)."""
    import psutil

    if pid <= 0:  # (a listener file is input: no process has such a pid; psutil raises ValueError)
        return False
    try:
        process = psutil.Process(pid)
        return process.create_time() <= since + 1.0 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def resolve_run(path: Path) -> tuple[Path, dict]:
    """The on-demand run folder PATH names: PATH itself, or the newest running on-demand run in PATH. A job
    that has finished is an error: it cannot record a window."""
    from stepscope.runfolder import is_run_folder

    if not path.exists():
        raise InputError(path, "no such file or folder")
    if is_run_folder(path):
        config = _on_demand_config(path)
        if config is None:
            raise InputError(
                path,
                "this run was started with neither on_demand=True nor watch=True, so nothing there listens for "
                "a trigger",
            )
        ended = not_listening(path)
        if ended is not None:
            raise InputError(path, f"{ended}: a finished job cannot record a window")
        return path, config
    if not path.is_dir():
        raise InputError(path, "not a run folder or a folder of run folders")
    candidates = []
    for child in path.iterdir():
        if child.is_dir() and is_run_folder(child):
            config = _on_demand_config(child)
            if config is not None:
                candidates.append((child.stat().st_mtime, child.name, child, config))
    if not candidates:
        raise InputError(
            path,
            "no run folder of an on-demand (on_demand=True) or watching (watch=True) monitor in this folder",
        )
    candidates.sort()
    running = [c for c in candidates if not_listening(c[2]) is None]
    if not running:
        newest = candidates[-1][2]
        raise InputError(
            path,
            f"no on-demand job here is running: the newest, {newest.name}: {not_listening(newest)}; a finished "
            "job cannot record a window",
        )
    _, _, run_dir, config = running[-1]
    if len(running) > 1:
        sys.stderr.write(
            f"stepscope: note: {len(running)} running on-demand jobs in {path}; triggering the newest, "
            f"{plain(run_dir.name)}\n"
        )
    return run_dir, config


@click.command(name="trigger")
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--active",
    type=click.IntRange(min=1, max=MAX_ACTIVE),
    default=None,
    help=f"Active steps of the window, at most {MAX_ACTIVE:,} (default: the run's `active` option).",
)
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=0.0,
    metavar="SECONDS",
    help="Wait up to SECONDS (not steps) for every profiled rank's trace of the window and print their paths.",
)
def command(path: Path, active: int | None, wait_s: float) -> int:
    """Make every profiled rank of a running on-demand job (on_demand=True, or watch=True) record the next window.

    PATH is the job's run folder, or the out_dir that holds it (the newest running on-demand job there is
    taken). A job that has finished, or was killed, cannot record a window: that is an error, and nothing is
    written.
    The ranks see the request within `trigger_poll_steps` steps and all start the window at the same step:
    `warmup` steps, then the active ones. Sending SIGUSR2 to a profiled rank does the same.
    """
    from stepscope.capture.window.trigger import read_claim, request_window

    run_dir, config = resolve_run(path)
    made, request = request_window(run_dir, active=active)
    steps = request.active or config.get("active")
    poll = config.get("trigger_poll_steps")
    if made:
        click.echo(
            f"requested a window of {steps} active step(s) in {plain(run_dir)} (id {plain(request.id)}); profiled ranks "
            f"look every {poll} steps"
        )
    else:
        age = time.time() - request.requested
        click.echo(
            f"a request is already pending in {plain(run_dir)} (id {plain(request.id)}, from {plain(request.source)}, made {age:.0f} s "
            "ago); its window comes first, trigger again after it. If the job is no longer running, delete "
            f"{plain(run_dir / 'trigger.json')}",
            err=True,
        )
        return 1
    if wait_s <= 0:
        return 0
    deadline = time.monotonic() + wait_s
    claim = None
    while time.monotonic() < deadline:
        ended = not_listening(run_dir)  # before the traces are looked at: a job ends after its last window
        claim = claim or read_claim(run_dir, request.id)
        if claim is not None:
            traces = _window_traces(run_dir, claim.start + claim.warmup + claim.active - 1)
            if traces is not None:
                first = claim.start + claim.warmup
                click.echo(f"window recorded: active steps {first}-{first + claim.active - 1}")
                for trace in traces:
                    click.echo(f"  {plain(trace)}")
                return 0
        if ended is not None:
            _withdraw(run_dir, request.id)
            click.echo(
                f"stepscope: {plain(ended)} before the window was recorded; the request is withdrawn",
                err=True,
            )
            return 1
        time.sleep(0.2)
    state = (
        "not yet seen by any rank (is the job still running?)"
        if claim is None
        else f"claimed (window from step {claim.start})"
    )
    click.echo(
        f"stepscope: the window was not recorded within {wait_s:g} s: the request is {state}", err=True
    )
    return 1


def _withdraw(run_dir: Path, request_id: str) -> None:
    """Remove the request `request_id` if it is still the pending one: no job is left to take it."""
    from stepscope.capture.window.trigger import TRIGGER_NAME, read_request

    pending = read_request(run_dir / TRIGGER_NAME)
    if pending is not None and pending.id == request_id:
        (run_dir / TRIGGER_NAME).unlink(missing_ok=True)


def _window_traces(run_dir: Path, last_step: int) -> list[Path] | None:
    """The traces of the window ending at `last_step` once every profiled rank has one, else None."""
    from stepscope.errors import StepscopeError
    from stepscope.runfolder import ArtifactKind, read_manifest

    try:
        manifest = read_manifest(run_dir)
    except StepscopeError:
        return None
    traces = {a.rank: a.path for a in manifest.of_kind(ArtifactKind.TRACE) if a.step == last_step}
    if not manifest.profiled_ranks or any(r not in traces for r in manifest.profiled_ranks):
        return None
    return [run_dir / traces[r] for r in sorted(manifest.profiled_ranks)]
