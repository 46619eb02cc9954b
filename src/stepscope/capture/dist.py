"""Rank, world size and the run folder name all ranks of one job agree on (torch.distributed optional)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import socket
import time
from pathlib import Path

RUN_NAME_KEY = "stepscope/run_name/{index}"
NAME_WAIT_SECONDS = 120.0


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

    from stepscope.capture.collector import StepscopeWarning, warn_user

    warn_user(
        f"stepscope: {problem}; this process profiles as rank 0 of 1 (its own run folder)", StepscopeWarning
    )


def new_run_name(now: float | None = None) -> str:
    """`<YYYY-MM-DD__HH-MM-SS>_<hash>`: time of creation plus 8 hex digits unique to this job."""
    now = time.time() if now is None else now
    stamp = _dt.datetime.fromtimestamp(now).strftime("%Y-%m-%d__%H-%M-%S")
    seed = (
        f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}:{os.environ.get('TORCHELASTIC_RUN_ID', '')}"
    )
    return f"{stamp}_{hashlib.sha1(seed.encode()).hexdigest()[:8]}"


def agree_run_name(out_dir: Path, rank: int, world_size: int, index: int) -> str:
    """One name for all ranks: rank 0 chooses it and publishes it; the others wait for it.

    With a process group the name travels through its key-value store (no collective, so ranks that do not
    record need not take part); otherwise, under torchrun, through a small file keyed by the job's run id.
    Clocks of different hosts are never compared.
    """
    if world_size <= 1:
        return new_run_name()
    dist = _dist()
    store = _default_store(dist) if dist is not None else None
    key = RUN_NAME_KEY.format(index=index)
    if store is not None:
        if rank == 0:
            name = new_run_name()
            store.set(key, name)
            return name
        store.wait([key], _dt.timedelta(seconds=NAME_WAIT_SECONDS))
        return bytes(store.get(key)).decode()
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    if not job:
        return new_run_name()
    marker = out_dir / f".job-{hashlib.sha1(job.encode()).hexdigest()[:12]}-{index}"
    if rank == 0:
        from stepscope.runfolder.atomic import atomic_write_text

        name = new_run_name()
        atomic_write_text(marker, name)
        return name
    deadline = time.monotonic() + NAME_WAIT_SECONDS
    while time.monotonic() < deadline:
        if marker.is_file():
            return marker.read_text().strip()
        time.sleep(0.05)
    raise TimeoutError(
        f"rank 0 did not publish the run folder name in {marker} within {NAME_WAIT_SECONDS:.0f} s"
    )


def _default_store(dist):  # type: ignore[no-untyped-def]
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None
