"""Spawned gloo jobs (torch.multiprocessing.spawn) that say where a rank died.

A rank of a 2-rank gloo job can die of SIGABRT (`terminate called without an active exception`) as its process
exits, after all its work: torch 2.13's own, seen with no profiler at all (docs/reliability.md, "A heap corruption
at window export"). A worker here calls `watch(out, rank)` first (faulthandler then writes every thread's Python
stack to `out/rank{rank}.fault` on a fatal signal) and `work_done(out, rank)` once its training and the monitor's
close are over, before the process group is destroyed. `spawn` runs the job; when a rank dies of a signal, the
error says where (its stacks), and when it died only after its work was done (tearing down), the job is run once
more and the first death is reported as a warning: what the tests check (what the job computed, what stepscope
wrote) is then checked on a run that ended cleanly. A rank that dies during its work fails the test.
"""

from __future__ import annotations

import faulthandler
import shutil
import socket
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

_FAULT_FILES: list[Any] = []  # kept open for faulthandler until the process ends


def watch(out: str | Path, rank: int) -> None:
    """In the worker, first: a fatal signal writes every thread's stack to `out/rank{rank}.fault`."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    fh = open(folder / f"rank{rank}.fault", "w")  # noqa: SIM115 (open until the process ends)
    _FAULT_FILES.append(fh)
    faulthandler.enable(fh, all_threads=True)


def work_done(out: str | Path, rank: int) -> None:
    """In the worker, after its training and the monitor's close, before the process group is destroyed."""
    Path(out, f"rank{rank}.done").touch()


def spawn(worker: Callable[..., None], args: tuple[Any, ...], out: Path, nprocs: int, tries: int = 2) -> None:
    """torch.multiprocessing.spawn of `worker(rank, out, port, *args)` (`port` a free loopback port for the
    rendezvous, a new one for each run), again when a rank died of a signal after its work was done (see the
    module's doc)."""
    import torch.multiprocessing as mp

    for attempt in range(tries):
        try:
            mp.spawn(worker, args=(str(out), free_port(), *args), nprocs=nprocs, join=True)
            return
        except mp.ProcessExitedException as exc:
            rank = exc.error_index
            where = _stacks(out, rank)
            done = Path(out, f"rank{rank}.done").exists()
            said = f"rank {rank} died of {exc.signal_name} {'after' if done else 'before'} its work was done"
            if not done or attempt == tries - 1:
                raise AssertionError(f"{said}; its threads then:\n{where}") from exc
            warnings.warn(f"{said} (run again); its threads then:\n{where}", RuntimeWarning, stacklevel=2)
            shutil.rmtree(out, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stacks(out: Path, rank: int) -> str:
    path = Path(out, f"rank{rank}.fault")
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return "(no stacks written)"
    return text or "(no stacks written)"
