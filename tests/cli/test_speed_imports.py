"""`stepscope analyze` of one trace file loads only what that file needs: no run-folder modules, no numpy.ma (which
np.unique and np.isin's sort path import on their first call, ~16 ms), no table of emoji codes. Each of these was
imported at every start before; the time itself is shown by benchmarks/instructions.py --cli, not here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# The ResNet trace has DataLoader ranges and many tiny kernels: the findings that look for a data-loader stall and
# for tiny kernels ran np.unique / np.isin on it.
RESNET = "kineto_resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"
NOT_NEEDED = ("numpy.ma", "stepscope.runfolder", "stepscope.analysis.run.folder", "rich._emoji_codes")

_CHILD = """
import json, sys
from stepscope.cli import main
status = main(["analyze", *sys.argv[2:]])
json.dump({"status": status, "modules": sorted(sys.modules)}, open(sys.argv[1], "w"))
"""


def _analyze(tmp_path: Path, *argv: str) -> dict[str, object]:
    """What a process running `stepscope analyze ARGV` printed and the modules it had imported by its end."""
    report = tmp_path / "child.json"
    child = [sys.executable, "-c", _CHILD, str(report), *argv]
    out = subprocess.run(child, check=True, timeout=120, capture_output=True, text=True).stdout
    result: dict[str, object] = {**json.loads(report.read_text()), "out": out}
    return result


@pytest.mark.shared
def test_analyze_json_of_a_trace_file_imports_only_what_it_needs(shared_traces: Path, tmp_path: Path) -> None:
    result = _analyze(tmp_path, str(shared_traces / RESNET), "--json")
    assert result["status"] == 0
    document = json.loads(str(result["out"]))
    assert [f["id"] for f in document["findings"]] == ["launch_bound", "pageable_copies"]
    assert [s["dataloader_us"] > 0 for s in document["ranks"][0]["steps"]] == [True] * 6
    loaded = [m for m in NOT_NEEDED if m in result["modules"]]  # type: ignore[operator]
    assert loaded == [], loaded


@pytest.mark.shared
@pytest.mark.parametrize(
    "trace",
    [
        # collectives (their args read once: np.unique imported numpy.ma there) and inferred waits (whatif's)
        "hta_ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
        "hta_nccl_parser_config/nccl_data.json.gz",
        "tracelens_qwen1.5_h100_mi300/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
        "hta_trace_filter",
    ],
)
def test_analyze_json_of_the_other_shared_traces_imports_no_numpy_ma(
    shared_traces: Path, tmp_path: Path, trace: str
) -> None:
    result = _analyze(tmp_path, str(shared_traces / trace), "--json")
    assert result["status"] == 0 and json.loads(str(result["out"]))["ranks"]
    assert "numpy.ma" not in result["modules"]  # type: ignore[operator]


@pytest.mark.shared
def test_analyze_in_the_terminal_of_a_trace_file_imports_only_what_it_needs(
    shared_traces: Path, tmp_path: Path
) -> None:
    result = _analyze(tmp_path, str(shared_traces / RESNET))
    assert result["status"] == 0
    assert "use pin_memory=True in the DataLoader" in str(result["out"])
    loaded = [m for m in NOT_NEEDED if m in result["modules"]]  # type: ignore[operator]
    assert loaded == [], loaded


@pytest.mark.shared
def test_analyze_json_of_a_folder_of_traces_imports_no_run_folder_modules(
    shared_traces: Path, tmp_path: Path
) -> None:
    # GIVEN a plain folder holding one trace (no manifest: not a run folder)
    folder = shared_traces / "hta_ns_resolution_trace"
    # WHEN analysed with --json
    result = _analyze(tmp_path, str(folder), "--json")
    # THEN the run folder's manifest, its readers and the process pool's modules were never imported
    assert result["status"] == 0
    not_needed = ("stepscope.runfolder.manifest", "stepscope.analysis.run.folder", "concurrent.futures")
    loaded = [m for m in not_needed if m in result["modules"]]  # type: ignore[operator]
    assert loaded == [], loaded
