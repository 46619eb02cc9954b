"""`stepscope diff` on real reruns (issue 33, item 10): runs of one script with one config pass every gate, pair
after pair; a real slowdown breaches; the output says which steps were compared."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stepscope.cli import main

from ..support.jobs.reruns import SCHEDULE, STEPS

# every test reads the run folders of one module fixture: several training jobs
pytestmark = pytest.mark.slow

JOB = Path(__file__).parents[1] / "support" / "jobs" / "reruns.py"
RUNS = 4  # 12 ordered pairs
RERUN_SETS = 3  # sets of reruns trained before a breach is believed
SLEEP_MS = 10.0  # the slowdown: 10 ms of sleep at the end of each step of a ~0.5 ms step (the 6-step window
# of a loaded machine can hold a few ms of preemption, which must not reach the other gate's 95% low end)
# a gate on every metric, at the thresholds the docs use
GATES = [
    "step_time>+5%",
    "data_loader>+2ms",
    "forward>+5%",
    "backward>+5%",
    "optimizer>+5%",
    "communication>+5%",
    "gpu_idle>+10%",
    "other>+5%",
    "new_high>0",
]
# the steps the profiler left alone: after step 0, outside warmup and active
WINDOW = range(SCHEDULE["wait"], SCHEDULE["wait"] + SCHEDULE["warmup"] + SCHEDULE["active"])
PLAIN = [s for s in range(1, STEPS) if s not in WINDOW]


def _train(out: Path) -> tuple[list[Path], Path]:
    """RUNS run folders of the job, and one of the job slowed by SLEEP_MS per step, under `out`."""
    subprocess.run(
        [sys.executable, str(JOB), str(out), str(RUNS), str(SLEEP_MS)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    runs = [next((out / f"run{i}").iterdir()) for i in range(RUNS)]
    return runs, next((out / "slow").iterdir())


@pytest.fixture(scope="module")
def reruns(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path]:
    """RUNS run folders of the job trained at the same time, and one of the job slowed by SLEEP_MS per step."""
    return _train(tmp_path_factory.mktemp("reruns"))


def plain_of(run: Path) -> list[int]:
    """The plain steps diff compares in `run`: PLAIN less those that ran beside a window's end work (the trace's
    beside_steps), where 8 remain (diff's minimum), else PLAIN."""
    manifest = json.loads((run / "manifest.json").read_text())
    busy = {
        s
        for a in manifest["artifacts"]
        if a["kind"] == "trace"
        for first, last in a.get("beside_steps") or ()
        for s in range(first, last + 1)
    }
    kept = [s for s in PLAIN if s not in busy]
    return kept if len(kept) >= 8 else PLAIN


def step_ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7, 8] -> '1-3, 7-8'."""
    out = []
    for _, group in itertools.groupby(enumerate(steps), lambda pair: pair[1] - pair[0]):
        run = [s for _, s in group]
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}")
    return ", ".join(out)


def gate_flags() -> list[str]:
    return [flag for gate in GATES for flag in ("--fail-on", gate)]


def _breaches(runs: list[Path], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Every ordered pair of `runs` through every gate: what each pair that breached printed."""
    pairs = list(itertools.permutations(runs, 2))
    assert len(pairs) >= 10
    breached = []
    for base, test in pairs:
        code = main(["diff", str(base), str(test), *gate_flags()])
        out, err = capsys.readouterr()
        if code != 0 or "breached" in err:
            breached.append(f"{base.parent.name} -> {test.parent.name} (exit {code}):\n{err}\n{out}")
        # the output says which steps were compared, and how many
        text = re.sub(r"\s+", " ", out)
        for run in (base, test):
            steps = plain_of(run)
            assert f"{len(steps)} plain steps: {step_ranges(steps)} (rank 0)" in text, text
    return breached


def test_reruns_of_one_script_pass_every_gate_pair_after_pair(
    reruns: tuple[list[Path], Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    runs, _ = reruns
    sets = [_breaches(runs, capsys)]
    # On 2 shared cores one of the runs trained together can still get less CPU than the others for the whole
    # job (its plain steps measurably slower too: about one set in 15 on a quiet machine; on 2026-11-30 the
    # full suite, after the multi-rank jobs, saw sets whose runs' medians were 20-35% apart in 3 of 4 runs, the
    # module alone in none of 3). A gate that calls reruns a regression does so again on every set of reruns;
    # the machine's bad moments do not.
    while sets[-1] and len(sets) < RERUN_SETS:
        sets.append(_breaches(_train(tmp_path / f"set{len(sets)}")[0], capsys))
    assert not sets[-1], "\n".join(f"set {i + 1}:\n" + "\n".join(b) for i, b in enumerate(sets))


def _slowdown_diff(base: Path, slow: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    gates = ["--fail-on", "step_time>+5%", "--fail-on", "other>+2ms"]
    assert main(["diff", str(base), str(slow), *gates, "--json"]) == 3
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_a_real_slowdown_breaches_the_step_time_gate(
    reruns: tuple[list[Path], Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    runs, slow = reruns
    # WHEN the slowed run is the test
    doc = _slowdown_diff(runs[0], slow, capsys)
    if not doc["gates"][1]["breached"]:
        # the other gate judges the 6-step window alone: a few ms of preemption in one of its steps on a loaded
        # machine (CI saw +10.4 ms, 95%: -5.09 to +10.7) can leave it undecided; a real slowdown shows again
        runs, slow = _train(tmp_path)
        doc = _slowdown_diff(runs[0], slow, capsys)
    # THEN the step time over the plain steps grew significantly, by about the sleep
    st = doc["step_time"]
    assert (st["base"]["steps"], st["test"]["steps"]) == (plain_of(runs[0]), plain_of(slow))
    assert st["significant"] and st["low_ms"] > 0 and st["delta_ms"] > 0.5 * SLEEP_MS
    step_gate, other_gate = doc["gates"]
    assert step_gate["breached"] and step_gate["low_ms"] > 0.05 * step_gate["base"]
    # the sleep is outside the annotated phases: "other" in the profiled window, confirmed by the plain steps
    assert other_gate["breached"] and other_gate["low_ms"] > 2.0, other_gate["reason"]
    # in words on stderr, exit status 3
    assert (
        main(["diff", str(runs[0]), str(slow), "--fail-on", "step_time>+5%", "--fail-on", "new_high>0"]) == 3
    )
    err = capsys.readouterr().err
    assert re.search(
        r"--fail-on step_time>\+5% breached: step time \+\d+\.\d% \(95%: \+[\d.]+% to \+[\d.]+%\): beyond \+5%",
        err,
    )
    # and the other way round it is a speed-up, not a breach
    assert main(["diff", str(slow), str(runs[0]), "--fail-on", "step_time>+5%"]) == 0
    assert "breached" not in capsys.readouterr().err
