"""The replay against steps with a known critical path (issue 43, items 2 and 5): with every stream wait's record
the prediction is the truth within 1%; without them (older Kineto) the waits are inferred from timing and the
prediction stays within 5%, and the path's largest kind is the true one."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from stepscope.analysis.read.loader import load_trace
from stepscope.analysis.whatif import parse_selector, whatif

from ._truth_streams import Streams, write_streams


def random_job(seed: int) -> Streams:
    rng = random.Random(seed)
    rounds = rng.randint(2, 6)
    comm_heavy = rng.random() < 0.5
    return Streams(
        compute_us=[rng.uniform(50, 400) * (0.3 if comm_heavy else 1.0) for _ in range(rounds)],
        comm_us=[rng.uniform(50, 400) * (1.0 if comm_heavy else 0.3) for _ in range(rounds)],
    )


@pytest.mark.parametrize("records", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_the_prediction_is_the_simulated_step(seed: int, records: bool, tmp_path: Path) -> None:
    job = write_streams(random_job(seed), tmp_path / "t.json", records=records)
    table = load_trace(tmp_path / "t.json")
    result = whatif(table, [parse_selector("kernel:ncclDevKernel=0.5")])
    # THEN the replay gives back the measured step, and halving the communication kernels gives the simulated step
    assert result.replay_error_pct == pytest.approx(0.0, abs=0.01)
    truth = job.step_us(comm_scale=0.5) / 1e3
    assert result.predicted_step_ms == pytest.approx(truth, rel=0.01 if records else 0.05)
    # AND the path's largest kind is the one the job spends most on
    (rank,) = result.ranks
    path = rank.critical_path[0]
    largest = max(path.by_kind_ms, key=lambda k: path.by_kind_ms[k])
    half = {"computation": sum(job.compute_us), "communication": 0.5 * sum(job.comm_us)}
    assert largest == max(half, key=lambda k: half[k])
    if not records:
        assert any("inferred" in n for n in result.notes)
