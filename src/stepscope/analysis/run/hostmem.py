"""tracemalloc's allocation sites of a run read back: per rank, the sites that hold the most Python heap and
those that grow in every window (kind `host_memory`).

In each window tracemalloc traces from the first warmup step; a site's growth is what it allocated during the
active steps and still held at the window's end (the warmup step's one-off allocations are not growth). A site
grows when that growth reaches GROWTH_MIN_BYTES_PER_STEP per active step in every window the rank recorded.
"""

from __future__ import annotations

import msgspec

from stepscope.analysis.run.python_samples import short_where
from stepscope.runfolder.payloads import HostMemory

GROWTH_MIN_BYTES_PER_STEP = 4096  # a site that keeps less per step is not reported as growing
TOP_SITES = 10


class SiteFacts(msgspec.Struct):
    """One allocation site of one rank over its windows."""

    function: str
    where: str  # file:line (the file's last two parts)
    file: str
    line: int
    size_bytes: int  # alive at the end of the rank's last window
    growth_bytes_per_step: float  # kept per active step, the mean over the windows
    windows_grown: int  # windows in which it kept GROWTH_MIN_BYTES_PER_STEP per active step or more
    windows: int


class HostMemoryFacts(msgspec.Struct):
    """tracemalloc's figures of one rank (`analyze --json`: run.host_memory)."""

    rank: int
    windows: int
    traced_bytes: int  # all tracemalloc held at the end of the last window
    peak_bytes: int  # its peak over the windows
    snapshot_ms: float  # the snapshots' cost to the training thread, summed over the windows
    growing: list[SiteFacts]  # sites that grew in every window, by growth per step
    top: list[SiteFacts]  # sites by size at the end of the last window
    notes: list[str]


def _active_steps(h: HostMemory) -> int:
    return max(h.last_step - h.first_step + 1, 1)


def host_memory_facts(records: list[HostMemory]) -> list[HostMemoryFacts]:
    """One HostMemoryFacts per rank, from its windows in step order."""
    by_rank: dict[int, list[HostMemory]] = {}
    for h in records:
        by_rank.setdefault(h.rank, []).append(h)
    return [_rank_facts(rank, sorted(hs, key=lambda h: h.last_step)) for rank, hs in sorted(by_rank.items())]


def _rank_facts(rank: int, windows: list[HostMemory]) -> HostMemoryFacts:
    last = windows[-1]
    per_site: dict[tuple[str, str, int], list[float]] = {}
    grown: dict[tuple[str, str, int], int] = {}
    for h in windows:
        steps = _active_steps(h)
        for site in h.sites:
            key = (site.function, site.file, site.line)
            rate = site.growth_bytes / steps
            per_site.setdefault(key, []).append(rate)
            if rate >= GROWTH_MIN_BYTES_PER_STEP:
                grown[key] = grown.get(key, 0) + 1
    size_at_end = {(s.function, s.file, s.line): s.size_bytes for s in last.sites}
    n = len(windows)

    def facts(key: tuple[str, str, int]) -> SiteFacts:
        function, file, line = key
        rates = per_site.get(key, [])
        return SiteFacts(
            function=function,
            where=short_where(file, line),
            file=file,
            line=line,
            size_bytes=size_at_end.get(key, 0),
            growth_bytes_per_step=round(sum(rates) / n, 1),  # a window that did not list it kept ~nothing
            windows_grown=grown.get(key, 0),
            windows=n,
        )

    growing = sorted(
        (facts(k) for k, count in grown.items() if count == n), key=lambda f: -f.growth_bytes_per_step
    )
    top = sorted((facts(k) for k in size_at_end), key=lambda f: -f.size_bytes)[:TOP_SITES]
    notes = [note for h in windows for note in h.notes]
    if n == 1:
        notes.append(
            "one window: a site that grows in it may be a one-off; with repeat >= 2 a growing site is one that "
            "grows in every window"
        )
    return HostMemoryFacts(
        rank=rank,
        windows=n,
        traced_bytes=last.traced_bytes,
        peak_bytes=max(h.peak_bytes for h in windows),
        snapshot_ms=round(sum(h.snapshot_ms for h in windows), 3),
        growing=growing[:TOP_SITES],
        top=top,
        notes=notes,
    )
