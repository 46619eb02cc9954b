"""The process group of each collective instance, and its mesh dimension. Rules (docs/analysis.md,
"Parallelism"), first that applies:

1. `trace`: record_param_comms names the group (`Process Group Name`, with `Process Group Description` and
   `Process Group Ranks` where the trace carries them: NCCL; gloo on torch 2.13 writes none); what the args
   lack comes from the rank's `distributedInfo.pg_config` or the known groups, by name.
2. `capture`: a CPU backend's range (`gloo:all_reduce`) runs on the thread of its group's backend; capture
   recorded each gloo group's worker threads on the rank and how many collectives the group issued in each
   window. The range is the group's whose threads it ran on, where the trace agrees with that record: the
   recorded window spans the trace's steps and the group's ranges on its threads, over the whole trace, are
   as many as it issued; a group whose count differs keeps its ranges unknown, with a note.
3. `only group`: the trace does not name it, but the rank belongs to one process group only (by its
   `pg_config`, else by the known groups): that one.
4. `matched ranks` (across ranks, cross_rank/distributed.py): instances still unknown that match across ranks take
   the group of those ranks where no other group could hold them.
5. `unknown`: otherwise; the group stays null and says so (`group_source`), never guessed.

Known groups: name -> {description, ranks, backend, mesh_dim, threads, windows}, as a capture's record of the
job's groups gives them (threads: rank -> gloo worker tids; windows: rank -> [(first step, last step, issued)]). The dimension is the known group's `mesh_dim`, else the DeviceMesh name in the description
(`mesh_tp` -> `tp`), else the description (`default_pg`), else null.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import msgspec

KnownGroups = Mapping[str, Mapping[str, Any]]
GROUP_SOURCES = ("trace", "capture", "only group", "matched ranks", "unknown")
_MESH_DESC = re.compile(r"^mesh_(.+)$")
_INT = re.compile(r"-?\d+")


class Group(msgspec.Struct, frozen=True):
    name: str  # "" unknown
    description: str
    ranks: tuple[int, ...] | None
    dim: str | None
    source: str  # one of GROUP_SOURCES


UNKNOWN = Group("", "", None, None, "unknown")


def parse_ranks(value: Any) -> tuple[int, ...] | None:
    """Ranks from a list of ints or a text such as "[0, 1]"; None when neither. A text is parsed once: every
    collective of a group names the same ranks, and the group of a job of 3,000 ranks is 17 KB of text (one
    tuple each, for 40 collectives on each of 3,000 ranks, held 4 GB)."""
    if isinstance(value, list | tuple) and all(type(r) is int for r in value):
        return tuple(value)
    if isinstance(value, str) and value.strip().startswith("["):
        return _parsed_ranks(value)
    return None


@functools.lru_cache(maxsize=256)
def _parsed_ranks(text: str) -> tuple[int, ...]:
    return tuple(int(r) for r in _INT.findall(text))


def dimension(description: str, mesh_dim: str | None = None) -> str | None:
    if mesh_dim:
        return mesh_dim
    match = _MESH_DESC.match(description)
    return match.group(1) if match else (description or None)


class GroupResolver:
    """Resolves the group of one rank's instances from the trace's args, its pg_config and known groups."""

    def __init__(self, rank: int, pg_config: list[dict[str, Any]], known: KnownGroups | None = None) -> None:
        self._groups: dict[str, dict[str, Any]] = {}
        self._rank = rank
        # name -> (this rank's gloo worker tids of the group, its windows: (first step, last step, issued))
        self._capture: dict[str, tuple[list[int], list[tuple[int, int, int]]]] = {}
        for name, g in (known or {}).items():
            tids = (g.get("threads") or {}).get(rank)
            if tids:
                windows = [(int(a), int(b), int(n)) for a, b, n in (g.get("windows") or {}).get(rank, [])]
                self._capture[str(name)] = (list(tids), windows)
            self._groups[str(name)] = {
                "description": str(g.get("description") or ""),
                "ranks": parse_ranks(g.get("ranks")),
                "mesh_dim": g.get("mesh_dim") or None,
            }
        for g in pg_config:
            name = str(g.get("pg_name", ""))
            if not name:
                continue
            entry = self._groups.setdefault(name, {"description": "", "ranks": None, "mesh_dim": None})
            entry["description"] = entry["description"] or str(g.get("pg_desc") or "")
            entry["ranks"] = entry["ranks"] or parse_ranks(g.get("ranks"))
        mine = [n for n, g in self._groups.items() if g["ranks"] is None or rank in g["ranks"]]
        own = [n for n in (str(g.get("pg_name", "")) for g in pg_config) if n] or mine
        self._only = self._group(own[0], "only group") if len(own) == 1 else UNKNOWN

    def _group(
        self, name: str, source: str, description: str = "", ranks: tuple[int, ...] | None = None
    ) -> Group:
        g = self._groups.get(name, {})
        desc = description or g.get("description", "")
        members = ranks or g.get("ranks")
        return Group(name, desc, members, dimension(desc, g.get("mesh_dim")), source)

    def thread_groups(
        self, steps: tuple[int, int] | None, ranges_by_tid: Mapping[int, int], notes: list[str]
    ) -> dict[int, str]:
        """tid -> group name, for the gloo groups whose capture record the trace agrees with (rule 2):
        `steps`, the first and last ProfilerStep of the rank's trace; `ranges_by_tid`, its CPU backend ranges
        per thread over the whole trace. What disagrees is said in `notes`."""
        found: dict[int, str] = {}
        if steps is None:
            return found
        for name, (tids, windows) in self._capture.items():
            window = [w for w in windows if w[0] <= steps[0] and steps[1] <= w[1]]
            ranges = sum(ranges_by_tid.get(t, 0) for t in tids)
            if len(window) == 1 and ranges == window[0][2]:
                found.update(dict.fromkeys(tids, name))
            elif len(window) == 1 or ranges:
                said = f"{window[0][2]} collectives issued" if len(window) == 1 else "no recorded window"
                notes.append(
                    f"process group {name!r}: {ranges} backend ranges on its threads in the trace, capture "
                    f"says {said} in steps {steps[0]}-{steps[1]}: its ranges are left in no group"
                )
        return found

    def by_capture(self, name: str) -> Group:
        return self._group(name, "capture")

    def resolve(self, name: str, description: str, ranks: tuple[int, ...] | None) -> Group:
        """The group of an instance whose args say `name` ("" when they do not), `description`, `ranks`."""
        if name:
            return self._group(name, "trace", description, ranks)
        return self._only
