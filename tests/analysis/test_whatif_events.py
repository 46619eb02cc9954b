"""The what-if graph's cross-stream edges (#29): CUDA events and stream waits, event synchronizes, CUDA graphs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.per_rank.prepare import prepare_rank
from stepscope.analysis.read.loader import load_trace
from stepscope.analysis.whatif import build_graph, parse_selector, whatif
from stepscope.analysis.whatif.replay import Scaling, replay

from ..support.traces import SHARED_TRACES, cpu, kernel, launched, runtime, step, write_trace


def _sync_event(name: str, ts: float, dur: float, *, corr: int, stream: int, on: int, record: int) -> dict:
    """A `cuda_sync` event as newer Kineto writes it beside a wait (on the waiting stream's thread)."""
    return kernel(
        name,
        ts,
        dur,
        stream=stream,
        corr=corr,
        cat="cuda_sync",
        cuda_sync_kind=name,
        wait_on_stream=on,
        wait_on_cuda_event_record_corr_id=record,
    )


def _two_streams(tmp_path: Path, *, named: bool = True, consumer_at: float = 525) -> Path:
    """One step (1000 us): `producer` (500 us) on stream 7; an event recorded after it; stream 20 waits for it,
    so `consumer` (200 us) starts 5 us after the producer ends; a device synchronize; 250 us of optimizer.
    `named`: with the cuda_sync event that names the event (newer Kineto), else the runtime calls only;
    `consumer_at`: when the consumer starts (525: 5 us after the producer ends)."""
    events = [
        step(1, 0, 1000),
        *launched("producer", 10, 20, 500, corr=1),
        runtime("cudaEventRecord", 12, 1, corr=2),
        runtime("cudaStreamWaitEvent", 14, 1, corr=3),
        *launched("consumer", 16, consumer_at, 200, corr=4, stream=20),
        runtime("cudaDeviceSynchronize", 30, 700, corr=5),
        cpu("optimizer", 740, 250, cat="user_annotation"),
    ]
    if named:
        events.append(_sync_event("Stream Wait Event", 14, 1, corr=3, stream=20, on=7, record=2))
    return write_trace(tmp_path / "streams.json", events)


def _predicted(path: Path, *scale: str) -> float:
    result = whatif(load_trace(path), [parse_selector(s) for s in scale])
    assert result.replay_error_pct == pytest.approx(0.0, abs=0.01)
    assert result.predicted_step_ms is not None
    return result.predicted_step_ms


def _graph(path: Path):  # type: ignore[no-untyped-def]
    return build_graph(prepare_rank(load_trace(path), 0))


def test_speeding_up_the_producer_stream_moves_the_consumer(tmp_path: Path) -> None:
    path = _two_streams(tmp_path)
    assert _predicted(path) == pytest.approx(1.0)
    # the consumer waited for the producer's event: it starts 250 us earlier, and so does everything after it
    assert _predicted(path, "kernel:producer=0.5") == pytest.approx(0.75)
    # without the consumer the synchronize waits for the producer (+5 us of its own): it returns at 525 us, 205
    # us earlier (removed work is not waited for: nor is the consumer's 5 us wait for the event)
    assert _predicted(path, "kernel:consumer=0") == pytest.approx(0.795)
    graph = _graph(path)
    assert graph.notes == []
    (consumer,) = np.flatnonzero(graph.gpu.stream == graph.gpu.stream.max())
    assert graph.gpu.follows_after[consumer]
    assert graph.names[graph.gpu.name[graph.gpu.after[consumer]]] == "producer"


def test_the_critical_path_runs_through_the_event(tmp_path: Path) -> None:
    (path,) = whatif(load_trace(_two_streams(tmp_path))).ranks[0].critical_path
    assert [name for name, _ in path.top] == ["producer", "consumer"]
    assert path.by_kind_ms["computation"] == pytest.approx(0.7)
    assert path.by_kind_ms["gap"] == pytest.approx(0.005)  # the consumer's start after the event
    assert path.by_kind_ms["launch"] == pytest.approx(0.01)  # the producer's
    assert sum(path.by_kind_ms.values()) == pytest.approx(path.step_ms, abs=0.002)


def test_a_wait_the_trace_does_not_name_is_inferred_from_timing(tmp_path: Path) -> None:
    # GIVEN the wait as older Kineto writes it (the runtime calls only): the consumer started 5 us after the
    # producer ended on another stream, long after its launch, its stream idle
    path = _two_streams(tmp_path, named=False)
    # THEN the edge is inferred, marked so, and the prediction is the named trace's
    assert _predicted(path, "kernel:producer=0.5") == pytest.approx(0.75)
    graph = _graph(path)
    (consumer,) = np.flatnonzero(graph.gpu.after >= 0)
    assert graph.names[graph.gpu.name[graph.gpu.after[consumer]]] == "producer"
    (note,) = graph.notes
    assert note.startswith("1 of 1 stream waits (cudaStreamWaitEvent) name no event") and "(inferred)" in note


def test_a_wait_whose_timing_names_nothing_keeps_its_measured_delay_and_says_so(tmp_path: Path) -> None:
    # GIVEN the unnamed wait, the consumer starting 10 us after the producer ended: nothing on another stream
    # ended within 5 us before it
    path = _two_streams(tmp_path, named=False, consumer_at=530)
    assert _predicted(path, "kernel:producer=0.5") == pytest.approx(1.0)
    graph = _graph(path)
    assert (graph.gpu.after == -1).all()
    (note,) = graph.notes
    assert note.startswith("1 of 1 stream waits (cudaStreamWaitEvent) have no cuda_sync event")
    assert "their timing names none" in note


def _event_sync(tmp_path: Path) -> Path:
    """A (760 us) on stream 7 and B (670 us) on stream 20; the host synchronizes on an event recorded after B,
    and returns at 800 us (after A ended too); then 180 us of optimizer."""
    events = [
        step(1, 0, 1000),
        *launched("A", 10, 20, 760, corr=1),
        *launched("B", 12, 30, 670, corr=2, stream=20),
        runtime("cudaEventRecord", 14, 1, corr=3),
        runtime("cudaEventSynchronize", 100, 700, corr=4),
        _sync_event("Event Sync", 100, 700, corr=4, stream=-1, on=20, record=3),
        cpu("optimizer", 810, 180, cat="user_annotation"),
    ]
    return write_trace(tmp_path / "event_sync.json", events)


def test_an_event_synchronize_awaits_its_event_exactly(tmp_path: Path) -> None:
    path = _event_sync(tmp_path)
    # A ended last before the call returned, but the call awaited B's event: A does not bound the step
    assert _predicted(path, "kernel:A=0.5") == pytest.approx(1.0)
    assert _predicted(path, "kernel:B=0.5") == pytest.approx(0.665)
    (step_path,) = whatif(load_trace(path)).ranks[0].critical_path
    assert [name for name, _ in step_path.top] == ["B"]


@pytest.mark.parametrize("launch", ["cudaGraphLaunch", "hipGraphLaunch"])
def test_a_cuda_graph_replays_as_a_unit_from_its_launch(tmp_path: Path, launch: str) -> None:
    """One graph launch in `forward`: g1 then g2 on stream 7, g3 on stream 20 after g1 (all share the launch's
    correlation id, as Kineto writes them); a device synchronize; the optimizer."""
    events = [
        step(1, 0, 1000),
        cpu("forward", 0, 100, cat="user_annotation"),
        runtime(launch, 10, 5, corr=5),
        kernel("g1", 30, 100, corr=5),
        kernel("g2", 135, 100, corr=5),
        kernel("g3", 140, 200, stream=20, corr=5),
        runtime("cudaDeviceSynchronize", 110, 240, corr=6),
        cpu("optimizer", 360, 600, cat="user_annotation"),
    ]
    path = write_trace(tmp_path / "graph.json", events)
    assert _predicted(path) == pytest.approx(1.0)
    # g3 followed g1 inside the graph: halving g1 moves g3, which ends last
    assert _predicted(path, "kernel:g1=0.5") == pytest.approx(0.95)
    assert _predicted(path, "kernel:g3=0.5") == pytest.approx(0.9)
    (step_path,) = whatif(load_trace(path)).ranks[0].critical_path
    assert [name for name, _ in step_path.top] == ["CUDA graph (forward) > g3", "CUDA graph (forward) > g1"]
    assert step_path.by_kind_ms["computation"] == pytest.approx(0.3)
    assert step_path.by_kind_ms["gap"] == pytest.approx(0.01)  # g3 after g1
    assert step_path.by_kind_ms["launch"] == pytest.approx(0.02)  # g1 after the graph's launch


@pytest.mark.shared
def test_the_hta_event_traces_name_what_each_wait_awaits() -> None:
    """The real A100 traces of HTA's critical-path tests: an event synchronize on a spin kernel; a stream that
    waits for another stream's event."""
    folder = SHARED_TRACES / "hta_critical_path"
    if not folder.is_dir():
        pytest.skip("../shared/traces is absent")
    table = load_trace(folder / "cuda_event_sync" / "event_sync_trace.json.gz")
    graph = build_graph(prepare_rank(table, 0))
    gpu, syncs = graph.gpu, graph.syncs
    spin = int(np.flatnonzero([graph.names[c].startswith("at::cuda::") for c in gpu.name.tolist()])[0])
    copy = int(np.flatnonzero([graph.names[c].startswith("Memcpy DtoH") for c in gpu.name.tolist()])[0])
    # the blocking copy and the cudaStreamSynchronize after it (its cuda_sync event names stream 7) await the
    # copy; cudaEventSynchronize the spin kernel (the event recorded after it); cudaDeviceSynchronize everything
    assert syncs.awaits.tolist() == [copy, copy, spin, spin]
    base = replay(graph)
    factor = np.where(np.arange(len(gpu)) == spin, 0.5, 1.0)
    half = replay(graph, Scaling(gpu=factor))
    saved = int(base.sync_end[2] - half.sync_end[2])
    assert saved == pytest.approx(int(gpu.dur[spin]) // 2, abs=1000)  # ns

    table = load_trace(folder / "cuda_event_sync_multi_stream" / "event_sync_trace.json.gz")
    graph = build_graph(prepare_rank(table, 0))
    gpu = graph.gpu
    (consumer,) = np.flatnonzero(gpu.after >= 0)
    producer = int(gpu.after[consumer])
    assert gpu.stream[producer] != gpu.stream[consumer]
    assert not gpu.follows_after[consumer]  # its producer had ended long before it was launched
    # make the producer 200x longer: the consumer now starts after it
    factor = np.where(np.arange(len(gpu)) == producer, 200.0, 1.0)
    slow = replay(graph, Scaling(gpu=factor))
    assert slow.gpu_start[consumer] >= slow.gpu_end[producer]
    # (the replay's host clock is float64 at epoch ns: within a few hundred ns)
    assert replay(graph).gpu_start[consumer] == pytest.approx(gpu.start[consumer], abs=1000)


def test_the_path_tells_apart_host_time_in_torch_compile_regions(tmp_path: Path) -> None:
    """A real torch.compile job (tests/support/jobs/compiled.py, aot_eager, ~4 s): on a CPU step the path is all host time;
    the part inside `Torch-Compiled Region` / `CompiledFunction*` ranges is their union within the step."""
    out = tmp_path / "compiled.json"
    subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "support" / "jobs" / "compiled.py"), str(out)],
        check=True,
        timeout=120,
    )
    events = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "X"]
    compiled = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e["name"].startswith(("Torch-Compiled Region", "CompiledFunction"))
    )
    steps = {
        int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e["name"].startswith("ProfilerStep#")
    }
    paths = whatif(load_trace(out)).ranks[0].critical_path
    assert len(paths) == 2
    for p in paths:
        lo, hi = steps[p.step]
        union, reach = 0.0, lo
        for s, e in compiled:  # the union of the ranges, clipped to the step (us)
            s, e = max(s, reach), min(e, hi)
            if e > s:
                union += e - s
                reach = e
        assert union > 0
        assert p.host_compiled_ms == pytest.approx(union / 1e3, abs=0.002)
        assert p.host_compiled_ms < p.by_kind_ms["host"]
