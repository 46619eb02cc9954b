"""The cache of decoded tables (issue 48, item 5): a second command on a trace maps the table the first one kept,
with the same figures; a changed file, a damaged cache file, `--no-cache` and the size bound each do what a user
would expect, and a cache file never runs code or fails a load."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from stepscope.analysis.read import cache
from stepscope.analysis.read.cache import tables
from stepscope.analysis.read.loader import load_trace
from stepscope.cli import main

from ..support.traces import cpu, kernel, launched, step, write_trace


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("STEPSCOPE_CACHE_DIR", str(folder))
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)
    return folder / "tables"


def a_trace(path: Path, steps: int = 3) -> Path:
    """A GPU trace of a few steps: dense, constant and sparse columns (kernels carry a stream, a correlation)."""
    events = []
    t = 0.0
    for k in range(steps):
        events.append(step(k + 1, t, 1000.0))
        events.append(cpu("forward", t + 10, 400.0, cat="user_annotation"))
        events += launched("gemm_A", t + 20, t + 30, 300.0, 100 + k, stream=7)
        events.append(kernel("ncclDevKernel_AllReduce", t + 400, 200.0, stream=20, corr=200 + k))
        t += 1000.0
    write_trace(path, events, 0, world_size=1)
    return path


def analyze(path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict:
    """`analyze --json` of `path`, its kept answer let go after it: the next command reads the table again (as
    a command whose answer is not kept, or another command, would)."""
    assert main([*flags, "analyze", str(path), "--json"]) == 0
    shutil.rmtree(Path(os.environ["STEPSCOPE_CACHE_DIR"]) / "results", ignore_errors=True)
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_a_second_analyze_reads_the_kept_table_and_says_the_same(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = a_trace(tmp_path / "t.json")
    first = analyze(trace, capsys)
    (kept,) = cache_dir.glob("*.table")
    second = analyze(trace, capsys)
    assert second == first
    # the second load maps the kept columns (read-only), the same values as a fresh decode
    fresh_env = os.environ.pop("STEPSCOPE_CACHE_DIR")
    os.environ[cache.NO_CACHE_ENV] = "1"
    try:
        fresh = load_trace(trace)
    finally:
        os.environ["STEPSCOPE_CACHE_DIR"] = fresh_env
        del os.environ[cache.NO_CACHE_ENV]
    load_trace(trace)  # (analyze loads without flow events: a table of its own)
    mapped = load_trace(trace)
    assert mapped.names == fresh.names and mapped.cats == fresh.cats
    for name, column in fresh.columns.items():
        assert list(mapped.columns[name]) == list(column), name
    assert not mapped.columns["ts"].flags.writeable
    assert len(list(cache_dir.glob("*.table"))) == 2 and kept.exists()


def test_a_changed_file_is_decoded_again(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = a_trace(tmp_path / "t.json", steps=3)
    assert len(analyze(trace, capsys)["ranks"][0]["steps"]) == 3
    time.sleep(0.01)
    a_trace(trace, steps=4)  # the same path, rewritten
    assert len(analyze(trace, capsys)["ranks"][0]["steps"]) == 4
    assert len(list(cache_dir.glob("*.table"))) == 2


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) // 2],  # cut short
        lambda b: b"garbage" + b[7:],  # a wrong magic
        lambda b: b.replace(b'"dense"', b'"pickle"', 1),  # a column kind that is none
        lambda b: b.replace(b'"<i8"', b'"|O"', 1),  # an object dtype: never read
    ],
)
def test_a_damaged_cache_file_is_rebuilt(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str], damage: object
) -> None:
    trace = a_trace(tmp_path / "t.json")
    first = analyze(trace, capsys)
    (kept,) = cache_dir.glob("*.table")
    kept.write_bytes(damage(kept.read_bytes()))  # type: ignore[operator]
    assert analyze(trace, capsys) == first
    assert tables.read(kept) is not None  # written anew, whole


def test_no_cache_neither_reads_nor_writes(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = a_trace(tmp_path / "t.json")
    analyze(trace, capsys, "--no-cache")
    assert not cache_dir.exists()
    assert cache.NO_CACHE_ENV not in os.environ  # (for that command only)


def test_the_cache_keeps_to_its_size(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = [a_trace(tmp_path / f"t{i}.json", steps=2 + i) for i in range(3)]
    analyze(traces[0], capsys)
    (one,) = cache_dir.glob("*.table")
    monkeypatch.setenv(cache.MAX_ENV, str(2.5 * one.stat().st_size / (1 << 20)))
    for trace in traces[1:]:
        time.sleep(0.01)
        analyze(trace, capsys)
    kept = sorted(cache_dir.glob("*.table"), key=lambda p: p.stat().st_mtime_ns)
    assert len(kept) == 2 and one not in kept  # the least recently used went first


def test_a_cache_that_cannot_be_written_is_no_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("STEPSCOPE_CACHE_DIR", str(blocker))  # (its tables/ folder cannot be made)
    trace = a_trace(tmp_path / "t.json")
    assert analyze(trace, capsys) == analyze(trace, capsys)


def test_another_spelling_of_the_path_is_the_file_as_named_now(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    trace = a_trace(tmp_path / "d" / "t.json")
    roundabout = tmp_path / "d" / ".." / "d" / "t.json"
    assert load_trace(roundabout).ranks[0].source == str(roundabout)
    assert load_trace(trace).ranks[0].source == str(trace)  # (the same kept table)
