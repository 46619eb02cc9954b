"""py-spy's samples of a run read back: the Python functions that hold each window's time, and its flame graph.

A window's samples (kind `python_samples`) are of every Python thread that was not idle; the figures here are of
the training thread (the thread that stepped the monitor), whose time is `sampled_s * rate_hz` samples: a
function's self share is the share of that time with it at the top of the Python stack (the native code it calls
included: native frames are off), its inclusive share the share with it anywhere on the stack.
"""

from __future__ import annotations

from pathlib import PurePath

import msgspec

from stepscope.runfolder.payloads import PythonSamples

TOP_FUNCTIONS = 10  # functions listed per window, by self time
FLAME_MIN_SHARE = 0.005  # flame-graph boxes narrower than this share of the samples are left out
FLAME_MAX_DEPTH = 48


class PyFunction(msgspec.Struct):
    """One Python function in one window: its samples, and its share of the training thread's sampled time."""

    function: str
    file: str
    line: int
    where: str  # file:line with the file shortened (its last two parts)
    self_samples: int
    inclusive_samples: int
    self_pct: float
    inclusive_pct: float


class PythonProfile(msgspec.Struct):
    """The Python functions of one rank's window, by self time (`analyze --json`: run.python_samples)."""

    rank: int
    first_step: int  # the first sampled step (the window's warmup) and the window's last active step
    last_step: int
    rate_hz: int
    sampled_s: float
    thread: str | None  # the thread the figures are of ("<native id> <name>")
    samples: int  # of that thread
    time_samples: int  # all its time in samples (sampled_s * rate_hz, or its samples where more)
    other_threads_samples: int  # samples of the process's other threads (not in the figures)
    functions: list[PyFunction]
    note: str | None  # why the figures are thin or missing


class FlameBox(msgspec.Struct):
    """One box of a flame graph: a function at a depth of the stack, over [start, end) in samples."""

    depth: int
    start: int
    end: int
    function: str
    where: str
    samples: int


class Flame(msgspec.Struct):
    """The flame graph of one rank's window (the training thread), boxes outermost first."""

    rank: int
    first_step: int
    last_step: int
    samples: int
    boxes: list[FlameBox]


def short_where(file: str, line: int) -> str:
    """`file:line` with only the file's last two parts (`pkg/module.py:12`)."""
    parts = PurePath(file).parts if file else ()
    return f"{'/'.join(parts[-2:]) or '?'}:{line}"


def _thread(samples: PythonSamples) -> tuple[int | None, str | None]:
    """The thread the figures are of: the training thread, else the one with the most samples (noted)."""
    if samples.training_thread is not None:
        return samples.training_thread, None
    totals: dict[int, int] = {}
    for stack in samples.stacks:
        totals[stack.thread] = totals.get(stack.thread, 0) + stack.count
    if not totals:
        return None, None
    busiest = max(totals, key=lambda t: (totals[t], -t))
    return busiest, "the training thread was never sampled busy: the figures are of the busiest thread"


def python_profile(samples: PythonSamples, top: int = TOP_FUNCTIONS) -> PythonProfile:
    """The functions holding the training thread's time in one window (self and inclusive shares)."""
    thread, note = _thread(samples)
    own = [s for s in samples.stacks if s.thread == thread]
    total = sum(s.count for s in own)
    other = sum(s.count for s in samples.stacks) - total
    time_samples = max(total, round(samples.sampled_s * samples.rate_hz))
    self_n: dict[int, int] = {}
    incl_n: dict[int, int] = {}
    for stack in own:
        if stack.frames:
            self_n[stack.frames[-1]] = self_n.get(stack.frames[-1], 0) + stack.count
        for frame in set(stack.frames):  # a recursive function counts once per sample
            incl_n[frame] = incl_n.get(frame, 0) + stack.count
    # functions by identity (a file and first line), several frame indices possibly naming one
    by_key: dict[tuple[str, str, int], list[int]] = {}
    for i in incl_n:
        f = samples.frames[i]
        key = (f.function, f.file, f.line)
        got = by_key.setdefault(key, [0, 0])
        got[0] += self_n.get(i, 0)
        got[1] += incl_n[i]
    ranked = sorted(by_key.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))[:top]

    def pct(n: int) -> float:
        return round(100 * n / time_samples, 2) if time_samples else 0.0

    functions = [
        PyFunction(name, file, line, short_where(file, line), s, i, pct(s), pct(i))
        for (name, file, line), (s, i) in ranked
    ]
    if thread is None:
        note = "py-spy took no sample of a busy thread in this window" + (
            f" ({'; '.join(samples.notes)})" if samples.notes else ""
        )
    return PythonProfile(
        rank=samples.rank,
        first_step=samples.first_step,
        last_step=samples.last_step,
        rate_hz=samples.rate_hz,
        sampled_s=samples.sampled_s,
        thread=samples.threads[thread] if thread is not None else None,
        samples=total,
        time_samples=time_samples,
        other_threads_samples=other,
        functions=functions,
        note=note,
    )


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


def flame(samples: PythonSamples) -> Flame:
    """The training thread's samples as flame-graph boxes: each stack's frames from the root, children of one box
    side by side (widest first), boxes under FLAME_MIN_SHARE of the samples and below FLAME_MAX_DEPTH left out."""
    thread, _ = _thread(samples)
    own = [s for s in samples.stacks if s.thread == thread]
    total = sum(s.count for s in own)
    root = _Node()
    for stack in own:
        node = root
        for frame in stack.frames[:FLAME_MAX_DEPTH]:
            node = node.children.setdefault(frame, _Node())
            node.count += stack.count
    boxes: list[FlameBox] = []
    floor = FLAME_MIN_SHARE * total

    def walk(node: _Node, depth: int, start: int) -> None:
        for frame, child in sorted(node.children.items(), key=lambda kv: -kv[1].count):
            if child.count < floor:
                continue
            f = samples.frames[frame]
            where = short_where(f.file, f.line)
            boxes.append(FlameBox(depth, start, start + child.count, f.function, where, child.count))
            walk(child, depth + 1, start)
            start += child.count

    walk(root, 0, 0)
    return Flame(samples.rank, samples.first_step, samples.last_step, total, boxes)
