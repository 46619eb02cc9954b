"""The report's section of what capture sampled on the host: py-spy's Python functions and flame graph, and
tracemalloc's allocation sites (growing ones first). Formatting only."""

from __future__ import annotations

from stepscope.report import columns as col
from stepscope.report.data import ReportData
from stepscope.report.html import charts
from stepscope.report.model import SECTION_TITLES, Charts, Section, table
from stepscope.units import fmt_bytes

PY_ROWS = 15


def host(data: ReportData, pc: Charts) -> Section:
    s = Section("host", SECTION_TITLES["host"])
    run = data.analysis.run
    if run is None:
        s.empty = "Python samples and host memory are taken during capture (python_sampling, host_memory)"
        return s
    _python(s, data, pc)
    _heap(s, data)
    if not run.python_samples and not run.host_memory:
        s.empty = "this run took no Python samples and traced no host memory (python_sampling, host_memory were off)"
    return s


def _python(s: Section, data: ReportData, pc: Charts) -> None:
    run = data.analysis.run
    assert run is not None
    latest = {p.rank: p for p in sorted(run.python_samples, key=lambda p: p.last_step)}
    for rank, p in sorted(latest.items()):
        s.facts.append(
            (
                f"rank {rank}: Python samples",
                f"{p.samples} of thread {p.thread or '-'} over {p.sampled_s:.2f} s at {p.rate_hz} Hz, "
                f"steps {p.first_step}-{p.last_step}" + (f" ({p.note})" if p.note else ""),
            )
        )
        s.tables.append(
            table(
                f"python-functions-{rank}",
                [col.PY_FUNCTION, col.PY_WHERE, col.PY_SELF, col.PY_INCLUSIVE, col.PY_SAMPLES],
                [
                    [f.function, f.where, f.self_pct, f.inclusive_pct, f.self_samples]
                    for f in p.functions[:PY_ROWS]
                ],
                caption=f"Rank {rank}: the Python functions holding the training thread's time (py-spy), by self "
                "time: self is the share of the thread's time with the function at the top of the Python stack "
                "(the native code it calls included), inclusive with it anywhere on the stack.",
            )
        )
    for f in data.run.python_flames if data.run is not None else []:
        boxes = [
            {
                "depth": b.depth,
                "start": b.start,
                "end": b.end,
                "function": b.function,
                "where": b.where,
                "samples": b.samples,
                "pct": round(100 * b.samples / f.samples, 2) if f.samples else 0.0,
            }
            for b in f.boxes
        ]
        pc.add(
            s,
            charts.flame(boxes, f.samples),
            f"Flame graph of rank {f.rank}'s training thread, steps {f.first_step}-{f.last_step} ({f.samples} "
            "py-spy samples): the outermost frame at the bottom, each box as wide as its samples.",
        )


def _heap(s: Section, data: ReportData) -> None:
    run = data.analysis.run
    assert run is not None
    for h in run.host_memory:
        s.facts.append(
            (
                f"rank {h.rank}: Python heap (tracemalloc)",
                f"{fmt_bytes(h.traced_bytes)} traced at the last window's end, peak {fmt_bytes(h.peak_bytes)}, "
                f"{h.windows} window(s); snapshots cost the training thread {h.snapshot_ms:.1f} ms",
            )
        )
        s.items.extend(f"rank {h.rank}: {note}" for note in h.notes)
        growing = {(g.file, g.line) for g in h.growing}
        rows = [
            [g.function, g.where, g.size_bytes, g.growth_bytes_per_step, f"{g.windows_grown} of {g.windows}"]
            for g in h.growing
        ]
        rows += [
            [t.function, t.where, t.size_bytes, t.growth_bytes_per_step, f"{t.windows_grown} of {t.windows}"]
            for t in h.top
            if (t.file, t.line) not in growing
        ]
        s.tables.append(
            table(
                f"host-memory-{h.rank}",
                [col.PY_FUNCTION, col.PY_WHERE, col.SITE_SIZE, col.SITE_GROWTH, col.WINDOWS_GROWN],
                rows,
                caption=f"Rank {h.rank}: allocation sites that grow in every window first, then the largest "
                "(tracemalloc; growth: what a site allocated during the active steps and still held at the "
                "window's end, per active step).",
            )
        )
