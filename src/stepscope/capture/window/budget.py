"""How big a window's trace will be before it is exported: the `trace_budget_mb` check, and the measurement
`stepscope estimate` extrapolates from.

Why a step is *measured* rather than counted: torch 2.13 keeps a recording profiler's events in C++ until
`stop_trace()` (`kineto_results` exists only after the stop, and nothing reports a count before), and counting
ops ourselves is worse: a TorchDispatchMode makes the profiler record every aten op twice, a TorchFunctionMode
misses the backward and the optimizer's ops, and the execution-trace observer slowed the recorded step 2.5x
and prints on stderr. So the first warmup step of the run's first window is recorded on its own by a
short-lived profiler with the window's options and exported to a hidden temp file; `measure_trace` splits its
events into what each step adds and what a trace holds once. Warmup steps are discarded anyway: the check costs
nothing outside the profiling cycle and leaves every recorded step alone. Later windows are checked against
the previous window's real export. The check (and the warning) comes as a window begins, before its profiler
records: earlier than after its first active step, and the warning's own Python frames stay out of the trace.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepscope.compress import gzip_bytes
from stepscope.units import fmt_mb

if TYPE_CHECKING:
    from stepscope.capture.config import ProfileConfig

MB = 1_000_000  # trace_budget_mb counts decimal megabytes
STEP_SPAN = "ProfilerStep#"
# The options a budget warning suggests dropping, and how their events show in a chrome trace.
DROPPABLE = ("with_stack", "record_shapes", "profile_memory")
SHAPE_ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
MEMORY_EVENTS = ("[memory]", "[OutOfMemory]")


@dataclass(frozen=True)
class TraceSize:
    """The bytes of a chrome trace: `*_fixed` once per trace (metadata, Python frames open when the profiler
    started), `*_per_step` for each active step; JSON as torch exports it, gz as stepscope stores it."""

    json_per_step: float
    gz_per_step: float
    json_fixed: float = 0.0
    gz_fixed: float = 0.0
    events_per_step: float | None = None
    # JSON bytes per step that each droppable option adds (only the options that were on; empty: unknown)
    option_bytes: Mapping[str, float] = field(default_factory=dict)
    steps: int = 1  # steps the measurement saw

    def window_json(self, active: int) -> float:
        return self.json_fixed + active * self.json_per_step

    def window_gz(self, active: int) -> float:
        return self.gz_fixed + active * self.gz_per_step

    def steps_within(self, budget: float, drop: Iterable[str] = ()) -> int:
        """How many active steps fit in `budget` bytes of JSON, with the options in `drop` off."""
        per_step = self.json_per_step - sum(self.option_bytes.get(option, 0.0) for option in drop)
        room = budget - self.json_fixed
        if room <= 0:
            return 0
        return int(room // per_step) if per_step > 0 else 1 << 30

    def corrected(self, json_bytes: float, gz_bytes: float, steps: int) -> TraceSize:
        """This measurement corrected by a real export of `steps` steps (the options keep their shares)."""
        json_per_step = max(json_bytes - self.json_fixed, 0.0) / steps
        scale = json_per_step / self.json_per_step if self.json_per_step > 0 else 1.0
        return dataclasses.replace(
            self,
            json_per_step=json_per_step,
            gz_per_step=max(gz_bytes - self.gz_fixed, 0.0) / steps,
            events_per_step=None if self.events_per_step is None else self.events_per_step * scale,
            option_bytes={option: size * scale for option, size in self.option_bytes.items()},
            steps=steps,
        )


def measure_trace(raw: bytes, gz_size: int | None = None) -> TraceSize:
    """Split an exported chrome trace (the JSON bytes torch wrote) into per-step and fixed bytes.

    A step's share is every event but the metadata, the profiler's own span and markers, and the Python frames
    that enclose a whole `ProfilerStep#N` span (frames already open when the profiler started: once per
    trace). Device events count as the step's even when they run after its CPU span. Event sizes are those of
    their compact encoding plus an even share of torch's indentation; the gz size of a step is that of its
    events compressed together. `gz_size` is the stored .json.gz size when known (else it is computed).
    """
    import msgspec

    doc = msgspec.json.decode(raw)
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list) or not events:
        raise ValueError("the trace has no traceEvents")
    events = [e for e in events if isinstance(e, dict)]
    spans = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
        for e in events
        if e.get("cat") == "user_annotation"
        and str(e.get("name", "")).startswith(STEP_SPAN)
        and isinstance(e.get("ts"), (int, float))
    )
    if not spans:
        raise ValueError("the trace has no ProfilerStep# span")
    starts = [start for start, _ in spans]
    encode = msgspec.json.encode
    encoded = [encode(e) for e in events]
    pad = max(len(raw) - sum(map(len, encoded)), 0) / len(events)

    def encloses_a_step(event: dict[str, Any]) -> bool:
        ts, dur = event.get("ts"), event.get("dur", 0.0)
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            return False
        i = bisect.bisect_left(starts, ts)  # the first step starting at or after the event
        return i < len(spans) and ts + dur >= spans[i][1]

    step_parts: list[bytes] = []
    option_bytes = dict.fromkeys(DROPPABLE, 0.0)
    step_json = 0.0
    for event, text in zip(events, encoded, strict=True):
        if _once_per_trace(event, encloses_a_step):
            continue
        size = len(text) + pad
        step_json += size
        step_parts.append(text)
        if event.get("cat") == "python_function":
            option_bytes["with_stack"] += size
        elif event.get("name") in MEMORY_EVENTS:
            option_bytes["profile_memory"] += size
        args = event.get("args")
        if isinstance(args, dict):
            option_bytes["record_shapes"] += sum(
                len(encode(key)) + len(encode(args[key])) + 3 for key in SHAPE_ARGS if key in args
            )
    steps = len(spans)
    step_gz = len(gzip_bytes(b",".join(step_parts)))
    total_gz = gz_size if gz_size is not None else len(gzip_bytes(raw))
    return TraceSize(
        json_per_step=step_json / steps,
        gz_per_step=step_gz / steps,
        json_fixed=max(len(raw) - step_json, 0.0),
        gz_fixed=float(max(total_gz - step_gz, 0)),
        events_per_step=len(step_parts) / steps,
        option_bytes={option: size / steps for option, size in option_bytes.items() if size > 0},
        steps=steps,
    )


def _once_per_trace(event: dict[str, Any], encloses_a_step: Any) -> bool:
    if event.get("ph") == "M" or event.get("cat") == "Trace":
        return True
    if event.get("ph") == "i" and "cat" not in event:  # the profiler's window markers
        return True
    # Python frames around the steps (the training loop, open when the profiler started) come once; the
    # frames between steps (data loading in the decorator form, the monitor's own) recur with each step.
    return event.get("cat") == "python_function" and encloses_a_step(event)


class TraceBudget:
    """The `trace_budget_mb` check of one rank: a step is measured once, then, as each window begins, the
    window's estimate is compared with the budget. It warns once per run and then does nothing more."""

    def __init__(self, config: ProfileConfig) -> None:
        self.config = config
        self.budget = float(config.trace_budget_mb or 0.0) * MB
        self.size: TraceSize | None = None
        self.done = False  # warned, or switched off after a failure

    @property
    def wants_measurement(self) -> bool:
        return not self.done and self.size is None

    def measured(self, raw: bytes) -> None:
        """The JSON of a trace recorded over one (warmup) step."""
        self.size = measure_trace(raw)

    def exported(self, json_bytes: int, gz_bytes: int, steps: int) -> None:
        """A window of `steps` steps was exported: later windows are checked against its real size."""
        if self.done or steps < 1:
            return
        if self.size is None:
            self.size = TraceSize(json_per_step=json_bytes / steps, gz_per_step=gz_bytes / steps, steps=steps)
        else:
            self.size = self.size.corrected(json_bytes, gz_bytes, steps)

    def check(self, active: int, last_step: int) -> str | None:
        """The warning for a window of `active` steps ending at `last_step` if its estimate exceeds the budget;
        None otherwise, and always after the first warning."""
        if self.done or self.size is None:
            return None
        if self.size.window_json(active) <= self.budget:
            return None
        self.done = True
        return over_budget_message(self.size, active, self.budget, self.config, last_step)


def enabled_droppable(config: ProfileConfig) -> list[str]:
    return [option for option in DROPPABLE if getattr(config, option)]


def over_budget_message(
    size: TraceSize, active: int, budget: float, config: ProfileConfig, last_step: int
) -> str:
    """What the budget warning says: the estimate, the budget, how many steps fit, which options to drop."""
    estimate = size.window_json(active)
    head = (
        f"stepscope: the trace of the window ending at step {last_step} will be about {fmt_mb(estimate)} of "
        f"JSON ({fmt_mb(size.window_gz(active))} on disk as .json.gz), over trace_budget_mb="
        f"{config.trace_budget_mb:g} ({fmt_mb(size.json_per_step)} per step x {active} active steps + "
        f"{fmt_mb(size.json_fixed)})."
    )
    fit = size.steps_within(budget)
    advice = [f"{steps_fit(fit)} in it (active={fit})" if fit else "Not even one active step fits in it"]
    options = enabled_droppable(config)
    costs = {option: size.option_bytes.get(option) for option in options}
    options.sort(key=lambda option: -(costs[option] or 0.0))
    drops = []
    for option in options:
        cost = costs[option]
        if cost:
            share = 100.0 * cost / size.json_per_step
            then = size.steps_within(budget, [option])
            drops.append(f"{option} ({fmt_mb(cost)} per step, {share:.0f}%; without it {steps_fit(then)})")
        elif size.events_per_step is None:  # sized from a window's totals: what each option costs is unknown
            drops.append(option)
    costly = [option for option in options if costs[option]]
    if drops:
        advice.append("to make steps smaller, drop " + ", ".join(drops))
        if len(costly) > 1:
            both = "both" if len(costly) == 2 else f"all {len(costly)}"
            advice.append(f"without {both}, {steps_fit(size.steps_within(budget, costly))}")
    elif options:
        advice.append(f"{', '.join(options)} add nothing measurable here: lower active or raise the budget")
    else:
        advice.append(f"none of {', '.join(DROPPABLE)} is on: lower active or raise the budget")
    note = ""
    if config.memory_timeline and options:
        note = " (memory_timeline needs record_shapes, profile_memory and with_stack)"
    return f"{head} {'; '.join(advice)}{note}."


def steps_fit(n: int) -> str:
    """'1 active step fits', '3 active steps fit'."""
    return "1 active step fits" if n == 1 else f"{n} active steps fit"
