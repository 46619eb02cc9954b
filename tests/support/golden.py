"""The outputs of `analyze --json`, `summary --json`, `diff --json` and `report` on every trace in
../shared/traces (and `ops --json` on those with recorded shapes), kept in tests/golden/ so that restructuring the code cannot change what a user sees.

Run as a script to (re)write the expected outputs after an intended change of output:

    .venv/bin/python -m tests.support.golden --write

and read `git diff tests/golden` before committing them. tests/analysis/test_golden.py runs the same cases and compares.
Each case is run in this one process through `stepscope.cli.main`, its stdout captured at the file descriptor
(so every way of writing is caught). What changes from run to run is normalised: the report's generation time and
the path of ../shared/traces.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

SHARED_TRACES = (Path(__file__).resolve().parents[2] / ".." / "shared" / "traces").resolve()
GOLDEN = Path(__file__).resolve().parents[1] / "golden"

# pairs compared by `diff` (base, test): the shared traces that are two runs of one job
DIFF_PAIRS = [
    ("kineto_docs_traces/before_fix_trace.json", "kineto_docs_traces/after_fix_trace.json"),
    ("hta_trace_compare/base/base.json.gz", "hta_trace_compare/test/test.json.gz"),
    (
        "kineto_resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
        "kineto_resnet50_num_workers_4/worker0.1623213129365.pt.trace.json.gz",
    ),
    (
        "tracelens_qwen1.5_h100_mi300/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
        "tracelens_qwen1.5_h100_mi300/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    ),
]
FOLDERS = ["hta_trace_filter"]  # a folder of ranks of one job
# the traces with recorded shapes (`stepscope ops` has something to count), and a folder of two ranks
OPS_INPUTS = [
    "kineto_resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    "tracelens_qwen1.5_h100_mi300/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens_qwen1.5_h100_mi300/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "hta_trace_filter",
]

_GENERATED = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
_BIG_SCRIPT = re.compile(rb"(<script>)(.{20000,}?)(</script>)", re.DOTALL)  # the bundled chart library


def _bundle_digest(match: re.Match[bytes]) -> bytes:
    body = match.group(2)
    return b"%s[%d bytes, sha256 %s]%s" % (match.group(1), len(body), digest(body).encode(), match.group(3))


def traces() -> list[str]:
    """Every trace file of ../shared/traces, relative to it, in a stable order."""
    return sorted(
        str(p.relative_to(SHARED_TRACES))
        for p in SHARED_TRACES.rglob("*")
        if p.is_file() and p.name != "README.md"
    )


def cases() -> Iterator[tuple[str, list[str]]]:
    """(case name, CLI arguments with paths relative to ../shared/traces marked by a leading '@')."""
    for rel in [*traces(), *FOLDERS]:
        name = rel.replace("/", "__")
        yield f"analyze__{name}", ["analyze", f"@{rel}", "--json"]
        yield f"summary__{name}", ["summary", f"@{rel}", "--json"]
        yield f"report__{name}", ["report", f"@{rel}", "-o", "{out}"]
    for rel in OPS_INPUTS:
        yield f"ops__{rel.replace('/', '__')}", ["ops", f"@{rel}", "--json"]
    for base, test in DIFF_PAIRS:
        name = f"{base.split('/')[0]}__{Path(base).name}__{Path(test).name}"
        yield f"diff__{name}", ["diff", f"@{base}", f"@{test}", "--json"]
        yield f"report_compare__{name}", ["report", f"@{base}", "--compare", f"@{test}", "-o", "{out}"]


@contextlib.contextmanager
def _captured(fd: int) -> Iterator[io.BytesIO]:
    """Everything written to file descriptor `fd` and to Python's stream for it (sys.stdout / sys.stderr, which
    a test runner may have pointed elsewhere) inside the block."""
    attr = "stdout" if fd == 1 else "stderr"
    old_stream = getattr(sys, attr)
    old_stream.flush()
    saved = os.dup(fd)
    result = io.BytesIO()
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), fd)
        raw = open(fd, "wb", closefd=False)  # noqa: SIM115 (closed with the wrapper below)
        stream = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
        setattr(sys, attr, stream)
        try:
            yield result
        finally:
            stream.flush()
            setattr(sys, attr, old_stream)
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            result.write(tmp.read())


def run_case(args: list[str], workdir: Path) -> bytes:
    """The case's exit status, stderr and output (stdout, or the written report), normalised."""
    from stepscope.cli import main

    out = workdir / "out.html"
    out.unlink(missing_ok=True)
    argv = [
        str(SHARED_TRACES / a[1:]) if a.startswith("@") else str(out) if a == "{out}" else a for a in args
    ]
    with _captured(2) as err, _captured(1) as std:
        status = main(argv)
    output = _BIG_SCRIPT.sub(_bundle_digest, out.read_bytes()) if out.exists() else std.getvalue()
    text = b"exit %d\n--- stderr\n%s\n--- output\n%s" % (status, err.getvalue(), output)
    text = text.replace(str(SHARED_TRACES).encode(), b"<traces>")
    return _GENERATED.sub(b"<generated>", text)


def golden_path(name: str) -> Path:
    return GOLDEN / f"{name}.gz"


def read_golden(name: str) -> bytes:
    return gzip.decompress(golden_path(name).read_bytes())


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write tests/golden/ from the current code")
    opts = parser.parse_args()
    GOLDEN.mkdir(exist_ok=True)
    changed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in cases():
            got = run_case(args, Path(tmp))
            path = golden_path(name)
            same = path.exists() and read_golden(name) == got
            if not same:
                changed += 1
                print(f"{'written' if opts.write else 'differs'}: {name}")
                if opts.write:
                    path.write_bytes(gzip.compress(got, mtime=0))
    print(f"{changed} of {len(list(cases()))} cases {'written' if opts.write else 'differ'}")
    return 1 if changed and not opts.write else 0


if __name__ == "__main__":
    sys.exit(main())
