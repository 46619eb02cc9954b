"""`stepscope memory`: output, exit codes, hostile and broken files, offline HTML."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import re
from pathlib import Path

import pytest

from stepscope.cli import main

from ..support.memory_data import KiB, MiB, snapshot


class _RunsCommand:
    """GIVEN a pickle whose loading would run a shell command that creates a file."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


class _OpensFile:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (str(self.target), "w"))


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def one_error_line(capsys, path: Path) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("stepscope: error: ") and str(path) in err, err
    return err


def test_tables(tmp_path, capsys):
    path = write(tmp_path / "s.pickle", pickle.dumps(snapshot()))
    assert main(["memory", str(path), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "19.50 MiB" in out  # peak allocated
    assert "26.00 MiB" in out  # reserved
    assert "32.7%" in out  # fragmentation 8.5 / 26
    assert "/home/u/train.py:40:step" in out
    assert "/home/u/model.py:12" not in out  # --top 1
    assert "Out-of-memory events" in out and "100.00 MiB" in out


def test_json_document(tmp_path, capsys):
    path = write(tmp_path / "s.pickle.gz", gzip.compress(pickle.dumps(snapshot())))
    assert main(["memory", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "stepscope.memory/1"
    assert doc["kind"] == "snapshot"
    dev = doc["devices"][0]
    assert dev["peak_allocated"] == 19 * MiB + 512 * KiB
    assert dev["reserved"] == 26 * MiB and dev["cached_unused"] == 13 * MiB
    assert dev["fragmentation"] == pytest.approx(8.5 / 26)
    assert [s["bytes"] for s in doc["top_sites"]] == [9 * MiB, 4 * MiB]
    assert dev["ooms"][0]["requested"] == 100 * MiB


def test_html_is_self_contained(tmp_path, capsys):
    data = snapshot()
    data["segments"][0]["blocks"][0]["frames"][2]["name"] = "<script>alert(1)</script>"
    path = write(tmp_path / "s.pickle", pickle.dumps(data))
    out = tmp_path / "report" / "memory.html"
    assert main(["memory", str(path), "--html", str(out), "--json"]) == 0
    assert "HTML report" in capsys.readouterr().err
    page = out.read_text()
    # the report's page: its charts are Vega-Lite specs with their data inline, the timeline among them
    specs = chart_specs(page)
    allocated = [v["value"] for spec in specs for v in spec["data"]["values"] if v["series"] == "allocated"]
    assert allocated and max(allocated) == 19.5 and "19.50 MiB" in page
    assert "<script>alert(1)" not in page and "&lt;script&gt;" in page
    assert not re.search(r"<script[^>]* src=", page) and "//cdn" not in page
    assert not [p for p in out.parent.iterdir() if p.name != "memory.html"]  # no temp file left behind


def test_memory_timeline_html(tmp_path, capsys):
    path = write(tmp_path / "mt.raw.json.gz", gzip.compress(b"[[-1,1,100,0],[2000,2,50,4],[3000,4,-50,4]]"))
    out = tmp_path / "mt.html"
    assert main(["memory", str(path), "--html", str(out)]) == 0
    assert "Memory timeline" in capsys.readouterr().out
    page = out.read_text()
    assert chart_specs(page) and "activation" in page and not re.search(r"<script[^>]* src=", page)


def chart_specs(page: str) -> list[dict]:
    """The Vega-Lite specs a page embeds (JSON script elements)."""
    found = re.findall(r'<script type="application/json" id="chart-\d+-spec">(.*?)</script>', page, re.S)
    return [json.loads(spec) for spec in found]


@pytest.mark.parametrize("payload", [_RunsCommand, _OpensFile])
def test_malicious_pickle_is_rejected_and_never_runs(tmp_path, capsys, payload):
    target = tmp_path / "pwned"
    data = snapshot()
    data["segments"][0]["blocks"][0]["frames"].append(payload(target))  # hidden deep inside a real snapshot
    path = write(tmp_path / "evil.pickle", pickle.dumps(data))
    assert main(["memory", str(path)]) == 2
    err = one_error_line(capsys, path)
    assert "unsafe pickle rejected" in err
    assert not target.exists()


def test_top_level_malicious_pickle(tmp_path, capsys):
    target = tmp_path / "pwned"
    path = write(tmp_path / "evil.pickle", pickle.dumps(_RunsCommand(target), protocol=0))
    assert main(["memory", str(path), "--json"]) == 2
    one_error_line(capsys, path)
    assert not target.exists()
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("truncated.pickle", pickle.dumps(snapshot())[:500]),
        ("garbage.pickle", bytes(range(7, 256)) * 3),
        ("empty.pickle", b""),
        ("bad.json", b'[[1, 2, 3, 4], ["x"'),
        ("bad.gz", b"\x1f\x8b\x08\x00garbage"),
        ("number.pickle", pickle.dumps(42)),
        ("dict.pickle", pickle.dumps({"hello": 1})),
        ("types.pickle", pickle.dumps({"segments": [{"total_size": "big"}]})),
        ("timeline.json", b"[[1, 2, 3]]"),
    ],
)
def test_broken_files_exit_2_with_one_line(tmp_path, capsys, name, raw):
    path = write(tmp_path / name, raw)
    assert main(["memory", str(path)]) == 2
    one_error_line(capsys, path)


def test_missing_file_and_folder(tmp_path, capsys):
    assert main(["memory", str(tmp_path / "nope.pickle")]) == 2
    one_error_line(capsys, tmp_path / "nope.pickle")
    assert main(["memory", str(tmp_path)]) == 2
    one_error_line(capsys, tmp_path)


def test_a_refused_global_is_named_in_one_line(tmp_path):
    from stepscope.analysis.memory.snapshot import analyze_memory_file
    from stepscope.errors import InputError

    # GIVEN a pickle asking for a global whose name holds a newline (STACK_GLOBAL of two strings)
    path = write(tmp_path / "newline.pickle", b"\x80\x04\x8c\x02os\x94\x8c\x07sys\ntem\x94\x93.")
    # THEN the library's error names it escaped, in one line, as any caller prints it
    with pytest.raises(InputError) as raised:
        analyze_memory_file(path)
    assert "refused to load os.sys\\ntem" in str(raised.value) and "\n" not in str(raised.value)
