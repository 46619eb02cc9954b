"""Every collective in its process group and mesh dimension, and communication per dimension (#28 items 3, 8): on
real torchrun gloo jobs (tests/support/jobs/parallelism.py: the 4-rank dp x tp mesh, FSDP2 on 2 ranks), where capture
recorded each gloo group's threads and collective counts; on traces of others (no capture record), where the
matched ranks name the group only where no other group could hold it."""

from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ..support.jobs import fsdp2_run, trace_ops
from ..support.jobs import run_parallel_job as run_job
from ..support.output import analyze_json

__all__ = ["fsdp2_run"]  # the module's fixture, used here too


@pytest.fixture(scope="module")
def mesh_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_job("mesh", 4, tmp_path_factory.mktemp("mesh"))


@pytest.fixture(scope="module")
def mesh_result(mesh_run: Path) -> dict[str, Any]:
    return analyze_json(mesh_run)


def issued_per_dim(run_dir: Path, rank: int) -> dict[str, int]:
    """The collectives the job issued on each dimension, read from the rank's trace with json: tensor
    parallel's functional all-reduces on "tp", the explicit c10d all-reduces (not under a functional one) on
    "dp"."""
    (path,) = (run_dir / "traces").glob(f"rank{rank}_*.json.gz")
    names = Counter(
        e["name"] for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"
    )
    tp = names["_c10d_functional::all_reduce"]
    return {"tp": tp, "dp": names["c10d::allreduce_"] - tp}


@pytest.mark.slow
def test_mesh_collectives_in_their_group_and_dim(mesh_run: Path, mesh_result: dict[str, Any]) -> None:
    # GIVEN a (2, 2) mesh ("dp", "tp") on 4 gloo ranks, whose gloo ranges name no group
    for rank in range(4):
        stats = mesh_result["ranks"][rank]["collectives"]
        # THEN every collective is in its group, known from capture's record of the group's gloo threads
        dp_ranks = [rank % 2, rank % 2 + 2]
        tp_ranks = [rank - rank % 2, rank - rank % 2 + 1]
        assert {(c["dim"], tuple(c["group_ranks"]), c["group_source"]) for c in stats} == {
            ("dp", tuple(dp_ranks), "capture"),
            ("tp", tuple(tp_ranks), "capture"),
        }
        # AND its count per dimension is what the job issued on that dimension
        issued = issued_per_dim(mesh_run, rank)
        assert issued["dp"] > issued["tp"] > 0
        assert {c["dim"]: c["count"] for c in stats} == issued
        # AND the dimensions summary agrees, per step
        dims = {d["dim"]: d for d in mesh_result["dimensions"]["ranks"][rank]["dims"]}
        steps = mesh_result["dimensions"]["ranks"][rank]["steps"]
        assert steps == mesh_result["ranks"][rank]["window"]["steps"] == 2
        for dim, n in issued.items():
            d = dims[dim]
            assert (d["count"], d["count_per_step"]) == (n, n / steps)
            assert 0 < d["exposed_ms_per_step"] <= d["time_ms_per_step"]
            step_ms = sum(s["dur_us"] for s in mesh_result["ranks"][rank]["steps"]) / 1e3 / steps
            assert d["time_ms_per_step"] <= step_ms
    # AND the job's row of each dimension sums the ranks' calls and covers every rank
    job = {d["dim"]: d for d in mesh_result["dimensions"]["job"]}
    assert set(job) == {"dp", "tp"}
    for dim, d in job.items():
        assert d["ranks"] == [0, 1, 2, 3]
        assert d["count"] == sum(issued_per_dim(mesh_run, r)[dim] for r in range(4))
    # AND each collective is matched across the 2 ranks of its group only (never with another group's): one match
    # per pair of instances, none left unmatched
    alignment = mesh_result["cross_rank"]["alignment"]
    instances = sum(sum(issued_per_dim(mesh_run, r).values()) for r in range(4))
    assert (alignment["matched"], alignment["unmatched"]) == (instances // 2, 0)


@pytest.mark.slow
def test_a_count_that_disagrees_with_capture_leaves_the_group_unknown(mesh_run: Path, tmp_path: Path) -> None:
    # GIVEN the mesh run, with rank 0's record saying its dp group issued one collective fewer
    copy = Path(shutil.copytree(mesh_run, tmp_path / "run"))
    record_path = copy / "process_groups" / "rank0.json"
    record = json.loads(record_path.read_text())
    dp = next(g["name"] for g in record["groups"] if g["mesh_dim"] == "dp")
    record["windows"][0]["collectives"][dp] -= 1
    record_path.write_text(json.dumps(record))
    result = analyze_json(copy)
    # THEN rank 0's dp ranges are in no group, and a note says why; tp keeps its group
    rank0 = result["ranks"][0]
    assert {(c["dim"], c["group_source"]) for c in rank0["collectives"]} == {
        (None, "unknown"),
        ("tp", "capture"),
    }
    assert any(f"process group {dp!r}" in n and "left in no group" in n for n in rank0["notes"])
    assert {d["dim"] for d in result["dimensions"]["ranks"][0]["dims"]} == {"unknown", "tp"}


@pytest.mark.slow
def test_parallelism_section_in_chromium(mesh_run: Path, tmp_path: Path) -> None:
    from stepscope.cli import main

    from ..support.browser import visit

    # GIVEN the report of the mesh run
    page = tmp_path / "report.html"
    assert main(["report", str(mesh_run), "-o", str(page)]) == 0
    with visit(page) as seen:
        # THEN its Parallelism section's dimensions table shows the job's and every rank's dp and tp rows, and
        # a chart (the tensor-parallel table beside it has its own test)
        assert not seen.console_errors, seen.console_errors
        section = seen.page.locator("section#parallelism")
        assert section.locator("h2").first.text_content().strip() == "Parallelism"
        assert section.locator("table#tensor").count() == 1
        rows = section.locator("table#dimensions tbody tr")
        cells = [rows.nth(i).locator("td").all_text_contents() for i in range(rows.count())]
        assert sorted((c[0], c[1]) for c in cells) == sorted(
            [("job", "dp"), ("job", "tp")] + [(str(r), d) for r in range(4) for d in ("dp", "tp")]
        )
        assert section.locator("div.chart svg, div.chart canvas").count() >= 1
        section.screenshot(path=str(tmp_path / "parallelism.png"))


@pytest.mark.slow
def test_fsdp2_collectives_in_the_mesh_group(fsdp2_run: Path) -> None:
    # GIVEN FSDP2 on 2 gloo ranks: a 1-D mesh without names over the default group
    result = analyze_json(fsdp2_run)
    for rank in (0, 1):
        ops = trace_ops(fsdp2_run, rank)
        stats = {c["kind"]: c for c in result["ranks"][rank]["collectives"]}
        # THEN its all-gathers and reduce-scatters are in that group, dimension dim_0, from capture's record
        assert {
            (c["group"], c["dim"], c["group_source"], tuple(c["group_ranks"])) for c in stats.values()
        } == {("0", "dim_0", "capture", (0, 1))}
        assert stats["all_gather"]["count"] == ops["c10d::_allgather_base_"]
        assert stats["reduce_scatter"]["count"] == ops["c10d::_reduce_scatter_base_"]
        (dim,) = result["dimensions"]["ranks"][rank]["dims"]
        assert (dim["dim"], dim["count"]) == ("dim_0", sum(c["count"] for c in stats.values()))


def _gloo_rank(rank: int, world_size: int, skew: float) -> dict[str, Any]:
    """A gloo rank of a job whose trace names no group: two steps, two all-reduces each, no pg_config."""
    from ..support.traces import cpu, step, trace

    events = []
    for n, t0 in ((1, 0.0), (2, 1000.0)):
        events.append(step(n, t0, 900))
        for k, at in enumerate((100.0, 500.0)):
            events.append(cpu("c10d::allreduce_", t0 + at + skew, 5))
            end = t0 + at + 200 + 10 * k
            events.append(
                cpu("gloo:all_reduce", t0 + at + skew, end - (t0 + at + skew), cat="user_annotation", tid=9)
            )
    doc = trace(events, rank, world_size=world_size)
    doc["distributedInfo"]["backend"] = "gloo"
    return doc


@pytest.mark.parametrize("world_size", [2, 4])
def test_traces_of_others_take_the_matched_ranks_group_only_where_sound(
    tmp_path: Path, world_size: int
) -> None:
    from ..support.traces import write

    # GIVEN two gloo ranks' traces that name no group (no capture record, no pg_config), rank 1 arriving later
    for rank in (0, 1):
        write(tmp_path / f"rank{rank}.json", _gloo_rank(rank, world_size, skew=30.0 * rank))
    result = analyze_json(tmp_path)
    for rank in (0, 1):
        (stat,) = result["ranks"][rank]["collectives"]
        assert (stat["kind"], stat["count"], stat["group"]) == ("all_reduce", 4, None)
        if world_size == 2:
            # THEN in a job of two ranks the matched instances are in the group of ranks {0, 1}
            assert (stat["group_source"], stat["group_ranks"]) == ("matched ranks", [0, 1])
        else:
            # THEN with 2 of 4 ranks loaded another group could hold them: unknown
            assert (stat["group_source"], stat["group_ranks"]) == ("unknown", None)
        assert [d["dim"] for d in result["dimensions"]["ranks"][rank]["dims"]] == ["unknown"]
        # AND the collectives matched across the ranks either way (one unknown group), rank 0 waiting
    assert result["cross_rank"]["alignment"]["matched"] == 4
