"""Host memory: tracemalloc traces the Python heap during each window (host_memory=True).

tracemalloc starts before the window's first traced step (its warmup), a snapshot is taken before its first
active step and one after its last, and tracemalloc stops: between windows it costs nothing. The training thread
pays for the tracing during the window and for taking the two snapshots (a copy of the traces); comparing them,
naming each site's function and writing the top sites by size and by growth (a HostMemory payload, kind
`host_memory`) happen on a thread of their own.
"""

from __future__ import annotations

import ast
import threading
import time
import tracemalloc
from functools import lru_cache
from typing import Any

from stepscope.capture.collector import Collector, RunContext
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.payloads import HostMemory, MemorySite

TOP_SITES = 25  # sites kept per window by size, and as many by growth
FRAMES = 1  # frames per traceback: the allocating line (more multiplies tracemalloc's cost)


class HostMemoryCollector(Collector):
    """tracemalloc over each window of this rank; its top allocation sites per window."""

    name = "host_memory"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self._start_step: int | None = None
        self._first_active: int | None = None
        self._last_active: int | None = None
        self._before: Any = None  # the snapshot before the first active step
        self._snapshot_ms = 0.0
        self._ours = False  # tracemalloc was started here (a job that traces already keeps its tracing)
        self._threads: list[threading.Thread] = []

    def next_busy(self, step: int) -> int:
        if self._start_step is None:
            return self.ctx.schedule.next_traced_step(step)
        return step  # the window's few steps

    def before_step(self, step: int) -> None:
        schedule = self.ctx.schedule
        if self._start_step is None:
            if not schedule.is_traced(step):
                return
            self._start_step = step
            last = schedule.window_end(step)
            self._first_active, self._last_active = last - schedule.active + 1, last
            self._ours = not tracemalloc.is_tracing()
            if self._ours:
                tracemalloc.start(FRAMES)
            tracemalloc.reset_peak()
        if step == self._first_active and self._before is None:
            self._before = self._take()

    def after_step(self, step: int, wall_ms: float) -> None:
        if self._last_active is not None and step >= self._last_active:
            self._finish(step)
        return None

    def close(self) -> None:
        if self._start_step is not None:
            self._finish(max(self.ctx.step - 1, self._start_step))
        for thread in self._threads:
            thread.join(60.0)
        self._threads = []

    def _take(self) -> Any:
        t0 = time.perf_counter()
        snapshot = tracemalloc.take_snapshot()
        self._snapshot_ms += (time.perf_counter() - t0) * 1e3
        return snapshot

    def _finish(self, last_step: int) -> None:
        after = self._take()
        traced, peak = tracemalloc.get_traced_memory()
        if self._ours:
            tracemalloc.stop()
        before = self._before
        start, first = self._start_step or 0, self._first_active
        first = first if first is not None and first <= last_step else start
        ms = self._snapshot_ms
        self._start_step = self._first_active = self._last_active = None
        self._before, self._snapshot_ms = None, 0.0
        notes = [] if self._ours else ["tracemalloc was already tracing: the job's own tracing was kept"]
        args = (before, after, start, first, last_step, traced, peak, ms, notes)
        thread = threading.Thread(target=self._write, args=args, name="stepscope-host-memory", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _write(
        self,
        before: Any,
        after: Any,
        start: int,
        first: int,
        last: int,
        traced: int,
        peak: int,
        snapshot_ms: float,
        notes: list[str],
    ) -> None:
        ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
        after = after.filter_traces(ignore)
        sizes = {s.traceback[0]: s for s in after.statistics("lineno")}
        grown: dict[Any, Any] = {}
        if before is not None:
            for d in after.compare_to(before.filter_traces(ignore), "lineno"):
                grown[d.traceback[0]] = d
        else:
            grown = {frame: s for frame, s in sizes.items()}
        by_size = sorted(sizes, key=lambda f: -sizes[f].size)[:TOP_SITES]
        by_growth = sorted(grown, key=lambda f: -_growth(grown[f]))[:TOP_SITES]
        sites = []
        for frame in dict.fromkeys([*by_size, *by_growth]):
            size = sizes.get(frame)
            delta = grown.get(frame)
            sites.append(
                MemorySite(
                    function=function_at(frame.filename, frame.lineno),
                    file=frame.filename,
                    line=frame.lineno,
                    size_bytes=size.size if size is not None else 0,
                    blocks=size.count if size is not None else 0,
                    growth_bytes=_growth(delta) if delta is not None else 0,
                    growth_blocks=_growth_blocks(delta) if delta is not None else 0,
                )
            )
        payload = HostMemory(
            rank=self.ctx.rank,
            start_step=start,
            first_step=first,
            last_step=last,
            traced_bytes=int(traced),
            peak_bytes=int(peak),
            sites=sites,
            snapshot_ms=round(snapshot_ms, 3),
            notes=notes,
        )
        self.ctx.writer.write_json(ArtifactKind.HOST_MEMORY, payload, last)


def _growth(stat: Any) -> int:
    return int(getattr(stat, "size_diff", getattr(stat, "size", 0)))


def _growth_blocks(stat: Any) -> int:
    return int(getattr(stat, "count_diff", getattr(stat, "count", 0)))


@lru_cache(maxsize=256)
def _functions(filename: str) -> tuple[tuple[int, int, str], ...] | None:
    """(first line, last line, qualified name) of every function and class body of a source file; None when it
    cannot be read."""
    try:
        with open(filename, encoding="utf-8") as file:
            tree = ast.parse(file.read(), filename)
    except (OSError, SyntaxError, ValueError):
        return None
    out: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                end = getattr(child, "end_lineno", None) or child.lineno
                out.append((child.lineno, end, name))
                visit(child, name + ("." if isinstance(child, ast.ClassDef) else ".<locals>."))
            else:
                visit(child, prefix)

    visit(tree, "")
    return tuple(out)


def function_at(filename: str, line: int) -> str:
    """The innermost function (or class) of `filename` around `line`; <module> at the top level, ? when the
    source cannot be read."""
    functions = _functions(filename)
    if functions is None:
        return "?"
    found = [(first, name) for first, last, name in functions if first <= line <= last]
    return max(found)[1] if found else "<module>"
