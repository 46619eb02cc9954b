"""The process-group recorder on real gloo jobs (torchrun, loopback): each profiled rank's process_groups file
holds its groups with their c10d names, ranks, backend and mesh dimension; `stepscope analyze --json` of the
run folder lists the job's groups; a torch without c10d's registry of names ends normally, with one warning."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

import stepscope
from stepscope.cli import main
from stepscope.runfolder import read_manifest
from stepscope.runfolder.payloads import PROCESS_GROUPS_SCHEMA, ProcessGroups

from ..support.jobs import run_ranks

pytestmark = pytest.mark.slow

JOB = Path(__file__).parents[1] / "support" / "jobs" / "process_groups.py"


def run_job(tmp_path: Path, mode: str, ranks: int) -> tuple[Path, str]:
    """`torchrun --standalone --nproc_per_node RANKS tests/support/jobs/process_groups.py OUT MODE`: the run folder and stderr."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(JOB.parents[3]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    result = run_ranks(
        [*cmd, str(JOB), str(tmp_path / "runs"), mode], tmp_path, text=True, env=env, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir, result.stderr


def records(run_dir: Path) -> dict[int, ProcessGroups]:
    """Each rank's process-groups record, found through the manifest."""
    entries = [a for a in read_manifest(run_dir).artifacts if a.kind == "process_groups"]
    assert all(a.schema == PROCESS_GROUPS_SCHEMA and a.step is None for a in entries)
    found = {}
    for entry in entries:
        assert entry.path == f"process_groups/rank{entry.rank}.json"
        found[entry.rank] = msgspec.json.decode((run_dir / entry.path).read_bytes(), type=ProcessGroups)
    return found


def groups_of(record: ProcessGroups) -> list[tuple[str, str, list[int], str, str | None, int]]:
    return [(g.name, g.description, g.ranks, g.backend, g.mesh_dim, g.size) for g in record.groups]


def analyze_run(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["analyze", str(run_dir), "--json"]) == 0
    run: dict[str, Any] = json.loads(capsys.readouterr().out)["run"]
    return run


def test_default_new_and_late_groups_on_two_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a 2-rank job with the default group, new_group "pair", and new_group "late" made after its window
    run_dir, stderr = run_job(tmp_path, "groups", 2)
    # THEN each rank's file lists the three, by c10d's names, the late one seen by the look at close
    assert "StepscopeWarning" not in stderr
    found = records(run_dir)
    assert sorted(found) == [0, 1]
    for rank, record in found.items():
        assert (record.schema, record.rank, record.world_size, record.meshes, record.notes) == (
            PROCESS_GROUPS_SCHEMA,
            rank,
            2,
            [],
            [],
        )
        assert groups_of(record) == [
            ("0", "default_pg", [0, 1], "gloo", None, 2),
            ("1", "pair", [0, 1], "gloo", None, 2),
            ("2", "late", [0, 1], "gloo", None, 2),
        ]
    # AND analyze --json of the run folder lists the job's groups, with the ranks that recorded each
    run = analyze_run(run_dir, capsys)
    assert [
        (g["name"], g["description"], g["ranks"], g["mesh_dim"], g["recorded_by"])
        for g in run["process_groups"]
    ] == [
        ("0", "default_pg", [0, 1], None, [0, 1]),
        ("1", "pair", [0, 1], None, [0, 1]),
        ("2", "late", [0, 1], None, [0, 1]),
    ]
    assert run["meshes"] == [] and run["process_group_notes"] == []


@pytest.mark.parametrize("mode", ["mesh", "bare_mesh"])
def test_dp_tp_mesh_on_four_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str) -> None:
    # GIVEN init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")) on 4 ranks: FSDP2 on dp and
    # ColwiseParallel / RowwiseParallel on tp ("mesh"), or the mesh alone with an all-reduce per dimension
    run_dir, stderr = run_job(tmp_path, mode, 4)
    assert "StepscopeWarning" not in stderr
    found = records(run_dir)
    assert sorted(found) == [0, 1, 2, 3]
    # c10d names the groups in the order the mesh made them: dp {0,2} "1", dp {1,3} "2", tp {0,1} "3", tp {2,3} "4"
    dp = {0: ("1", [0, 2]), 2: ("1", [0, 2]), 1: ("2", [1, 3]), 3: ("2", [1, 3])}
    tp = {0: ("3", [0, 1]), 1: ("3", [0, 1]), 2: ("4", [2, 3]), 3: ("4", [2, 3])}
    for rank, record in found.items():
        # THEN each rank has the default group and its own group along each dimension, named by dimension
        assert groups_of(record) == [
            ("0", "default_pg", [0, 1, 2, 3], "gloo", None, 4),
            (dp[rank][0], "mesh_dp", dp[rank][1], "gloo", "dp", 2),
            (tp[rank][0], "mesh_tp", tp[rank][1], "gloo", "tp", 2),
        ]
        # AND the mesh: its shape, names, global ranks and this rank's group along each dimension
        (mesh,) = record.meshes
        assert (mesh.device_type, mesh.shape, mesh.dim_names, mesh.ranks) == (
            "cpu",
            [2, 2],
            ["dp", "tp"],
            [0, 1, 2, 3],
        )
        assert mesh.dim_groups == [dp[rank][0], tp[rank][0]]
    # AND analyze --json lists the job's five groups with their dimensions, and the one mesh
    run = analyze_run(run_dir, capsys)
    assert [
        (g["name"], g["ranks"], g["mesh_dim"], g["backend"], g["recorded_by"]) for g in run["process_groups"]
    ] == [
        ("0", [0, 1, 2, 3], None, "gloo", [0, 1, 2, 3]),
        ("1", [0, 2], "dp", "gloo", [0, 2]),
        ("2", [1, 3], "dp", "gloo", [1, 3]),
        ("3", [0, 1], "tp", "gloo", [0, 1]),
        ("4", [2, 3], "tp", "gloo", [2, 3]),
    ]
    assert run["meshes"] == [
        {"device_type": "cpu", "shape": [2, 2], "dim_names": ["dp", "tp"], "ranks": [0, 1, 2, 3]}
    ]


def test_torch_without_the_group_registry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN the 2-rank job, untraced, on a torch whose c10d has no _world.pg_names while the monitor runs
    run_dir, stderr = run_job(tmp_path, "no_private", 2)
    # THEN it ends normally, each rank warns once, naming what is missing
    warnings = [line for line in stderr.splitlines() if "StepscopeWarning" in line]
    assert len(warnings) == 2, stderr[-3000:]
    assert all("_world.pg_names" in line for line in warnings)
    # AND each rank still records what the public API gives (the default group), saying the rest is missing
    for record in records(run_dir).values():
        assert groups_of(record) == [("0", "default_pg", [0, 1], "gloo", None, 2)]
        assert record.notes == [
            "torch here has no torch.distributed.distributed_c10d._world.pg_names: fewer facts"
        ]
    # AND every step of both ranks was measured as ever
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted((line["rank"], line["step"]) for line in lines) == [
        (r, s) for r in (0, 1) for s in range(4)
    ]
    run = analyze_run(run_dir, capsys)
    assert [g["name"] for g in run["process_groups"]] == ["0"]
    assert len(run["process_group_notes"]) == 2


def test_a_job_without_process_groups_writes_none(tmp_path: Path) -> None:
    # GIVEN a one-process job that never initialises torch.distributed
    import torch

    monitor = stepscope.performance_monitor(
        out_dir=str(tmp_path), wait=0, warmup=0, active=1, console=False, report=False
    )
    with monitor:
        for _ in range(2):
            torch.ones(8).sum()
            monitor.step()
    # THEN its run folder has no process_groups file, in the manifest or on disk
    assert monitor.run_dir is not None
    assert not [a for a in read_manifest(monitor.run_dir).artifacts if a.kind == "process_groups"]
    assert not (monitor.run_dir / "process_groups").exists()
