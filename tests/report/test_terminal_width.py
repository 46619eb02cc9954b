"""Terminal output survives a log file: `summary`, `analyze` and `diff` of real traces at COLUMNS=80 keep every
column, print no line wider than 80, never print two different names alike, and never read trace strings as
markup."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stepscope.cli import main
from stepscope.units import distinct_labels, fmt_us, short_name

from ..support.output import tables
from ..support.traces import SHARED_TRACES, cpu, launched, step, trace, write

TRACES = ["hta_trace_filter", "tracelens_qwen1.5_h100_mi300/h100", "kineto_resnet50_num_workers_4"]
DIFFS = [
    ("tracelens_qwen1.5_h100_mi300/h100", "tracelens_qwen1.5_h100_mi300/mi300"),
    ("hta_trace_compare/base", "hta_trace_compare/test"),
]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 0
    return capsys.readouterr().out


def check(out: str) -> None:
    wide = [line for line in out.splitlines() if len(line) > 80]
    assert wide == [], wide[:3]
    found = tables(out)
    assert found
    for columns, rows in found:
        assert all(c for c in columns[1:]), columns  # every header kept
        for row in rows:
            assert len(row) == len(columns), (columns, row)  # no column dropped
            assert all("…" not in cell for cell in row[1:]), row  # numbers never cut
        names = [r[0] for r in rows]
        if columns[0].lower() in ("op", "kernel", "name"):
            assert len(names) == len(set(names)), names  # no two names alike


@pytest.fixture(autouse=True)
def eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


@pytest.mark.shared
@pytest.mark.parametrize("relative", TRACES)
def test_summary_and_analyze_fit_80_columns(relative: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = SHARED_TRACES / relative
    check(run(["summary", str(path)], capsys))
    check(run(["analyze", str(path)], capsys))


@pytest.mark.shared
@pytest.mark.parametrize(("base", "test"), DIFFS)
def test_diff_fits_80_columns(base: str, test: str, capsys: pytest.CaptureFixture[str]) -> None:
    check(run(["diff", str(SHARED_TRACES / base), str(SHARED_TRACES / test)], capsys))


@pytest.mark.shared
@pytest.mark.slow
def test_kernels_that_cut_alike_print_differently(capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN the DLRM trace, whose split_embedding kernels differ only deep inside their template arguments
    path = SHARED_TRACES / "hta_trace_filter"
    doc = json.loads(run(["summary", str(path), "--top", "0", "--json"], capsys))
    names = [k["name"] for r in doc["ranks"] for k in r["kernels"]]
    out = run(["summary", str(path), "--top", "0"], capsys)
    check(out)
    kernel_tables = [rows for columns, rows in tables(out) if columns[0] == "kernel"]
    assert kernel_tables
    for rows in kernel_tables:
        assert len({r[0] for r in rows}) == len(rows)
    # ... and --wide prints them in full
    wide = run(["summary", str(path), "--top", "0", "--wide"], capsys)
    assert all(name in wide for name in names)


def test_short_names_drop_return_type_then_parameters_then_cut_the_middle() -> None:
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, at::detail::Array<char*, 3> >(int, at::native::AddFunctor<float>, at::detail::Array<char*, 3>)"
    assert short_name(name, 175) == name
    assert short_name(name, 172) == name.removeprefix("void ")
    assert short_name(name, 110) == (
        "at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, at::detail::Array<char*, 3> >"
    )
    cut = short_name(name, 60)
    assert len(cut) == 60 and cut.startswith("at::native::vectorized_elementwise_k")
    assert cut.endswith("Array<char*, 3> >") and "…" in cut
    # two kernels differing in the middle of the template arguments stay distinct
    a = "cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1_aaaaaaaaaaaa_end>"
    b = "cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_32x6_nt_align1_aaaaaaaaaaaa_end>"
    la, lb = distinct_labels([a, b], 40)
    assert la != lb and len(la) <= 40 and len(lb) <= 40


def test_one_time_format() -> None:
    assert [fmt_us(v) for v in (0, 12.34, 812.4, 999.96, 3414, 60712, 2_050_000, -607_312)] == [
        "0 us",
        "12.3 us",
        "812 us",
        "1.00 ms",
        "3.41 ms",
        "60.7 ms",
        "2.05 s",
        "-607 ms",
    ]


def test_trace_strings_are_never_markup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN an op, a region and a kernel whose names look like rich markup
    t0 = 1000
    ev = [
        step(1, t0, 1000),
        cpu("[bold]fwd[/bold]", t0 + 10, 900, cat="user_annotation"),
        cpu("[param|cuda]", t0 + 20, 800),
        cpu("aten::mm", t0 + 30, 100),
        *launched("[red]kern[/red]", t0 + 40, t0 + 50, 100, 1),
    ]
    path = write(tmp_path / "markup.json", trace(ev))
    for command in (["summary"], ["analyze"]):
        out = run([*command, str(path)], capsys)
        assert "[param|cuda]" in out and "[red]kern[/red]" in out
    assert "[bold]fwd[/bold]" in run(["summary", str(path)], capsys)
    other = write(tmp_path / "other.json", trace([*ev, cpu("[/]oops[/]", t0 + 200, 500)]))
    out = run(["diff", str(path), str(other)], capsys)
    assert "[/]oops[/]" in re.sub(r"\s+", "", out) or "[/]oops[/]" in out


# --- narrow terminals and pipes, on a real run (no shared traces needed) ---------------------------------
@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled demo's run folder (12 steps: one window), as `stepscope demo` writes it."""
    from stepscope.capture.demo import run_demo

    monitor = run_demo(out_dir=tmp_path_factory.mktemp("demo"), steps=12, console=False, report=False)
    return Path(monitor.run_dir)


def number_columns(out: str) -> list[tuple[str, list[str]]]:
    """(header, cells) of every column but the first (the names) of every table, in the order printed."""
    return [
        (" ".join(header.split()), [row[j] for row in rows])
        for columns, rows in tables(out)
        for j, header in enumerate(columns)
        if j
    ]


@pytest.mark.parametrize("command", ["summary", "analyze"])
def test_at_60_columns_every_number_is_printed(
    demo_run: Path, command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the tables of a real run as a wide terminal shows them
    monkeypatch.setenv("COLUMNS", "200")
    wide = run([command, str(demo_run)], capsys)
    # WHEN the terminal is 60 columns wide
    monkeypatch.setenv("COLUMNS", "60")
    narrow = run([command, str(demo_run)], capsys)
    # THEN no line is wider, and every column is there with every number, in full (what does not fit on the
    # line continues in a table below, its headers wrapped)
    assert [line for line in narrow.splitlines() if len(line) > 60] == []
    assert number_columns(narrow) == number_columns(wide)
    assert all(cell for _, cells in number_columns(narrow) for cell in cells)
    if command == "analyze":  # the Steps table needs 70 columns: its last ones continue below
        assert "Steps (continued)" in narrow


@pytest.mark.parametrize("command", ["summary", "analyze"])
def test_piped_output_has_no_trailing_spaces(demo_run: Path, command: str) -> None:
    import os
    import subprocess
    import sys

    # WHEN the output goes into a pipe, as into a log or `diff`
    done = subprocess.run(
        [sys.executable, "-m", "stepscope", command, str(demo_run)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "100"},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # THEN it holds its tables, and no line ends in spaces
    assert tables(done.stdout) and len(lines) > 10
    assert [line for line in lines if line != line.rstrip()] == []


def test_narrow_name_columns_keep_their_width_and_the_table_its_figures_at_80_columns() -> None:
    # GIVEN a table with one long name column and two short ones (a format, a bound) among many figures
    import io

    from rich.console import Console

    from stepscope.report.terminal import FitTable

    cols = [
        "op",
        "format",
        "calls",
        "total",
        "share",
        "FLOPs",
        "bytes",
        "TFLOP/s",
        "TB/s",
        "bound",
        "of roof",
    ]
    row = ["aten::_flash_attention_forward", "bf16", "24", "2.72 ms", "8.5%", "245.7 GFLOP", "1.64 GiB"]
    row += ["90.3", "0.646", "memory", "19.3%"]
    numeric = [c not in ("op", "format", "bound") for c in cols]
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False).print(FitTable("T", cols, [row, row], numeric=numeric))
    text = out.getvalue()
    # THEN no line passes 80 columns and every header and figure is printed whole (the long name shortened)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    for cell in (*cols, *row[1:]):
        assert re.search(rf"(^|\s){re.escape(cell)}(\s|$)", text, flags=re.M), cell
