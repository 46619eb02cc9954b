"""One big plain-JSON trace read by several processes (`load_trace(..., workers=N)`, `analyze --jobs N`): the
same table as one process, whatever the file holds where it is cut."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

import stepscope.analysis.read._split as split
from stepscope.analysis.read.loader import load_trace
from stepscope.cli import main
from stepscope.errors import InputError
from tests.support.traces import SHARED_TRACES, cpu, kernel, runtime, step, trace, write


@pytest.fixture(autouse=True)
def runs(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Small files are split too; each split reading appends whether its stretches all vouched for their
    text (False: the file went to the one-process reader)."""
    monkeypatch.setattr(split, "SPLIT_MIN_BYTES", 0)
    # (these tests read a file several ways: with the cache on, a later read took the table an earlier one kept
    # instead of splitting the file, and test_analyze_with_jobs_reads_one_big_file_in_stretches failed when run
    # alone or with its file)
    monkeypatch.setenv("STEPSCOPE_NO_CACHE", "1")
    seen: list[bool] = []
    original = split._run

    def run(*args):  # type: ignore[no-untyped-def]
        results = original(*args)
        seen.append(results is not None)
        return results

    monkeypatch.setattr(split, "_run", run)
    return seen


def _same(a, b) -> None:  # type: ignore[no-untyped-def]
    assert a.names == b.names and a.cats == b.cats
    assert a.columns.keys() == b.columns.keys()
    for key in a.columns:
        assert a.columns[key].dtype == b.columns[key].dtype, key
        assert np.array_equal(a.columns[key], b.columns[key]), key
    assert a.ranks == b.ranks and a.notices == b.notices


def _plain(src: Path, dst: Path) -> Path:
    data = src.read_bytes()
    dst.write_bytes(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return dst


@pytest.mark.shared
@pytest.mark.parametrize(
    "name",
    [
        "hta_nccl_parser_config/nccl_data.json.gz",
        "hta_ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
        "tracelens_qwen1.5_h100_mi300/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    ],
)
@pytest.mark.parametrize("workers", [2, 3, 7])
@pytest.mark.slow
def test_a_shared_trace_read_in_stretches_is_the_same_table(
    tmp_path: Path, name: str, workers: int, runs: list[bool]
) -> None:
    path = _plain(SHARED_TRACES / name, tmp_path / "t.json")
    _same(load_trace(path, workers=workers), load_trace(path, workers=1))
    _same(load_trace(path, workers=workers, flows=False), load_trace(path, workers=1, flows=False))
    assert runs == [True, True]


@pytest.mark.shared
def test_more_stretches_than_processes_are_taken_in_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs: list[bool]
) -> None:
    # a big file is cut into several stretches per process (a slow process then takes fewer of them)
    path = _plain(SHARED_TRACES / "hta_nccl_parser_config/nccl_data.json.gz", tmp_path / "t.json")
    monkeypatch.setattr(split, "_MIN_STRETCH", 1 << 10)
    seen: list[tuple[int, int]] = []
    counted = split._run

    def run(path, stretches, processes, *rest):  # type: ignore[no-untyped-def]
        seen.append((len(stretches), processes))
        return counted(path, stretches, processes, *rest)

    monkeypatch.setattr(split, "_run", run)
    _same(load_trace(path, workers=2), load_trace(path, workers=1))
    assert seen == [(2 * split.STRETCHES_PER_PROCESS, 2)] and runs == [True]


def _events(n: int, filler: dict) -> list[dict]:
    events = []
    for i in range(n):
        events += [
            step(i, i * 100.0, 90.0),
            cpu("aten::mm", i * 100.0 + 1, 50.0, **filler),
            runtime("cudaLaunchKernel", i * 100.0 + 2, 5.0, i + 1),
            kernel("gemm", i * 100.0 + 10, 30.0, corr=i + 1),
        ]
    return events


@pytest.mark.parametrize(
    "filler",
    [
        lambda i: {"note": "},{" * (40_000 + 997 * i)},  # strings full of cut look-alikes
        lambda i: {"note": [{"a": k} for k in range(20_000 + 331 * i)]},  # arrays of objects in the args
        lambda i: {"note": "x" * (300_000 + 1009 * i)},  # no cut at all near a split point
    ],
)
def test_cut_look_alikes_inside_events_give_the_same_table(tmp_path: Path, filler, runs: list[bool]) -> None:  # type: ignore[no-untyped-def]
    events = [e for i in range(12) for e in _events(1, filler(i))]
    path = write(tmp_path / "t.json", trace(events, rank=3, world_size=4))
    data = path.read_bytes()
    for k in (1, 2, 3):  # every split point lies in a filler
        at = len(data) * k // 4
        assert data.rfind(b'"note"', 0, at) > data.rfind(b'"ph"', 0, at)
    _same(load_trace(path, workers=4), load_trace(path, workers=1))
    assert len(runs) <= 1  # (no cut found near a split point: read by one process)


def test_cuts_between_events_are_used(tmp_path: Path, runs: list[bool]) -> None:
    path = write(tmp_path / "t.json", trace(_events(400, {"note": "},{"}), rank=3, world_size=4))
    table = load_trace(path, workers=4)
    assert runs == [True]
    _same(table, load_trace(path, workers=1))
    assert table.ranks[3].world_size == 4


def test_header_keys_on_both_sides_of_the_array(tmp_path: Path, runs: list[bool]) -> None:
    doc = trace(_events(50, {}), rank=1, world_size=2)
    before = {"distributedInfo": doc.pop("distributedInfo"), "traceEvents": doc.pop("traceEvents")}
    text = json.dumps({**before, "deviceProperties": [{"id": 0, "name": "H100"}], **doc}, indent=1)
    path = tmp_path / "t.json"
    path.write_text(text)
    table = load_trace(path, workers=3)
    _same(table, load_trace(path, workers=1))
    assert table.ranks[1].world_size == 2 and table.ranks[1].device_properties == [{"id": 0, "name": "H100"}]
    assert runs == [True]


def test_a_bad_event_late_in_the_file_reads_as_with_one_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], runs: list[bool]
) -> None:
    events = _events(200, {})
    events[-5]["ts"] = "soon"
    path = write(tmp_path / "t.json", trace(events))
    with pytest.raises(InputError) as one:
        load_trace(path, workers=1)
    with pytest.raises(InputError) as several:
        load_trace(path, workers=3)
    assert str(several.value) == str(one.value)
    assert main(["analyze", str(path), "--jobs", "3"]) == 2
    assert capsys.readouterr().err.strip().endswith(one.value.problem)
    assert runs == [False, False]  # the last stretch refused it; the one-process reader named it


@pytest.mark.shared
def test_analyze_with_jobs_reads_one_big_file_in_stretches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], runs: list[bool]
) -> None:
    path = _plain(SHARED_TRACES / "hta_nccl_parser_config/nccl_data.json.gz", tmp_path / "t.json")
    outputs = []
    for jobs in ("1", "2"):
        assert main(["analyze", str(path), "--json", "--jobs", jobs]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1]
    assert outputs[0]["ranks"][0]["steps"]
    assert runs == [True]


@pytest.mark.shared
def test_stretches_kept_in_memory_when_no_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs: list[bool]
) -> None:
    # the workers write their columns to a temporary folder; without one they send them back whole
    def no_folder(**_: object) -> str:
        raise OSError("no space left on device")

    monkeypatch.setattr(tempfile, "mkdtemp", no_folder)
    path = _plain(SHARED_TRACES / "hta_nccl_parser_config/nccl_data.json.gz", tmp_path / "t.json")
    _same(load_trace(path, workers=3), load_trace(path, workers=1))
    assert runs == [True]


@pytest.mark.shared
def test_the_temporary_folder_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    made: list[str] = []
    original = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: made.append(original(**kw)) or made[-1])
    path = _plain(SHARED_TRACES / "hta_nccl_parser_config/nccl_data.json.gz", tmp_path / "t.json")
    load_trace(path, workers=2)
    events = trace(_events(200, {}))
    events["traceEvents"][-5]["ts"] = "soon"
    with pytest.raises(InputError):
        load_trace(write(tmp_path / "bad.json", events), workers=2)
    assert len(made) == 2 and all(m.startswith(str(tmp_path / "tmp")) for m in made)
    assert list((tmp_path / "tmp").iterdir()) == []
