"""The process group of each collective instance, and its mesh dimension. Rules (docs/analysis.md,
"Parallelism"), first that applies:

1. `trace`: record_param_comms names the group (`Process Group Name`, with `Process Group Description` and
   `Process Group Ranks` where the trace carries them: NCCL; gloo on torch 2.13 writes none); what the args
   lack comes from the rank's `distributedInfo.pg_config` or the known groups, by name.
2. `only group`: the trace does not name it, but the rank belongs to one process group only (by its
   `pg_config`, else by the known groups): that one.
3. `unknown`: otherwise; the group stays null and says so (`group_source`), never guessed.

Known groups: name -> {description, ranks, backend, mesh_dim}, as a capture's record of the job's groups gives
them. The dimension is the known group's `mesh_dim`, else the DeviceMesh name in the description
(`mesh_tp` -> `tp`), else the description (`default_pg`), else null.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KnownGroups = Mapping[str, Mapping[str, Any]]
GROUP_SOURCES = ("trace", "only group", "unknown")
_MESH_DESC = re.compile(r"^mesh_(.+)$")
_INT = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Group:
    name: str  # "" unknown
    description: str
    ranks: tuple[int, ...] | None
    dim: str | None
    source: str  # one of GROUP_SOURCES


UNKNOWN = Group("", "", None, None, "unknown")


def parse_ranks(value: Any) -> tuple[int, ...] | None:
    """Ranks from a list of ints or a text such as "[0, 1]"; None when neither."""
    if isinstance(value, list | tuple) and all(type(r) is int for r in value):
        return tuple(value)
    if isinstance(value, str) and value.strip().startswith("["):
        return tuple(int(r) for r in _INT.findall(value))
    return None


def dimension(description: str, mesh_dim: str | None = None) -> str | None:
    if mesh_dim:
        return mesh_dim
    match = _MESH_DESC.match(description)
    return match.group(1) if match else (description or None)


class GroupResolver:
    """Resolves the group of one rank's instances from the trace's args, its pg_config and known groups."""

    def __init__(self, rank: int, pg_config: list[dict[str, Any]], known: KnownGroups | None = None) -> None:
        self._groups: dict[str, dict[str, Any]] = {}
        for name, g in (known or {}).items():
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

    def resolve(self, name: str, description: str, ranks: tuple[int, ...] | None) -> Group:
        """The group of an instance whose args say `name` ("" when they do not), `description`, `ranks`."""
        if name:
            return self._group(name, "trace", description, ranks)
        return self._only
