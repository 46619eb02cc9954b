"""Every reader of an untrusted file is bounded (issue 34, items 11-13): memory files whatever their opcodes,
`stepscope merge` on millions of events, and the small artifacts of a run folder that someone replaced with a
FIFO or a device. Each command ends with an answer or one line and exit 2, in bounded memory and time."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.analysis.memory.snapshot import analyze_memory_file, analyze_memory_object

from ..support.jobs import _PEAK_OF
from ..support.jobs import merge_in_child as _merge_in_child

# Runs the command given as its arguments and prints that child's exit status and its own peak RSS in KiB (a
# child forked straight from pytest would report pytest's peak: ru_maxrss survives fork and exec).


def stepscope(*args: str, **env: str) -> tuple[int, str, str, int, float]:
    """`stepscope ARGS` in a child: exit status, stdout, stderr, peak RSS in MiB, wall seconds."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_OF, sys.executable, "-m", "stepscope", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=180,
    )
    code, peak_kib = done.stdout.split()[-2:]
    out = done.stdout.rsplit("\n", 2)[0]
    return int(code), out, done.stderr, int(peak_kib) // 1024, time.perf_counter() - t0


def one_line(err: str, path: Path, problem: str) -> bool:
    return err.count("\n") == 1 and err.startswith(f"stepscope: error: {path}: ") and problem in err


# --- item 11: memory files ---------------------------------------------------------------------------------


def test_a_10_byte_pickle_asking_for_memo_index_2_28_is_refused_at_once(tmp_path: Path) -> None:
    # GIVEN 10 bytes: protocol 4, None, and LONG_BINPUT at index 0xfffffff (Python's unpickler: 4.1 GiB)
    path = tmp_path / "memo.pickle"
    path.write_bytes(b"\x80\x04N" + b"r" + struct.pack("<I", 0xFFFFFFF) + b".")
    # WHEN `stepscope memory` reads it
    code, _, err, peak_mb, _ = stepscope("memory", str(path))
    # THEN one line naming the memo index, and no memory spent on it
    assert code == 2 and one_line(err, path, "memo index 268435455 beyond the 0 entries stored"), err
    assert peak_mb < 200


@pytest.mark.parametrize(
    ("opcodes", "problem"),
    [
        (b"]", "its objects would take more than 64 MiB"),  # EMPTY_LIST: 80 bytes each
        (b"\x8f", "its objects would take more than 64 MiB"),  # EMPTY_SET: 340 bytes each
        (b"N0", "pickle opcodes"),  # None, POP: nothing kept, only time
        (b"h\x00", "memo index 0 beyond the 0 entries stored"),  # BINGET before any PUT
    ],
)
def test_an_opcode_flood_stops_at_the_budget_in_one_line(
    tmp_path: Path, opcodes: bytes, problem: str
) -> None:
    # GIVEN 16 MiB of one opcode (EMPTY_LIST: 1.3 GB of lists if built), the input limit at 128 MiB (a budget
    # of 64 MiB of objects and 4 million opcodes; the default 1 GiB allows 512 MiB, 33.5 million)
    path = tmp_path / "flood.pickle"
    path.write_bytes(b"\x80\x04" + opcodes * ((16 << 20) // len(opcodes)) + b".")
    # WHEN `stepscope memory` reads it
    code, _, err, peak_mb, seconds = stepscope("memory", str(path), STEPSCOPE_MAX_INPUT_BYTES=str(128 << 20))
    # THEN one line, exit 2, memory near the budget, a few seconds
    assert code == 2 and one_line(err, path, problem), err
    assert "Traceback" not in err and peak_mb < 64 + 200, peak_mb
    assert seconds < 60


def test_a_gzipped_list_of_ints_is_refused_while_it_streams(tmp_path: Path) -> None:
    # GIVEN a gzip'd pickle of 40 MB of 4-byte ints (8 million: 320 MB once built; 2 MB on disk), the limit at
    # 128 MiB (its budget 64 MiB)
    path = tmp_path / "ints.pickle.gz"
    body = b"\x80\x04](" + b"J\x00\x00\x00\x01" * 8_000_000 + b"e."
    path.write_bytes(gzip.compress(body, 1))
    del body
    # WHEN `stepscope memory` reads it
    code, _, err, peak_mb, _ = stepscope("memory", str(path), STEPSCOPE_MAX_INPUT_BYTES=str(128 << 20))
    # THEN it stops at the budget: the 40 MB of text are never held whole, nor the ints built
    assert code == 2 and one_line(err, path, "its objects would take more than 64 MiB"), err
    assert peak_mb < 64 + 200, peak_mb


def test_a_real_shaped_snapshot_reads_the_same_as_pythons_unpickler(tmp_path: Path) -> None:
    # GIVEN a snapshot pickled by Python (frames shared between entries, as torch's are), every protocol
    frames = [{"filename": f"/u/m{i}.py", "line": i, "name": f"f{i}"} for i in range(50)]
    entries = [
        {
            "action": "alloc",
            "addr": i,
            "size": 512 * (i + 1),
            "time_us": 1e6 + i,
            "frames": frames[i % 7 :][:9],
        }
        for i in range(300)
    ]
    snap = {"segments": [], "device_traces": [entries]}
    for protocol in range(6):  # 0 and 1: text opcodes (PUT, GET, INT, FLOAT, UNICODE), DICT and LIST
        path = tmp_path / f"s{protocol}.pickle"
        path.write_bytes(pickle.dumps(snap, protocol=protocol))
        # WHEN it is analyzed
        report = analyze_memory_file(path)
        # THEN the history is read whole: peak = every allocation (nothing is freed)
        assert report.devices[0].trace_entries == 300
        assert report.devices[0].peak_allocated == sum(512 * (i + 1) for i in range(300))


_TEXT = st.text(max_size=12)
_FRAME = st.fixed_dictionaries({"filename": _TEXT, "line": st.integers(0, 10**6), "name": _TEXT})
_BLOCK = st.fixed_dictionaries(
    {
        "size": st.integers(0, 2**40),
        "address": st.integers(0, 2**64),
        "state": st.sampled_from(["active_allocated", "inactive", "active_awaiting_free"]),
        "frames": st.lists(_FRAME, max_size=4),
    }
)
_SNAPSHOT = st.fixed_dictionaries(
    {
        "segments": st.lists(
            st.fixed_dictionaries(
                {
                    "device": st.integers(0, 3),
                    "total_size": st.integers(0, 2**40),
                    "segment_type": st.sampled_from(["large", "small"]),
                    "blocks": st.lists(_BLOCK, max_size=4),
                    "segment_pool_id": st.tuples(st.integers(0, 9), st.integers(0, 9)),
                }
            ),
            max_size=4,
        ),
        "device_traces": st.lists(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "action": st.sampled_from(["alloc", "free_completed", "segment_alloc", "oom"]),
                        "size": st.integers(0, 2**40),
                        "time_us": st.floats(0, 1e15),
                        "frames": st.lists(_FRAME, max_size=3),
                    }
                ),
                max_size=6,
            ),
            max_size=2,
        ),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(snap=_SNAPSHOT, protocol=st.integers(0, 5), share=st.booleans())
@pytest.mark.slow
def test_a_pickled_snapshot_reads_as_the_object_it_was_made_from(
    tmp_path: Path, snap: dict, protocol: int, share: bool
) -> None:
    # GIVEN any snapshot-shaped object, its frames maybe shared (memo references), pickled by Python
    if share:
        for segment in snap["segments"]:
            for block in segment["blocks"]:
                block["frames"] = (
                    snap["segments"][0]["blocks"][0]["frames"] if snap["segments"][0]["blocks"] else []
                )
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=protocol))
    # WHEN the file is analyzed, THEN the report is that of the object itself
    expected = analyze_memory_object(snap, source=str(path))
    assert analyze_memory_file(path) == expected


@pytest.mark.slow
def test_a_2_million_point_memory_timeline_is_read_in_seconds(tmp_path: Path) -> None:
    # GIVEN a memory timeline of 2 million points (torch's [times, sizes] shape: padding and 8 categories, two of
    # them used)
    rng = np.random.default_rng(0)
    n = 2_000_000
    sizes = np.zeros((n, 9), dtype=np.int64)
    sizes[:, 4:6] = rng.integers(0, 1 << 20, size=(n, 2))
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps([(np.arange(n) * 10).tolist(), sizes.tolist()]))
    expected_peak = int(sizes.sum(axis=1).max())
    del sizes
    # WHEN `stepscope memory --json` reads it (once: 37 s, the sizes checked row by row; then refused as more
    # than 20 million objects)
    code, out, err, peak_mb, seconds = stepscope("memory", "--json", str(path))
    # THEN the peak is the largest row sum, in seconds (4-7 s here) and bounded memory
    assert code == 0, err
    device = json.loads(out)["devices"][0]
    assert device["peak_allocated"] == expected_peak
    assert seconds < 30 and peak_mb < 1024, (seconds, peak_mb)


# --- item 13: the small files of a run folder are regular files, read in bounded amounts -------------------


def _replace(path: Path, kind: str) -> None:
    """Put a FIFO, a link to /dev/zero, or a sparse file of 100 GB where `path` was."""
    path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as fh:
            fh.truncate(100 << 30)


def _listening_run(tmp_path: Path) -> Path:
    """A run folder of an on-demand job whose rank 0 listens (this test's own process stands for it)."""
    from stepscope.capture.window.trigger import LISTENER_TEMPLATE, TriggerListener
    from stepscope.runfolder import Manifest, encode_manifest

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_bytes(encode_manifest(Manifest(profiled_ranks=[0])))
    (run / "config.yaml").write_text("on_demand: true\nactive: 2\ntrigger_poll_steps: 5\n")
    listener = TriggerListener(
        rank=0, pid=os.getpid(), host=__import__("socket").gethostname(), since=time.time()
    )
    (run / LISTENER_TEMPLATE.format(rank=0)).write_bytes(
        json.dumps(__import__("msgspec").to_builtins(listener)).encode()
    )
    return run


@pytest.mark.parametrize("kind", ["fifo", "zero", "sparse"])
def test_trigger_with_a_fifo_or_device_for_its_request_file_is_one_line(tmp_path: Path, kind: str) -> None:
    # GIVEN a running on-demand job whose trigger.json is a FIFO (once: a hang), /dev/zero (once: read until
    # MemoryError) or a sparse 100 GB file
    run = _listening_run(tmp_path)
    _replace(run / "trigger.json", kind)
    # WHEN `stepscope trigger` asks for a window
    code, _, err, peak_mb, seconds = stepscope("trigger", str(run))
    # THEN one line naming the file, exit 2, at once
    assert code == 2 and one_line(err, run / "trigger.json", "a trigger request file"), err
    assert seconds < 30 and peak_mb < 200


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run folder of rank 0: one window (steps 2-3) and metrics of every step."""
    import stepscope

    from ..support.train import make_training

    out = tmp_path_factory.mktemp("runs")
    train_step, model = make_training()
    monitor = stepscope.performance_monitor(
        model, out_dir=str(out), wait=1, warmup=1, active=2, console=False
    )
    step = monitor(train_step)
    for _ in range(5):
        step()
    monitor.close()
    assert monitor.run_dir is not None
    return monitor.run_dir


@pytest.mark.parametrize("kind", ["fifo", "zero", "sparse"])
def test_a_run_whose_small_files_are_fifos_or_devices_still_analyzes_with_a_note(
    small_run: Path, tmp_path: Path, kind: str
) -> None:
    import shutil

    from stepscope.runfolder import Artifact, encode_manifest, read_manifest

    # GIVEN the run, its metrics.jsonl, config.yaml and a flops artifact replaced (once: analyze hung on a FIFO)
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    manifest = read_manifest(run)
    manifest.artifacts.append(Artifact(kind="flops", path="flops/rank0_step3.json", rank=0, step=3))
    (run / "manifest.json").write_bytes(encode_manifest(manifest))
    for name in ("metrics.jsonl", "config.yaml", "flops/rank0_step3.json"):
        _replace(run / name, kind)
    # WHEN it is analyzed
    code, out, err, peak_mb, seconds = stepscope("analyze", str(run))
    # THEN the traces are analyzed, and a note names each file left out
    assert code == 0, err
    assert "Steps" in out or "step" in out
    for name in ("metrics.jsonl", "config.yaml", "rank0_step3.json"):
        assert any(name in line and "left out" in line for line in err.splitlines()), err
    assert "Traceback" not in err and seconds < 60 and peak_mb < 500


# --- item 12: merge streams --------------------------------------------------------------------------------


@pytest.mark.slow
def test_merge_of_a_million_events_streams_under_an_address_space_limit(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_merge import write_rank

    # GIVEN two ranks of 500,000 events each (8.6 MB of gzip; as dicts, whole, merge once took 1.2 GB; with the
    # whole table loaded, 271 MiB)
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in range(2):
        write_rank(folder / f"rank{rank}.json.gz", rank, 500_000, 2)
    out = tmp_path / "merged.json.gz"
    # WHEN they are merged in a process limited to 1.5 GB of address space
    code, err, peak_mb, _ = _merge_in_child(folder, out, 1536 << 20)
    # THEN the merge succeeds with every event, well under the limit
    assert code == 0, err
    with gzip.open(out, "rb") as fh:
        merged = json.loads(fh.read())["traceEvents"]
    assert sum(1 for e in merged if e["ph"] == "X") == 1_000_000
    assert peak_mb < 160, peak_mb


@pytest.mark.slow
def test_merge_keeps_every_event_whatever_its_strings_hold(tmp_path: Path) -> None:
    # GIVEN a trace of 3 MB (several batches) whose names and args hold what a cut could be fooled by
    tricky = ['}, {"ph":"X"', '"traceEvents":[', "]}", "\\u007d,{", "é∑😀"]
    events = []
    for i in range(12_000):
        name = f"op{i} {tricky[i % len(tricky)]}"
        args = {"list": [{"a": i}, {"b": name}], "text": "}, {" * (i % 4)}
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": name,
                "pid": 1,
                "tid": 1,
                "ts": i * 10,
                "dur": 5,
                "args": args,
            }
        )
    events.append(
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "long",
            "pid": 1,
            "tid": 1,
            "ts": 1,
            "dur": 1,
            "args": {"x": [{"y": "}, {"}] * 50_000},
        }
    )
    path = tmp_path / "rank0.json"
    path.write_text(
        json.dumps(
            {
                "distributedInfo": {"rank": 0, "world_size": 1},
                "traceEvents": events,
                "after": {"traceEvents": 1},
            }
        )
    )
    # WHEN it is merged
    from stepscope.cli import main

    out = tmp_path / "merged.json"
    assert main(["merge", str(path), "-o", str(out)]) == 0
    # THEN every event comes out as it went in (pid: the rank's process)
    merged = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(merged) == len(events)
    for before, after in zip(events, merged, strict=True):
        assert (after["name"], after["args"], after["ts"], after["pid"]) == (
            before["name"],
            before["args"],
            before["ts"],
            1,
        )


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_config_yaml_that_is_a_fifo_or_device_is_refused_in_one_line(tmp_path: Path, kind: str) -> None:
    # GIVEN a config YAML that is a FIFO (a plain open waits for a writer) or /dev/zero
    path = tmp_path / "profile.yaml"
    _replace(path, kind)
    # WHEN ProfileConfig reads it
    code = "import stepscope, sys\ntry:\n    stepscope.ProfileConfig.from_yaml(sys.argv[1])\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
    # THEN InputError naming the file, at once
    assert done.stdout.startswith(f"InputError {path}: not a regular file"), done.stdout + done.stderr
