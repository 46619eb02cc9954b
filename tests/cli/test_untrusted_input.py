"""To the terminal and the shell: no text from a file drives the terminal (C0, C1, bidi), every failure is one
line, nothing is written through a link, folders are walked once by real path."""

from __future__ import annotations

import json
import os
import pickle
import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from stepscope.cli import main

from ..support.traces import cpu, launched, step, write_trace

# ESC ]8;; (a hyperlink), ESC ]0; (the window title), ESC [2J (clear the screen), a C1 CSI, bidi overrides
HOSTILE = "\x1b]8;;https:evil.example\x07ln\x1b]8;;\x07\x1b]0;title\x07\x1b[2J\x9b31m\u202eevil\u2066x\u2069\u200f\u061c"
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def raw_controls(text: str) -> list[str]:
    """The characters of `text` that would drive a terminal: C0 but newline, DEL, C1, bidi controls."""
    return [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0 or c in BIDI]


def strings_in(doc: Any) -> set[str]:
    if isinstance(doc, str):
        return {doc}
    values = doc.values() if isinstance(doc, dict) else doc if isinstance(doc, list) else ()
    keys = set(doc) if isinstance(doc, dict) else set()
    return keys.union(*(strings_in(v) for v in values))


def _events(name: str = "aten::mm") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n in range(3):
        out += [step(n, n * 1000, 900), cpu(name, n * 1000 + 10, 100)]
        out += launched(name, n * 1000 + 20, n * 1000 + 200, 50, corr=n + 1)
    return out


def make_run(folder: Path, *, manifest: dict[str, Any] | None = None, phase: str = "record") -> Path:
    """A run folder written by hand: one trace of rank 0 (window ending at step 2), six metrics lines."""
    write_trace(folder / "traces" / "rank0_step2.json", _events(), rank=0)
    doc = {
        "schema": "stepscope.manifest/2",
        "run_name": "run",
        "world_size": 1,
        "profiled_ranks": [0],
        "artifacts": [{"kind": "trace", "path": "traces/rank0_step2.json", "rank": 0, "step": 2}],
    } | (manifest or {})
    (folder / "manifest.json").write_text(json.dumps(doc))
    (folder / "config.yaml").write_text("active: 1\n")
    lines = (json.dumps({"step": s, "rank": 0, "wall_ms": 10 + s, "phase": phase}) for s in range(6))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def cli(capsysbinary: pytest.CaptureFixture[bytes], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    captured = capsysbinary.readouterr()
    return status, captured.out.decode("utf-8"), captured.err.decode("utf-8")


# --- item 15: one escaping function for every text from a file ------------------------------------------------
@pytest.mark.parametrize("command", ["summary", "analyze", "report", "merge", "ops"])
def test_a_hostile_file_name_in_an_error_line_is_shown_as_text(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], command: str
) -> None:
    # GIVEN a file named with terminal sequences that is not a trace
    bad = tmp_path / f"bad{HOSTILE}.json"
    bad.write_text("{not json")
    # WHEN a command reads it THEN one line, exit 2, the name escaped
    status, out, err = cli(capsysbinary, command, str(bad))
    assert status == 2 and err.count("\n") == 1, err
    assert raw_controls(out + err) == []
    assert "bad\\x1b]8;;https:evil.example\\x07ln" in err and "\\u202eevil\\u2066" in err


def test_a_hostile_pickle_global_name_is_shown_as_text(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    # GIVEN a pickle that asks for a global named with terminal sequences
    name = f"ev{HOSTILE}".encode()
    path = tmp_path / "g.pickle"
    path.write_bytes(b"\x80\x04\x8c\x08builtins\x94\x8c" + bytes([len(name)]) + name + b"\x94\x93\x94.")
    # WHEN `stepscope memory` refuses it THEN the refusal names the global as text
    status, out, err = cli(capsysbinary, "memory", str(path))
    assert status == 2 and err.count("\n") == 1 and raw_controls(out + err) == []
    assert "builtins.ev\\x1b]8;;" in err


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("command", ["summary", "analyze"])
def test_op_names_with_c1_and_bidi_never_reach_the_terminal_raw(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], command: str, as_json: bool
) -> None:
    # GIVEN a trace whose op and kernel name carries C0, C1 and bidi controls
    name = f"op{HOSTILE}"
    path = write_trace(tmp_path / "t.json", _events(name), rank=0)
    # WHEN it is printed, as text or as JSON
    status, out, err = cli(capsysbinary, command, str(path), "--json" if as_json else "--wide")
    # THEN no control character is printed raw, and the JSON reads back to the very name
    assert status == 0 and raw_controls(out + err) == [], raw_controls(out + err)
    if as_json:
        assert "\\u009b" in out and "\\u202e" in out
        assert name in strings_in(json.loads(out))
    else:
        assert "\\x9b31m\\u202eevil" in out.replace("\n", "")


@pytest.mark.parametrize("as_json", [False, True])
def test_python_frames_and_a_device_name_with_controls_never_reach_the_terminal_raw_in_ops(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], as_json: bool
) -> None:
    # GIVEN a trace whose Python frame (with_stack) and device name carry C0, C1 and bidi controls
    frame = f"train{HOSTILE}.py(3): step"
    mm = {"Input Dims": [[64, 64], [64, 64]], "Input type": ["float", "float"]}
    events = [
        {
            "ph": "X",
            "cat": "python_function",
            "name": frame,
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 100,
            "args": {},
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 50, "args": mm},
    ]
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps({"deviceProperties": [{"id": 0, "name": f"gpu{HOSTILE}"}], "traceEvents": events})
    )
    # WHEN its ops are printed, as text or as JSON
    status, out, err = cli(capsysbinary, "ops", str(path), "--json" if as_json else "--wide")
    # THEN no control character is printed raw, and the JSON reads back to the very frame
    assert status == 0 and raw_controls(out + err) == [], raw_controls(out + err)
    if as_json:
        assert frame in strings_in(json.loads(out))
    else:
        assert "\\u202eevil" in out.replace("\n", "")  # (the frame, escaped)


@pytest.mark.parametrize("as_json", [False, True])
def test_a_run_folders_manifest_and_metrics_never_drive_the_terminal(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], as_json: bool
) -> None:
    # GIVEN a run whose manifest hosts, notes, versions and run name and whose metrics phase carry controls
    manifest = {
        "run_name": f"run{HOSTILE}",
        "hosts": [f"host{HOSTILE}"],
        "notes": [f"note{HOSTILE}"],
        "versions": {f"torch{HOSTILE}": f"2{HOSTILE}"},
    }
    run = make_run(tmp_path / "run", manifest=manifest, phase=f"record{HOSTILE}")
    # WHEN analyze (and diff) print it
    for command in (["analyze", str(run)], ["diff", str(run), str(run)]):
        status, out, err = cli(capsysbinary, *command, *(["--json"] if as_json else []))
        # THEN nothing raw; the JSON keeps the strings as they were
        assert status == 0 and raw_controls(out + err) == [], (command, raw_controls(out + err))
        if as_json and command[0] == "analyze":
            doc = json.loads(out)
            assert doc["run"]["versions"] == manifest["versions"]
    status, out, err = cli(capsysbinary, "analyze", str(run))
    assert f"record{HOSTILE[:2]}" not in out and "record\\x1b]8;;" in out.replace("\n", "")


# --- item 19: one line, never a traceback --------------------------------------------------------------------
@pytest.mark.parametrize("phase", ["[/]", "[link=http://evil.example]x[/link]"])
def test_a_metrics_phase_is_text_not_markup(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], phase: str
) -> None:
    # GIVEN a metrics.jsonl whose phase is rich markup (once: a MarkupError traceback, or a live link)
    run = make_run(tmp_path / "run", phase=phase)
    status, out, err = cli(capsysbinary, "analyze", str(run))
    # THEN it is printed as written, in the slowest steps line
    assert status == 0, err
    slowest = [line for line in out.splitlines() if "slowest steps" in line]
    assert slowest and phase[:5] in slowest[0] and "\x1b" not in out


def test_a_manifest_nested_200000_deep_is_one_line(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    run = make_run(tmp_path / "run")
    manifest = run / "manifest.json"
    manifest.write_text(manifest.read_text()[:-1] + ', "extra": ' + "[" * 200_000 + "]" * 200_000 + "}")
    for command in (["analyze", str(run)], ["diff", str(run), str(run)], ["summary", str(run)]):
        status, _, err = cli(capsysbinary, *command)
        # the manifest is damaged: the run is read from its files with a note (analyze), or refused in one line
        assert "Traceback" not in err and status in (0, 2), err
        assert (status == 0 and f"{manifest}: invalid manifest: nested too deeply" in err) or err.count(
            "\n"
        ) == 1


def test_a_manifest_rank_of_2_40_is_answered(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    # GIVEN a run whose manifest gives its trace the rank 2^40 (once: OverflowError in analyze and diff)
    artifact = {"kind": "trace", "path": "traces/rank0_step2.json", "rank": 2**40, "step": 2}
    run = make_run(tmp_path / "run", manifest={"artifacts": [artifact], "profiled_ranks": [2**40]})
    for command in (["analyze", str(run)], ["diff", str(run), str(run)]):
        status, _, err = cli(capsysbinary, *command)
        assert status in (0, 2) and "Traceback" not in err and (status == 0 or err.count("\n") == 1), err


def test_a_snapshot_with_a_negative_device_is_one_line(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    block = {"size": 512, "address": 1, "state": "active_allocated", "frames": []}
    snap = {"segments": [{"device": -5, "total_size": 4096, "address": 1, "blocks": [block]}]}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap | {"device_traces": [[]]}))
    status, _, err = cli(capsysbinary, "memory", str(path))
    assert status == 2 and err.count("\n") == 1 and "device" in err, err


def test_an_address_of_2_70_is_answered(tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    frames = [{"filename": "a.py", "line": 1, "name": "f"}]
    block = {"size": 512, "address": 2**70, "state": "active_allocated", "frames": frames}
    history = [{"action": "alloc", "addr": 2**70, "size": 512, "frames": frames, "time_us": 1}]
    snap = {"segments": [{"device": 0, "total_size": 4096, "address": 2**70, "blocks": [block]}]}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap | {"device_traces": [history]}))
    for extra in ([], ["--json"]):
        status, _, err = cli(capsysbinary, "memory", str(path), *extra)
        assert status in (0, 2) and "Traceback" not in err and (status == 0 or err.count("\n") == 1), err


@pytest.mark.parametrize(
    "args",
    [
        ["memory", "--top", "-1", "x.pickle"],
        ["analyze", "--steps", "5:1", "x"],
        ["diff", "a"],
        ["frobnicate"],
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(
    capsysbinary: pytest.CaptureFixture[bytes], args: list[str]
) -> None:
    status, _, err = cli(capsysbinary, *args)
    assert status == 2 and err.count("\n") == 1 and "error:" in err and "--help" in err, err


def test_a_folder_on_the_way_without_search_permission_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    # (root searches every folder, so the stat that fails with EACCES is simulated; once: a traceback, exit 1)
    import os

    target = tmp_path / "locked" / "run"
    real_stat = os.stat

    def stat(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith(str(target)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    for command in ("summary", "analyze", "report", "merge"):
        status, _, err = cli(capsysbinary, command, str(target))
        assert status == 2 and err.count("\n") == 1 and "Permission denied" in err, (command, err)


# --- item 16: one output helper; nothing written through a link ----------------------------------------------
def _snapshot(path: Path) -> Path:
    block = {"size": 512, "address": 1, "state": "active_allocated", "frames": []}
    snap = {
        "segments": [{"device": 0, "total_size": 4096, "address": 1, "blocks": [block]}],
        "device_traces": [],
    }
    path.write_bytes(pickle.dumps(snap))
    return path


def _writers(tmp_path: Path) -> dict[str, list[str]]:
    """Each command that writes a file the user names, without its output option's value."""
    trace = str(write_trace(tmp_path / "in" / "rank0.json", _events(), rank=0))
    other = str(write_trace(tmp_path / "in2" / "rank0.json", _events("aten::add"), rank=0))
    snapshot = str(_snapshot(tmp_path / "s.pickle"))
    return {
        "report": ["report", trace, "-o"],
        "report --compare": ["report", trace, "--compare", other, "-o"],
        "merge": ["merge", trace, "-o"],
        "memory --html": ["memory", snapshot, "--html"],
    }


@pytest.mark.parametrize("writer", ["report", "report --compare", "merge", "memory --html"])
@pytest.mark.parametrize("kind", ["link to a file", "dangling link", "fifo", "folder"])
def test_no_command_writes_through_a_link_or_over_what_is_not_a_file(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], writer: str, kind: str
) -> None:
    import os
    import stat

    # GIVEN an output name that is a symbolic link (to a file, or to nothing), a FIFO or a folder
    command = _writers(tmp_path)[writer]
    real = tmp_path / "real.txt"
    real.write_text("keep me")
    target = tmp_path / "out.json.gz"
    if kind == "link to a file":
        target.symlink_to(real)
    elif kind == "dangling link":
        target.symlink_to(tmp_path / "nowhere.txt")
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    before = os.lstat(target).st_mode
    # WHEN the command is told to write there
    status, _, err = cli(capsysbinary, *command, str(target))
    # THEN one line naming it, exit 2, and the link, its target, the FIFO or the folder as they were
    assert status == 2 and err.count("\n") == 1 and str(target) in err, err
    assert os.lstat(target).st_mode == before and real.read_text() == "keep me"
    assert not (tmp_path / "nowhere.txt").exists()
    if stat.S_ISLNK(before):
        assert "symbolic link" in err


@pytest.mark.parametrize("writer", ["report", "report --compare", "merge", "memory --html"])
def test_a_command_replaces_a_regular_file_whole(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], writer: str
) -> None:
    # GIVEN an earlier output, hard-linked elsewhere (a write in place would change the other name too)
    command = _writers(tmp_path)[writer]
    target = tmp_path / "out.json.gz"
    target.write_text("an earlier output")
    (tmp_path / "elsewhere").hardlink_to(target)
    # WHEN the command writes there THEN a new file took its place by a rename, and no temp file is left
    status, _, err = cli(capsysbinary, *command, str(target))
    assert status == 0, err
    assert (tmp_path / "elsewhere").read_text() == "an earlier output"
    assert target.read_bytes() != b"an earlier output" and target.stat().st_size > 100
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# --- item 18: folders walked once by real path, cycles cut ---------------------------------------------------
def _runs_read(capsysbinary: pytest.CaptureFixture[bytes], folder: Path) -> list[str]:
    status, out, err = cli(capsysbinary, "analyze", str(folder), "--json")
    assert status == 0, err
    doc = json.loads(out)
    return [r["path"] for r in doc["runs"]] if "runs" in doc else [r["source"] for r in doc["ranks"]]


def test_a_folder_of_self_links_reads_each_real_run_once(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    import time

    # GIVEN a folder of 20 links to itself and one link to a folder of traces (once: 421 runs, 72 s)
    write_trace(tmp_path / "traces" / "rank0.json", _events(), rank=0)
    top = tmp_path / "top"
    top.mkdir()
    for i in range(20):
        (top / f"self{i:02d}").symlink_to(".")
    (top / "tr").symlink_to(tmp_path / "traces")
    # WHEN analyze looks for the runs below it THEN it finds the one run, once, at once
    started = time.monotonic()
    assert _runs_read(capsysbinary, top) == [str(top / "tr")]
    assert time.monotonic() - started < 15  # 0.6 s here; the walk of every path took 26-72 s


def test_a_symlink_loop_is_cut(tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    # GIVEN two folders linking to each other (and to themselves), one of them to a folder of traces
    write_trace(tmp_path / "traces" / "rank0.json", _events(), rank=0)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "to_b").symlink_to(b)
    (b / "to_a").symlink_to(a)
    (b / "back").symlink_to("..")
    (b / "t").symlink_to(tmp_path / "traces")
    (a / "t2").symlink_to(tmp_path / "traces")
    # THEN the trace folder is read once, by the first path that reaches it
    assert _runs_read(capsysbinary, a) == [str(a / "t2")]


def test_two_names_of_one_trace_are_one_rank(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    trace = write_trace(tmp_path / "run" / "rank0.json", _events(), rank=0)
    (tmp_path / "run" / "rank1.json").symlink_to(trace)
    status, out, _ = cli(capsysbinary, "summary", str(tmp_path / "run"), "--json")
    doc = json.loads(out)
    assert status == 0 and [r["source"] for r in doc["ranks"]] == [str(trace)]
    assert f"{tmp_path / 'run' / 'rank1.json'}: the same file as {trace}; read once" in doc["notices"]


# --- item 17: the memory page has the report's Content-Security-Policy ---------------------------------------------------
@pytest.mark.slow
def test_the_memory_page_has_a_csp_and_still_renders(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    from ..support.browser import visit

    # GIVEN a snapshot whose frames carry a script, and its page
    frames = [
        {
            "filename": "<script>window.__pwned=1</script>.py",
            "line": 1,
            "name": "<img src=x onerror=alert(1)>",
        }
    ]
    block = {"size": 512, "address": 1, "state": "active_allocated", "frames": frames}
    history = [{"action": "alloc", "addr": 1, "size": 512, "frames": frames, "time_us": 1}]
    snap = {"segments": [{"device": 0, "total_size": 4096, "address": 1, "blocks": [block]}]}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap | {"device_traces": [history]}))
    page_path = tmp_path / "memory.html"
    assert cli(capsysbinary, "memory", str(path), "--html", str(page_path))[0] == 0
    html = page_path.read_text()
    # THEN the page declares the report's policy: only its own two scripts run (by their hashes), nothing loads
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', html)
    assert policy is not None
    rules = dict(rule.split(" ", 1) for rule in unescape(policy.group(1)).split("; "))
    assert rules["default-src"] == "'none'"
    assert [src.split("-")[0] for src in rules["script-src"].split()] == ["'sha256", "'sha256"]
    # AND in a browser it renders (its tables, its timeline chart), with no error and none of the frames' script run
    with visit(page_path) as seen:
        page = seen.page
        assert not seen.console_errors and not seen.remote_requests and not seen.dialogs
        assert page.evaluate("typeof window.__pwned") == "undefined"
        page.wait_for_selector("#device-0 div.chart svg.marks")
        assert page.locator(
            "table"
        ).count() >= 2 and "<script>window.__pwned=1</script>.py" in page.inner_text("body")


# --- item 20: no JavaScript engine to write a page -----------------------------------------------------------
def test_report_writes_its_page_under_a_memory_limit_with_no_cache_and_no_js_engine(tmp_path: Path) -> None:
    import subprocess
    import sys

    # GIVEN an empty cache folder, a 2 GiB address-space limit (a JS engine died there: a 39-line V8 dump, exit
    # 133), and vl_convert made unimportable
    trace = write_trace(tmp_path / "t.json", _events(), rank=0)
    page = tmp_path / "t.html"
    cache = tmp_path / "cache"
    cache.mkdir()
    code = (
        "import sys; sys.modules['vl_convert'] = None; from stepscope.cli import main; "
        f"sys.exit(main(['report', {str(trace)!r}, '-o', {str(page)!r}]))"
    )
    done = subprocess.run(
        ["bash", "-c", f'ulimit -v {2 << 20} && exec "$0" -c "$1"', sys.executable, code],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "STEPSCOPE_CACHE_DIR": str(cache)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    # THEN the page is written, with the charting library in it
    assert done.returncode == 0 and done.stderr.count("\n") <= 2, done.stderr[-2000:]
    html = page.read_text()
    assert "window.vegaLite=__default1;" in html and "vl-convert-python" in html


def test_the_progress_bar_shows_a_file_name_as_text(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepscope.cli._output import ProgressBar

    # GIVEN a progress bar drawn as on a colour terminal, loading files named with markup and terminal sequences
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    for name in ("[/]", "[link=https://evil.example]x[/link]", HOSTILE):
        with ProgressBar(enabled=True) as bar:
            bar.DELAY_S = 0
            bar(1, 10, name)  # (drawn at the latest when the bar stops: once, a MarkupError for the first)
        err = capsys.readouterr().err
        # THEN the name is shown, and no sequence from it reached the terminal (rich's own codes are CSI, not OSC)
        assert "\x1b]8;;" not in err and "\x1b]0;title" not in err, repr(err)
        assert "evil.example" in err or name == "[/]"


_READERS = ["analyze", "summary", "whatif", "diff", "merge"]


@pytest.mark.parametrize("command", [*_READERS, *(f"{c} --json" for c in _READERS if c != "merge")])
def test_a_reader_that_goes_away_ends_the_command_with_0(tmp_path: Path, command: str) -> None:
    # GIVEN a trace whose report is many lines, and a reader that goes away (`| head -1` once it has its line)
    import subprocess
    import sys

    from ..support.traces import cpu, launched, step, write_trace

    events = [step(k, k * 1000, 1000) for k in range(4)]
    for k in range(4):
        for i in range(40):
            events.append(cpu(f"aten::op{i}", k * 1000 + i * 20, 10))
            events.extend(
                launched(f"kernel_{i}", k * 1000 + i * 20 + 1, k * 1000 + i * 20 + 5, 8, k * 100 + i + 1)
            )
    path = write_trace(tmp_path / "t.json", events)
    name, *flags = command.split()
    args = (
        [path, path]
        if name == "diff"
        else [path, "-o", tmp_path / "m.json.gz"]
        if name == "merge"
        else [path]
    )
    job = subprocess.Popen(
        [sys.executable, "-m", "stepscope", name, *map(str, args), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert job.stdout is not None
    job.stdout.close()  # (before the command writes: its first write meets a closed pipe, whatever its size)
    _, err = job.communicate(timeout=120)
    # THEN the command ends as `analyze` always did: exit 0, nothing more on stderr than its notes
    assert job.returncode == 0, err.decode()[-2000:]
    assert b"Traceback" not in err and b"Exception ignored" not in err


def test_a_hostile_out_dir_never_reaches_the_terminal_raw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN an out_dir holding an OSC sequence (it would set the terminal's title) and a BEL
    import warnings

    import torch

    import stepscope

    hostile = tmp_path / "runs\x1b]0;PWNED\x07here"
    model = torch.nn.Linear(4, 4)
    monitor = stepscope.performance_monitor(
        model, out_dir=str(hostile), wait=0, warmup=0, active=1, report=True
    )
    with warnings.catch_warnings(record=True) as caught, monitor:
        warnings.simplefilter("always")
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
            monitor.step()
    # THEN what the job prints, and every warning it gives, shows the path's control characters as escapes
    err = capsys.readouterr().err
    said = err + "".join(str(w.message) for w in caught)
    assert "\x1b" not in said and "\x07" not in said
    assert "stepscope: report:" in err and "\\x1b]0;PWNED\\x07here" in err
