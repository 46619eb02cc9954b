"""The run's HTML report, written when the monitor closes (`report=True`, the default).

The report is made by `stepscope report RUN_DIR` in a child process: capture never imports the analysis, the
training process never holds the analysis's memory, and a report that fails costs the job one warning, not its
exit. It runs at close only, never inside a step.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stepscope.capture.console import StepscopeWarning, console_write, warn_user
from stepscope.runfolder import ArtifactKind, artifact_path

REPORT_TIMEOUT_S = 600  # a report that takes longer than this is given up (the traces are all there)


def write_run_report(run_dir: Path, *, console: bool = True) -> Path | None:
    """Write `report.html` in `run_dir` and index it in the manifest; None (and one warning) on failure."""
    target = run_dir / artifact_path(ArtifactKind.REPORT)
    command = [sys.executable, "-m", "stepscope", "report", str(run_dir), "-o", str(target)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=REPORT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        warn_user(
            f"stepscope: the HTML report was not written ({type(exc).__name__}: {exc})", StepscopeWarning
        )
        return None
    if done.returncode != 0 or not target.is_file():
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        warn_user(
            f"stepscope: the HTML report was not written (`stepscope report {run_dir}` exited "
            f"{done.returncode}: {last})",
            StepscopeWarning,
        )
        return None
    if console:
        console_write(f"stepscope: report: {target}\n")
    return target
