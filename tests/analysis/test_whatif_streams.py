"""The replay of a graph without coupled collectives whose streams wait on no other stream is computed per stream
and stretch between synchronizations as a running maximum (whatif/replay.py, _by_stream): the same starts, ends,
synchronizations and steps as the activity-by-activity loop, with and without scaled (and removed) activities and
synchronizations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.per_rank.prepare import prepare_rank
from stepscope.analysis.read.loader import load_trace
from stepscope.analysis.whatif import build_graph
from stepscope.analysis.whatif import replay as replay_module
from stepscope.analysis.whatif.graph import RankGraph
from stepscope.analysis.whatif.replay import Replay, Scaling, replay

FIELDS = ("gpu_start", "gpu_end", "sync_start", "sync_end", "step_start", "step_end")


def _both(graph: RankGraph, scaling: Scaling, monkeypatch: pytest.MonkeyPatch) -> tuple[Replay, Replay]:
    fast = replay(graph, scaling)
    with monkeypatch.context() as m:
        m.setattr(replay_module, "_by_stream", lambda *args: None)
        loop = replay(graph, scaling)
    return fast, loop


def _graph(gpu_streams: list[int], seed: int, n_syncs: int = 0) -> RankGraph:
    """A graph of activities on `gpu_streams`, launched in order, with random gaps, latencies and durations, and
    `n_syncs` synchronizations among the launches (device-wide or awaiting a stream's last activity)."""
    from stepscope.analysis.whatif.graph import GpuNodes, SyncNodes, previous_on_stream

    rng = np.random.default_rng(seed)
    n = len(gpu_streams)
    stream = np.array(gpu_streams, dtype=np.int64)
    launch = np.cumsum(rng.integers(0, 2_000, n)).astype(np.int64) + 1_700_000_000_000_000_000
    dur = rng.integers(0, 5_000, n).astype(np.int64)
    z = np.zeros(n, dtype=np.int64)
    gpu = GpuNodes(
        name=z, kind=z, stream=stream, launch=launch, start=launch, dur=dur,
        prev=previous_on_stream(stream), gap=rng.integers(0, 300, n).astype(np.int64),
        latency=rng.integers(0, 4_000, n).astype(np.int64), follows_stream=z.astype(bool), row=z,
        after=np.full(n, -1, dtype=np.int64), after_gap=z, follows_after=z.astype(bool), graph=z - 1,
    )  # fmt: skip
    sync_start = np.sort(rng.choice(launch[:-1] + 1, n_syncs, replace=False))
    sync_end = sync_start + rng.integers(0, 20_000, n_syncs)
    launched = np.searchsorted(launch, sync_start, side="right")
    sync_stream = rng.choice([-1, *sorted(set(gpu_streams))], n_syncs)
    awaits = np.array(
        [
            max((i for i in range(k) if s < 0 or stream[i] == s), default=-1)
            for k, s in zip(launched.tolist(), sync_stream.tolist(), strict=True)
        ],
        dtype=np.int64,
    )
    own = rng.integers(0, 500, n_syncs).astype(np.int64)
    syncs = SyncNodes(sync_start, sync_end, sync_stream, awaits, launched, own, rng.random(n_syncs) < 0.3)
    lo, hi = int(launch[0]), int(launch[-1]) + 100_000
    edges = np.linspace(lo, hi, 4).astype(np.int64)
    return RankGraph(0, [""], lo, hi, np.arange(3), edges[:-1], edges[1:], gpu, syncs, {}, None)


@pytest.mark.parametrize(("seed", "n_syncs"), [(0, 0), (1, 0), (2, 3), (3, 12), (4, 20)])
def test_by_stream_replay_is_the_loops(seed: int, n_syncs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(100 + seed)
    graph = _graph(rng.integers(0, 3, 1200).tolist(), seed, n_syncs)
    factors = rng.choice([0.0, 0.1, 0.5, 1.0, 1.5, 3.0], size=len(graph.gpu))
    clock = replay_module._HostClock(graph, Scaling())
    assert replay_module._by_stream(graph, clock, Scaling()) is not None
    for scaling in (Scaling(), Scaling(gpu=factors), Scaling(gpu=factors, sync=0.5), Scaling(sync=0.0)):
        fast, loop = _both(graph, scaling, monkeypatch)
        for field in FIELDS:
            assert np.array_equal(getattr(fast, field), getattr(loop, field)), field


def test_a_graph_whose_prev_is_not_its_streams_order_takes_the_loop() -> None:
    graph = _graph([0, 1, 0, 1, 0], 7)
    graph.gpu.prev = np.array([-1, -1, -1, 1, 2], dtype=np.int64)  # (activity 2 does not follow activity 0)
    assert replay_module._by_stream(graph, replay_module._HostClock(graph, Scaling()), Scaling()) is None


@pytest.mark.shared
def test_by_stream_on_a_shared_trace(shared_traces: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN hta_ns_resolution_trace: 4,876 kernels on one stream, no synchronization
    table = load_trace(next((shared_traces / "hta_ns_resolution_trace").glob("*.gz")))
    graph = build_graph(prepare_rank(table, table.rank_ids()[0], drop_last_step=True))
    clock = replay_module._HostClock(graph, Scaling())
    assert replay_module._by_stream(graph, clock, Scaling()) is not None
    factors = np.random.default_rng(1).choice([0.0, 0.5, 2.0], size=len(graph.gpu))
    # WHEN replayed per stream and by the loop THEN they agree
    for scaling in (Scaling(), Scaling(gpu=factors)):
        fast, loop = _both(graph, scaling, monkeypatch)
        for field in FIELDS:
            assert np.array_equal(getattr(fast, field), getattr(loop, field)), field
