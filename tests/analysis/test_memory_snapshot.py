"""Snapshot and memory-timeline analysis against numbers worked out by hand (see memory_data.py)."""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.memory.snapshot import NO_STACK, analyze_memory_file, analyze_snapshot
from stepscope.analysis.memory.timeline import downsample
from stepscope.errors import InputError

from ..support.memory_data import BUFFER, MAIN, STEP, KiB, MiB, entry, snapshot

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"


def site(f: dict) -> str:
    return f"{f['filename']}:{f['line']}:{f['name']}"


def test_state_at_snapshot_time_comes_from_segments():
    dev = analyze_snapshot(snapshot()).devices[0]
    assert dev.device == 0
    assert dev.reserved == 26 * MiB
    assert dev.allocated == 13 * MiB
    assert dev.active == 13 * MiB + 512 * KiB
    assert dev.requested == 8_000_000 + 4 * MiB + 1_000_000
    assert dev.cached_unused == 13 * MiB
    assert dev.inactive_split == 8 * MiB + 512 * KiB
    assert dev.fragmentation == pytest.approx((8.5 * MiB) / (26 * MiB))
    seg = dev.segments
    assert (seg.count, seg.total, seg.largest, seg.smallest, seg.large_count, seg.small_count) == (
        3,
        26 * MiB,
        20 * MiB,
        2 * MiB,
        2,
        1,
    )


def test_peaks_replay_the_trace_from_the_inferred_baseline():
    dev = analyze_snapshot(snapshot()).devices[0]
    assert dev.trace_entries == 11
    assert dev.trace_baseline == 1 * MiB + 512 * KiB
    assert dev.peak_allocated == 19 * MiB + 512 * KiB
    assert dev.peak_t_us == 30
    assert dev.peak_reserved == 26 * MiB
    assert not dev.time_is_index
    base = 1 * MiB + 512 * KiB
    levels = [0, 0, 8, 14, 18, 18, 12, 12, 12, 16, 16, 12]
    assert dev.timeline_allocated == [base + x * MiB for x in levels]
    assert dev.timeline_t_us == [0, 0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert dev.timeline_reserved == [
        2 * MiB + x * MiB for x in (0, 20, 20, 20, 20, 20, 20, 20, 24, 24, 24, 24)
    ]


def test_largest_blocks_and_call_sites_skip_torch_and_native_frames():
    report = analyze_snapshot(snapshot(), top=2)
    assert [(b.size, b.requested_size, b.site) for b in report.top_blocks] == [
        (8 * MiB, 8_000_000, site(STEP)),
        (4 * MiB, 4 * MiB, site(BUFFER)),
    ]
    assert report.top_blocks[0].stack == [site(STEP), site(MAIN)]
    # train.py:40 holds the 8 MiB block (through linear.py) and the 1 MiB one; awaiting-free is not live.
    assert [(s.site, s.bytes, s.blocks) for s in report.top_sites] == [
        (site(STEP), 9 * MiB, 2),
        (site(BUFFER), 4 * MiB, 1),
    ]


def test_oom_entries_are_reported_with_their_site():
    (oom,) = analyze_snapshot(snapshot()).devices[0].ooms
    assert (oom.device, oom.t_us, oom.requested, oom.device_free) == (0, 60, 100 * MiB, 1 * MiB)
    assert oom.site == "/home/u/train.py:55:step"


def test_trace_only_snapshot_starts_from_zero_and_counts_old_free_action():
    data = {
        "segments": [],
        "device_traces": [
            [],
            [
                {"action": "alloc", "addr": 1, "size": 100},
                {"action": "alloc", "addr": 2, "size": 200},
                {"action": "free", "addr": 1, "size": 100},
                {"action": "alloc", "addr": 3, "size": 300},
                {"action": "snapshot", "addr": 0, "size": 0},
            ],
        ],
    }
    report = analyze_snapshot(data)
    (dev,) = report.devices
    assert dev.device == 1
    assert (dev.peak_allocated, dev.peak_t_us, dev.trace_baseline) == (500, 4, 0)
    assert dev.time_is_index
    assert dev.timeline_allocated == [0, 100, 300, 200, 500, 500]
    assert dev.reserved == 0 and dev.fragmentation is None


def test_history_that_frees_earlier_memory_raises_the_baseline():
    data = {"device_traces": [[entry("free_completed", 64, 5), entry("alloc", 16, 6)]]}
    dev = analyze_snapshot(data).devices[0]
    assert dev.trace_baseline == 64
    assert dev.timeline_allocated == [64, 0, 16]


def test_snapshot_without_history_or_frames_says_so():
    data = snapshot()
    data["device_traces"] = [[]]
    for seg in data["segments"]:
        for b in seg["blocks"]:
            b["frames"] = []
    report = analyze_snapshot(data)
    dev = report.devices[0]
    assert dev.peak_allocated == dev.active == 13 * MiB + 512 * KiB
    assert dev.peak_t_us is None and dev.timeline_allocated == []
    assert report.top_sites[0].site == NO_STACK
    assert any("no allocation history" in n for n in report.notes)
    assert any("no stack frames" in n for n in report.notes)


def test_pre_2_1_blocks_with_history():
    data = {
        "segments": [
            {
                "device": 0,
                "total_size": 1000,
                "blocks": [
                    {
                        "size": 600,
                        "state": "active_allocated",
                        "history": [{"real_size": 550, "frames": [STEP]}],
                    }
                ],
            }
        ]
    }
    (blk,) = analyze_snapshot(data).top_blocks
    assert (blk.size, blk.requested_size, blk.site) == (600, 550, site(STEP))


def test_wrong_types_name_the_field(tmp_path):
    with pytest.raises(InputError, match=r"\$\.segments\[0\]\.total_size"):
        analyze_snapshot({"segments": [{"total_size": "big"}]}, source="x.pickle")


def test_downsample_keeps_ends_and_peak_within_bound():
    values = np.zeros(10_000, dtype=np.int64)
    values[1234] = 99
    keep = downsample(values, 50)
    assert len(keep) <= 50 and keep[0] == 0 and keep[-1] == 9_999 and 1234 in keep
    assert list(downsample(values[:10], 50)) == list(range(10))


def test_long_trace_is_bounded(tmp_path):
    trace = [entry("alloc" if i % 2 == 0 else "free_completed", 8, i) for i in range(20_000)]
    trace.insert(7_001, entry("alloc", 10**6, 7_000))
    dev = analyze_snapshot({"segments": [], "device_traces": [trace]}, max_points=100).devices[0]
    assert len(dev.timeline_allocated) <= 100
    assert max(dev.timeline_allocated) == dev.peak_allocated == 10**6 + 8


def test_file_loading_pickle_gzip_and_json(tmp_path):
    data = snapshot()
    for name, raw in {
        "a.pickle": pickle.dumps(data),
        "b.pickle": pickle.dumps(data, protocol=0),
        "c.pickle.gz": gzip.compress(pickle.dumps(data)),
        "d.json": json.dumps(data).encode(),
    }.items():
        (tmp_path / name).write_bytes(raw)
        assert analyze_memory_file(tmp_path / name).devices[0].peak_allocated == 19 * MiB + 512 * KiB, name


# Raw timeline events: [time_ns, action (1 pre-existing, 2 create, 3 increment version, 4 destroy), bytes, category]
RAW = [
    [-1, 1, 1000, 0],  # parameter, existed before profiling: placed at the first real time (5000 ns)
    [5000, 2, 200, 4],  # activation
    [5000, 2, 300, 3],  # temporary                                       -> 1500 at t=0 us
    [7000, 2, 400, 5],  # gradient created before the temporary dies: 1900 only within the timestamp
    [7000, 4, -300, 3],  #                                                 -> 1600 at t=2 us (the peak)
    [9000, 3, -400, 5],
    [9000, 3, 400, 5],  #                                                  -> 1600 at t=4 us
    [12000, 4, -200, 4],  #                                                -> 1400 at t=7 us
]


def test_raw_memory_timeline(tmp_path):
    path = tmp_path / "mt.raw.json.gz"
    path.write_bytes(gzip.compress(json.dumps(RAW).encode()))
    report = analyze_memory_file(path)
    assert report.kind == "memory_timeline"
    (dev,) = report.devices
    assert (dev.peak_allocated, dev.peak_t_us, dev.reserved) == (1600, 2, None)
    assert dev.categories_at_peak == {"parameter": 1000, "gradient": 400, "activation": 200}
    assert dev.timeline_t_us == [0, 2, 4, 7]
    assert dev.timeline_allocated == [1500, 1600, 1600, 1400]


def test_coalesced_memory_timeline_and_empty_one(tmp_path):
    rows = [[0, 100, 0, 0, 0, 0, 0, 0, 0], [0, 100, 0, 0, 0, 50, 0, 0, 0], [0, 100, 0, 0, 0, 0, 0, 0, 0]]
    (tmp_path / "mt.json").write_text(json.dumps([[10, 20, 30], rows]))
    (dev,) = analyze_memory_file(tmp_path / "mt.json").devices
    assert (dev.peak_allocated, dev.peak_t_us) == (150, 10)
    assert dev.categories_at_peak == {"parameter": 100, "activation": 50}
    (tmp_path / "empty.json").write_text("[[], []]")
    report = analyze_memory_file(tmp_path / "empty.json")
    assert report.devices == [] and "cpu:0" in report.notes[0]


@pytest.mark.shared
def test_shared_raw_memory_timeline():
    (dev,) = analyze_memory_file(SHARED / "hta_memory_analysis" / "memory_timeline.raw.gz").devices
    assert dev.trace_entries == 16_845
    assert dev.peak_allocated == 3_082_832_104  # replayed independently with a plain Python loop
    assert dev.peak_t_us == 98_424
    assert sum(dev.categories_at_peak.values()) == dev.peak_allocated
    assert max(dev.categories_at_peak, key=dev.categories_at_peak.get) == "activation"
    assert dev.timeline_allocated[-1] == 332_060_904


def test_analysis_never_imports_torch(tmp_path):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot()))
    code = (
        "import sys\n"
        "from stepscope.cli import main\n"
        f"assert main(['memory', {str(path)!r}, '--json', '--html', {str(tmp_path / 'r.html')!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
