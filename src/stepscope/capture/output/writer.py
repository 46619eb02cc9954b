"""The run writer: the one object of a recording rank that writes into the run folder.

It owns the manifest updates, the metrics buffer, and the encoding of every typed payload; collectors ask it
for paths by artifact kind and hand it what they wrote. No torch here.

The manifest is merged by a thread of its own (capture/output/manifest_keeper.py): no step ever waits for the run
folder's lock. The metrics file is appended to only while it is a regular file (a FIFO in its place would
block the job forever).
"""

from __future__ import annotations

import errno
import os
import platform
import socket
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import msgspec

from stepscope._version import __version__
from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.capture.output.manifest_keeper import ManifestKeeper
from stepscope.capture.schedule import Schedule
from stepscope.runfolder import CONFIG_NAME, METRICS_NAME, Artifact, ArtifactKind, artifact_path, relpath
from stepscope.runfolder.atomic import atomic_write_bytes, atomic_write_text
from stepscope.runfolder.files import append_regular, open_regular_fd
from stepscope.runfolder.manifest import resolves_inside
from stepscope.runfolder.payloads import KIND_SCHEMAS, StepMetrics

if TYPE_CHECKING:
    from stepscope.capture.config import ProfileConfig

METRICS_FLUSH_LINES = 256
_encoder = msgspec.json.Encoder()


def open_run_folder(
    run_dir: Path,
    config: ProfileConfig,
    schedule: Schedule,
    rank: int,
    world_size: int,
    profiled: list[int] | None,
) -> RunWriter:
    """The writer of a rank that starts recording into `run_dir`: the folder made, its config.yaml written, the
    run's facts and job-wide files handed to the manifest (merged by the keeper's thread). `profiled` is None
    for "all" ranks."""
    import torch  # only here: the monitor is imported (and the writer with it) long before a rank records

    run_dir.mkdir(parents=True, exist_ok=True)
    writer = RunWriter(run_dir, rank, schedule)
    atomic_write_text(run_dir / CONFIG_NAME, config.to_yaml())
    writer.update(
        run_name=run_dir.name,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        versions={
            "stepscope": __version__,
            "torch": str(torch.__version__),
            "python": platform.python_version(),
        },
        world_size=world_size,
        schedule=schedule.as_dict(),
        hosts=[socket.gethostname()],
        # with "all", each rank adds itself: the manifest lists the ranks that exist and record
        **({"profiled_ranks_add": [rank]} if profiled is None else {"profiled_ranks": profiled}),
    )
    writer.add(ArtifactKind.CONFIG, run_dir / CONFIG_NAME, rank=None)
    writer.add(ArtifactKind.METRICS, run_dir / METRICS_NAME, rank=None)
    return writer


class RunWriter:
    """Writes the artifacts of one rank into `run_dir` and indexes them in the manifest."""

    def __init__(self, run_dir: Path, rank: int, schedule: Schedule) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.schedule = schedule
        self.manifest = ManifestKeeper(run_dir)
        # metrics: full lines of busy steps, and (step, wall ns) of quiet ones, formatted at flush (the
        # monitor appends to quiet_buffer directly: it is the same list for the whole run)
        self._lines: list[StepMetrics] = []
        self.quiet_buffer: list[tuple[int, int]] = []
        # Quiet steps lie outside every window while the trace collector runs (it works at every traced step);
        # the monitor clears this when that collector is switched off, and phases are then computed.
        self.quiet_outside_windows = True
        self.metrics_off = False  # metrics.jsonl could not be written: no more lines are kept or written

    # --- files and the manifest -------------------------------------------------------------------
    def path(self, kind: ArtifactKind | str, step: int | None = None, template: str | None = None) -> Path:
        """Absolute path of an artifact of this rank (parent folders created)."""
        relative = (
            template.format(rank=self.rank, step=step) if template else artifact_path(kind, self.rank, step)
        )
        target = self.run_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        # a folder of the run swapped for a link (to anywhere outside it) must not take the run's files there
        if not resolves_inside(self.run_dir, target.parent):
            where = os.path.realpath(target.parent)
            raise OSError(
                errno.EXDEV, f"{target.parent} leads out of the run folder (to {where}): not written"
            )
        return target

    def add(
        self,
        kind: ArtifactKind | str,
        path: str | Path,
        step: int | None = None,
        rank: int | None = -1,
        beside_steps: list[tuple[int, int]] | None = None,
    ) -> None:
        """Index a written file in the manifest (rank defaults to this rank; None for job-wide files)."""
        kind = str(ArtifactKind(kind))
        artifact = Artifact(
            kind=kind,
            path=relpath(self.run_dir, path),
            rank=self.rank if rank == -1 else rank,
            step=step,
            schema=KIND_SCHEMAS.get(kind),
            beside_steps=beside_steps,
        )
        self.manifest.record(artifacts=[artifact])

    def update(
        self, *, notes: Any = (), hosts: Any = (), profiled_ranks_add: Any = (), **fields: Any
    ) -> None:
        """Merge notes, hosts, ranks that join profiled_ranks or top-level fields (set where the manifest has
        none yet) into the manifest."""
        self.manifest.record(notes=notes, hosts=hosts, defaults=fields, ranks=profiled_ranks_add)

    def close(self) -> bool:
        """Wait a bounded time for the manifest to hold all this rank recorded; False (said) if it could not."""
        return self.manifest.close()

    def write_json(self, kind: ArtifactKind | str, payload: Any, step: int | None = None) -> Path:
        """Write a typed payload (msgspec Struct) as indented JSON, atomically, and index it."""
        path = self.path(kind, step)
        atomic_write_bytes(path, msgspec.json.format(_encoder.encode(payload), indent=2) + b"\n")
        self.add(kind, path, step)
        return path

    def write_text(self, kind: ArtifactKind | str, text: str, step: int | None = None) -> Path:
        path = self.path(kind, step)
        atomic_write_text(path, text)
        self.add(kind, path, step)
        return path

    def open_lines(self, kind: ArtifactKind | str) -> JsonLines:
        """A JSON-lines file of this rank (memory log, system samples), created empty and indexed."""
        path = self.path(kind)
        lines = JsonLines(path)
        self.add(kind, path)
        return lines

    # --- metrics.jsonl ----------------------------------------------------------------------------
    def step_line(self, line: StepMetrics) -> None:
        if not self.metrics_off:
            self._lines.append(line)

    @property
    def pending(self) -> int:
        return len(self._lines) + len(self.quiet_buffer)

    def flush_metrics(self) -> None:
        if not self._lines and not self.quiet_buffer:
            return
        rank, phase = self.rank, self.schedule.phase
        if self.quiet_outside_windows:
            quiet = [
                StepMetrics(step=s, rank=rank, wall_ms=ns / 1e6, phase="none") for s, ns in self.quiet_buffer
            ]
        else:
            quiet = [
                StepMetrics(step=s, rank=rank, wall_ms=ns / 1e6, phase=phase(s).value)
                for s, ns in self.quiet_buffer
            ]
        lines = self._lines + quiet
        self._lines = []
        self.quiet_buffer.clear()
        lines.sort(key=lambda line: line.step)
        # One O_APPEND write per flush: lines of different ranks never interleave mid-line.
        append_regular(self.run_dir / artifact_path(ArtifactKind.METRICS), _encoder.encode_lines(lines))

    def flush_metrics_or_switch_off(self) -> None:
        """`flush_metrics`, where a failure switches step metrics off (`metrics_failed`) instead of raising."""
        if self.metrics_off:
            self.quiet_buffer.clear()
            return
        try:
            self.flush_metrics()
        except Exception as exc:
            self.metrics_failed(exc)

    def metrics_failed(self, exc: Exception) -> None:
        """metrics.jsonl cannot be written, or a step's line cannot be made: step metrics are off for the rest
        of the run, said once; training goes on."""
        if self.metrics_off:
            return
        self.metrics_off = True
        self.quiet_buffer.clear()
        cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        warn_user(
            f"stepscope: cannot write {METRICS_NAME} ({cause}); step metrics are switched off, training goes on",
            StepscopeWarning,
        )

    def create_metrics(self) -> None:
        """Create metrics.jsonl (empty) if there is none; OSError when what is there is not a regular file."""
        append_regular(self.run_dir / artifact_path(ArtifactKind.METRICS), b"")


class JsonLines:
    """An append-only JSON-lines file of typed rows, one line written (and flushed) per row."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd = open_regular_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, follow=False)
        self._file: IO[bytes] | None = os.fdopen(fd, "wb")  # kept open for the run

    def write(self, row: Any) -> None:
        if self._file is None:
            return
        self._file.write(_encoder.encode(row) + b"\n")
        self._file.flush()

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()
