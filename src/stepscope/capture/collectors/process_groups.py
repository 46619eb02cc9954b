"""The process-group recorder: every process group and DeviceMesh of the job, as each profiled rank sees them.

c10d registers on each rank the groups that rank belongs to (the default group, `new_group`, each DeviceMesh
dimension, pipeline groups); this collector writes them (kind `process_groups`, a ProcessGroups payload) with
their names as record_param_comms prints them ("Process Group Name"), so that analysis can join a collective of
a trace to its group and mesh dimension.

It looks at the first step, after each exported window and at close, never at a quiet step; a look costs the
length of c10d's registry of names while no group is new (and, in a job that imported pipelining, until its
stages are found, a scan for them: pipeline_stages.py), and the file is rewritten only when its content
changes. For the `gloo:*` ranges of a trace, which name no group, it also records each gloo group's worker
threads (gloo_threads.py: read when a group is new, until they are told apart) and, per window, how many
collectives each group issued in it: c10d's sequence number of every group, read at the window's first active
step (before it runs) and at its end (on_window), a call per group at two steps of each window. Private torch APIs are guarded: one that is missing costs facts (said once, and kept in `notes`),
never the job. A job without an initialised default group writes nothing.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

import msgspec

from stepscope.capture.collector import Collector, RunContext, Window
from stepscope.capture.collectors.gloo_threads import gloo_threads, is_gloo, sequence_number, split_threads
from stepscope.capture.collectors.pipeline_stages import MAX_SCANS, find_stages
from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.capture.schedule import Phase
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.payloads import GroupWindow, Mesh, PipelineStageRecord, ProcessGroup, ProcessGroups

UNKNOWN = "unknown"
MESH_PREFIX = "mesh_"  # torch's description of a mesh dimension's group: mesh_<dim name> (mesh_default: none)


class ProcessGroupCollector(Collector):
    """Records the rank's process groups and device meshes, once per new group."""

    name = "process_groups"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self._count: int | None = -1  # the registry's size at the last look (None: no cheap count here)
        self._written = b""
        self._missing: list[str] = []  # the private APIs torch lacks here, in the order first missed
        self._warned = False
        self._record_now: ProcessGroups | None = None  # the groups at the last look that found a new one
        self._threads_known = False  # every gloo group's threads told apart (or none to tell)
        self._at_start: dict[str, int] | None = None  # sequence numbers at the open window's first step
        self._windows: list[GroupWindow] = []
        self._stages: list[PipelineStageRecord] = []  # pipelining's stages on this rank (pipeline_stages.py)
        self._stage_scans = 0

    def start(self) -> None:
        self._look()

    def next_busy(self, step: int) -> int:
        """The first active step of the next window: its sequence numbers are read before it runs."""
        return self.ctx.schedule.next_window_start(step)

    def before_step(self, step: int) -> None:
        if _window_start(self.ctx.schedule, step):
            self._at_start = self._sequence_numbers()

    def on_window(self, window: Window) -> None:
        if self._at_start is not None:
            start, self._at_start = self._at_start, None
            end = self._sequence_numbers()
            if end:
                issued = {name: n - start.get(name, 0) for name, n in end.items()}
                self._windows.append(GroupWindow(window.first_step, window.last_step, issued))
        self._look()

    def close(self) -> None:
        self._look()

    # --- one look ---------------------------------------------------------------------------------
    def _look(self) -> None:
        dist = _initialised_dist()
        if dist is None:
            return
        count = self._registry_size()
        if count is None or count != self._count or not self._threads_known or self._record_now is None:
            self._count = count
            self._record_now = self._record(dist)
        if not self._stages and self._stage_scans < MAX_SCANS:
            found = find_stages(dist, self._miss)
            self._stage_scans = MAX_SCANS if found is None else self._stage_scans + 1
            self._stages = found or []
        record = msgspec.structs.replace(
            self._record_now, windows=list(self._windows), pipeline_stages=list(self._stages)
        )
        content = msgspec.json.encode(record)
        if content != self._written:
            self.ctx.writer.write_json(ArtifactKind.PROCESS_GROUPS, record)
            self._written = content
        self._warn_once()

    def _sequence_numbers(self) -> dict[str, int]:
        """Group name -> collectives it issued so far, for every group of this rank torch can count."""
        names = self._private("torch.distributed.distributed_c10d", "_world", "pg_names")
        found = {}
        for pg, name in list((names or {}).items()):
            number = sequence_number(pg)
            if number is None:
                self._miss("ProcessGroup._get_sequence_number_for_group")
            else:
                found[str(name)] = number
        return found

    def _threads(self, groups: list[Any]) -> dict[str, list[int]]:
        """Group name -> its gloo worker tids (gloo_threads.py); {} until they can be told apart."""
        gloo = [str(name) for pg in groups if (name := _attr(pg, "group_name")) is not None and is_gloo(pg)]
        if not gloo:
            self._threads_known = True
            return {}
        threads = gloo_threads()
        if threads is None:  # no /proc: nothing to tell them apart by, and no point in looking again
            self._threads_known = True
            return {}
        split = split_threads(threads, gloo)
        self._threads_known = split is not None
        return split or {}

    def _registry_size(self) -> int | None:
        names = self._private("torch.distributed.distributed_c10d", "_world", "pg_names")
        return None if names is None else len(names)

    def _record(self, dist: Any) -> ProcessGroups:
        meshes = self._meshes()
        groups = self._groups(dist, meshes)
        dims = _mesh_dims(meshes)
        threads = self._threads(groups)
        records = [r for pg in groups if (r := self._group(dist, pg, dims, threads)) is not None]
        records.sort(key=lambda r: _name_key(r.name))
        return ProcessGroups(
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            groups=records,
            meshes=[m for mesh in meshes if (m := self._mesh(mesh)) is not None],
            notes=[f"torch here has no {name}: fewer facts" for name in self._missing],
        )

    def _groups(self, dist: Any, meshes: list[Any]) -> list[Any]:
        """Every group c10d registered on this rank (its registry of names); without that registry, the
        default group and the groups of the meshes found."""
        names = self._private("torch.distributed.distributed_c10d", "_world", "pg_names")
        if names is not None:
            return list(names)
        found: list[Any] = [dist.group.WORLD]
        for mesh in meshes:
            found.extend(g for g, _ in _dim_groups(mesh) if all(g is not f for f in found))
        return found

    def _group(
        self, dist: Any, pg: Any, dims: dict[str, str], threads: dict[str, list[int]]
    ) -> ProcessGroup | None:
        name = _attr(pg, "group_name")
        if name is None:
            self._miss("ProcessGroup.group_name")
            return None
        description = _attr(pg, "group_desc")
        if description is None:
            self._miss("ProcessGroup.group_desc")
        try:
            ranks = [int(r) for r in dist.get_process_group_ranks(pg)]
        except Exception:
            self._miss("get_process_group_ranks")
            ranks = []
        try:
            backend = str(dist.get_backend(pg))
        except Exception:
            backend = UNKNOWN
        try:
            size = int(pg.size())
        except Exception:
            size = len(ranks)
        description = str(description) if description is not None else UNKNOWN
        mesh_dim = dims.get(str(name))
        if mesh_dim is None and description.startswith(MESH_PREFIX) and description != "mesh_default":
            mesh_dim = description[len(MESH_PREFIX) :]
        return ProcessGroup(
            name=str(name),
            description=description,
            ranks=ranks,
            backend=backend,
            mesh_dim=mesh_dim,
            size=size,
            threads=threads.get(str(name)),
        )

    # --- device meshes ----------------------------------------------------------------------------
    def _meshes(self) -> list[Any]:
        """The root meshes of the job: those of the model's DTensor parameters, the one in use, and, when a
        group's description names a mesh dimension none of them explains, every DeviceMesh alive (a scan of the
        collected objects, done only then). A job that never imported torch's device mesh has none."""
        module = sys.modules.get("torch.distributed.device_mesh")
        mesh_type = getattr(module, "DeviceMesh", None)
        if not isinstance(mesh_type, type):
            return []
        roots: list[Any] = []

        def add(mesh: Any) -> None:
            root = _root(mesh)
            if type(root) is mesh_type and all(root is not r for r in roots):
                roots.append(root)

        model = self.ctx.model
        if model is not None and hasattr(model, "parameters"):
            for param in model.parameters():
                mesh = getattr(param, "device_mesh", None)
                if mesh is not None:
                    add(mesh)
        stack = self._private("torch.distributed.device_mesh", "_mesh_resources", "mesh_stack")
        for mesh in stack or ():
            add(mesh)
        if self._unexplained_mesh_groups(roots):
            for obj in gc.get_objects():
                if type(obj) is mesh_type:
                    add(obj)
        return roots

    def _unexplained_mesh_groups(self, roots: list[Any]) -> bool:
        names = self._private("torch.distributed.distributed_c10d", "_world", "pg_names")
        if names is None:
            return True
        known = _mesh_dims(roots)
        for pg, name in list(names.items()):
            desc = _attr(pg, "group_desc")
            if isinstance(desc, str) and desc.startswith(MESH_PREFIX) and str(name) not in known:
                return True
        return False

    def _mesh(self, mesh: Any) -> Mesh | None:
        try:
            names = mesh.mesh_dim_names
            return Mesh(
                device_type=str(mesh.device_type),
                shape=[int(n) for n in mesh.mesh.shape],
                dim_names=list(names) if names else None,
                ranks=[int(r) for r in mesh.mesh.flatten().tolist()],
                dim_groups=[str(g.group_name) for g, _ in _dim_groups(mesh)],
            )
        except Exception:
            self._miss("DeviceMesh.mesh / mesh_dim_names / get_group")
            return None

    # --- torch's private APIs, guarded ------------------------------------------------------------
    def _private(self, module_name: str, *path: str) -> Any:
        """`module.<path>`, or None (noted once) when this torch lacks a part of it."""
        obj: Any = sys.modules.get(module_name)
        for part in path:
            if obj is None:
                break
            obj = getattr(obj, part, None)
        if obj is None:
            self._miss(".".join((module_name, *path)))
        return obj

    def _miss(self, what: str) -> None:
        if what not in self._missing:
            self._missing.append(what)

    def _warn_once(self) -> None:
        if self._missing and not self._warned:
            self._warned = True
            warn_user(
                f"stepscope: the process groups are recorded without what this torch lacks "
                f"({', '.join(self._missing)}): fewer facts in process_groups/rank{self.ctx.rank}.json, "
                "training goes on",
                StepscopeWarning,
            )


def _initialised_dist() -> Any:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
    except Exception:
        return None
    return dist


def _window_start(schedule: Any, step: int) -> bool:
    """Whether `step` is the first active step of a window (windows may follow one another with no gap)."""
    return bool(schedule.is_active(step)) and not (step > 0 and schedule.phase(step - 1) is Phase.RECORD)


def _attr(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:  # a property of the C++ object that raises
        return None


def _root(mesh: Any) -> Any:
    get_root = getattr(mesh, "_get_root_mesh", None)
    try:
        return get_root() if get_root is not None else mesh
    except Exception:
        return mesh


def _dim_groups(mesh: Any) -> list[tuple[Any, str]]:
    """(group, dimension name) of each dimension of `mesh` on this rank, then of its flattened dimensions."""
    names = mesh.mesh_dim_names
    found = [(mesh.get_group(i), names[i] if names else f"dim_{i}") for i in range(mesh.ndim)]
    flattened = getattr(mesh, "_flatten_mapping", None) or {}
    for name, flat in dict(flattened).items():
        found.append((flat.get_group(), str(name)))
    return found


def _mesh_dims(meshes: list[Any]) -> dict[str, str]:
    """Group name -> the mesh dimension it is (the first mesh that names it wins)."""
    dims: dict[str, str] = {}
    for mesh in meshes:
        try:
            for group, dim in _dim_groups(mesh):
                dims.setdefault(str(group.group_name), dim)
        except Exception:
            continue
    return dims


def _name_key(name: str) -> tuple[int, int | str]:
    """c10d's sequential names ("0", "1", ...) in number order, hashed names after them."""
    return (0, int(name)) if name.isdigit() else (1, name)
