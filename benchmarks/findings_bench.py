"""The findings bench as a table: for every case of tests/support/findings_cases.py (small CPU jobs with one
injected problem, and the real GPU traces of ../shared/traces), the expected first finding, what fired, and any
unexpected HIGH finding. Prints the Markdown table of docs/analysis.md ("The findings bench").

    .venv/bin/python benchmarks/findings_bench.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.findings_cases import CASES, run_jobs

from _results import write_markdown_result
from stepscope.analysis.analyze import analyze
from stepscope.analysis.read.loader import load_trace


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        jobs = Path(tmp)
        run_jobs(jobs)
        rows = []
        fired = unexpected_high = 0
        for case in CASES:
            findings = analyze(load_trace(case.path(jobs))).findings
            first = findings[0] if findings else None
            ok = first is not None and first.id == case.top
            fired += ok
            extra = sorted({f.id for f in findings if f.severity == "high" and f.id not in case.high})
            unexpected_high += len(extra)
            got = (
                f"{first.id} ({first.severity}, {first.cost_ms_per_step} ms/step; saves "
                f"{first.saving_ms_per_step} ms by {first.saving_from})"
                if first
                else "none"
            )
            if first is not None and first.cost_ms_per_step is None:
                got = f"{first.id} (info)"
            rows.append(f"| `{case.name}` | {case.what} | `{case.top}` | {got} | {', '.join(extra) or '-'} |")
    lines = [
        "| case | problem | expected first | first finding | unexpected HIGH |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"{fired} of {len(CASES)} expected first findings fire; {unexpected_high} unexpected HIGH findings.",
    ]
    print("\n".join(lines))
    write_markdown_result("findings_bench", "The findings bench", lines)
    return 0 if fired == len(CASES) and unexpected_high == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
