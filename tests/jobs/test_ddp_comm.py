"""Communication on a real DDP job with DDP's default buckets (two all-reduces at once on gloo's threads), 4 ranks
all traced, rank 2 sleeping 60 ms in its collate_fn, run as a user would: `stepscope run --nproc-per-node 4
--profiled-ranks all` (the `ddp_two_buckets_all_ranks` fixture). What `stepscope analyze --json` and the report
say: the straggler's delay, its cause, collective time and waiting as unions in time, and communication as its
own step category."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from stepscope.cli import main

from ..support.browser import visit
from ..support.output import SCREENSHOTS, assert_clean, make_report

pytestmark = pytest.mark.slow
SLOW_RANK = 2
DELAY_MS = 60.0  # the job's sleep in rank 2's collate_fn
WAITING_RANKS = (0, 1, 3)
# figures that may be below zero by their meaning (a clock ahead or behind, a trend, a difference of ranks)
SIGNED_KEYS = {"offset_us", "clock_offset_us", "trend_pct", "excess_ms_per_step"}


def analyze_json(path: Path) -> dict[str, Any]:
    """`stepscope analyze PATH --json`, through the CLI's main, for a module-scoped fixture (no capsys)."""
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8")
    with contextlib.redirect_stdout(out):
        assert main(["analyze", str(path), "--json"]) == 0
        out.flush()
    return json.loads(raw.getvalue())  # type: ignore[no-any-return]


def negative_figures(doc: Any, where: str = "") -> list[str]:
    """Every number below zero in the document, by its path (keys in SIGNED_KEYS aside)."""
    if isinstance(doc, dict):
        return [
            bad
            for key, value in doc.items()
            if key not in SIGNED_KEYS
            for bad in negative_figures(value, f"{where}.{key}")
        ]
    if isinstance(doc, list):
        return [bad for i, value in enumerate(doc) for bad in negative_figures(value, f"{where}[{i}]")]
    if isinstance(doc, (int, float)) and not isinstance(doc, bool) and doc < 0:
        return [f"{where} = {doc}"]
    return []


@pytest.fixture(scope="module")
def ddp_doc(ddp_two_buckets_all_ranks: Path) -> dict[str, Any]:
    return analyze_json(ddp_two_buckets_all_ranks)


def test_two_buckets_straggler_is_rank_2_by_its_sleep_for_its_data_loading(ddp_doc: dict[str, Any]) -> None:
    # GIVEN the job's two gradient buckets: two all-reduces per step on every rank
    steps = ddp_doc["ranks"][0]["window"]["steps"]
    for rank_doc in ddp_doc["ranks"]:
        (all_reduce,) = [c for c in rank_doc["collectives"] if c["kind"] == "all_reduce"]
        assert all_reduce["count"] == 2 * steps
    # THEN rank 2 is the straggler, holding the others back about its 60 ms sleep per step (the two buckets'
    # waits at once are one wait: 120 ms was the sum), less than a step
    straggler = ddp_doc["straggler"]
    assert straggler["rank"] == SLOW_RANK
    assert 0.6 * DELAY_MS <= straggler["delay_ms_per_step"] <= 1.5 * DELAY_MS
    assert straggler["delay_pct"] <= 100
    # AND its cause is its data loading (the collate_fn), not time that no region accounts for
    cause = straggler["cause"]
    assert cause["phase"] == "data_loader"
    assert cause["rank_ms_per_step"] >= 0.9 * DELAY_MS > cause["others_ms_per_step"] + 0.8 * DELAY_MS
    (finding,) = [f for f in ddp_doc["findings"] if f["id"] == "straggler"]
    assert finding["rank"] == SLOW_RANK and "data loading" in finding["message"]
    assert "no annotated region" not in finding["message"]


def test_two_buckets_comm_and_waiting_per_step_never_exceed_the_step(ddp_doc: dict[str, Any]) -> None:
    # THEN per rank, waiting <= collective time <= step time, and transfer is what is left
    for stat in ddp_doc["cross_rank"]["ranks"]:
        assert 0 <= stat["comm_wait_us"] <= stat["comm_us"] <= stat["step_us"], stat
        assert stat["transfer_us"] == pytest.approx(stat["comm_us"] - stat["comm_wait_us"], abs=0.01)
        if stat["rank"] in WAITING_RANKS:  # the others wait for rank 2's sleep
            assert stat["comm_wait_us"] >= 0.5 * DELAY_MS * 1e3, stat
    # AND each rank's collectives table is a union in time too: never more time than its window
    for rank_doc in ddp_doc["ranks"]:
        window_ms = rank_doc["window"]["dur_us"] / 1e3
        for coll in rank_doc["collectives"]:
            assert 0 <= coll["wait_ms"] <= coll["time_ms"] <= window_ms, coll
    # AND no figure anywhere in the document is negative
    assert negative_figures(ddp_doc) == []


def test_communication_is_its_own_step_category(ddp_doc: dict[str, Any]) -> None:
    cross = {s["rank"]: s for s in ddp_doc["cross_rank"]["ranks"]}
    for rank_doc in ddp_doc["ranks"]:
        rank = rank_doc["rank"]
        rows = rank_doc["step_categories"]
        assert len(rows) == rank_doc["window"]["steps"]
        parts = ("kernel", "memcpy", "memset", "communication", "runtime", "data_loader", "cpu_exec", "other")
        for row in rows:
            # THEN each step's categories add up to the step, communication (waiting + transfer) among them
            assert sum(row[f"{p}_us"] for p in parts) == pytest.approx(row["dur_us"], abs=0.01)
            assert row["comm_wait_us"] + row["comm_transfer_us"] == pytest.approx(
                row["communication_us"], abs=0.01
            )
        # AND per step they hold the time the Ranks table shows (a CPU job: no GPU work hides any of it)
        n = len(rows)
        mean = {key: sum(r[key] for r in rows) / n for key in ("communication_us", "comm_wait_us")}
        assert mean["communication_us"] == pytest.approx(cross[rank]["comm_us"], abs=1.0)
        assert mean["comm_wait_us"] == pytest.approx(cross[rank]["comm_wait_us"], abs=1.0)
        # AND the Steps table's comm column is filled with the same time
        for step, row in zip(rank_doc["steps"], rows, strict=True):
            assert step["comm_us"] == pytest.approx(row["communication_us"], abs=0.01)
        if rank in WAITING_RANKS:
            # AND the ranks that wait most of each step see it as communication, not as CPU exec
            assert mean["communication_us"] >= 0.5 * sum(r["dur_us"] for r in rows) / n
            assert mean["comm_wait_us"] >= 0.5 * DELAY_MS * 1e3
            assert sum(r["cpu_exec_us"] for r in rows) / n < 0.5 * mean["communication_us"]


def test_the_step_breakdown_names_communication_not_other_code(ddp_doc: dict[str, Any]) -> None:
    # GIVEN the ranks that wait for rank 2 most of each step, inside gloo's all-reduces
    breakdowns = [f for f in ddp_doc["findings"] if f["id"] == "step_breakdown"]
    covered = {r for f in breakdowns for r in f["ranks"]}
    assert set(WAITING_RANKS) <= covered
    for f in breakdowns:
        evidence = f["evidence"]
        # THEN the step breakdown gives that time to communication, as the step categories do, not to other code
        assert "communication (outside the phases)" in f["message"]
        assert evidence["communication_ms_per_step"] > 0
        if set(f["ranks"]) <= set(WAITING_RANKS):
            assert evidence["communication_ms_per_step"] >= 0.5 * evidence["step_ms"]
            assert evidence["other_ms_per_step"] < 0.25 * evidence["step_ms"]


def overview_rows(html: str) -> dict[str, float]:
    """The report's overview-categories table: category -> microseconds per step."""
    table = html[html.index('<table id="overview-categories"') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r'<td class="txt">([^<]+)</td>\s*<td class="num" data-v="([^"]+)"', table)
    return {label: float(value) for label, value in rows}


@pytest.fixture(scope="module")
def ddp_report(ddp_two_buckets_all_ranks: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_report(ddp_two_buckets_all_ranks, tmp_path_factory.mktemp("ddp_report") / "report.html")


def test_report_overview_table_shows_communication(ddp_report: Path, ddp_doc: dict[str, Any]) -> None:
    table = overview_rows(ddp_report.read_text(encoding="utf-8"))
    # THEN the overview table has the communication, as waiting and transfer, with the analysis' time
    rows = [row for rank_doc in ddp_doc["ranks"] for row in rank_doc["step_categories"]]
    for label, key in (
        ("Communication: waiting", "comm_wait_us"),
        ("Communication: transfer", "comm_transfer_us"),
    ):
        assert table[label] == pytest.approx(sum(r[key] for r in rows) / len(rows), rel=1e-6)
    assert "Communication" not in table  # split wherever the collectives were matched
    assert table["Communication: waiting"] > table["CPU Exec"]


def test_report_overview_chart_draws_communication(ddp_report: Path) -> None:
    with visit(ddp_report) as seen:
        page = seen.page
        assert_clean(seen)
        # THEN the per-step categories chart is drawn, its legend naming the communication's two parts
        chart = page.locator("#overview div.chart").nth(1)
        assert chart.locator("svg.marks").count() == 1
        labels = chart.locator("svg text").all_text_contents()
        assert "Communication: waiting" in labels and "Communication: transfer" in labels
        if SCREENSHOTS is not None:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.locator("#overview").screenshot(path=str(SCREENSHOTS / "ddp_overview.png"))
