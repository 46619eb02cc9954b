"""Result types of the memory analyses (`stepscope memory`): plain msgspec Structs, JSON schema
`stepscope.memory/1`. Byte counts are integers; times are integer microseconds from the first event."""

from __future__ import annotations

import msgspec

MEMORY_SCHEMA = "stepscope.memory/1"


class LiveBlock(msgspec.Struct, frozen=True):
    """One allocated block alive when the snapshot was taken, with where it was allocated."""

    device: int
    address: int
    size: int
    requested_size: int
    site: str
    stack: list[str]


class CallSite(msgspec.Struct, frozen=True):
    """A source line (first frame outside torch) and the live bytes allocated from it."""

    site: str
    bytes: int
    blocks: int
    stack: list[str]


class SegmentStats(msgspec.Struct, frozen=True):
    """The cudaMalloc'd segments of one device at snapshot time."""

    count: int
    total: int
    largest: int
    smallest: int
    large_count: int
    small_count: int


class OomEvent(msgspec.Struct, frozen=True):
    """An allocation the allocator could not satisfy (`oom` trace entry)."""

    device: int
    t_us: int | None
    requested: int
    device_free: int
    site: str
    stack: list[str]


class DeviceMemory(msgspec.Struct, frozen=True):
    """Memory figures of one device.

    `reserved`/`allocated`/`active` are the state at snapshot time (from segments; None for a memory
    timeline). `peak_*` also cover the replayed trace. `inactive_split` is free memory inside segments that
    still hold live blocks: empty_cache() cannot return it, so it is the fragmentation that costs.
    """

    device: int
    reserved: int | None
    allocated: int | None
    active: int | None
    requested: int | None
    inactive_split: int | None
    peak_allocated: int
    peak_reserved: int | None
    peak_t_us: int | None
    trace_entries: int
    trace_baseline: int
    segments: SegmentStats | None
    timeline_t_us: list[int]
    timeline_allocated: list[int]
    timeline_reserved: list[int] | None
    time_is_index: bool
    ooms: list[OomEvent]
    categories_at_peak: dict[str, int] | None = None
    # memory timelines: bytes per category at each point of timeline_t_us (the categories add up to allocated)
    timeline_by_category: dict[str, list[int]] | None = None

    @property
    def cached_unused(self) -> int | None:
        """Reserved but not allocated: what the caching allocator holds back."""
        if self.reserved is None or self.allocated is None:
            return None
        return self.reserved - self.allocated

    @property
    def fragmentation(self) -> float | None:
        """inactive_split / reserved, 0..1."""
        if not self.reserved or self.inactive_split is None:
            return None
        return self.inactive_split / self.reserved


class MemoryReport(msgspec.Struct, frozen=True):
    """What `stepscope memory` reports for one file."""

    source: str
    kind: str  # "snapshot" or "memory_timeline"
    devices: list[DeviceMemory]
    top_blocks: list[LiveBlock]
    top_sites: list[CallSite]
    notes: list[str]
    schema: str = MEMORY_SCHEMA


def to_document(report: MemoryReport) -> dict[str, object]:
    """The JSON document of `--json`: the report plus the derived fragmentation figures per device."""
    doc = msgspec.to_builtins(report)
    for dev, out in zip(report.devices, doc["devices"], strict=True):
        out["cached_unused"] = dev.cached_unused
        out["fragmentation"] = dev.fragmentation
    return {"schema": MEMORY_SCHEMA, **{k: v for k, v in doc.items() if k != "schema"}}
