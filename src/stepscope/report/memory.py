"""Render a `MemoryReport`: rich tables for the terminal and one self-contained HTML page (inline SVG chart,
no script, no external URL, so it opens offline). Renderers format; they never compute."""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.text import Text

from stepscope.report.terminal import fmt_bytes, fmt_pct, fmt_us, make_table, plain
from stepscope.runfolder.atomic import atomic_write_text

if TYPE_CHECKING:
    from stepscope.analysis.memory.model import DeviceMemory, MemoryReport

_SPARK = "▁▂▃▄▅▆▇█"


def _device_name(device: int) -> str:
    return "-" if device < 0 else f"cuda:{device}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else fmt_pct(100.0 * value)


def _time(dev: DeviceMemory, t: int | None) -> str:
    if t is None:
        return "-"
    return f"entry {t}" if dev.time_is_index else fmt_us(t)


def sparkline(values: Sequence[int], width: int = 60) -> str:
    """A one-line bar chart of `values` (max of each of `width` buckets)."""
    if not values:
        return ""
    n = len(values)
    cols = [
        max(values[i * n // width : max(i * n // width + 1, (i + 1) * n // width)])
        for i in range(min(width, n))
    ]
    top = max(cols) or 1
    return "".join(
        _SPARK[min(len(_SPARK) - 1, int(v / top * (len(_SPARK) - 1) + 0.5))] if v > 0 else " " for v in cols
    )


def _segments(d: DeviceMemory) -> str:
    s = d.segments
    if s is None:
        return "-"
    return f"{s.count} ({s.large_count} large, {s.small_count} small; largest {fmt_bytes(s.largest)})"


# (label, value of one device as text): the rows of the devices table, one column per device.
_DEVICE_FIGURES: tuple[tuple[str, Callable[[DeviceMemory], str]], ...] = (
    ("peak allocated", lambda d: fmt_bytes(d.peak_allocated)),
    ("peak at", lambda d: _time(d, d.peak_t_us)),
    ("peak reserved", lambda d: fmt_bytes(d.peak_reserved)),
    ("allocated (at snapshot)", lambda d: fmt_bytes(d.allocated)),
    ("reserved (at snapshot)", lambda d: fmt_bytes(d.reserved)),
    ("reserved - allocated", lambda d: fmt_bytes(d.cached_unused)),
    ("inactive split", lambda d: fmt_bytes(d.inactive_split)),
    ("fragmentation", lambda d: _ratio(d.fragmentation)),
    ("segments", _segments),
    ("trace entries", lambda d: str(d.trace_entries)),
    ("allocated before history", lambda d: fmt_bytes(d.trace_baseline)),
    ("OOM events", lambda d: str(len(d.ooms))),
)


def device_rows(report: MemoryReport) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the devices table: one row per figure, one column per device."""
    columns = ["", *(_device_name(d.device) for d in report.devices)]
    return columns, [[label, *(value(d) for d in report.devices)] for label, value in _DEVICE_FIGURES]


class MemoryView:
    """A memory report as tables (a rich renderable)."""

    def __init__(self, report: MemoryReport) -> None:
        self.report = report

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from _memory_parts(self.report)


def _memory_parts(report: MemoryReport) -> Iterator[RenderableType]:
    what = "CUDA memory snapshot" if report.kind == "snapshot" else "Memory timeline"
    # a long path is folded, never cut: every character of it is printed
    yield Text.assemble((what, "bold"), ": ", plain(report.source), overflow="fold")
    if report.kind == "snapshot":
        yield make_table("Devices", *device_rows(report))
    for d in report.devices:
        if report.kind != "snapshot":
            yield (
                f"peak allocated {fmt_bytes(d.peak_allocated)} at {_time(d, d.peak_t_us)} "
                f"({d.trace_entries} events)"
            )
        if d.timeline_allocated:
            prefix = "" if d.device < 0 else f"{_device_name(d.device)} "
            yield Text(f"{prefix}allocated over time |{sparkline(d.timeline_allocated, 48)}|")
        if d.categories_at_peak:
            rows: list[tuple[Any, ...]] = [
                (name, fmt_bytes(n), fmt_pct(100.0 * n / d.peak_allocated))
                for name, n in d.categories_at_peak.items()
            ]
            yield make_table("By category at the peak", ("category", "bytes", "share"), rows)
    if report.top_sites:
        rows = [(s.site, fmt_bytes(s.bytes), s.blocks) for s in report.top_sites]
        yield make_table("Call sites holding the most live memory", ("site", "live", "blocks"), rows)
    if report.top_blocks:
        rows = [
            (
                b.site,
                fmt_bytes(b.size),
                fmt_bytes(b.requested_size),
                _device_name(b.device),
            )
            for b in report.top_blocks
        ]
        yield make_table("Largest live blocks", ("allocated at", "size", "requested", "device"), rows)
    ooms = [o for d in report.devices for o in d.ooms]
    if ooms:
        dev_by_id = {d.device: d for d in report.devices}
        rows = [
            (
                o.site,
                _device_name(o.device),
                _time(dev_by_id[o.device], o.t_us),
                fmt_bytes(o.requested),
                fmt_bytes(o.device_free),
            )
            for o in ooms
        ]
        yield (
            make_table(
                "Out-of-memory events", ("site", "device", "when", "requested", "free on device"), rows
            )
        )


# ---------------------------------------------------------------------------------------------- HTML

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}
th,td{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right;font-variant-numeric:tabular-nums}
th{background:#f3f3f3}
td.l,th.l{text-align:left;font-family:monospace;font-size:90%}
td.l{white-space:pre}
svg text{font-size:11px;fill:#444}
.note{color:#864}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[object]], left: Sequence[int] = ()
) -> str:
    head = "".join(
        f"<th class='l'>{_e(c)}</th>" if i in left else f"<th>{_e(c)}</th>" for i, c in enumerate(columns)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='l'>{_e(v)}</td>" if i in left else f"<td>{_e(v)}</td>" for i, v in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<h2>{_e(title)}</h2><table><tr>{head}</tr>{body}</table>"


def timeline_svg(dev: DeviceMemory, width: int = 900, height: int = 280) -> str:
    """An inline SVG line chart of allocated (and reserved) bytes over time."""
    xs, ya, yr = dev.timeline_t_us, dev.timeline_allocated, dev.timeline_reserved or []
    if not xs:
        return ""
    left, right, top, bottom = 80, 20, 20, 40
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    ymax = max([*ya, *yr, 1])

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - y / ymax * (height - top - bottom)

    def poly(ys: Sequence[int], colour: str, label: str) -> str:
        # Memory holds its level until the next event: draw steps, not slopes.
        steps = [(xs[0], ys[0])]
        for x, y, prev in zip(xs[1:], ys[1:], ys, strict=False):
            steps += [(x, prev), (x, y)]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in steps)
        return f"<polyline fill='none' stroke='{colour}' stroke-width='1.5' points='{points}'><title>{_e(label)}</title></polyline>"

    parts = [f"<svg width='{width}' height='{height}' role='img' aria-label='memory timeline'>"]
    for i in range(5):
        y = ymax * i / 4
        parts.append(
            f"<line x1='{left}' x2='{width - right}' y1='{py(y):.1f}' y2='{py(y):.1f}' stroke='#eee'/>"
        )
        parts.append(f"<text x='{left - 6}' y='{py(y) + 4:.1f}' text-anchor='end'>{_e(fmt_bytes(y))}</text>")
    for i in range(5):
        x = x0 + (x1 - x0) * i / 4
        label = f"{x:.0f}" if dev.time_is_index else fmt_us(x)
        parts.append(
            f"<text x='{px(x):.1f}' y='{height - bottom + 16}' text-anchor='middle'>{_e(label)}</text>"
        )
    if yr:
        parts.append(poly(yr, "#c77", "reserved"))
    parts.append(poly(ya, "#36c", "allocated"))
    if dev.peak_t_us is not None:
        label = f"peak {fmt_bytes(dev.peak_allocated)} at {_time(dev, dev.peak_t_us)}"
        parts.append(
            f"<circle cx='{px(dev.peak_t_us):.1f}' cy='{py(dev.peak_allocated):.1f}' r='4' fill='#d33'>"
            f"<title>{_e(label)}</title></circle>"
        )
    xlabel = "trace entry" if dev.time_is_index else "time since first event"
    parts.append(
        f"<text x='{(left + width - right) / 2}' y='{height - 6}' text-anchor='middle'>{_e(xlabel)}</text>"
    )
    parts.append("</svg>")
    legend = (
        "<p><span style='color:#36c'>&#9632; allocated</span>"
        + (" <span style='color:#c77'>&#9632; reserved</span>" if yr else "")
        + "</p>"
    )
    return "".join(parts) + legend


# The page's Content-Security-Policy, in the report's style: it holds no script, so none may run (a name from the
# snapshot that escaped its escaping still could not), and nothing is loaded from anywhere.
MEMORY_PAGE_CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'none'",
        "style-src 'unsafe-inline'",
        "img-src data:",
        "base-uri 'none'",
        "form-action 'none'",
    ]
)


def memory_html(report: MemoryReport) -> str:
    """The whole page as one string."""
    what = "CUDA memory snapshot" if report.kind == "snapshot" else "Memory timeline"
    out = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f'<meta http-equiv="Content-Security-Policy" content="{MEMORY_PAGE_CSP}">',
        f"<title>stepscope memory: {_e(Path(report.source).name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(what)}</h1><p class='l'>{_e(report.source)}</p>",
    ]
    if report.kind == "snapshot":
        out.append(_table("Devices", *device_rows(report), left=(0,)))
    for d in report.devices:
        out.append(f"<h2>Allocated over time: {_e(_device_name(d.device))}</h2>")
        out.append(f"<p>peak allocated {_e(fmt_bytes(d.peak_allocated))} at {_e(_time(d, d.peak_t_us))}</p>")
        out.append(timeline_svg(d))
        if d.categories_at_peak:
            rows: list[tuple[Any, ...]] = [(k, fmt_bytes(v), v) for k, v in d.categories_at_peak.items()]
            out.append(_table("By category at the peak", ("category", "size", "bytes"), rows, left=(0,)))
    if report.top_sites:
        rows = [
            (fmt_bytes(s.bytes), s.bytes, s.blocks, "\n".join(s.stack) or s.site) for s in report.top_sites
        ]
        out.append(
            _table(
                "Call sites holding the most live memory",
                ("live", "bytes", "blocks", "stack"),
                rows,
                left=(3,),
            )
        )
    if report.top_blocks:
        rows = [
            (
                fmt_bytes(b.size),
                b.size,
                b.requested_size,
                _device_name(b.device),
                hex(b.address),
                "\n".join(b.stack) or b.site,
            )
            for b in report.top_blocks
        ]
        out.append(
            _table(
                "Largest live blocks",
                ("size", "bytes", "requested", "device", "address", "stack"),
                rows,
                left=(5,),
            )
        )
    ooms = [o for d in report.devices for o in d.ooms]
    if ooms:
        rows = [
            (
                _device_name(o.device),
                o.t_us if o.t_us is not None else "-",
                o.requested,
                o.device_free,
                o.site,
            )
            for o in ooms
        ]
        out.append(
            _table(
                "Out-of-memory events",
                ("device", "t (us)", "requested", "free on device", "site"),
                rows,
                left=(4,),
            )
        )
    out.extend(f"<p class='note'>note: {_e(n)}</p>" for n in report.notes)
    out.append("</body></html>\n")
    return "".join(out)


def write_memory_html(report: MemoryReport, path: str | Path) -> Path:
    """Write the page atomically (a reader never sees half a file)."""
    return atomic_write_text(path, memory_html(report))
