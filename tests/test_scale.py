"""Scale: many rank files analysed by a pool of processes or a Dask cluster, with the same result as in one
process; limits on hostile input; folders of runs in sub-folders."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.cli import main
from tests._traces import SHARED_TRACES

ROOT = Path(__file__).resolve().parents[1]
BASE = SHARED_TRACES / "hta_trace_filter" / "sampled_rank-0.json.gz"


@pytest.fixture(scope="module")
def ranks4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four generated ranks of a real trace; rank 2 reaches every collective 100 ms after the others."""
    out = tmp_path_factory.mktemp("ranks4")
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "make_big_trace.py"),
            "--ranks",
            "4",
            "--slow-ms",
            "100",
            "--base",
            str(BASE),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    return out


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _analyze_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code, out, err = _cli(capsys, "analyze", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_jobs_give_the_same_json_and_find_the_slow_rank(
    ranks4: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = _analyze_json(capsys, str(ranks4), "--jobs", "1")
    two = _analyze_json(capsys, str(ranks4), "--jobs", "2")
    assert one == two
    assert [r["rank"] for r in one["ranks"]] == [0, 1, 2, 3]
    assert one["straggler"]["rank"] == 2
    assert any(f["id"] == "straggler" and f["rank"] == 2 for f in one["findings"])


def test_dask_local_cluster_gives_the_local_json(ranks4: Path, capsys: pytest.CaptureFixture[str]) -> None:
    distributed = pytest.importorskip("distributed")
    from stepscope.analysis.parallel import analyze_path

    local = _analyze_json(capsys, str(ranks4), "--jobs", "1")
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        address = cluster.scheduler_address
        assert _analyze_json(capsys, str(ranks4), "--executor", "dask", "--scheduler", address) == local
        # the tasks ran on the cluster's workers, not in this process
        import msgspec

        seen: list[str] = []
        via_api = analyze_path(
            ranks4,
            executor="dask",
            scheduler=cluster.scheduler_address,
            progress=lambda done, total, label: seen.append(label),
        )
        assert json.loads(msgspec.json.encode(via_api)) == local
        assert {f"rank{r}.json.gz" for r in range(4)} <= set(seen)


def test_an_unreachable_scheduler_is_one_line(ranks4: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("distributed")
    code, _, err = _cli(
        capsys, "analyze", str(ranks4), "--executor", "dask", "--scheduler", "tcp://127.0.0.1:9"
    )
    assert code == 2
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in err
    assert "Traceback" not in err


def test_dask_missing_says_which_extra(
    ranks4: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails as if not installed
    code, _, err = _cli(capsys, "analyze", str(ranks4), "--executor", "dask")
    assert code == 2
    assert "pip install 'stepscope[dask]'" in err


def test_a_bad_file_among_ranks_is_named(
    ranks4: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ranks"
    folder.mkdir()
    for f in ranks4.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "rank3.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": ')[:-9])
    code, _, err = _cli(capsys, "analyze", str(folder), "--jobs", "2")
    assert code == 2
    assert "rank3.json.gz" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
