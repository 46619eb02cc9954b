"""The child process of a window's end (see stepscope.capture.window.child), kept by the profiled rank's worker:

    python -m stepscope.cli.window_end      (one window_end.Job a line on stdin, one Reply a line on stdout)

For each job it reads the exported trace with stepscope's own loader (which also proves it is a whole trace),
gzips it into place and writes the per-rank summary file; its reply says what was written and carries the top ops
and kernels. Status 0 done; 2 the exported file is not a whole trace (nothing written); 1 anything else (the
reason in the reply; the child's temp files are removed, the exported file is left to the worker). It runs at the
lowest priority (SCHED_IDLE where Linux allows it), one job at a time per machine; the end of stdin ends it, and
so does a job after which its memory stays above child.KEEP_RSS_BYTES.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import msgspec

from stepscope.capture.window.child import KEEP_RSS_BYTES, Reply, lower_priority, node_turn, rss_bytes
from stepscope.capture.window.window_end import Job, Result, write_gzip
from stepscope.errors import StepscopeError


def run_job(job: Job) -> Result:
    from stepscope.analysis.per_rank.summary import Summary, summarize
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
    from stepscope.report.terminal import make_console
    from stepscope.report.terminal.summary import SummaryReport
    from stepscope.runfolder.atomic import atomic_write_text

    assert job.summary is not None
    buffer = io.StringIO()
    make_console(file=buffer, width=160).print(SummaryReport(summary, wide=True))  # type: ignore[arg-type]
    atomic_write_text(job.summary, f"{job.header}\n\n{buffer.getvalue()}\n{job.memory}\n")


def main() -> int:
    """Jobs from stdin, a line each; a Reply line on stdout for each; the end of stdin ends it (see child.py)."""
    lower_priority()
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        reply = answer(line)
        out.write(msgspec.json.encode(reply) + b"\n")
        out.flush()
        rss = rss_bytes()
        if rss is not None and rss > KEEP_RSS_BYTES:
            break  # (a big trace's heap: the next window gets a fresh child)
    return 0


def answer(line: bytes) -> Reply:
    try:
        job = msgspec.json.decode(line, type=Job)
        with node_turn():  # the windows of every rank on this machine, one at a time
            return Reply(0, run_job(job))
    except StepscopeError as exc:
        return Reply(2, error=str(exc))
    except Exception as exc:
        return Reply(1, error=f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
