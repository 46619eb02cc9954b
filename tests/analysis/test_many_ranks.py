"""Scale: many rank files analysed by a pool of processes or a Dask cluster, with the same result as in one
process; limits on hostile input; folders of runs in sub-folders."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest

from stepscope.cli import main
from tests.support.traces import SHARED_TRACES

ROOT = Path(__file__).resolve().parents[2]
BASE = SHARED_TRACES / "hta_trace_filter" / "sampled_rank-0.json.gz"


@pytest.fixture(scope="module")
def ranks4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four generated ranks of a real trace, twice over (4 steps: the straggler test's units; 8 collectives of 2
    steps are too few to tell lateness from jitter); rank 2 reaches every collective 100 ms after the others."""
    out = tmp_path_factory.mktemp("ranks4")
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "make_big_trace.py"),
            "--ranks",
            "4",
            "--slow-ms",
            "100",
            "--copies",
            "2",
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


# the tests on generated ranks (`ranks4`, make_big_trace.py) repeat a real trace of ../shared/traces
@pytest.mark.shared
def test_jobs_give_the_same_json_and_find_the_slow_rank(
    ranks4: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = _analyze_json(capsys, str(ranks4), "--jobs", "1")
    two = _analyze_json(capsys, str(ranks4), "--jobs", "2")
    assert one == two
    assert [r["rank"] for r in one["ranks"]] == [0, 1, 2, 3]
    assert one["straggler"]["rank"] == 2
    assert any(f["id"] == "straggler" and f["rank"] == 2 for f in one["findings"])


@pytest.mark.shared
@pytest.mark.slow
def test_ten_ranks_on_two_workers_in_batches(tmp_path: Path) -> None:
    """Ten ranks on two workers go in batches of two, then one by one: the same result as one process, progress
    that only grows and ends at the total, the slow rank found."""
    from stepscope.analysis.parallel import analyze_path

    make = [
        sys.executable,
        str(ROOT / "benchmarks" / "make_big_trace.py"),
        "--ranks",
        "10",
        "--slow-ms",
        "100",
    ]
    subprocess.run(
        [*make, "--base", str(BASE), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    calls: list[tuple[int, int, str]] = []
    two = analyze_path(tmp_path, jobs=2, progress=lambda done, total, name: calls.append((done, total, name)))
    one = analyze_path(tmp_path, jobs=1)
    assert msgspec.json.encode(two) == msgspec.json.encode(one)
    assert two.straggler is not None and two.straggler.rank == 5
    done = [c[0] for c in calls]
    assert done == sorted(done) and done[-1] == calls[-1][1] > 0
    assert len(calls) < 10  # (the first batches hold two files: fewer reports than files)


@pytest.mark.shared
@pytest.mark.slow
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

        seen: list[str] = []
        via_api = analyze_path(
            ranks4,
            executor="dask",
            scheduler=cluster.scheduler_address,
            progress=lambda done, total, label: seen.append(label),
        )
        assert json.loads(msgspec.json.encode(via_api)) == local
        assert {f"rank{r}.json.gz" for r in range(4)} <= set(seen)


@pytest.mark.shared
@pytest.mark.slow
def test_an_unreachable_scheduler_is_one_line(ranks4: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("distributed")
    code, _, err = _cli(
        capsys, "analyze", str(ranks4), "--executor", "dask", "--scheduler", "tcp://127.0.0.1:9"
    )
    assert code == 2
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in err
    assert "Traceback" not in err


@pytest.mark.shared
def test_dask_missing_says_which_extra(
    ranks4: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails as if not installed
    code, _, err = _cli(capsys, "analyze", str(ranks4), "--executor", "dask")
    assert code == 2
    assert "pip install 'stepscope[dask]'" in err


@pytest.mark.shared
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


# --- limits on hostile input ------------------------------------------------------------------------
def _gzip_stream(path: Path, parts: list[bytes], repeat: int = 1) -> Path:
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as fh:
        fh.write(packer.compress(parts[0]))
        for _ in range(repeat):
            fh.write(packer.compress(parts[1]))
        fh.write(packer.compress(parts[2]))
        fh.write(packer.flush())
    return path


# Runs the command given as its arguments and prints that child's peak RSS in KiB. A child forked straight from
# pytest would report pytest's own peak (ru_maxrss survives fork and exec); one forked from this small process
# reports its own.
_PEAK_OF = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[1:])\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n"
)


def _cli_subprocess(path: Path, **env: str) -> tuple[int, str, int]:
    """`stepscope analyze PATH` in a child: exit status, stderr, the child's own peak RSS in MB."""
    import os

    done = subprocess.run(
        [sys.executable, "-c", _PEAK_OF, sys.executable, "-m", "stepscope", "analyze", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )
    code, peak_kib = done.stdout.split()[-2:]
    return int(code), done.stderr, int(peak_kib) // 1024


@pytest.mark.slow
def test_a_gzip_bomb_ends_in_one_line_with_bounded_memory(tmp_path: Path) -> None:
    # 1 GiB of spaces inside a valid start: ~1 MB on disk
    bomb = _gzip_stream(tmp_path / "bomb.json.gz", [b'{"traceEvents": [', b" " * (1 << 24), b"]}"], 64)
    assert bomb.stat().st_size < 4 << 20
    code, err, peak_mb = _cli_subprocess(bomb)
    assert code == 2
    assert err.startswith(f"stepscope: error: {bomb}: gzip data inflates to more than 200 times")
    assert "STEPSCOPE_MAX_GZIP_RATIO" in err and len(err.strip().splitlines()) == 1
    assert peak_mb < 400


@pytest.mark.parametrize(
    ("filler", "problem"),
    [
        (b"A", "no end of an event in 1048576 bytes"),
        (b"},{", "no place to split the events found in 1048576 bytes"),
    ],
)
def test_a_string_longer_than_the_limit_is_refused(tmp_path: Path, filler: bytes, problem: str) -> None:
    """A 12 MB string (raw and gzipped) against a 1 MiB event limit: refused without reading it all."""
    start = b'{"traceEvents": [{"ph": "X", "name": "'
    for gz in (False, True):
        path = tmp_path / ("long.json.gz" if gz else "long.json")
        body = filler * ((12 << 20) // len(filler))
        if gz:
            _gzip_stream(path, [start, body, b'"}]}'])
        else:
            path.write_bytes(start + body + b'"}]}')
        code, err, _ = _cli_subprocess(
            path, STEPSCOPE_MAX_EVENT_BYTES=str(1 << 20), STEPSCOPE_MAX_GZIP_RATIO="100000"
        )
        assert code == 2, err
        assert problem in err and "STEPSCOPE_MAX_EVENT_BYTES" in err, err
        assert len(err.strip().splitlines()) == 1


# --- runs in sub-folders ------------------------------------------------------------------------------
@pytest.mark.shared
def test_runs_in_sub_folders_are_analyzed_separately(capsys: pytest.CaptureFixture[str]) -> None:
    folder = SHARED_TRACES / "tracelens_qwen1.5_h100_mi300"
    code, out, err = _cli(capsys, "analyze", str(folder), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "stepscope.analysis-runs/1"
    assert [Path(r["path"]).name for r in doc["runs"]] == ["h100", "mi300"]
    # each run on its own: one rank each, never two ranks of one job
    assert [[rank["rank"] for rank in r["analysis"]["ranks"]] for r in doc["runs"]] == [[0], [0]]
    assert doc["runs"][0]["analysis"] == _analyze_json(capsys, str(folder / "h100"))
    assert "2 runs in sub-folders (h100, mi300), analyzed separately" in doc["notices"][0]
    code, out, err = _cli(capsys, "analyze", str(folder))
    assert code == 0
    assert "analyzed separately" in err and "h100" in out and "mi300" in out


@pytest.mark.shared
def test_other_commands_ask_for_one_run_of_a_folder_of_runs(capsys: pytest.CaptureFixture[str]) -> None:
    folder = SHARED_TRACES / "tracelens_qwen1.5_h100_mi300"
    code, _, err = _cli(capsys, "summary", str(folder))
    assert code == 2
    assert (
        err.strip()
        == f"stepscope: error: {folder}: holds 2 runs in sub-folders (h100, mi300): give one of them"
    )


def _symbols(symbols: list[str], codes: np.ndarray) -> np.ndarray:
    return np.array([*symbols, ""], dtype=object)[codes]


SETS_WITH_FLOWS = (
    "hta_nccl_parser_config/nccl_data.json.gz",
    "hta_cupti_profiler",
    "kineto_resnet50_num_workers_4",
)


@pytest.mark.shared
@pytest.mark.parametrize("name", SETS_WITH_FLOWS)
@pytest.mark.slow
def test_analysis_without_flow_events_is_the_same(name: str) -> None:
    # analyze reads no flow ('s'/'f') rows: leaving them out changes no figure, and they are many rows
    from stepscope.analysis.analyze import analyze
    from stepscope.analysis.parallel import analyze_path
    from stepscope.analysis.read.loader import load_trace
    from stepscope.analysis.read.table import STRING_ARGS

    path = SHARED_TRACES / name
    with_flows = load_trace(path, workers=1)
    without = load_trace(path, workers=1, flows=False)
    is_flow = np.isin(with_flows.columns["ph"], [ord("s"), ord("f")])
    assert is_flow.sum() > len(with_flows) // 10
    assert len(without) == len(with_flows) - is_flow.sum()
    for key, column in without.columns.items():
        expected = with_flows.columns[key][~is_flow]
        if key == "cat":  # codes of each table's own symbols: compared as the strings
            column, expected = _symbols(without.cats, column), _symbols(with_flows.cats, expected)
        elif key == "name" or key in {f"args_{k}" for k in STRING_ARGS}:
            column, expected = _symbols(without.names, column), _symbols(with_flows.names, expected)
        assert np.array_equal(column, expected), key
    full = msgspec.json.encode(analyze(with_flows))
    assert msgspec.json.encode(analyze(without)) == full
    assert msgspec.json.encode(analyze_path(path, jobs=1)) == full
