"""Render a `MemoryReport`: rich tables for the terminal, and one self-contained HTML page of model sections on the
report's templates and Vega-Lite charts (nothing loaded from the network). Renderers format; they never compute."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.text import Text

from stepscope.report import columns as col
from stepscope.report.html import charts
from stepscope.report.model import Charts, Column, Section, Table, table
from stepscope.report.terminal import fit_table, fmt_bytes, fmt_pct, fmt_us, plain

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


def device_table(report: MemoryReport) -> Table:
    """The devices side by side: one row per figure, one column per device (the terminal's and the page's)."""
    return table(
        "devices-table",
        [col.FIGURE, *(Column(_device_name(d.device), figure=True) for d in report.devices)],
        ([label, *(value(d) for d in report.devices)] for label, value in _DEVICE_FIGURES),
        filter=False,
        title="Devices",
    )


def category_table(d: DeviceMemory) -> Table:
    """A device's memory at its peak by category (the terminal's and the page's; none without categories)."""
    return table(
        f"categories-{d.device}",
        [col.CATEGORY, col.SIZE, col.RAW_BYTES, col.SHARE],
        (
            [name, n, n, 100.0 * n / d.peak_allocated if d.peak_allocated else None]
            for name, n in (d.categories_at_peak or {}).items()
        ),
        caption="By category at the peak.",
        filter=False,
        title="By category at the peak",
    )


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
        yield fit_table(device_table(report))
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
            yield fit_table(category_table(d))
    if report.top_sites:
        yield fit_table(
            table(
                "sites",
                [col.SITE, col.LIVE, col.BLOCKS],
                ([s.site, s.bytes, s.blocks] for s in report.top_sites),
                title="Call sites holding the most live memory",
            )
        )
    if report.top_blocks:
        yield fit_table(
            table(
                "blocks",
                [col.ALLOCATED_AT, col.SIZE, col.REQUESTED, col.DEVICE],
                ([b.site, b.size, b.requested_size, _device_name(b.device)] for b in report.top_blocks),
                title="Largest live blocks",
            )
        )
    ooms = [(d, o) for d in report.devices for o in d.ooms]
    if ooms:
        yield fit_table(
            table(
                "ooms",
                [col.SITE, col.DEVICE, col.WHEN, col.REQUESTED, col.FREE_ON_DEVICE],
                (
                    [o.site, _device_name(o.device), _time(d, o.t_us), o.requested, o.device_free]
                    for d, o in ooms
                ),
                title="Out-of-memory events",
            )
        )


# ---------------------------------------------------------------------------------------------- HTML
def memory_sections(report: MemoryReport, pc: Charts) -> list[Section]:
    """The memory page: the devices, each device's allocation over time and its categories at the peak, the call
    sites and blocks holding the most memory, the out-of-memory events."""
    sections = []
    if report.kind == "snapshot":
        devices = Section("devices", "Devices")
        devices.tables.append(device_table(report))
        sections.append(devices)
    sections.extend(_device_section(d, pc) for d in report.devices)
    if report.top_sites:
        sites = Section("sites", "Call sites holding the most live memory")
        sites.tables.append(
            table(
                "sites-table",
                [col.LIVE, col.RAW_BYTES, col.BLOCKS, col.STACK],
                ([s.bytes, s.bytes, s.blocks, _stack(s.stack, s.site)] for s in report.top_sites),
            )
        )
        sections.append(sites)
    if report.top_blocks:
        blocks = Section("blocks", "Largest live blocks")
        blocks.tables.append(
            table(
                "blocks-table",
                [col.SIZE, col.RAW_BYTES, col.REQUESTED, col.DEVICE, col.ADDRESS, col.STACK],
                (
                    [
                        b.size,
                        b.size,
                        b.requested_size,
                        _device_name(b.device),
                        hex(b.address),
                        _stack(b.stack, b.site),
                    ]
                    for b in report.top_blocks
                ),
            )
        )
        sections.append(blocks)
    ooms = [(d, o) for d in report.devices for o in d.ooms]
    if ooms:
        section = Section("ooms", "Out-of-memory events")
        section.tables.append(
            table(
                "ooms-table",
                [col.DEVICE, col.WHEN, col.REQUESTED, col.FREE_ON_DEVICE, col.SITE],
                (
                    [_device_name(o.device), _time(d, o.t_us), o.requested, o.device_free, o.site]
                    for d, o in ooms
                ),
            )
        )
        sections.append(section)
    return sections


def _device_section(d: DeviceMemory, pc: Charts) -> Section:
    s = Section(f"device-{d.device}", f"Allocated over time: {_device_name(d.device)}")
    s.facts.append(("peak allocated", f"{fmt_bytes(d.peak_allocated)} at {_time(d, d.peak_t_us)}"))
    x_title = "trace entry" if d.time_is_index else "time since the first event (ms)"
    scale = 1 if d.time_is_index else 1000
    values = [
        {"x": t / scale, "series": name, "value": _mib(level)}
        for name, levels in (("allocated", d.timeline_allocated), ("reserved", d.timeline_reserved or []))
        for t, level in zip(d.timeline_t_us, levels, strict=False)
    ]
    pc.add(
        s,
        charts.lines(values, x="x", x_title=x_title, y_title="MiB", steps=True),
        "Allocated (and reserved) memory after each event; memory holds its level until the next one.",
    )
    if d.categories_at_peak:
        s.tables.append(category_table(d))
    return s


def _stack(stack: Sequence[str], site: str) -> str:
    return " < ".join(stack) or site  # innermost frame first


def _mib(n: int) -> float:
    return round(n / 2**20, 3)


def memory_html(report: MemoryReport) -> str:
    """The whole page as one string: the report's look, script and charts, self-contained."""
    from stepscope.report.html import render_sections_page

    pc = Charts()
    sections = memory_sections(report, pc)
    what = "CUDA memory snapshot" if report.kind == "snapshot" else "Memory timeline"
    return render_sections_page(
        title=f"stepscope memory: {Path(report.source).name}",
        heading=what,
        subtitle=report.source,
        header=[
            ("file", report.source),
            ("devices", ", ".join(_device_name(d.device) for d in report.devices)),
        ],
        sections=sections,
        notes=list(report.notes),
        charts=pc,
    )
