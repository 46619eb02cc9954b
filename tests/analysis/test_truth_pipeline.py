"""The pipeline view recovers the bubble put into generated GPipe jobs (issue 42: each stage's bubble within 5
points of the injected one), with peers recorded, inferred from a group of two, or from capture's record of the
stages where the trace names no peer."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.analyze import analyze
from stepscope.analysis.read.loader import load_trace

from ..support.truth_pipeline import Pipe, write_pipe


def random_pipe(seed: int, stages: int | None = None) -> Pipe:
    rng = random.Random(seed)
    p = stages or rng.randint(2, 5)
    return Pipe(
        forward_us=[rng.uniform(60, 400) for _ in range(p)],
        backward_us=[rng.uniform(100, 800) for _ in range(p)],
        micro_batches=rng.randint(2, 8),
        transfer_us=rng.uniform(5, 50),
    )


def pipeline_of(folder: Path, known_groups: Any = None) -> Any:
    return analyze(load_trace(folder), known_groups=known_groups).pipeline


@pytest.mark.parametrize("seed", range(12))
def test_every_stage_bubble_is_the_injected_one(seed: int, tmp_path: Path) -> None:
    # GIVEN a generated GPipe job, stages of random speeds, its ops naming their peers
    pipe = write_pipe(random_pipe(seed), tmp_path)
    pipeline = pipeline_of(tmp_path)
    # THEN the stages are the ranks in order, with the injected micro-batches, and each one's bubble is within
    # 5 points of the share of the step it spends outside compute
    assert pipeline is not None
    assert [(s.rank, s.stage) for s in pipeline.stages] == [(r, r) for r in range(pipe.stages)]
    assert pipeline.num_stages == pipe.stages and pipeline.micro_batches == pipe.micro_batches
    for s in pipeline.stages:
        assert s.bubble == pytest.approx(pipe.bubble(s.rank), abs=0.05), (s, pipe.bubble(s.rank))
        assert s.bubble_ms == pytest.approx(pipe.bubble(s.rank) * pipe.step_us / 1e3, rel=0.05, abs=0.002)


@pytest.mark.parametrize("seed", range(4))
def test_two_stages_without_peers_take_the_other_member(seed: int, tmp_path: Path) -> None:
    # GIVEN a 2-stage job recorded without shapes: no op names its peer
    pipe = write_pipe(random_pipe(seed, stages=2), tmp_path, peers=False)
    pipeline = pipeline_of(tmp_path)
    # THEN the group of two names the peer, and the bubbles are the injected ones
    assert pipeline is not None and [(s.rank, s.prev, s.next) for s in pipeline.stages] == [
        (0, None, 1),
        (1, 0, None),
    ]
    for s in pipeline.stages:
        assert s.bubble == pytest.approx(pipe.bubble(s.rank), abs=0.05)


def test_four_stages_without_peers_need_capture_record(tmp_path: Path) -> None:
    # GIVEN a 4-stage job recorded without shapes: a peer could be any of 3 ranks
    pipe = write_pipe(random_pipe(7, stages=4), tmp_path, peers=False)
    result = analyze(load_trace(tmp_path))
    # THEN from the traces alone there is no pipeline, and the notices say why
    assert result.pipeline is None
    assert any("name no peer" in n for n in result.notices)
    # WITH capture's record of the stages (what a run folder's process_groups hold), every stage and its bubble
    known = {
        "0": {"description": "default_pg", "ranks": [0, 1, 2, 3], "pipeline": {"stage_ranks": [0, 1, 2, 3]}}
    }
    pipeline = pipeline_of(tmp_path, known)
    assert pipeline is not None and pipeline.num_stages == 4
    assert [(s.rank, s.stage, s.prev, s.next) for s in pipeline.stages] == [
        (0, 0, None, 1), (1, 1, 0, 2), (2, 2, 1, 3), (3, 3, 2, None)
    ]  # fmt: skip
    for s in pipeline.stages:
        assert s.bubble == pytest.approx(pipe.bubble(s.rank), abs=0.05)
