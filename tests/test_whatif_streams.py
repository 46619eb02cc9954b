"""The replay of a graph whose streams nothing ties (no synchronization, no coupled collective, no cross-stream
wait) is computed per stream as a running maximum (whatif/replay.py, _streams_alone): the same starts, ends and
steps as the activity-by-activity loop, with and without scaled (and removed) activities."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.rank.prepare import prepare_rank
from stepscope.analysis.read.loader import load_trace
from stepscope.analysis.whatif import build_graph
from stepscope.analysis.whatif import replay as replay_module
from stepscope.analysis.whatif.graph import RankGraph
from stepscope.analysis.whatif.replay import Replay, Scaling, replay

FIELDS = ("gpu_start", "gpu_end", "sync_start", "sync_end", "step_start", "step_end")


def _both(graph: RankGraph, scaling: Scaling, monkeypatch: pytest.MonkeyPatch) -> tuple[Replay, Replay]:
    fast = replay(graph, scaling)
    with monkeypatch.context() as m:
        m.setattr(replay_module, "_streams_alone", lambda *args: None)
        loop = replay(graph, scaling)
    return fast, loop


def _graph(gpu_streams: list[int], seed: int) -> RankGraph:
    """A graph of activities on `gpu_streams`, launched in order, with random gaps, latencies and durations."""
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
    e = np.zeros(0, dtype=np.int64)
    syncs = SyncNodes(e, e, e, e, e, e, e.astype(bool))
    lo, hi = int(launch[0]), int(launch[-1]) + 100_000
    edges = np.linspace(lo, hi, 4).astype(np.int64)
    return RankGraph(0, [""], lo, hi, np.arange(3), edges[:-1], edges[1:], gpu, syncs, {}, None)


@pytest.mark.parametrize("seed", range(4))
def test_streams_alone_replay_is_the_loops(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(100 + seed)
    graph = _graph(rng.integers(0, 4, 300).tolist(), seed)
    factors = rng.choice([0.0, 0.1, 0.5, 1.0, 1.5, 3.0], size=len(graph.gpu))
    assert (
        replay_module._streams_alone(graph, replay_module._HostClock(graph, Scaling()), Scaling()) is not None
    )
    for scaling in (Scaling(), Scaling(gpu=factors)):
        fast, loop = _both(graph, scaling, monkeypatch)
        for field in FIELDS:
            assert np.array_equal(getattr(fast, field), getattr(loop, field)), field


def test_a_graph_whose_prev_is_not_its_streams_order_takes_the_loop() -> None:
    graph = _graph([0, 1, 0, 1, 0], 7)
    graph.gpu.prev = np.array([-1, -1, -1, 1, 2], dtype=np.int64)  # (activity 2 does not follow activity 0)
    assert replay_module._streams_alone(graph, replay_module._HostClock(graph, Scaling()), Scaling()) is None


@pytest.mark.shared
def test_streams_alone_on_a_shared_trace(shared_traces: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN hta_ns_resolution_trace: 4,876 kernels on one stream, no synchronization
    table = load_trace(next((shared_traces / "hta_ns_resolution_trace").glob("*.gz")))
    graph = build_graph(prepare_rank(table, table.rank_ids()[0], drop_last_step=True))
    clock = replay_module._HostClock(graph, Scaling())
    assert replay_module._streams_alone(graph, clock, Scaling()) is not None
    factors = np.random.default_rng(1).choice([0.0, 0.5, 2.0], size=len(graph.gpu))
    # WHEN replayed per stream and by the loop THEN they agree
    for scaling in (Scaling(), Scaling(gpu=factors)):
        fast, loop = _both(graph, scaling, monkeypatch)
        for field in FIELDS:
            assert np.array_equal(getattr(fast, field), getattr(loop, field)), field
