"""The job's process groups and device meshes, from what each profiled rank recorded (kind `process_groups`).

Each rank records the groups it belongs to; the job's view is their union, one entry per group name (c10d
names a group alike on every rank: the name record_param_comms prints as "Process Group Name"), with the ranks
that recorded it. Two ranks that disagree on a group's members are said in a note, never merged silently.
"""

from __future__ import annotations

import msgspec

from stepscope.runfolder.payloads import ProcessGroups


class GroupFacts(msgspec.Struct):
    """One process group of the job."""

    name: str  # c10d's group name ("Process Group Name" in record_param_comms)
    description: str  # "Process Group Description": default_pg, mesh_<dim>, ...
    ranks: list[int]  # global ranks, in group-rank order
    backend: str
    mesh_dim: str | None  # the DeviceMesh dimension the group is, None when it is none
    size: int
    recorded_by: list[int]  # the profiled ranks whose record lists it


class MeshFacts(msgspec.Struct):
    """One DeviceMesh of the job."""

    device_type: str
    shape: list[int]
    dim_names: list[str] | None
    ranks: list[int]  # global ranks, row-major over `shape`


def job_groups(records: list[ProcessGroups]) -> tuple[list[GroupFacts], list[MeshFacts], list[str]]:
    """The job's groups (by name, in c10d's order), its meshes and notes (what a rank could not record; ranks
    that disagree on a group)."""
    groups: dict[str, GroupFacts] = {}
    meshes: dict[tuple[object, ...], MeshFacts] = {}
    notes: list[str] = []
    for record in sorted(records, key=lambda r: r.rank):
        notes.extend(f"rank {record.rank}: {note}" for note in record.notes)
        for group in record.groups:
            known = groups.get(group.name)
            if known is None:
                groups[group.name] = GroupFacts(
                    name=group.name,
                    description=group.description,
                    ranks=list(group.ranks),
                    backend=group.backend,
                    mesh_dim=group.mesh_dim,
                    size=group.size,
                    recorded_by=[record.rank],
                )
            elif known.ranks != group.ranks:
                notes.append(
                    f"process group {group.name!r}: ranks {known.ranks} on rank {known.recorded_by[0]}, "
                    f"{group.ranks} on rank {record.rank}; the first is kept"
                )
            elif record.rank not in known.recorded_by:
                known.recorded_by.append(record.rank)
        for mesh in record.meshes:
            key = (mesh.device_type, tuple(mesh.shape), tuple(mesh.dim_names or ()), tuple(mesh.ranks))
            meshes.setdefault(
                key, MeshFacts(mesh.device_type, list(mesh.shape), mesh.dim_names, list(mesh.ranks))
            )
    ordered = sorted(
        groups.values(), key=lambda g: (0, int(g.name), "") if g.name.isdigit() else (1, 0, g.name)
    )
    return ordered, list(meshes.values()), notes


def capture_evidence(records: list[ProcessGroups]) -> dict[str, dict[str, dict[int, object]]]:
    """Group name -> {"threads": rank -> its gloo worker tids, "windows": rank -> [(first step, last step,
    collectives issued)]}: what each rank's capture saw of the group, for the collectives analysis to put a
    gloo range in its group (per_rank/comm/groups.py, rule `capture`)."""
    found: dict[str, dict[str, dict[int, object]]] = {}
    for record in records:
        for group in record.groups:
            entry = found.setdefault(group.name, {"threads": {}, "windows": {}})
            if group.threads:
                entry["threads"][record.rank] = list(group.threads)
        for window in record.windows:
            for name, issued in window.collectives.items():
                entry = found.setdefault(name, {"threads": {}, "windows": {}})
                spans = entry["windows"].setdefault(record.rank, [])
                assert isinstance(spans, list)
                spans.append((window.first_step, window.last_step, issued))
    return found
