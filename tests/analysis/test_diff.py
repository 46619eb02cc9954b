"""`stepscope diff`: totals, deltas ranked by change, flagged slowdowns, appeared/disappeared names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from stepscope.analysis.diff.compare import DIFF_SCHEMA, diff_tables
from stepscope.analysis.read.loader import load_trace
from stepscope.cli import main

from ..support.traces import SHARED_TRACES, cpu, kernel, step, trace, write

NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
BASE = [
    step(1, 0, 1000),
    step(2, 1000, 1000),
    cpu("aten::mm", 100, 200),
    kernel(NCCL, 10, 10, stream=20),
    kernel(NCCL, 30, 10, stream=20),
    kernel("gemm", 100, 100),
    kernel("gemm", 300, 100),
    kernel("gemm", 500, 100),
    kernel("old_kernel", 700, 50),
]
TEST = [
    step(1, 0, 1500),
    step(2, 1500, 1500),
    cpu("aten::mm", 100, 200),
    cpu("aten::foo", 400, 100),
    kernel(NCCL, 10, 5000, stream=20),  # the same NCCL kernel, 500x slower
    kernel(NCCL, 6000, 5000, stream=20),
    kernel("gemm", 100, 110),
    kernel("gemm", 300, 110),
    kernel("gemm", 500, 110),
    kernel("new_kernel", 12000, 20),
    kernel("new_kernel", 12100, 20),
]


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    return write(tmp_path / "base.json.gz", trace(BASE)), write(tmp_path / "test.json", trace(TEST))


def test_totals_of_both_sides(runs: tuple[Path, Path]) -> None:
    d = diff_tables(load_trace(runs[0]), load_trace(runs[1]))
    b, t = d.base, d.test
    assert (b.steps, b.step_mean_us, t.steps, t.step_mean_us) == (2, 1000.0, 2, 1500.0)
    # traces, not run folders: the step time over their profiled steps, 2 and 2: too few for a 95% interval
    st = d.step_time
    assert (st.base.source, st.base.steps, st.base.median_ms, st.test.median_ms) == (
        "profiled",
        [1, 2],
        1.0,
        1.5,
    )
    assert (st.delta_ms, st.change_pct, st.low_ms, st.high_ms, st.significant) == (
        0.5,
        50.0,
        None,
        None,
        False,
    )
    assert st.note is not None and "too few to bound the change" in st.note
    assert (b.gpu_busy_us, b.gpu_span_us, b.gpu_busy_pct, b.kernel_total_us) == (370.0, 740.0, 50.0, 370.0)
    assert (t.gpu_busy_us, t.gpu_span_us, t.gpu_busy_pct, t.kernel_total_us) == (
        10040.0,
        12110.0,
        82.91,
        10370.0,
    )
    assert (b.cpu_self_us, t.cpu_self_us) == (2000.0, 3000.0)
    assert d.notices == [] and d.schema == DIFF_SCHEMA


def test_kernel_deltas_ranked_and_flagged(runs: tuple[Path, Path]) -> None:
    d = diff_tables(load_trace(runs[0]), load_trace(runs[1]))
    rows = [
        (
            k.name,
            k.status,
            k.base_count,
            k.test_count,
            k.delta_count,
            k.base_total_us,
            k.test_total_us,
            k.delta_total_us,
            k.base_mean_us,
            k.test_mean_us,
            k.mean_ratio,
            k.flagged,
        )
        for k in d.kernels
    ]
    assert rows == [
        (NCCL, "changed", 2, 2, 0, 20.0, 10000.0, 9980.0, 10.0, 5000.0, 500.0, True),
        ("old_kernel", "removed", 1, 0, -1, 50.0, 0.0, -50.0, 50.0, None, None, False),
        ("new_kernel", "added", 0, 2, 2, 0.0, 40.0, 40.0, None, 20.0, None, False),
        ("gemm", "changed", 3, 3, 0, 300.0, 330.0, 30.0, 100.0, 110.0, 1.1, False),
    ]


def test_op_deltas_use_self_time_and_skip_unchanged(runs: tuple[Path, Path]) -> None:
    d = diff_tables(load_trace(runs[0]), load_trace(runs[1]))
    assert [(o.name, o.status, o.base_total_us, o.test_total_us, o.mean_ratio) for o in d.ops] == [
        ("ProfilerStep#*", "changed", 1800.0, 2700.0, 1.5),
        ("aten::foo", "added", 0.0, 100.0, None),
    ]


def test_factor_changes_what_is_flagged(runs: tuple[Path, Path]) -> None:
    d = diff_tables(load_trace(runs[0]), load_trace(runs[1]), factor=1.05)
    # gemm's mean moved 1.1x, but by 15 us per step: under the 50 us threshold, so never flagged
    assert [k.name for k in d.kernels if k.flagged] == [NCCL]
    assert [(k.name, k.delta_per_step_us, k.above_threshold) for k in d.kernels if k.name == "gemm"] == [
        ("gemm", 15.0, False)
    ]
    assert [o.name for o in d.ops if o.flagged] == ["ProfilerStep#*"]


def test_different_step_counts_are_noted(tmp_path: Path) -> None:
    base = write(tmp_path / "b.json", trace([step(1, 0, 10)]))
    test = write(tmp_path / "t.json", trace([step(1, 0, 10), step(2, 10, 10)]))
    d = diff_tables(load_trace(base), load_trace(test))
    assert d.notices == ["the runs have 1 and 2 profiler steps: op and kernel totals are per step"]


def test_cli_text_report(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs[0]), str(runs[1])]) == 0
    out = re.sub(" +", " ", capsys.readouterr().out)
    assert "Mean duration changed 5x or more" in out
    assert "10.0 us │ 5.00 ms │ 500.00x │ +4.99 ms" in out
    assert "old_kernel" in out and "new_kernel" in out and "aten::foo" in out
    assert "step (profiled) │ 1.00 ms │ 1.50 ms │ +500 us │ +50.0% │ too few │" in out
    assert "base │ 1.00 ms │ 1.00 ms to 1.00 ms │ 1.00 ms" in out
    assert "compared: 2 profiled steps: 1-2 (rank 0) in each run" in out
    assert "new rank 0 HIGH comm_bound" in out


def test_cli_json(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs[0]), str(runs[1]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "stepscope.diff/3" and doc["factor"] == 5.0 and doc["min_change_us"] == 50.0
    assert doc["base"]["path"] == str(runs[0]) and doc["test"]["steps"] == 2
    assert doc["kernels"][0]["name"] == NCCL and doc["kernels"][0]["flagged"] is True
    assert set(doc["kernels"][0]) == {
        "name",
        "status",
        "base_count",
        "test_count",
        "delta_count",
        "base_total_us",
        "test_total_us",
        "delta_total_us",
        "base_mean_us",
        "test_mean_us",
        "mean_ratio",
        "flagged",
        "delta_per_step_us",
        "above_threshold",
    }
    assert [p["name"] for p in doc["phases"]] == ["profiled_step", "communication", "gpu_idle", "other"]
    assert doc["step_time"]["base"]["steps"] == [1, 2] and doc["step_time"]["significant"] is False
    assert doc["gates"] == []


def test_cli_rejects_factor_of_one(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs[0]), str(runs[1]), "--factor", "1"]) == 2
    assert "--factor" in capsys.readouterr().err


def test_cli_missing_test_run(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    missing = runs[0].parent / "nope"
    assert main(["diff", str(runs[0]), str(missing)]) == 2
    assert capsys.readouterr().err == f"stepscope: error: {missing}: no such file or directory\n"


@pytest.mark.shared
def test_hta_trace_compare_names_the_kernel_that_disappeared(capsys: pytest.CaptureFixture[str]) -> None:
    base, test = SHARED_TRACES / "hta_trace_compare" / "base", SHARED_TRACES / "hta_trace_compare" / "test"
    if not base.is_dir():
        pytest.skip("../shared/traces not available")
    gone = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<int>, "
        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<int>, at::detail::Array<char*, 3>)"
    )
    d = diff_tables(load_trace(base), load_trace(test))
    assert [(k.name, k.base_count, k.test_count, k.delta_total_us) for k in d.kernels] == [(gone, 3, 2, -4.0)]
    assert {o.name for o in d.ops if o.status == "added"} == {
        "All2All_Pooled_Req",
        "AddmmBackward0",
        "CatBackward0",
    }
    assert main(["diff", str(base), str(test)]) == 0
    out = capsys.readouterr().out.replace("\n", "")
    assert "Kernels launched a different number of times" in out


@pytest.fixture(scope="module")
def loader_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The loader-stall job of the findings bench and its fix (8 loader workers), as run folders."""
    from ..support.findings_cases import JOBS_SCRIPT

    out = tmp_path_factory.mktemp("loader_jobs")
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, str(JOBS_SCRIPT), str(out), "loader_stall", "loader_fixed"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    ((stall,), (fixed,)) = (list((out / j).iterdir()) for j in ("loader_stall", "loader_fixed"))
    return stall, fixed


def plain_steps(run: Path) -> list[int]:
    """Step 1 and the 12 steps after the window (11-22), less those its manifest says ran beside the window's
    end work (`beside_steps` of its trace: how many depends on the machine's load), where MIN_PLAIN_STEPS remain
    (else all of them, as diff does)."""
    from stepscope.analysis.diff.steps import MIN_PLAIN_STEPS

    manifest = json.loads((run / "manifest.json").read_text())
    beside = {
        step
        for a in manifest["artifacts"]
        if a["kind"] == "trace"
        for first, last in a.get("beside_steps") or []
        for step in range(first, last + 1)
    }
    every = [1, *range(11, 23)]
    kept = [s for s in every if s not in beside]
    return kept if len(kept) >= MIN_PLAIN_STEPS else every


def plain_median_ms(run: Path) -> float:
    """The median wall time of a run's plain steps, read from its metrics.jsonl as a user would."""
    import statistics

    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(
        m["wall_ms"] for m in lines if m["phase"] == "none" and m["step"] > 0 and "flops" not in m
    )


@pytest.mark.slow
def test_diff_of_the_loader_fix_shows_the_data_loader_per_step(
    loader_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    stall, fixed = loader_runs
    assert main(["diff", str(stall), str(fixed), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # the step time over the plain steps of each run (step 1 and the 12 after the window, less those beside the
    # window's end work), which the profiler left alone: their medians, and the change inside its interval. Whether the fix is faster depends on the
    # machine: 8 loader workers on 2 busy cores can cost the main process more than the sleeps they take over,
    # and the diff must say so rather than a fixed figure.
    st = doc["step_time"]
    assert [(s["source"], s["steps"]) for s in (st["base"], st["test"])] == [
        ("plain", plain_steps(stall)),
        ("plain", plain_steps(fixed)),
    ]
    assert st["base"]["median_ms"] == pytest.approx(plain_median_ms(stall), abs=1e-4)
    assert st["test"]["median_ms"] == pytest.approx(plain_median_ms(fixed), abs=1e-4)
    assert st["low_ms"] <= st["delta_ms"] <= st["high_ms"]
    phases = {p["name"]: p for p in doc["phases"]}
    # 64 samples x 0.25 ms of sleep per step in the main process, against 8 workers loading ahead: the medians
    # over the window's 8 steps
    loader = phases["data_loader"]
    assert (loader["base_values"], loader["test_values"]) == (8, 8)
    assert loader["base_ms"] > 15 and loader["test_ms"] < loader["base_ms"] and loader["delta_ms"] < 0
    # both iterator classes are one op, not one gone and one new
    ops = [o for o in doc["ops"] if "DataLoader" in o["name"]]
    assert [(o["name"], o["status"]) for o in ops] == [("DataLoader (any iterator)", "changed")]
    # the fix breaches no gate on the data loader
    assert main(["diff", str(stall), str(fixed), "--fail-on", "data_loader>+5ms"]) == 0
    out = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert re.search(r"data loader │ [\d.]+ ms │ [\d.]+ (us|ms) │ -[\d.]+ (us|ms) │ -[\d.]+%", out), out
    if plain_steps(stall) == plain_steps(fixed) == [1, *range(11, 23)]:
        assert "compared: 13 plain steps: 1, 11-22 (rank 0) in each run" in out
    else:  # (a loaded machine: the window's end work ran beside some of the steps after it)
        assert re.search(r"compared: \d+ plain steps", out), out


@pytest.mark.parametrize(
    "gate", ["step_time>5", "step_time>-5%", "nonsense>+5%", "new_high>+1%", "step_time", "forward<+2ms"]
)
def test_fail_on_rejects_malformed_gates(
    runs: tuple[Path, Path], gate: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diff", str(runs[0]), str(runs[1]), "--fail-on", gate]) == 2
    err = capsys.readouterr().err
    assert "--fail-on" in err and "Traceback" not in err


def loader_job_trace(path: Path, loader_ms: float, step_ms: float = 10.0, steps: int = 6) -> Path:
    """A CPU job whose every step waits `loader_ms` on the DataLoader, then runs forward (3 ms) and backward (the
    rest) in torch ops: data_loader_stall is its only priced finding (MEDIUM from 5% of the step, HIGH from 20%)."""
    events = []
    for i in range(steps):
        t0, lo, total = i * step_ms * 1000, loader_ms * 1000, step_ms * 1000
        events += [
            step(i, t0, total),
            cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0, lo),
            cpu("forward", t0 + lo, 3000, cat="user_annotation"),
            cpu("aten::mm", t0 + lo, 3000),
            cpu("backward", t0 + lo + 3000, total - lo - 3000, cat="user_annotation"),
            cpu("aten::mm", t0 + lo + 3000, total - lo - 3000),
        ]
    return write(path, trace(events))


def test_new_high_breaches_on_a_finding_that_went_from_medium_to_high(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a run whose loader stall costs 10% of the step (MEDIUM) and one where it costs 30% (HIGH)
    base = loader_job_trace(tmp_path / "base.json", loader_ms=1.0)
    test = loader_job_trace(tmp_path / "test.json", loader_ms=3.0)
    # WHEN diffed with the gate on new HIGH findings
    assert main(["diff", str(base), str(test), "--fail-on", "new_high>0"]) == 3
    captured = capsys.readouterr()
    out = re.sub(" +", " ", captured.out)
    # THEN the gate is breached, the table counts the HIGH findings of each run, and the change is listed
    assert "new_high>0 │ 0 │ 1 │ - │ BREACHED" in out
    assert "changed rank 0 data_loader_stall: MEDIUM -> HIGH, 1.00 ms -> 3.00 ms per step" in out
    assert (
        "--fail-on new_high>0 breached: 1 finding(s) became HIGH: data_loader_stall rank 0 (was MEDIUM)"
        in (captured.err)
    )
    assert main(["diff", str(base), str(test), "--fail-on", "new_high>0", "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    (change,) = doc["findings"]
    assert (change["status"], change["base_severity"], change["severity"]) == ("changed", "medium", "high")
    assert [(g["base"], g["test"], g["breached"]) for g in doc["gates"]] == [(0.0, 1.0, True)]
    # and the other way round, HIGH -> MEDIUM is a change but no new HIGH
    assert main(["diff", str(test), str(base), "--fail-on", "new_high>0"]) == 0
    assert "data_loader_stall: HIGH -> MEDIUM" in re.sub(" +", " ", capsys.readouterr().out)


def test_a_finding_made_high_by_a_shorter_step_is_not_a_new_high(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the same 1.5 ms loader stall in both runs: 15% of a 10 ms step (MEDIUM), 25% of a 6 ms step (HIGH)
    base = loader_job_trace(tmp_path / "base.json", loader_ms=1.5, step_ms=10.0)
    test = loader_job_trace(tmp_path / "test.json", loader_ms=1.5, step_ms=6.0)
    # WHEN diffed with the new_high gate
    assert main(["diff", str(base), str(test), "--fail-on", "new_high>0"]) == 0
    captured = capsys.readouterr()
    out = re.sub(r"\s+", " ", captured.out)
    # THEN the escalation is shown, with the loader's own time unchanged, and not counted by the gate
    assert (
        "changed rank 0 data_loader_stall: MEDIUM -> HIGH, 1.50 ms -> 1.50 ms per step (data loader itself: change "
        "not significant)" in out
    )
    assert "new_high>0 │ 0 │ 1 │ - │ ok" in out
    assert (
        "data_loader_stall rank 0 (was MEDIUM) with data loader became HIGH, but the phase shows no significant "
        "change: not counted" in out
    )
    assert "breached" not in captured.err


def test_compare_page_shows_whole_finding_messages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from html.parser import HTMLParser

    base = loader_job_trace(tmp_path / "base.json", loader_ms=1.0)
    test = loader_job_trace(tmp_path / "test.json", loader_ms=3.0)
    assert main(["analyze", str(test), "--json"]) == 0
    (message,) = [
        f["message"]
        for f in json.loads(capsys.readouterr().out)["findings"]
        if f["id"] == "data_loader_stall"
    ]
    assert len(message) > 200
    page = tmp_path / "compare.html"
    assert main(["report", str(base), "--compare", str(test), "-o", str(page)]) == 0

    class Cells(HTMLParser):
        """The text of each cell of the findings table."""

        def __init__(self) -> None:
            super().__init__()
            self.table: str | None = None
            self.cells: list[str] = []
            self.in_cell = False

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "table":
                self.table = dict(attrs).get("id")
            elif tag == "td" and self.table == "finding-changes":
                self.in_cell = True
                self.cells.append("")

        def handle_endtag(self, tag: str) -> None:
            self.in_cell = self.in_cell and tag != "td"

        def handle_data(self, data: str) -> None:
            if self.in_cell:
                self.cells[-1] += data

    cells = Cells()
    cells.feed(page.read_text())
    # the message is in its cell whole, as analyze wrote it, and the severity change is named
    assert message in cells.cells
    assert any("MEDIUM -> HIGH" in c for c in cells.cells)


def test_a_diff_of_rank_folders_is_the_same_on_workers_as_pooled_in_one_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each side's ranks are analysed one file per task (`--jobs`), and their totals added in ns: the diff is
    the one of the whole tables loaded in this process."""
    from ..support.truth import Job, write_job

    base, test = tmp_path / "base", tmp_path / "test"
    base.mkdir()
    test.mkdir()
    write_job(Job(ranks=4, steps=6, seed=1), base)
    write_job(Job(ranks=4, steps=6, seed=2, late={2: (3000.0, 1.0)}), test)
    documents = []
    for jobs in ("1", "2"):
        assert main(["diff", str(base), str(test), "--json", "--jobs", jobs]) == 0
        documents.append(json.loads(capsys.readouterr().out))
    assert documents[0] == documents[1]
    pooled = json.loads(
        msgspec.json.encode(
            diff_tables(load_trace(base), load_trace(test), base_path=str(base), test_path=str(test))
        )
    )
    for key in ("base", "test", "kernels", "ops", "phases", "step_time", "findings"):
        assert documents[1][key] == pooled[key], key
    assert documents[1]["test"]["ranks"] == [0, 1, 2, 3]
    # the late rank shows: its peers' communication grew
    assert any(p["name"] == "communication" and p["significant"] for p in documents[1]["phases"])
