"""The manifest of one recording rank, kept up to date by a thread of its own.

Every rank of a job merges into one manifest.json under the run folder's lock. A lock held by a stuck writer
(another process, a slow network filesystem) must never hold a training step, so the steps only record what
the manifest should gain, and this thread merges it: it tries the lock in short slices, says once when the lock
has been held for long, and merges as soon as it frees. Each merge holds this rank's whole index (every
artifact, note, host and field it ever recorded), so a manifest rebuilt after damage, by this rank or another,
is whole again with this rank's next merge. Close waits for the last merge a bounded time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.runfolder import MANIFEST_NAME, Artifact
from stepscope.runfolder.manifest import merge_manifest

LOCK_SLICE_S = 0.25  # one wait for the lock, between which the thread sees whether it must stop
LOCK_WARN_S = 20.0  # a lock held this long by another process is said (once)
FIRST_WAIT_S = 0.1  # the first merge, when the run folder is created, waits this long at most
CLOSE_WAIT_S = 10.0  # at close, the longest wait for the last merge


class ManifestKeeper:
    """What this rank put into the manifest, and the thread that merges it there."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._cond = threading.Condition()
        self._merging = threading.Lock()  # one merge at a time (the thread's, or the first on the caller's)
        self._artifacts: dict[str, Artifact] = {}
        self._defaults: dict[str, Any] = {}
        self._hosts: list[str] = []
        self._notes: list[str] = []
        self._ranks: set[int] = set()  # profiled_ranks="all": this rank joins the list
        self._recorded = 0  # changes recorded
        self._merged = 0  # changes that manifest.json holds
        self._thread: threading.Thread | None = None
        self._closing = False
        self._given_up = False
        self._ok = True  # the last merge succeeded
        self._said: set[str] = set()

    # --- the training thread's side -----------------------------------------------------------
    def record(
        self,
        *,
        artifacts: Iterable[Artifact] = (),
        notes: Iterable[str] = (),
        hosts: Iterable[str] = (),
        defaults: dict[str, Any] | None = None,
        ranks: Iterable[int] = (),
    ) -> None:
        """Note what the manifest should gain; the thread merges it (this never waits for the lock)."""
        with self._cond:
            for artifact in artifacts:
                self._artifacts[artifact.path] = artifact
            self._notes.extend(n for n in notes if n not in self._notes)
            self._hosts.extend(h for h in hosts if h not in self._hosts)
            self._defaults.update(defaults or {})
            self._ranks.update(ranks)
            self._recorded += 1
            if self._thread is None and not self._closing:
                self._thread = threading.Thread(target=self._run, name="stepscope-manifest", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def merge_now(self, timeout: float = FIRST_WAIT_S) -> bool:
        """One merge on the caller's thread, waiting at most `timeout` s for the lock (the run folder is a run
        folder at once where the lock is free); False when the thread has to do it."""
        try:
            self._merge(timeout)
        except TimeoutError:
            return False
        except Exception as exc:
            self._say_failure(exc)
            return False
        return True

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Wait up to `timeout` s for the manifest to hold everything recorded; False (said once, and the thread
        gives up) when the lock stayed held that long, or when the last merge failed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while self._merged < self._recorded and self._thread is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._given_up = True
                    self._cond.notify_all()
                    break
                self._cond.wait(left)
            if not self._given_up:
                return self._ok
        self._say(
            "held",
            f"stepscope: another process held the lock of {self.run_dir} for the {timeout:g} s the monitor waits "
            f"at close; {MANIFEST_NAME} may lack this rank's last artifacts (their files are in the folder), "
            "training goes on",
        )
        return False

    # --- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        held_since: float | None = None
        while True:
            with self._cond:
                while self._merged >= self._recorded and not self._closing:
                    self._cond.wait()
                if self._given_up or self._merged >= self._recorded:
                    self._thread = None
                    self._cond.notify_all()
                    return
            try:
                self._merge(LOCK_SLICE_S)
                held_since = None
            except TimeoutError:
                now = time.monotonic()
                held_since = held_since or now
                if now - held_since >= LOCK_WARN_S:
                    self._say(
                        "held",
                        f"stepscope: another process has held the lock of {self.run_dir} for "
                        f"{LOCK_WARN_S:g} s; {MANIFEST_NAME} is updated when it frees (training goes on)",
                    )
            except (
                Exception
            ) as exc:  # a folder removed, a full disk: said once, tried again at the next change
                self._say_failure(exc)
                with self._cond:
                    self._merged = self._recorded
                    self._ok = False
                    self._cond.notify_all()

    def _merge(self, timeout: float) -> None:
        with self._merging:
            with self._cond:
                recorded = self._recorded
                artifacts = list(self._artifacts.values())
                notes, hosts, defaults = list(self._notes), list(self._hosts), dict(self._defaults)
                ranks = sorted(self._ranks)
            _, damage = merge_manifest(
                self.run_dir,
                artifacts=artifacts,
                notes=notes,
                hosts=hosts,
                defaults=defaults,
                profiled_ranks_add=ranks,
                timeout=timeout,
            )
            with self._cond:
                self._merged = max(self._merged, recorded)
                self._ok = True
                self._cond.notify_all()
        if damage is not None:
            self._say(
                "damaged",
                f"stepscope: {self.run_dir / MANIFEST_NAME} was damaged ({damage}); it is rewritten from this "
                "rank's index and the files in the run folder",
            )

    def _say_failure(self, exc: Exception) -> None:
        cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        self._say(
            "failed",
            f"stepscope: cannot update {self.run_dir / MANIFEST_NAME} ({cause}); the files of the run are in "
            "the folder, training goes on",
        )

    def _say(self, what: str, message: str) -> None:
        if what not in self._said:
            self._said.add(what)
            # (warnings turned into errors must not end this thread, nor reach the job from close)
            with contextlib.suppress(Exception):
                warn_user(message, StepscopeWarning)
