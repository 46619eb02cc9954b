"""A command's answer kept for the same command on the same input (issue 48, item 5): the second `analyze --json`,
`summary --json`, `whatif --json` or `report` of an input prints or writes what the first did without analysing
again; anything that changes the answer (the input, an option, a rank's file) makes it analyse again; a damaged
kept answer, `--no-cache` and a failing command each do what a user would expect."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from stepscope.cli import main

from ..support.traces import cpu, kernel, launched, step, write_trace


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("STEPSCOPE_CACHE_DIR", str(folder))
    monkeypatch.delenv("STEPSCOPE_NO_CACHE", raising=False)
    return folder / "results"


def a_trace(path: Path, steps: int = 3, rank: int = 0, slow: float = 0.0) -> Path:
    events = []
    t = 0.0
    for k in range(steps):
        events.append(step(k + 1, t, 1000.0 + slow))
        events.append(cpu("forward", t + 10, 400.0, cat="user_annotation"))
        events += launched("gemm_A", t + 20, t + 30, 300.0 + slow, 100 + k, stream=7)
        events.append(kernel("ncclDevKernel_AllReduce", t + 400 + slow, 200.0, stream=20, corr=200 + k))
        t += 1000.0 + slow
    write_trace(path, events, rank, world_size=2)
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    assert main(list(args)) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


@pytest.fixture
def no_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any analysis from here on fails the test: the answer must come from what was kept."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("analysed again")

    import stepscope.analysis.read.loader as loader
    import stepscope.analysis.service as service

    for name in ("load_trace", "load_file", "cached_load"):
        monkeypatch.setattr(loader, name, refuse)
    monkeypatch.setattr(service, "analyze_source", refuse)


@pytest.mark.parametrize("command", ["analyze", "summary", "whatif"])
def test_a_second_json_answer_is_the_kept_one(
    tmp_path: Path,
    cache_dir: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    request: pytest.FixtureRequest,
) -> None:
    trace = a_trace(tmp_path / "t.json")
    first, _ = run(capsys, command, str(trace), "--json")
    assert len(list(cache_dir.glob("*.result"))) == 1
    request.getfixturevalue("no_analysis")
    second, _ = run(capsys, command, str(trace), "--json")
    assert second == first and json.loads(second)


_CHILD = """
import json, sys
from stepscope.cli import main
status = main(sys.argv[2:])
json.dump({"status": status, "modules": sorted(sys.modules)}, open(sys.argv[1], "w"))
"""


def _process(tmp_path: Path, *argv: str) -> dict[str, object]:
    """What a process running `stepscope ARGV` returned and printed, and the modules it had imported by its end."""
    report = tmp_path / "child.json"
    child = [sys.executable, "-c", _CHILD, str(report), *argv]
    done = subprocess.run(child, timeout=120, capture_output=True, text=True)
    return {**json.loads(report.read_text()), "out": done.stdout, "err": done.stderr}


def test_the_same_command_line_again_is_answered_before_click_is_imported(
    tmp_path: Path, cache_dir: Path
) -> None:
    # GIVEN a folder of two ranks analysed once, with an option
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in (0, 1):
        a_trace(folder / f"rank{rank}.json", rank=rank)
    line = ("analyze", str(folder), "--json", "--top", "3")
    first = _process(tmp_path, *line)
    assert first["status"] == 0 and {"click", "numpy"} <= set(first["modules"])  # type: ignore[arg-type]
    # WHEN the same line runs again
    second = _process(tmp_path, *line)
    # THEN it prints the same answer without importing click, numpy or any analysis
    assert second["status"] == 0 and second["out"] == first["out"] and second["err"] == first["err"]
    loaded = set(second["modules"])  # type: ignore[arg-type]
    assert not loaded & {"click", "numpy", "stepscope.analysis.service", "stepscope.analysis.options"}, loaded
    # AND the same options in another order go through click once, then are answered at once too
    other = ("analyze", "--top=3", "--json", str(folder))
    assert _process(tmp_path, *other)["out"] == first["out"]
    assert "click" not in _process(tmp_path, *other)["modules"]  # type: ignore[operator]
    # AND a rank's file changed makes the same line analyse again
    a_trace(folder / "rank1.json", rank=1, slow=500.0)
    changed = _process(tmp_path, *line)
    assert "numpy" in changed["modules"] and changed["out"] != first["out"]  # type: ignore[operator]
    steps = {r["rank"]: r["steps"][0]["dur_us"] for r in json.loads(str(changed["out"]))["ranks"]}
    assert steps[1] > steps[0]


def test_the_same_report_line_again_writes_the_page_before_click_is_imported(
    tmp_path: Path, cache_dir: Path
) -> None:
    # GIVEN a trace whose page was written once, to a page named on the line
    trace = a_trace(tmp_path / "t.json")
    page = tmp_path / "page.html"
    line = ("report", str(trace), "-o", str(page))
    first = _process(tmp_path, *line)
    assert first["status"] == 0 and "click" in first["modules"]  # type: ignore[operator]
    written = page.read_text()
    # WHEN the same line runs again, twice (the page it wrote is one of its arguments)
    for _ in range(2):
        before = page.stat().st_ino
        again = _process(tmp_path, *line)
        # THEN it writes the same page again (a new file, saying when it was written), says what report says,
        # without click
        assert again["status"] == 0 and again["out"] == first["out"] and again["err"] == first["err"]
        assert not {"click", "numpy", "jinja2"} & set(again["modules"])  # type: ignore[arg-type]
        assert page.stat().st_ino != before and _without_time(page.read_text()) == _without_time(written)
    # AND a page that became a link is not written through: the command runs and refuses it in one line
    elsewhere = tmp_path / "elsewhere.html"
    elsewhere.write_text("mine")
    page.unlink()
    page.symlink_to(elsewhere)
    refused = _process(tmp_path, *line)
    assert refused["status"] == 2 and elsewhere.read_text() == "mine"
    assert len(str(refused["err"]).splitlines()) == 1 and "link" in str(refused["err"])


def test_a_kept_line_whose_answer_is_gone_runs_the_command(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = a_trace(tmp_path / "t.json")
    first, _ = run(capsys, "whatif", str(trace), "--json")
    assert len(list(cache_dir.glob("*.line"))) == 1
    for kept in cache_dir.glob("*.result"):
        kept.unlink()
    assert run(capsys, "whatif", str(trace), "--json")[0] == first
    assert len(list(cache_dir.glob("*.result"))) == 1


def test_the_terminal_view_is_not_kept(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = a_trace(tmp_path / "t.json")
    run(capsys, "analyze", str(trace))
    assert not cache_dir.exists()


def test_a_changed_input_or_option_is_analysed_again(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = a_trace(tmp_path / "t.json", steps=3)
    out, _ = run(capsys, "analyze", str(trace), "--json")
    assert len(json.loads(out)["ranks"][0]["steps"]) == 3
    st = trace.stat()
    a_trace(trace, steps=4)  # written again, its time put back
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    out, _ = run(capsys, "analyze", str(trace), "--json")
    assert len(json.loads(out)["ranks"][0]["steps"]) == 4
    out, _ = run(capsys, "analyze", str(trace), "--json", "--steps", "2:3")
    assert [s["step"] for s in json.loads(out)["ranks"][0]["steps"]] == [2, 3]
    assert len(list(cache_dir.glob("*.result"))) == 3


def test_a_folder_with_one_rank_changed_is_analysed_again(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in (0, 1):
        a_trace(folder / f"rank{rank}.json", rank=rank)
    first, _ = run(capsys, "analyze", str(folder), "--json")
    assert run(capsys, "analyze", str(folder), "--json")[0] == first
    a_trace(folder / "rank1.json", rank=1, slow=500.0)
    changed, _ = run(capsys, "analyze", str(folder), "--json")
    steps = {r["rank"]: r["steps"][0]["dur_us"] for r in json.loads(changed)["ranks"]}
    assert steps[1] > steps[0] and changed != first


def test_no_cache_neither_reads_nor_keeps(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = a_trace(tmp_path / "t.json")
    first, _ = run(capsys, "--no-cache", "analyze", str(trace), "--json")
    assert not cache_dir.exists()
    run(capsys, "analyze", str(trace), "--json")
    (kept,) = cache_dir.glob("*.result")
    kept.write_bytes(kept.read_bytes().replace(b'"ranks"', b'"RANKS"'))  # (a kept answer a test can tell)
    assert '"RANKS"' in run(capsys, "analyze", str(trace), "--json")[0]
    assert run(capsys, "--no-cache", "analyze", str(trace), "--json")[0] == first


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b"\xc1" + b[1:], lambda b: b""])
def test_a_damaged_kept_answer_is_removed_and_the_command_runs(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str], damage: object
) -> None:
    trace = a_trace(tmp_path / "t.json")
    first, _ = run(capsys, "analyze", str(trace), "--json")
    (kept,) = cache_dir.glob("*.result")
    kept.write_bytes(damage(kept.read_bytes()))  # type: ignore[operator]
    assert run(capsys, "analyze", str(trace), "--json")[0] == first
    assert run(capsys, "analyze", str(trace), "--json")[0] == first  # (kept again, whole)


def test_a_failing_command_keeps_nothing(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    assert main(["analyze", str(bad), "--json"]) == 2
    assert not list(cache_dir.glob("*.result"))


def _without_time(page: str) -> str:
    return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "TIME", page)


def test_a_second_report_writes_the_kept_page_saying_when(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = a_trace(tmp_path / "t.json")
    out1, _ = run(capsys, "report", str(trace), "-o", str(tmp_path / "one.html"))
    first = (tmp_path / "one.html").read_text()
    time.sleep(1.1)
    import stepscope.report.html as html

    monkeypatch.setattr(html, "render_report", lambda *a, **k: pytest.fail("rendered again"))
    out2, _ = run(capsys, "report", str(trace), "-o", str(tmp_path / "two.html"))
    second = (tmp_path / "two.html").read_text()
    assert "two.html" in out2 and "one.html" in out1
    assert _without_time(second) == _without_time(first)
    stamp = re.compile(r"generated</dt><dd>([^<]+)</dd>")
    assert stamp.search(first)[1] < stamp.search(second)[1]  # type: ignore[index]
    assert f"Made by stepscope on {stamp.search(second)[1]}." in second  # type: ignore[index]


def test_a_run_folders_second_report_is_kept_and_indexed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ..support.train import profiled_run

    folder = profiled_run(tmp_path / "runs", 8, wait=1, warmup=1, active=2)
    capsys.readouterr()  # (the console table the monitor printed)
    _, err1 = run(capsys, "report", str(folder))
    first = (folder / "report.html").read_text()
    shutil.copy(folder / "report.html", tmp_path / "first.html")
    import stepscope.report.html as html

    monkeypatch.setattr(html, "render_report", lambda *a, **k: pytest.fail("rendered again"))
    for _ in range(2):  # (the page the first wrote and indexed in the folder does not change what it answers)
        _, err = run(capsys, "report", str(folder))
        assert _without_time((folder / "report.html").read_text()) == _without_time(first)
        assert err == err1  # the same notes
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [a["path"] for a in manifest["artifacts"] if a["kind"] == "report"] == ["report.html"]
    monkeypatch.undo()
    (folder / "metrics.jsonl").write_text((folder / "metrics.jsonl").read_text() + "\n")  # the run changed
    import stepscope.cli.report as report

    made = []
    monkeypatch.setattr(report, "_page", lambda *a, _page=report._page: made.append(1) or _page(*a))
    run(capsys, "report", str(folder))
    assert made == [1]


def test_a_second_diff_gives_the_kept_answer_and_exit_code(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = a_trace(tmp_path / "base.json", steps=12)
    test = a_trace(tmp_path / "test.json", steps=12, slow=300.0)
    args = ["diff", str(base), str(test), "--json", "--fail-on", "step_time>+5%", "--fail-on", "new_high>0"]
    code = main(args)
    first = capsys.readouterr()
    assert code == 3 and "step_time>+5% breached" in first.err
    import stepscope.analysis.diff.compare as compare

    monkeypatch.setattr(compare, "diff_paths", lambda *a, **k: pytest.fail("compared again"))
    assert main(args) == 3
    second = capsys.readouterr()
    assert (second.out, second.err) == (first.out, first.err)
    monkeypatch.undo()
    a_trace(test, steps=12)  # TEST written again as the base: no gate breaches
    assert main(args) == 0
    assert [g["outcome"] for g in json.loads(capsys.readouterr().out)["gates"]] == ["pass", "pass"]


@pytest.mark.parametrize("where", ["cli/_output.py", "report/templates/base.html.j2", "analysis/analyze.py"])
def test_a_changed_file_anywhere_in_a_checkouts_package_is_new_code(where: str) -> None:
    import stepscope
    from stepscope.analysis.read import cache

    package = Path(stepscope.__file__).resolve().parent
    if package.parent.name in ("site-packages", "dist-packages"):
        pytest.skip("an installed wheel is known by its record of files")
    changed = package / where
    st = changed.stat()
    cache.code_key.cache_clear()
    before = cache.code_key()
    try:
        os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # (as an edit would)
        cache.code_key.cache_clear()
        after = cache.code_key()
    finally:
        os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns))
        cache.code_key.cache_clear()
    assert after != before


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_a_fifo_beside_the_traces_or_named_on_the_line_is_never_opened_to_key_an_answer(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # GIVEN a folder of traces that also holds a FIFO nobody writes to (opening it to read would wait forever)
    folder = tmp_path / "ranks"
    folder.mkdir()
    a_trace(folder / "rank0.json")
    os.mkfifo(folder / "pipe")
    page = str(tmp_path / "x.html")
    line = [command, str(folder), "--json"] if command == "analyze" else [command, str(folder), "-o", page]
    # WHEN the command runs twice (the answer is not kept: the folder cannot be keyed)
    for _ in range(2):
        out, _ = run(capsys, *line)
        assert out
    # THEN it ran, and nothing was kept for it
    assert not cache_dir.exists() or not list(cache_dir.glob("*.result"))


def _fresh(capsys: pytest.CaptureFixture[str], *line: str) -> str:
    """What the line prints with nothing kept."""
    return run(capsys, "--no-cache", *line)[0]


@pytest.mark.parametrize("spelling", ["{}/", "{}/.", "-- {}"])
def test_a_changed_input_however_the_line_spells_it_is_analysed_again(
    tmp_path: Path,
    cache_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    spelling: str,
) -> None:
    # GIVEN a trace named with a trailing slash, or a name that starts with '-' after '--', analysed twice
    monkeypatch.chdir(tmp_path)
    trace = a_trace(tmp_path / ("-t.json" if spelling.startswith("--") else "t.json"), steps=3)
    named = spelling.format(trace.name).split()
    line = ["analyze", "--json", *named] if named[0] == "--" else ["analyze", *named, "--json"]
    run(capsys, *line)
    run(capsys, *line)
    # WHEN the trace is written again
    a_trace(trace, steps=4)
    # THEN the same line gives the new trace's answer, as a line with nothing kept does
    out = run(capsys, *line)[0]
    assert len(json.loads(out)["ranks"][0]["steps"]) == 4 and out == _fresh(capsys, *line)


def test_an_input_changed_while_the_command_ran_is_not_answered_from_its_line(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a first analysis during which the trace is written anew (after it was keyed, before the end)
    trace = a_trace(tmp_path / "t.json", steps=3)
    import stepscope.analysis.service as service

    original = service.analyze_source

    def rewritten(*args: object, **kwargs: object) -> object:
        result = original(*args, **kwargs)  # type: ignore[arg-type]
        a_trace(trace, steps=5)
        return result

    monkeypatch.setattr(service, "analyze_source", rewritten)
    run(capsys, "analyze", str(trace), "--json")
    monkeypatch.setattr(service, "analyze_source", original)
    # THEN the same line gives the trace's answer as it is now, twice
    for _ in range(2):
        out = run(capsys, "analyze", str(trace), "--json")[0]
        assert len(json.loads(out)["ranks"][0]["steps"]) == 5


def test_a_report_whose_page_overwrites_its_input_fails_again_as_it_would_afresh(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = a_trace(tmp_path / "self.json")
    assert main(["report", str(trace), "-o", str(trace)]) == 0
    capsys.readouterr()
    assert main(["report", str(trace), "-o", str(trace)]) == 2  # (the page is no trace)
    assert "not valid JSON" in capsys.readouterr().err


def test_a_changed_trace_in_a_linked_sub_folder_is_analysed_again(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = tmp_path / "A"
    real.mkdir()
    a_trace(real / "rank0.json", steps=3)
    folder = tmp_path / "P"
    folder.mkdir()
    (folder / "a").symlink_to(real)
    (folder / "loop").symlink_to(folder)  # (a link to a folder above: walked once, no loop)
    first = run(capsys, "analyze", str(folder), "--json")[0]
    assert run(capsys, "analyze", str(folder), "--json")[0] == first
    a_trace(real / "rank0.json", steps=4)
    out = run(capsys, "analyze", str(folder), "--json")[0]
    assert json.loads(out)["notices"] == [
        f"{folder}: 1 run in sub-folders (a), analyzed separately (not as ranks of one job)"
    ]
    (analysis,) = [r["analysis"] for r in json.loads(out)["runs"] if r["path"].endswith("a")]
    assert len(analysis["ranks"][0]["steps"]) == 4 and out == _fresh(capsys, "analyze", str(folder), "--json")


def test_the_input_limits_hold_for_a_kept_table(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = a_trace(tmp_path / "t.json")
    run(capsys, "analyze", str(trace))  # (its table kept)
    monkeypatch.setenv("STEPSCOPE_MAX_EVENTS", "3")
    for _ in range(2):
        assert main(["analyze", str(trace), "--json"]) == 2
        assert "more than 3 events" in capsys.readouterr().err


def test_a_kept_answer_printed_to_a_full_disk_is_one_line_and_status_2(
    tmp_path: Path, cache_dir: Path
) -> None:
    trace = a_trace(tmp_path / "t.json")
    _process(tmp_path, "analyze", str(trace), "--json")
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "stepscope", "analyze", str(trace), "--json"],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 2 and done.stderr == "stepscope: error: No space left on device\n"


def test_a_fifo_in_the_cache_is_no_answer(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = a_trace(tmp_path / "t.json")
    first = run(capsys, "analyze", str(trace), "--json")[0]
    for kept in [*cache_dir.glob("*.line"), *cache_dir.glob("*.result")]:
        kept.unlink()
        os.mkfifo(kept)
    assert run(capsys, "analyze", str(trace), "--json")[0] == first


def _merged(tmp_path: Path, *line: str, **env: str) -> tuple[int, str]:
    """A process's exit status and what it wrote on stdout and stderr, in the order it wrote them."""
    done = subprocess.run(
        [sys.executable, "-m", "stepscope", *line],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, **env},
    )  # fmt: skip
    return done.returncode, done.stdout


def test_a_diff_answered_from_its_line_says_its_gates_after_its_answer_as_it_first_did(
    tmp_path: Path, cache_dir: Path
) -> None:
    base = a_trace(tmp_path / "base.json", steps=12)
    test = a_trace(tmp_path / "test.json", steps=12, slow=300.0)
    line = ("diff", str(base), str(test), "--json", "--fail-on", "step_time>+5%")
    fresh = _merged(tmp_path, *line, STEPSCOPE_NO_CACHE="1")
    assert fresh[0] == 3 and fresh[1].startswith("{")  # (the answer, then the gate's line)
    assert fresh[1].splitlines()[-1].startswith("stepscope: --fail-on step_time>+5% breached")
    for _ in range(3):  # (the first keeps it, the next two are answered from the line)
        assert _merged(tmp_path, *line) == fresh


def test_a_report_answered_from_its_line_says_its_notes_once_when_stdout_is_full(
    tmp_path: Path, cache_dir: Path
) -> None:
    folder = tmp_path / "ranks"
    folder.mkdir()
    a_trace(folder / "rank0.json")
    a_trace(folder / "rank1.json", rank=1)
    (folder / "notes.json").write_text("{}")  # (skipped, with a note)
    line = ["report", str(folder), "-o", str(tmp_path / "page.html")]

    def full() -> tuple[int, str]:
        with open("/dev/full", "w") as stdout:
            done = subprocess.run(
                [sys.executable, "-m", "stepscope", *line], stdout=stdout, stderr=subprocess.PIPE, text=True,
                timeout=120,
            )  # fmt: skip
        return done.returncode, done.stderr

    fresh = subprocess.run(
        [sys.executable, "-m", "stepscope", *line], capture_output=True, text=True, timeout=120
    )
    assert fresh.returncode == 0 and fresh.stderr.count("stepscope: note:") == 1
    for _ in range(2):
        status, err = full()
        assert status == 2 and err.endswith("stepscope: error: No space left on device\n")
        assert err.count("stepscope: note:") == fresh.stderr.count("stepscope: note:")


def test_a_loop_of_links_or_a_dangling_link_is_said_as_such_in_one_line_with_the_cache_on(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    dangling = tmp_path / "gone"
    dangling.symlink_to(tmp_path / "nothing")
    commands = (
        ["analyze", str(loop), "--json"],
        ["report", str(loop), "-o", str(tmp_path / "x.html")],
        ["report", str(loop)],  # (its page's name comes from the input's)
        ["ops", str(loop)],
    )
    for command in commands:
        assert main(command) == 2
        assert capsys.readouterr().err == f"stepscope: error: {loop}: a loop of symbolic links\n", command
    # AND a link to nothing says where it points, not that there is no such file
    assert main(["analyze", str(dangling)]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"stepscope: error: {dangling}: a symbolic link to '{tmp_path / 'nothing'}', which does not exist\n"
    )


def test_no_cache_on_the_line_wins_over_a_variable_that_says_otherwise(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = a_trace(tmp_path / "t.json")
    run(capsys, "analyze", str(trace), "--json")
    (kept,) = cache_dir.glob("*.result")
    kept.write_bytes(kept.read_bytes().replace(b'"ranks"', b'"RANKS"'))  # (a kept answer a test can tell)
    monkeypatch.setenv("STEPSCOPE_NO_CACHE", "0")
    assert '"RANKS"' in run(capsys, "analyze", str(trace), "--json")[0]
    assert '"RANKS"' not in run(capsys, "--no-cache", "analyze", str(trace), "--json")[0]
    assert os.environ["STEPSCOPE_NO_CACHE"] == "0"  # (put back once the command ended)


def _ended(tmp_path: Path, line: Sequence[str], *, stderr: str, **env: str) -> int:
    """The status of a process running `line` whose stderr is a full disk ('full') or a pipe nobody reads
    ('gone'), its stdout thrown away."""
    if stderr == "full":
        err: Any = open("/dev/full", "w")  # noqa: SIM115
    else:
        read, write = os.pipe()
        os.close(read)
        err = os.fdopen(write, "w")
    with err:
        return subprocess.run(
            [sys.executable, "-m", "stepscope", *line], stdout=subprocess.DEVNULL, stderr=err, timeout=120,
            cwd=tmp_path, env={**os.environ, **env},
        ).returncode  # fmt: skip


@pytest.mark.parametrize("stderr", ["full", "gone"])
def test_a_line_answered_at_once_ends_as_the_command_does_when_stderr_cannot_be_written(
    tmp_path: Path, cache_dir: Path, stderr: str
) -> None:
    # GIVEN a report with a note and a diff whose gate line follows its answer, each run once (kept)
    folder = tmp_path / "ranks"
    folder.mkdir()
    a_trace(folder / "rank0.json")
    (folder / "notes.json").write_text("{}")  # (skipped, with a note)
    page = tmp_path / "page.html"
    report = ["report", str(folder), "-o", str(page)]
    base = a_trace(tmp_path / "base.json", steps=12)
    test = a_trace(tmp_path / "test.json", steps=12, slow=300.0)
    diff = ["diff", str(base), str(test), "--json", "--fail-on", "step_time>+5%"]
    for line in (report, diff):
        done = subprocess.run([sys.executable, "-m", "stepscope", *line], capture_output=True, cwd=tmp_path)
        assert done.returncode in (0, 3)
    # WHEN each runs again with a stderr that cannot be written, and afresh
    for line in (report, diff):
        page.unlink(missing_ok=True)
        again = _ended(tmp_path, line, stderr=stderr)
        written = page.exists()
        page.unlink(missing_ok=True)
        fresh = _ended(tmp_path, line, stderr=stderr, STEPSCOPE_NO_CACHE="1")
        # THEN both end with the same status, and neither writes the page its note could not precede
        assert (again, written) == (fresh, page.exists()), line
