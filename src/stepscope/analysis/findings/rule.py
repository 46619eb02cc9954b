"""`Rule`: what a family of findings declares about each kind of finding it raises (registry.py gathers them)."""

from __future__ import annotations

import msgspec

__all__ = ["Rule"]


class Rule(msgspec.Struct, frozen=True):
    """One kind of finding. `section`: the report section with its evidence (overview, gpu, ops,
    communication, ranks); `priced_by`: what its `cost_ms_per_step` measures ("" for a finding without a
    price)."""

    id: str
    section: str
    priced_by: str
