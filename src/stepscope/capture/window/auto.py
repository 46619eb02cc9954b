"""Windows the watch opens by itself (config `watch=True`, issue 45): the monitor's side of `StepWatch`.

The step loop hands this the steps it must see and nothing else: a step slower than the slow bound (`over_ns`),
and every `trigger_poll_steps`-th step (`next_check`), where the watch learns the plain steps since the last
check from the metrics buffer, refreshes its bound and looks for a request (one stat(): `stepscope trigger`,
SIGUSR2, another rank's watch). Every other step costs the step loop one comparison.

What it does with an anomaly:
- slow steps now: a request, and a claim that starts the window at the next step with no warmup (the slow steps
  may be over in a few steps), which every profiled rank follows (capture/window/trigger.py). In a job whose
  ranks wait for each other, every rank sees the same slow steps and reads that claim at once; a rank that did
  not see them reads it at its next check;
- slow steps that recur (`StepWatch.period`): a claim ahead of time, whose warmup ends at the next occurrence's
  first step, so that the window records the slow step itself;
- neither while a window is planned, recording or still being written (the steps beside that work are not the
  job's own), during the cool-down after a window, over `watch_windows_per_hour`, or once the rank's traces
  take `watch_max_mb`: a "skipped" record says which.
An on-demand run records one plain window, the reference, once the watch has learned the job's steps; a
scheduled run's own windows are its reference, and the watch acts once they are over.

Every decision is a `WatchRecord` line of watch/rank{R}.jsonl, and the asking rank's a note of the manifest.

No torch here.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from stepscope.capture.collector import RunContext
from stepscope.capture.schedule import NEVER_STEP
from stepscope.capture.window.trigger import REFERENCE_SOURCE, WATCH_SOURCE, TriggerClaim, TriggerCollector
from stepscope.capture.window.watch import Anomaly, StepWatch
from stepscope.runfolder.layout import ArtifactKind, artifact_path
from stepscope.runfolder.payloads import WatchRecord

NEVER_NS = 1 << 62  # a slow bound no step reaches: nothing is judged
HOUR_S = 3600.0


class AutoWindows:
    """See the module's doc. `step(step, wall_ns, buffer)` at the end of a step the step loop hands on."""

    def __init__(self, ctx: RunContext, trigger: TriggerCollector, trace: Any) -> None:
        config = ctx.config
        self.ctx, self.trigger, self.trace = ctx, trigger, trace
        self.rank = ctx.rank
        self.watch = StepWatch()
        self.every = config.trigger_poll_steps
        self.next_check = 0  # the step at whose end the next check runs
        self.over_ns = NEVER_NS  # the bound the step loop compares a step with (NEVER_NS: none is judged now)
        self._learned = -1  # the last step learned (or passed over)
        self._unrefreshed = 0  # steps learned since the last refresh
        self._free_from = 0  # the first step a window may start at (the cool-down)
        self._cooldown = config.watch_cooldown_steps
        self._per_hour = config.watch_windows_per_hour
        self._max_bytes = config.watch_max_mb * 1e6
        self._asked: deque[float] = deque()  # when this rank's windows were planned (monotonic s)
        self._has_reference = not config.on_demand  # the scheduled windows are the reference
        self._planned_for = -1  # the recurring slow step a window is claimed for
        self._period: tuple[int, int] | None = None  # slow steps that recur: (every, first step mod every)
        self._records: Any = None  # watch/rank{R}.jsonl, opened at the first decision
        self.source = f"{WATCH_SOURCE} {self.rank}"

    # --- the step loop's calls ----------------------------------------------------------------------------
    def step(self, step: int, wall_ns: int, buffer: list[tuple[int, int]]) -> bool:
        """Step `step` ended, taking `wall_ns` (0: not to be judged): True when a window was planned, from the
        next step on at the soonest."""
        planned = False
        if step >= self.next_check:
            self.next_check = step + self.every
            planned = self._check(step, buffer)
        if not planned and wall_ns > self.over_ns:
            planned = self._slow(step, wall_ns)
        return planned

    def close(self) -> None:
        records, self._records = self._records, None
        if records is not None:
            records.close()

    # --- checks -----------------------------------------------------------------------------------------
    def _busy(self, step: int) -> bool:
        """A window records, begins before the next check, or its end work still runs: the steps now are not
        the job's own, and no window is asked for."""
        trace = self.trace
        if trace.prof is not None or trace.worker.busy:
            return True
        return self.ctx.schedule.next_traced_step(step + 1) <= step + self.every

    def _check(self, step: int, buffer: list[tuple[int, int]]) -> bool:
        busy = self._busy(step)
        if busy:
            self.over_ns = NEVER_NS
        else:
            self._learn(buffer)
        self._learned = step
        # a request (a user's, another rank's) is answered while the last window's end work still runs too
        if self._windows_over(step) and (request := self.trigger.look(step + 1, step + 1)) is not None:
            self._followed(step, request.source)
            return True
        if not busy and not self._has_reference and self.over_ns < NEVER_NS:
            return self._ask_reference(step)
        return False

    def _learn(self, buffer: list[tuple[int, int]]) -> None:
        """The plain steps since the last check (newest first in the buffer), and the slow bound."""
        learned, new = self._learned, []
        for at, wall in reversed(buffer):
            if at <= learned:
                break
            new.append(wall)
        new.reverse()  # (oldest first: the history keeps the newest steps)
        self.watch.learn_many(new)
        self._unrefreshed += len(new)
        if self._unrefreshed >= self.watch.every or self.over_ns == NEVER_NS:
            self._unrefreshed = 0
            self.watch.refresh()
        self.over_ns = self.watch.over_ns

    def _windows_over(self, step: int) -> bool:
        """No window is planned from here on (a scheduled one, or one asked for)."""
        return self.ctx.schedule.next_traced_step(step + 1) >= NEVER_STEP

    def _slow(self, step: int, wall_ns: int) -> bool:
        anomaly = self.watch.slow(step, wall_ns)
        if anomaly is None:  # a slow step, not (yet) an anomaly: another rank may have asked already
            if (request := self.trigger.look(step + 1, step + 1)) is not None:
                self._followed(step, request.source)
                return True
            return False
        recurring = self.watch.period()
        if recurring is not None:
            self._period = recurring[0], recurring[1] % recurring[0]
        elif self._period is not None and anomaly.first % self._period[0] == self._period[1]:
            # a known recurrence (its stretches since may not all have been seen: a window hid some)
            every = self._period[0]
            recurring = every, anomaly.first + every
        if recurring is not None:
            return self._plan_ahead(step, anomaly, *recurring)
        return self._open_now(step, anomaly)

    # --- decisions --------------------------------------------------------------------------------------
    def _refused(self, step: int, start: int, cooldown: bool = True) -> str | None:
        """Why no window may start at `start` (asked at the end of `step`), None when one may."""
        if not self._windows_over(step):
            return "a window is already planned"
        if cooldown and start < self._free_from:
            return (
                f"cool-down until step {self._free_from} (watch_cooldown_steps={self._cooldown} after the last "
                "window)"
            )
        now = time.monotonic()
        while self._asked and now - self._asked[0] > HOUR_S:
            self._asked.popleft()
        if len(self._asked) >= self._per_hour:
            return f"{len(self._asked)} windows in the last hour (watch_windows_per_hour={self._per_hour})"
        held = self._trace_bytes()
        if held >= self._max_bytes:
            return f"this rank's traces take {held / 1e6:.0f} MB (watch_max_mb={self._max_bytes / 1e6:g})"
        return None

    def _trace_bytes(self) -> int:
        traces = self.ctx.run_dir / artifact_path(ArtifactKind.TRACE, self.rank, 0)
        total = 0
        for path in traces.parent.glob(f"rank{self.rank}_step*.json.gz"):
            try:
                total += path.stat().st_size
            except OSError:
                continue
        return total

    def _open_now(self, step: int, anomaly: Anomaly) -> bool:
        reason = self._refused(step, step + 1)
        if reason is not None:
            self._record(step, "skipped", anomaly, reason=reason)
            return False
        claim = self.trigger.ask(step + 1, step + 1, 0, self.source)
        if claim is None:
            self._record(step, "skipped", anomaly, reason="an earlier request is still pending")
            return False
        self._decided(step, claim, "window" if claim.claimed_by == self.rank else "joined", anomaly)
        return True

    def _plan_ahead(self, step: int, anomaly: Anomaly, period: int, occurrence: int) -> bool:
        warmup = self.ctx.config.warmup
        while occurrence - warmup <= step + 1:
            occurrence += period
        if occurrence == self._planned_for:
            return False
        # the first window from a recurrence's first step is not held back by the cool-down (of a window opened
        # at one of its occurrences, too late to record it)
        reason = self._refused(step, occurrence - warmup, cooldown=self._planned_for >= 0)
        if reason is not None:
            self._record(step, "skipped", anomaly, reason=reason)
            return False
        claim = self.trigger.ask(step + 1, occurrence - warmup, warmup, self.source)
        if claim is None:
            self._record(step, "skipped", anomaly, reason="an earlier request is still pending")
            return False
        self._planned_for = occurrence
        why = anomaly.why
        if not why.startswith("slow steps every"):
            why = f"slow steps every {period} steps (from step {occurrence % period} on): {why}"
        self._decided(step, claim, "planned", anomaly, why=why)
        return True

    def _ask_reference(self, step: int) -> bool:
        # one check later than the soonest: the other ranks, which check at the same steps, see it in time
        start = step + 1 + self.every
        claim = self.trigger.ask(step + 1, start, self.ctx.config.warmup, f"{self.source} {REFERENCE_SOURCE}")
        self._has_reference = True
        if claim is None:
            return False
        why = (
            f"a plain window to compare anomaly windows with (median step {self.watch.median_ns / 1e6:.1f} ms, "
            f"slow above {self.over_ns / 1e6:.1f} ms)"
        )
        self._decided(step, claim, "reference", None, why=why)
        return True

    def _planned(self, step: int, source: str) -> None:
        """A window was planned from a request (`source`: a user's, a rank's watch): judge nothing until it is
        over and written; after an anomaly's window (not a user's, not a reference), the cool-down."""
        self.over_ns = NEVER_NS
        if source.startswith(WATCH_SOURCE) and not source.endswith(REFERENCE_SOURCE):
            self._free_from = self.trigger.busy_until + 1 + self._cooldown
        self._has_reference = True  # (any window this rank records serves, when none was there)

    def _followed(self, step: int, source: str) -> None:
        """A window planned from a request this rank read (another rank's watch, a user's): recorded as such."""
        self._planned(step, source)
        if source.startswith(WATCH_SOURCE):
            decision = "reference" if source.endswith(REFERENCE_SOURCE) else "joined"
        else:
            decision = "requested"
        window = self.ctx.schedule.windows()[0]
        self._record(step, decision, None, window=window, why=f"the request of {source}")

    def _decided(
        self, step: int, claim: TriggerClaim, decision: str, anomaly: Anomaly | None, why: str = ""
    ) -> None:
        self._planned(step, self.source if decision != "reference" else f"{self.source} {REFERENCE_SOURCE}")
        if decision != "reference":
            self._asked.append(time.monotonic())
        last = self.trigger.busy_until  # (a rank that read the claim late records later steps)
        window = (last - claim.active + 1, last)
        self._record(step, decision, anomaly, window=window, why=why, asked=claim.claimed_by == self.rank)

    def _record(
        self,
        step: int,
        decision: str,
        anomaly: Anomaly | None,
        *,
        window: tuple[int, int] | None = None,
        reason: str | None = None,
        why: str = "",
        asked: bool = False,
    ) -> None:
        """A line of watch/rank{R}.jsonl; a note of the manifest where this rank's claim set the window (`asked`),
        or where the first profiled rank opened none."""
        record = WatchRecord(
            step=step,
            rank=self.rank,
            decision=decision,
            why=why or (anomaly.why if anomaly is not None else ""),
            unix_time=round(time.time(), 3),
            first=None if anomaly is None else anomaly.first,
            last=None if anomaly is None else anomaly.last,
            factor=None if anomaly is None else anomaly.factor,
            median_ms=round(self.watch.median_ns / 1e6, 3),
            slow_ms=round(self.watch.over_ns / 1e6, 3) if self.watch.over_ns < NEVER_NS else None,
            window=window,
            reason=reason,
        )
        writer = self.ctx.writer
        if self._records is None:
            self._records = writer.open_lines(ArtifactKind.WATCH)
        self._records.write(record)
        if asked or (decision == "skipped" and self.ctx.is_first_profiled_rank):
            outcome = (
                f"no window: {reason}"
                if window is None
                else f"every profiled rank records steps {window[0]}-{window[1]}"
            )
            writer.update(notes=[f"watch: rank {self.rank} at step {step}: {record.why}; {outcome}"])


__all__ = ["NEVER_NS", "AutoWindows"]
