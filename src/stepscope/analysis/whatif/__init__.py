"""Critical path and what-if: each rank's steps as a dependency graph built from its trace, replayed with the
measured durations or with some work scaled (`stepscope whatif`).

The names below are this package's public API, imported on first use (importing the package costs nothing); the
replay itself is `whatif.replay.replay` (a name the package cannot export: its submodule has it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope._lazy import lazy_exports

if TYPE_CHECKING:
    from stepscope.analysis.whatif.graph import RankGraph, build_graph
    from stepscope.analysis.whatif.path import PathStep, critical_path
    from stepscope.analysis.whatif.predict import RankWhatIf, WhatIfResult, whatif
    from stepscope.analysis.whatif.replay import Replay, Scaling
    from stepscope.analysis.whatif.select import Selector, SelectorError, parse_selector, scaling_for

_EXPORTS = {
    "RankGraph": "graph",
    "build_graph": "graph",
    "PathStep": "path",
    "critical_path": "path",
    "Replay": "replay",
    "Scaling": "replay",
    "Selector": "select",
    "SelectorError": "select",
    "parse_selector": "select",
    "scaling_for": "select",
    "RankWhatIf": "predict",
    "WhatIfResult": "predict",
    "whatif": "predict",
}

__all__ = [
    "PathStep",
    "RankGraph",
    "RankWhatIf",
    "Replay",
    "Scaling",
    "Selector",
    "SelectorError",
    "WhatIfResult",
    "build_graph",
    "critical_path",
    "parse_selector",
    "scaling_for",
    "whatif",
]

__getattr__ = lazy_exports(__name__, _EXPORTS)
