"""Rank, world size and the run folder name all ranks of one job agree on (torch.distributed optional)."""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import hashlib
import os
import re
import socket
import time
from pathlib import Path

from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.runfolder.atomic import create_exclusive
from stepscope.runfolder.files import read_regular

RUN_NAME_KEY = "stepscope/run_name/{index}"
RUN_NAME_PATTERN = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}__[0-9]{2}-[0-9]{2}-[0-9]{2}_[0-9a-f]{8}")
NAME_WAIT_SECONDS = 120.0  # only with a store that has no compare-and-set
MARKER_TEMPLATE = ".job-{job}-{index}"
MARKER_MAX_BYTES = 256
_released: set[tuple[Path, int]] = set()


def _dist():  # type: ignore[no-untyped-def]
    """torch.distributed when a default process group exists, else None."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def rank_and_world() -> tuple[int, int]:
    """Global rank and world size: from the process group if one exists, else torchrun's environment."""
    dist = _dist()
    if dist is not None:
        return dist.get_rank(), dist.get_world_size()
    rank, world = _env_int("RANK", 0, 0), _env_int("WORLD_SIZE", 1, 1)
    if rank >= world:
        _warn_env(f"RANK={rank} is not below WORLD_SIZE={world}")
        return 0, 1
    return rank, world


def _env_int(name: str, default: int, lowest: int) -> int:
    """An integer from the environment; a value that is not one (or below `lowest`) warns and gives `default`."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = lowest - 1
    if value < lowest:
        _warn_env(f"{name}={text!r} is not an integer >= {lowest}")
        return default
    return value


def _warn_env(problem: str) -> None:
    warn_user(
        f"stepscope: {problem}; this process profiles as rank 0 of 1 (its own run folder)", StepscopeWarning
    )


def run_folder(out_dir: Path, index: int) -> tuple[int, int, Path]:
    """This process's rank and world size, and its job's run folder under `out_dir` (the `index`-th monitor of
    the process). A rendezvous that fails gives this rank a folder of its own, with a warning: a lost
    rendezvous must not stop training."""
    rank, world_size = rank_and_world()
    try:
        name = agree_run_name(out_dir, rank, world_size, index)
    except Exception as exc:
        name = new_run_name()
        warn_user(f"stepscope: ranks could not agree on a run folder ({exc}); using {name}", StepscopeWarning)
    return rank, world_size, out_dir / name


def new_run_name(now: float | None = None) -> str:
    """`<YYYY-MM-DD__HH-MM-SS>_<hash>`: time of creation plus 8 hex digits unique to this job."""
    now = time.time() if now is None else now
    stamp = _dt.datetime.fromtimestamp(now).strftime("%Y-%m-%d__%H-%M-%S")
    seed = (
        f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}:{os.environ.get('TORCHELASTIC_RUN_ID', '')}"
    )
    return f"{stamp}_{hashlib.sha1(seed.encode()).hexdigest()[:8]}"


def is_run_name(text: str) -> bool:
    """A name `new_run_name` makes: one folder name, never a path (no separator, no `..`, not absolute)."""
    return RUN_NAME_PATTERN.fullmatch(text) is not None


def agree_run_name(out_dir: Path, rank: int, world_size: int, index: int) -> str:
    """One name for all ranks of a job, and no rank ever waits for another: the first rank to get here proposes
    its name and every later one takes it.

    With a process group the name travels through its key-value store (compare-and-set: no collective, so
    ranks that do not record need not take part, and a rank that starts late, rank 0 included, finds the name
    there); otherwise, under torchrun, through a marker file in `out_dir` named after this launch of the job
    (see `job_marker`), created exclusively. Clocks of different hosts are never compared.
    """
    if world_size <= 1:
        return new_run_name()
    dist = _dist()
    store = _default_store(dist) if dist is not None else None
    if store is not None:
        return _name_from_store(store, RUN_NAME_KEY.format(index=index), rank)
    marker = job_marker(out_dir, index)
    if marker is None:
        return new_run_name()
    return _name_from_marker(marker, rank, world_size)


def _name_from_store(store, key: str, rank: int) -> str:  # type: ignore[no-untyped-def]
    try:
        name = bytes(store.compare_set(key, "", new_run_name())).decode()
    except (AttributeError, NotImplementedError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and "not implemented" not in str(exc).lower():
            raise  # a store that is there but does not answer: waiting on it would not help
        # a store without compare-and-set (a user's own): rank 0 publishes, the others wait for it
        if rank == 0:
            name = new_run_name()
            store.set(key, name)
            return name
        store.wait([key], _dt.timedelta(seconds=NAME_WAIT_SECONDS))
        name = bytes(store.get(key)).decode()
    if not is_run_name(name):
        raise ValueError(f"the process group's store holds {name[:80]!r} as the run folder name")
    return name


def job_marker(out_dir: Path, index: int, launcher_pid: int | None = None) -> Path | None:
    """The marker file, inside `out_dir`, through which the ranks of one launch of a torchrun job (without a
    process group) share the name of monitor `index`'s run folder; None outside torchrun.

    torchrun's run id alone does not tell launches apart (it is `none` unless --standalone or --rdzv-id gives
    one), nor does MASTER_ADDR:MASTER_PORT (29500 by default): the marker is named after those and the launch
    of torchrun's agent on this host: the folder it made for this attempt's error files (a fresh temp folder
    per launch, the same for all its workers, named in TORCHELASTIC_ERROR_FILE), or else the launcher, the
    process that started this one (its pid and start time, this host and this boot). No two launches share a
    marker, even with the same id, on the same port, one after the other. (Ranks on other hosts have other
    agents: without a process group, each host's ranks share a folder of their own.)"""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id:
        return None
    parts = [
        run_id,
        os.environ.get("TORCHELASTIC_RESTART_COUNT", ""),
        os.environ.get("MASTER_ADDR", ""),
        os.environ.get("MASTER_PORT", ""),
        socket.gethostname(),
        _boot_id(),
    ]
    launch = _agent_launch_folder()
    if launch:
        parts.append(launch)
    else:
        launcher = os.getppid() if launcher_pid is None else launcher_pid
        parts += [str(launcher), _start_time(launcher)]
    digest = hashlib.sha1("\0".join(parts).encode()).hexdigest()[:16]
    return out_dir / MARKER_TEMPLATE.format(job=digest, index=index)


def _agent_launch_folder() -> str:
    """`<log dir>/<run id>_<random>/attempt_<N>` of TORCHELASTIC_ERROR_FILE (`.../<local rank>/error.json`):
    what torchrun's agent made for this attempt of this launch; empty where it is not set so."""
    error_file = Path(os.environ.get("TORCHELASTIC_ERROR_FILE", ""))
    if error_file.name != "error.json" or not error_file.parent.parent.name.startswith("attempt_"):
        return ""
    return str(error_file.parent.parent)


def _name_from_marker(marker: Path, rank: int, world_size: int) -> str:
    marker.parent.mkdir(parents=True, exist_ok=True)
    proposal = new_run_name()
    if create_exclusive(marker, proposal.encode()):
        name = proposal
    else:
        name = read_regular(marker, "a job marker", limit=MARKER_MAX_BYTES).decode("utf-8", "replace").strip()
        if not is_run_name(name):
            raise ValueError(f"{marker} does not hold a run folder name; it is ignored")
    atexit.register(release_marker, marker, rank, world_size)
    return name


def release_marker(marker: Path, rank: int, world_size: int) -> None:
    """Say that this rank is done with `marker`; the last rank of the job removes it, and the others' notes.
    (A rank that never gets here, one that has no monitor or was killed, leaves it: no later launch reads it.)"""
    if (marker, rank) in _released:
        return
    _released.add((marker, rank))
    prefix = f"{marker.name}.closed-"
    with contextlib.suppress(OSError):
        create_exclusive(marker.with_name(f"{prefix}{rank}"), b"")
        # counted from the folder, never by a list of world_size names (WORLD_SIZE can be any number)
        closed = [p for p in marker.parent.iterdir() if p.name.startswith(prefix)]
        if len(closed) >= world_size:
            for path in [marker, *closed]:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read(64).strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str:
    """When process `pid` started, in clock ticks since boot (Linux); empty where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read(4096)
    except OSError:
        return ""
    fields = stat.rpartition(b")")[2].split()
    return fields[19].decode() if len(fields) > 19 else ""  # field 22, starttime


def _default_store(dist):  # type: ignore[no-untyped-def]
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None
