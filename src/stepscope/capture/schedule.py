"""The profiling schedule: wait / warmup / active cycles, with torch.profiler.schedule's exact semantics.

Our own copy (rather than torch's closure) lets the monitor ask questions torch cannot answer: is a step
active, when does the first window end, which steps lie outside every window (for the FLOP counter).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass

from stepscope.errors import ConfigError

NEVER_STEP = 1 << 62  # a step index no job reaches
# The most steps one window records: torch.profiler keeps every event of a window in memory until it is exported
MAX_ACTIVE = 100_000


class Phase(enum.Enum):
    NONE = "none"  # wait, skip_first, or after the last cycle
    WARMUP = "warmup"
    RECORD = "record"
    RECORD_AND_SAVE = "record_and_save"  # last active step of a window: the trace is exported after it


@dataclass(frozen=True)
class Schedule:
    """Cycles of `wait` idle, `warmup` traced-but-discarded and `active` recorded steps.

    `repeat=0` repeats forever; `skip_first` steps are ignored once before the first cycle.
    """

    wait: int = 5
    warmup: int = 2
    active: int = 3
    repeat: int = 1
    skip_first: int = 0

    def __post_init__(self) -> None:
        for name in ("wait", "warmup", "repeat", "skip_first"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"invalid option '{name}': must be an integer >= 0 (got {value!r})")
        if (
            not isinstance(self.active, int)
            or isinstance(self.active, bool)
            or not 1 <= self.active <= MAX_ACTIVE
        ):
            raise ConfigError(
                f"invalid option 'active': must be an integer from 1 to {MAX_ACTIVE:,} (got {self.active!r}): a "
                "window keeps every event of its steps in memory until it is exported"
            )

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    def phase(self, step: int) -> Phase:
        """Phase of 0-based `step`, as torch.profiler.schedule computes it."""
        if step < self.skip_first:
            return Phase.NONE
        step -= self.skip_first
        if self.repeat > 0 and step >= self.repeat * self.cycle:
            return Phase.NONE
        mod = step % self.cycle
        if mod < self.wait:
            return Phase.NONE
        if mod < self.wait + self.warmup:
            return Phase.WARMUP
        return Phase.RECORD if mod < self.cycle - 1 else Phase.RECORD_AND_SAVE

    def is_active(self, step: int) -> bool:
        return self.phase(step) in (Phase.RECORD, Phase.RECORD_AND_SAVE)

    def is_traced(self, step: int) -> bool:
        """True when the profiler runs during `step` (warmup or active)."""
        return self.phase(step) is not Phase.NONE

    def window_end(self, step: int) -> int:
        """The last active step of the cycle that traced `step` belongs to."""
        k = step - self.skip_first
        return step - k % self.cycle + self.cycle - 1

    def windows(self, limit: int | None = None) -> list[tuple[int, int]]:
        """(first, last) active step of each window, in order; `limit` bounds the count when repeat=0."""
        count = self.repeat if self.repeat > 0 else (limit if limit is not None else 1)
        first_active = self.skip_first + self.wait + self.warmup
        return [
            (first_active + i * self.cycle, first_active + i * self.cycle + self.active - 1)
            for i in range(count)
        ]

    @property
    def first_window_end(self) -> int:
        """The step after which the first trace is exported (0-based)."""
        return self.windows(1)[0][1]

    def short_job_note(self, steps_done: int) -> str | None:
        """What to say of a job that ended after `steps_done` steps before its first window completed; None
        when that window completed."""
        if steps_done > self.first_window_end:
            return None
        return (
            f"the job ended after {steps_done} step(s), before the first active window completed "
            f"(it ends after step {self.first_window_end}: skip_first={self.skip_first}, "
            f"wait={self.wait}, warmup={self.warmup}, active={self.active}); "
            "lower wait/warmup or run more steps"
        )

    def last_step(self) -> int | None:
        """The last step the profiler cares about; None when it repeats forever."""
        return None if self.repeat == 0 else self.windows()[-1][1]

    def first_untraced_step_from(self, step: int) -> int:
        """The first step >= `step` that lies outside every warmup/active window."""
        while self.is_traced(step):
            step += 1
        return step

    def next_traced_step(self, step: int) -> int:
        """The first step >= `step` that is warmup or active; NEVER_STEP when none is left."""
        if step < self.skip_first:
            step = self.skip_first
        k = step - self.skip_first
        if self.repeat > 0 and k >= self.repeat * self.cycle:
            return NEVER_STEP
        mod = k % self.cycle
        return step if mod >= self.wait else step + (self.wait - mod)

    def next_window_start(self, step: int) -> int:
        """The first active step of the first window starting at or after `step`; NEVER_STEP when none is
        left. Computed, not walked: a window of 10^6 steps costs what one of 3 does."""
        if step < self.skip_first:
            step = self.skip_first
        k = step - self.skip_first
        first = step - k % self.cycle + self.wait + self.warmup  # this cycle's first active step
        if step > first:
            first += self.cycle
        if self.repeat > 0 and first - self.skip_first >= self.repeat * self.cycle:
            return NEVER_STEP
        return first

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
