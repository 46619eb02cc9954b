"""The child process of a window's end (see stepscope.capture.window.window_end), run by the profiled rank's worker:

    python -m stepscope.cli.window_end < job.json

It reads the exported trace with stepscope's own loader (which also proves it is a whole trace), gzips it into
place and writes the per-rank summary file; one JSON document on stdout says what was written and carries the
top ops and kernels. It lowers its own priority: on a busy host the training process goes first.

Exit status: 0 done; 2 the exported file is not a whole trace (nothing written); 1 anything else (the reason on
stderr; the child's temp files are removed, the exported file is left to the parent).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

import msgspec

from stepscope.capture.window.window_end import Job, Result, write_gzip
from stepscope.errors import StepscopeError

NICENESS = 10


def run_job(job: Job) -> Result:
    from stepscope.analysis.rank.summary import Summary, summarize
    from stepscope.analysis.read.loader import load_trace

    plain = Path(job.plain)
    json_bytes = plain.stat().st_size
    summary: Summary = summarize(load_trace(plain), top=max(job.summary_rows, job.top + 1))
    for rank_summary in summary.ranks:
        rank_summary.source = job.trace  # not the temp file's name
    gz_bytes = write_gzip(plain, Path(job.trace))
    summary_error = None
    if job.summary is not None:
        try:
            write_summary(job, summary)
        except OSError as exc:  # the trace is written: it is what matters
            summary_error = f"{type(exc).__name__}: {exc}"
    rank = summary.ranks[0] if summary.ranks else None
    # the ProfilerStep#N spans are whole steps, not ops: left out of the rows handed on
    ops = (
        [msgspec.structs.asdict(o) for o in rank.ops if not o.name.startswith("ProfilerStep")] if rank else []
    )
    kernels = [msgspec.structs.asdict(k) for k in rank.kernels[: job.top]] if rank else []
    return Result(json_bytes, gz_bytes, summary_error, ops[: job.top], kernels)


def write_summary(job: Job, summary: object) -> None:
    from stepscope.report.summary import SummaryReport
    from stepscope.report.terminal import make_console
    from stepscope.runfolder.atomic import atomic_write_text

    assert job.summary is not None
    buffer = io.StringIO()
    make_console(file=buffer, width=160).print(SummaryReport(summary, wide=True))  # type: ignore[arg-type]
    atomic_write_text(job.summary, f"{job.header}\n\n{buffer.getvalue()}\n{job.memory}\n")


def main() -> int:
    with contextlib.suppress(OSError):
        os.nice(NICENESS)
    try:
        result = run_job(msgspec.json.decode(sys.stdin.buffer.read(), type=Job))
    except StepscopeError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    except Exception as exc:
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        return 1
    sys.stdout.buffer.write(msgspec.json.encode(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
