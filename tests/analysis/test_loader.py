"""The fast loader: exact columns on synthetic traces, the same table as the reference builder, ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.analysis.read.loader import load_trace
from stepscope.analysis.read.table import MISSING
from stepscope.errors import InputError
from stepscope.runfolder import Artifact, update_manifest

from ..support.reference import reference
from ..support.synthetic import RICH_EVENTS
from ..support.tables import assert_same_table
from ..support.traces import ARG_KEYS, SHARED_TRACES, cpu, kernel, trace, write


def test_columns_of_a_small_trace_are_exact(tmp_path: Path) -> None:
    # GIVEN a trace with every kind of event the table keeps
    path = write(tmp_path / "t.json.gz", trace(RICH_EVENTS, rank=3))
    # WHEN it is loaded
    table = load_trace(path)
    # THEN every row and column holds the expected numbers
    assert len(table) == 11  # 2 metadata events and 1 bad phase left out
    assert table.rank_ids() == [3]
    names = [table.name_of(i) for i in range(len(table))]
    assert names[:3] == ["ProfilerStep#1", "aten::mm", "cudaLaunchKernel"]
    assert table.columns["ts"].tolist()[:6] == [1000500, 1001000, 1002000, 1010123, 1020000, 1002000]
    assert table.columns["dur"].tolist()[:5] == [500250, 10001, 3000, 4500, 2000]
    assert table.columns["stream"].tolist()[:5] == [MISSING, MISSING, MISSING, 7, 7]
    assert table.columns["device"].tolist()[:5] == [MISSING, MISSING, MISSING, 0, 0]
    assert table.columns["correlation"].tolist()[:5] == [MISSING, MISSING, 55, 55, 56]
    assert table.columns["bytes"].tolist()[4] == 4096
    assert chr(table.columns["ph"][7]) == "i" and table.columns["cat"][7] == MISSING
    assert table.names[table.columns["args_collective"][8]] == "allreduce"
    assert table.columns["args_in_nelems"][8] == 1024 and table.columns["args_group_size"][8] == 2
    assert table.columns["args_collective"][0] == MISSING
    assert table.cats[table.columns["cat"][4]] == "gpu_memcpy"
    info = table.ranks[3]
    assert info.world_size == 2 and info.backend == "nccl" and not info.rank_assigned


def test_fast_loader_matches_reference_builder(tmp_path: Path) -> None:
    events = [
        *RICH_EVENTS,
        # 2021 schema: old categories, string tids, "external id" on runtime and kernels
        {"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 5, "tid": "5555", "ts": 7, "dur": 2},
        {
            "ph": "X",
            "cat": "Kernel",
            "name": "k",
            "pid": 0,
            "tid": "stream 7",
            "ts": 9,
            "dur": 1,
            "args": {"stream": 7, "device": 0, "external id": 43, "correlation": 1},
        },
        {
            "ph": "X",
            "cat": "Memset",
            "name": "Memset (Device)",
            "pid": 0,
            "tid": "stream 7",
            "ts": 11,
            "dur": 1,
        },
        # integers beyond int64 in args, pid and id; floats where ints are expected
        cpu("huge", 20, 1, correlation=2**64 + 5, **{"External id": -(2**70)}),
        {"ph": "s", "id": 2**65, "pid": 2**64, "tid": 1.0, "ts": 21, "cat": "ac2g", "name": "ac2g"},
        cpu("floaty", 22.5, 0.0005, stream=3.0, correlation=9.0),
        # missing fields, null fields, negative duration, string stream
        {"ph": "X"},
        {"ph": "X", "name": None, "cat": None, "ts": None, "dur": None, "args": None},
        cpu("negative", 30, -5),
        kernel("str stream", 31, 1, stream="7"),  # type: ignore[arg-type]
        {"ph": "X", "name": "nested args", "ts": 32, "args": {"Collective name": ["a"], "dtype": 5}},
        # ns resolution at epoch magnitude, and a Python-style float with a long fraction
        cpu("epoch", 1712195495519689.047, 63.813),
        cpu("long fraction", 1712195495519695.8123456, 0.30000000000000004),
        cpu("exponent", 1.5e3, 2e1),
    ]
    path = write(tmp_path / "t.json", trace(events, rank=0))
    assert_same_table(load_trace(path), reference(path))


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("1712195495519689.047", 1712195495519689047),  # epoch us with ns: float64 is 0.25 us off here
        ("4458676522690.655", 4458676522690655),  # relative, beyond 2^42 us: still needs the exact pass
        ("1428625731896.179", 1428625731896179),  # relative, below 2^41 us: float64 is exact
        ("1682725898236567", 1682725898236567000),  # integer epoch us
        ("-3.5", -3500),
        ("1712195495519689.0465", 1712195495519689046),  # exact pass: half a ns rounds to even
        ("1712195495519689.0475", 1712195495519689048),
    ],
)
def test_timestamps_keep_the_nanoseconds(tmp_path: Path, text: str, ns: int) -> None:
    path = write(
        tmp_path / "t.json",
        '{"traceEvents": [{"ph": "M", "name": "process_name", "ts": 1.5}, '
        f'{{"ph": "X", "name": "a", "ts": {text}, "dur": 63.813}}, {{"ph": "i", "name": "c", "ts": 12}}]}}',
    )
    table = load_trace(path)
    assert table.columns["ts"].tolist() == [ns, 12000]
    assert table.columns["dur"].tolist() == [63813, 0]


def test_epoch_float_timestamps_late_in_the_file_are_exact(tmp_path: Path) -> None:
    # GIVEN float epoch timestamps only after the first 64 KB (the decoder cannot see them coming)
    early = [cpu(f"op{i}", 1000 + i, 1) for i in range(1200)]
    late = '{"ph": "X", "name": "late", "ts": 1712195495519689.047, "dur": 0.001}'
    path = write(tmp_path / "t.json", '{"traceEvents": ' + json.dumps(early)[:-1] + ", " + late + "]}")
    assert path.stat().st_size > 1 << 16
    # WHEN loaded THEN a second pass reads the timestamps exactly, and the file matches the reference
    table = load_trace(path)
    assert table.columns["ts"].tolist()[-1] == 1712195495519689047 and table.columns["dur"].tolist()[-1] == 1
    assert_same_table(table, reference(path))


def test_string_timestamp_in_epoch_float_file_is_an_input_error(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.json",
        '{"traceEvents": [{"ph": "X", "ts": 1712195495519689.047}, {"ph": "X", "ts": "x"}]}',
    )
    with pytest.raises(InputError, match=r"wrong field type: `ts` of event 1 is b'\"x\"'"):
        load_trace(path)


def test_folder_ranks_are_distinct_and_stable(tmp_path: Path) -> None:
    # GIVEN a folder: two files declare rank 1, two declare none
    write(tmp_path / "a.json", trace([cpu("a", 1, 1)], rank=1))
    write(tmp_path / "b.json.gz", trace([cpu("b", 1, 1)], rank=None))
    write(tmp_path / "c.json", trace([cpu("c", 1, 1)], rank=1))
    write(tmp_path / "d.json", trace([cpu("d", 1, 1)], rank=None))
    write(tmp_path / "notes.txt", "not a trace")
    # WHEN the folder is loaded
    table = load_trace(tmp_path)
    # THEN every file has its own rank: declared first, then the lowest free ones in path order
    by_source = {Path(info.source).name: rank for rank, info in table.ranks.items()}
    assert by_source == {"a.json": 1, "b.json.gz": 0, "c.json": 2, "d.json": 3}
    assert [table.name_of(i) for i in range(len(table))] == ["b", "a", "c", "d"]
    assert table.columns["rank"].tolist() == [0, 1, 2, 3]
    assert table.notices == [
        f"{tmp_path / 'b.json.gz'}: no distributedInfo.rank; loaded as rank 0",
        f"{tmp_path / 'c.json'}: declares rank 1 like {tmp_path / 'a.json'}; loaded as rank 2",
        f"{tmp_path / 'd.json'}: no distributedInfo.rank; loaded as rank 3",
    ]
    assert table.ranks[0].rank_assigned and not table.ranks[1].rank_assigned


@pytest.mark.parametrize("workers", [1, 2])
def test_folder_skips_json_that_is_not_a_chrome_trace(tmp_path: Path, workers: int) -> None:
    write(tmp_path / "rank0.json", trace([cpu("a", 1, 1)], rank=0))
    write(tmp_path / "rank0_et.json", {"schema": "1.0.1", "nodes": []})  # an execution trace
    table = load_trace(tmp_path, workers=workers)
    assert table.rank_ids() == [0] and len(table) == 1
    assert table.notices == [
        f"{tmp_path / 'rank0_et.json'}: skipped, JSON without traceEvents: not a chrome trace"
    ]


def test_folder_with_only_other_json_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "config.json", [1, 2])
    with pytest.raises(InputError, match=r"directory has no chrome traces \(JSON with traceEvents\)"):
        load_trace(tmp_path)


def test_a_broken_file_in_a_folder_is_still_an_error(tmp_path: Path) -> None:
    write(tmp_path / "rank0.json", trace([cpu("a", 1, 1)], rank=0))
    write(tmp_path / "rank1.json.gz", b"{broken")
    with pytest.raises(InputError, match=r"rank1\.json\.gz: not valid JSON"):
        load_trace(tmp_path)


def test_single_rankless_file_is_rank_zero_without_notice(tmp_path: Path) -> None:
    table = load_trace(write(tmp_path / "t.json", trace([cpu("a", 1, 1)], rank=None)))
    assert table.rank_ids() == [0] and table.notices == [] and table.ranks[0].rank_assigned


def test_run_folder_is_read_through_its_manifest(tmp_path: Path) -> None:
    write(tmp_path / "traces" / "rank0_step5.json.gz", trace([cpu("r0", 1, 1)], rank=None))
    write(tmp_path / "traces" / "rank1_step5.json.gz", trace([cpu("r1", 1, 1)], rank=None))
    write(tmp_path / "traces" / "stray.json", trace([cpu("stray", 1, 1)], rank=7))  # not in the manifest
    update_manifest(
        tmp_path,
        artifacts=[
            Artifact(kind="trace", path="traces/rank1_step5.json.gz", rank=1, step=5),
            Artifact(kind="trace", path="traces/rank0_step5.json.gz", rank=0, step=5),
        ],
    )
    table = load_trace(tmp_path)
    assert {
        r: table.name_of(int(np.flatnonzero(table.columns["rank"] == r)[0])) for r in table.rank_ids()
    } == {
        0: "r0",
        1: "r1",
    }
    assert table.notices == []


def test_pool_gives_the_same_table(tmp_path: Path) -> None:
    for r in range(3):
        write(tmp_path / f"r{r}.json.gz", trace([cpu(f"op{r}", 1, 1), kernel("k", 2, r + 1)], rank=r))
    serial = load_trace(tmp_path, workers=1)
    pooled = load_trace(tmp_path, workers=2)
    assert_same_table(serial, pooled)
    assert pooled.names == serial.names


def test_pool_reports_input_errors(tmp_path: Path) -> None:
    write(tmp_path / "a.json", trace([cpu("a", 1, 1)], rank=0))
    write(tmp_path / "b.json", '{"traceEvents": [')
    with pytest.raises(InputError, match="truncated JSON"):
        load_trace(tmp_path, workers=2)


def test_progress_is_reported_to_the_callback_up_to_the_total(tmp_path: Path) -> None:
    write(tmp_path / "a.json", trace([cpu("a", 1, 1)], rank=0))
    write(tmp_path / "b.json", trace([cpu("b", 1, 1)], rank=1))
    seen: list[tuple[int, int, str]] = []
    table = load_trace(
        tmp_path, workers=1, progress=lambda done, total, label: seen.append((done, total, label))
    )
    assert len(table) == 2 and seen
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)  # never backwards
    assert seen[-1][0] == seen[-1][1]  # ends at the total


def test_progress_bar_can_be_forced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.cli._output import ProgressBar

    monkeypatch.setattr(ProgressBar, "DELAY_S", -1.0)
    with ProgressBar(enabled=True) as bar:
        table = load_trace(write(tmp_path / "t.json", trace([cpu("a", 1, 1)])), progress=bar)
        assert bar._bar is not None  # shown, although stderr is not a terminal
    assert len(table) == 1 and bar._bar is None


def test_analysis_never_imports_torch() -> None:
    code = (
        "import sys; import stepscope.analysis.read.loader, stepscope.analysis.per_rank.summary, stepscope.analysis.diff.compare, "
        "stepscope.cli.summary, stepscope.cli.diff; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


SHARED_FILES = [
    "hta_trace_compare/base/base.json.gz",
    "hta_critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    "hta_amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "kineto_docs_traces/after_fix_trace.json",
    "hta_rank_unavailable/rank_not_found.json.gz",
    "hta_ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
]


@pytest.mark.shared
@pytest.mark.parametrize("name", SHARED_FILES)
def test_shared_traces_match_reference(name: str) -> None:
    path = SHARED_TRACES / name
    table = load_trace(path)
    (rank,) = table.rank_ids()
    assert_same_table(table, reference(path, rank))


@pytest.mark.shared
def test_shared_old_schema_trace_maps_categories() -> None:
    path = SHARED_TRACES / "kineto_resnet50_num_workers_4" / "worker0.1623212756351.pt.trace.json.gz"
    table = load_trace(path)
    assert {"cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset"} <= set(table.cats)
    assert not {"Operator", "Runtime", "Kernel"} & set(table.cats)
    kernels = table.cat_mask("kernel")
    assert (
        int(kernels.sum()) == 8868
        and (table.columns["stream"][kernels] == 7).all()
        and (table.columns["tid"][kernels] == 7).all()
    )
    assert set(table.columns["tid"][table.cat_mask("cpu_op")].tolist()) == {5555, 5786}


# --- property: on any well-formed trace the fast loader and the reference builder agree -----------------
ids = st.one_of(st.integers(-5, 2**66), st.sampled_from(["5555", "stream 7", "Spans", ""]), st.none())
us_ints = st.integers(-(10**6), 2**52)
us_floats = st.builds(lambda i, f: i + f / 1000, st.integers(0, 2**40), st.integers(0, 999))
arg_values = st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=3), st.none(), st.floats(-1e20, 1e20))
arg_dicts = st.dictionaries(
    st.sampled_from(ARG_KEYS),
    arg_values,
    max_size=4,
)
well_formed_event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "i", "s", "f", "C", "M", "b"]),
        "name": st.sampled_from(["aten::mm", "k", "process_name", "thread_name", "ProfilerStep#1"]),
        "pid": ids,
        "tid": ids,
        "ts": st.one_of(us_ints, us_floats),
    },
    optional={
        "cat": st.sampled_from(["cpu_op", "kernel", "Kernel", "Operator", "gpu_memcpy", "Memset", "ac2g"]),
        "dur": st.one_of(st.integers(-10, 2**40), us_floats),
        "id": ids,
        "args": arg_dicts,
    },
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(well_formed_event, max_size=12), gz=st.booleans())
def test_fast_loader_matches_reference_on_random_traces(tmp_path: Path, events: list[Any], gz: bool) -> None:
    path = write(tmp_path / ("t.json.gz" if gz else "t.json"), trace(events, rank=0))
    fast = load_trace(path)
    ref = reference(path)
    assert_same_table(fast, ref)


@pytest.mark.parametrize(
    "values",
    [
        [1, 2, 3],
        [1, 2.5, 3],  # one float among ints: the float path, exact to the ns
        [2**62, 1.5],  # an int beyond int64 ns next to a float
        [1623212388482442, 7, 2**70],  # epoch ints and one beyond int64
        [0.001, 1e-3, 12.345],
        [1.5, 2**1100, 7],  # an int beyond float range among floats
        [],
    ],
)
def test_strict_time_columns_match_the_type_scan(values: list[Any]) -> None:
    # strict chunks skip the scan of value types; the columns must be the same as with it
    from stepscope.analysis.read._values import ns_from_us

    fast, fast_inexact = ns_from_us(list(values), strict=True)
    slow, slow_inexact = ns_from_us(list(values))
    assert fast.tolist() == slow.tolist() and fast_inexact == slow_inexact


def test_symbol_codes_across_the_byte_boundary() -> None:
    # codes are read as bytes while the lookup is small; past 255 symbols, and for -1, through numpy
    from stepscope.analysis.read._values import codes_of

    names: dict[str, int] = {}

    def add(value: str | None) -> int:
        return -1 if value is None else names.setdefault(value, len(names))

    lookup: dict[str | None, int] = {}
    values = [None if i % 97 == 0 else f"op{(i * 7) % 300}" for i in range(1200)]
    parts = [codes_of(values[lo : lo + 150], lookup, add, np.int32) for lo in range(0, len(values), 150)]
    decoded = [None if c == -1 else list(names)[c] for c in np.concatenate(parts).tolist()]
    assert decoded == values
    assert len(names) == 300


def test_a_folder_of_many_files_without_ranks_names_ten_and_counts_the_rest(tmp_path: Path) -> None:
    # GIVEN 25 files that declare no rank and 13 that all declare rank 0 (5,000 such files printed 5,000 notes)
    for i in range(25):
        write(tmp_path / f"n{i:02d}.json", trace([cpu("a", 1, 1)], rank=None))
    for i in range(13):
        write(tmp_path / f"r{i:02d}.json", trace([cpu("a", 1, 1)], rank=0))
    table = load_trace(tmp_path)
    # THEN every file has its own rank, ten notes of each kind name a file, one line counts the rest
    assert table.rank_ids() == list(range(38))
    assert sum("no distributedInfo.rank; loaded as rank" in n for n in table.notices) == 10
    assert sum("declares rank 0 like" in n for n in table.notices) == 10
    assert table.notices[-2:] == [
        "15 more files have no distributedInfo.rank; each loaded as the lowest free rank",
        "2 more files declare a rank another file declares; each loaded as the lowest free rank",
    ]
