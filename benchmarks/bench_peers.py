"""Side by side: `stepscope analyze` against its peers (HTA 0.5.0, TraceInsight 0.6.1, AMD's TraceLens), whole process.

Every run is a fresh process, timed from its start to its exit (imports, parsing, analyses, output: what a user
waits for), its peak RSS taken from `os.wait4`'s rusage (ru_maxrss: the largest of the process and the workers it
waited for). The tools take turns on each input, round after round (stepscope, HTA, TraceInsight, TraceLens, then
the next round), so a busy machine slows them alike; the best time of the rounds is kept.

A run that passes --max-rss-gb (the RSS of its whole process tree, read from /proc every 0.2 s) or --timeout is
killed with its process group and reported as "did not finish"; a tool that did not finish on an input is not run
again on that input, nor on any later input at least as large.

Each peer lives in its own virtual environment outside the repo (never a stepscope dependency):
    python3 -m venv /work/hta-venv && /work/hta-venv/bin/pip install holistictraceanalysis==0.5.0 'pandas<3'
    python3 -m venv /work/peers/traceinsight-venv && /work/peers/traceinsight-venv/bin/pip install traceinsight==0.6.1
    python3 -m venv /work/peers/tracelens-venv && /work/peers/tracelens-venv/bin/pip install /path/to/TraceLens
(TraceLens from a checkout of github.com/AMD-AGI/TraceLens; a file SOURCE_COMMIT beside its setup.py, if there, is
reported as its commit.)

    .venv/bin/python benchmarks/bench_peers.py --repeat 3 --big /tmp/big/250m.json --out /tmp/peers.md

The workloads, each the tool's own "analyze this trace" entry:
- stepscope: `stepscope analyze PATH --json > /dev/null` (a file, or the folder of a multi-rank set).
- HTA / TraceInsight: benchmarks/_peer_hta.py: TraceAnalysis(trace_dir=...) + get_temporal_breakdown +
  get_idle_time_breakdown (every rank), visualize=False. HTA reads a folder: each input is given to it as a
  temporary folder of links to the input's files.
- TraceLens: `TraceLens_generate_perf_report_pytorch --profile_json_path FILE --output_csvs_dir TMP` (its documented
  per-trace report, CSVs instead of Excel) once per file; a multi-rank set's time is the sum over its files and its
  peak RSS the largest.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _results import write_markdown_result

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
# single-rank sets (one file each) and one two-rank set (a folder)
DEFAULT_SETS = (
    "hta_nccl_parser_config/nccl_data.json.gz",
    "hta_ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "kineto_resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    "tracelens_qwen1.5_h100_mi300/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "hta_trace_filter",
)
TOOLS = ("stepscope", "hta", "traceinsight", "tracelens")
NAMES = {"stepscope": "stepscope", "hta": "HTA", "traceinsight": "TraceInsight", "tracelens": "TraceLens"}
POLL_S = 0.2
NS_ENV = "HTA_DISABLE_NS_ROUNDING"
NS_EXACT: set[tuple[str, str]] = set()  # (tool, input) where HTA failed with its ns rounding on


# --- inputs ------------------------------------------------------------------------------------------
@dataclass
class Input:
    label: str
    path: Path  # a file, or a folder of per-rank files
    files: list[Path]
    json_bytes: int = 0
    events: int = 0
    rounds: int = 0  # 0: --repeat


def trace_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.name.endswith((".json", ".json.gz")))
    return [path]


def count_child(paths: list[str]) -> None:
    """JSON bytes and events ("ph" keys) of the files, streamed in small blocks; run in a child process so that
    the harness's own peak RSS, which a forked child's ru_maxrss starts from, stays small."""
    total = events = 0
    for p in paths:
        with open(p, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        with gzip.open(p, "rb") if gz else open(p, "rb") as fh:
            tail = b""
            while block := fh.read(1 << 22):
                total += len(block)
                data = tail + block
                events += data.count(b'"ph"')
                tail = data[-3:]  # a key split over two blocks is counted once: 3 < len('"ph"')
    print(json.dumps({"json_bytes": total, "events": events}))


def measure_input(inp: Input) -> None:
    out = subprocess.run(
        [sys.executable, __file__, "--count", *map(str, inp.files)],
        capture_output=True,
        text=True,
        check=True,
    )
    counts = json.loads(out.stdout)
    inp.json_bytes, inp.events = counts["json_bytes"], counts["events"]


# --- one run -----------------------------------------------------------------------------------------
@dataclass
class Run:
    status: str = "ok"  # ok | error | oom | timeout | skipped
    wall_s: float = 0.0
    rss_mb: float = 0.0  # ru_maxrss of the process (and the workers it waited for)
    tree_rss_mb: float = 0.0  # largest RSS of the whole process tree seen by the poller
    detail: str = ""
    note: str = ""  # how the run differed from the tool's defaults
    parts: list[dict[str, Any]] = field(default_factory=list)


def _tree_pids(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_one(
    argv: list[str], cwd: Path, timeout_s: float, max_rss_kb: int, env: dict[str, str] | None = None
) -> Run:
    """One process: wall time start to exit, ru_maxrss; killed (with its group) past the memory cap or the time."""
    err = tempfile.TemporaryFile()  # noqa: SIM115
    killed: dict[str, Any] = {}
    tree_peak = [0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=err,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    done = threading.Event()

    def watch() -> None:
        while not done.wait(POLL_S):
            rss = sum(_rss_kb(p) for p in _tree_pids(proc.pid))
            tree_peak[0] = max(tree_peak[0], rss)
            elapsed = time.perf_counter() - t0
            if rss > max_rss_kb:
                killed.update(status="oom", rss_kb=rss, at_s=elapsed)
            elif elapsed > timeout_s:
                killed.update(status="timeout", rss_kb=rss, at_s=elapsed)
            if killed:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _, status, rusage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    watcher.join()
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen from waiting again
    with contextlib.suppress(OSError):  # workers left behind by the tool (none expected) go with it
        os.killpg(proc.pid, signal.SIGKILL)
    err.seek(0, os.SEEK_END)
    err.seek(max(0, err.tell() - 8192))
    tail = err.read().decode(errors="replace")
    err.close()
    run = Run(wall_s=wall, rss_mb=rusage.ru_maxrss / 1024, tree_rss_mb=tree_peak[0] / 1024)
    if killed:
        run.status = killed["status"]
        gb = killed["rss_kb"] / 1024**2
        run.detail = (
            f"did not finish: out of memory at {gb:.1f} GB ({killed['at_s']:.0f} s)"
            if run.status == "oom"
            else f"did not finish: over time at {killed['at_s']:.0f} s (RSS {gb:.1f} GB)"
        )
    elif proc.returncode != 0:
        lines = [line.strip() for line in tail.splitlines() if line.strip()]
        run.status = "error"
        run.detail = f"exit {proc.returncode}: " + (lines[-1][:200] if lines else "no message")
    return run


# --- the tools ---------------------------------------------------------------------------------------
@dataclass
class Tool:
    key: str
    exe: str  # the stepscope / TraceLens script, or the venv's python for HTA and TraceInsight
    version: str = ""
    missing: str = ""


def _venv_python(exe: str) -> str:
    return str(Path(exe).parent / "python")


def _dist_version(python: str, dist: str) -> str:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "d = m.distribution(sys.argv[1])\n"
        "url = d.read_text('direct_url.json')\n"
        "print(json.dumps({'version': d.version, 'url': json.loads(url)['url'] if url else None}))\n"
    )
    try:
        out = subprocess.run(
            [python, "-c", code, dist], capture_output=True, text=True, timeout=120, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"not found ({type(exc).__name__})"
    info = json.loads(out.stdout)
    text = info["version"]
    if info["url"] and info["url"].startswith("file://"):
        src = Path(info["url"][len("file://") :])
        commit = src / "SOURCE_COMMIT"
        text += f" from {src}" + (f" @ {commit.read_text().strip()[:12]}" if commit.exists() else "")
    return text


def _pandas(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import pandas, numpy; print(pandas.__version__, numpy.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    parts = out.stdout.split()
    return f"pandas {parts[0]}, numpy {parts[1]}" if len(parts) == 2 else "pandas ?"


def describe(tool: Tool) -> None:
    if not Path(tool.exe).exists():
        tool.missing = f"not installed ({tool.exe} not found)"
        return
    if tool.key == "stepscope":
        python = _venv_python(tool.exe)
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        tool.version = f"{_dist_version(python, 'stepscope')} (git {commit or '?'})"
    elif tool.key == "hta":
        tool.version = (
            f"holistictraceanalysis {_dist_version(tool.exe, 'holistictraceanalysis')}; {_pandas(tool.exe)}"
        )
    elif tool.key == "traceinsight":
        tool.version = f"traceinsight {_dist_version(tool.exe, 'traceinsight')}; {_pandas(tool.exe)}"
    else:
        python = _venv_python(tool.exe)
        tool.version = f"TraceLens {_dist_version(python, 'TraceLens')}; {_pandas(python)}"


def run_tool(tool: Tool, inp: Input, args: argparse.Namespace) -> Run:
    cap_kb = int(args.max_rss_gb * 1024**2)
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp_name:
        tmp = Path(tmp_name)
        if tool.key == "stepscope":
            return run_one([tool.exe, "analyze", str(inp.path), "--json"], ROOT, args.timeout, cap_kb)
        if tool.key in ("hta", "traceinsight"):
            # HTA reads every trace file of a folder: a folder of links to this input's files only
            folder = tmp / "traces"
            folder.mkdir()
            for f in inp.files:
                (folder / f.name).symlink_to(f)
            argv = [tool.exe, str(ROOT / "benchmarks" / "_peer_hta.py"), str(folder)]
            # As bench_analyze.py: where HTA fails with its default rounding of ns timestamps to whole us (an
            # AssertionError on some traces), it runs again with that rounding off, and the table says so.
            key = (tool.key, inp.label)
            if key not in NS_EXACT:
                run = run_one(argv, tmp, args.timeout, cap_kb)
                if run.status != "error":
                    return run
                print(f"    ({NAMES[tool.key]}: {run.detail}; again with {NS_ENV}=1)", file=sys.stderr)
                NS_EXACT.add(key)
            run = run_one(argv, tmp, args.timeout, cap_kb, env={**os.environ, NS_ENV: "1"})
            run.note = f"{NS_ENV}=1"
            return run
        # TraceLens: its per-trace report, once per file; the time left shrinks with each file
        total = Run()
        for i, f in enumerate(inp.files):
            argv = [tool.exe, "--profile_json_path", str(f), "--output_csvs_dir", str(tmp / f"csv{i}")]
            run = run_one(argv, tmp, args.timeout - total.wall_s, cap_kb)
            total.wall_s += run.wall_s
            total.rss_mb = max(total.rss_mb, run.rss_mb)
            total.tree_rss_mb = max(total.tree_rss_mb, run.tree_rss_mb)
            total.parts.append({"file": f.name, **_asdict(run)})
            if run.status != "ok":
                total.status, total.detail = run.status, run.detail
                break
            shutil.rmtree(tmp / f"csv{i}", ignore_errors=True)
        return total


def _asdict(run: Run) -> dict[str, Any]:
    return {k: v for k, v in run.__dict__.items() if k != "parts" or v}


# --- the table ---------------------------------------------------------------------------------------
def best(runs: list[Run]) -> Run | None:
    ok = [r for r in runs if r.status == "ok"]
    if not ok:
        return runs[-1] if runs else None
    top = min(ok, key=lambda r: r.wall_s)
    notes = sorted({r.note for r in ok if r.note})
    rss = max(r.rss_mb for r in ok)
    out = Run(status="ok", wall_s=top.wall_s, rss_mb=rss, tree_rss_mb=top.tree_rss_mb, note=", ".join(notes))
    if len(ok) >= 3:  # the median too: on a busy machine the best alone flatters
        out.detail = f"median {statistics.median(r.wall_s for r in ok):.2f}"
    return out


def _cell_time(r: Run | None, mb: float) -> str:
    if r is None:
        return "-"
    if r.status != "ok":
        return r.detail
    median = f", {r.detail}" if r.detail else ""
    return f"{r.wall_s:.2f} ({mb / r.wall_s:.1f}{median})" + (" *" if r.note else "")


def _paired(ours: list[Run], theirs: list[Run]) -> str:
    """Median (min-max) of peer / stepscope over the rounds, each round's two runs made one right after the other:
    on a busy machine both of a round's runs meet much the same load, where the two best times may not."""
    ratios = sorted(
        t.wall_s / o.wall_s
        for o, t in zip(ours, theirs, strict=False)
        if o.status == "ok" and t.status == "ok" and o.wall_s > 0
    )
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.1f}x ({ratios[0]:.1f}-{ratios[-1]:.1f})"


def table(rows: list[dict[str, Any]], tools: list[Tool]) -> str:
    keys = [t.key for t in tools]
    header = ["input", "JSON MB", "events"]
    for k in keys:
        header += [f"{NAMES[k]} s (MB/s)", f"{NAMES[k]} peak RSS MB"]
    header += [f"{NAMES[k]} / stepscope time" for k in keys if k != "stepscope"]
    header += [f"{NAMES[k]} / stepscope paired" for k in keys if k != "stepscope" and "stepscope" in keys]
    header += [f"{NAMES[k]} / stepscope RSS" for k in keys if k != "stepscope"]
    lines = []
    for row in rows:
        inp: Input = row["input"]
        mb = inp.json_bytes / 1e6
        cells = [inp.label, f"{mb:.1f}", f"{inp.events:,}"]
        bests = {k: best(row["runs"][k]) for k in keys}
        for k in keys:
            b = bests[k]
            cells += [_cell_time(b, mb), f"{b.rss_mb:.0f}" if b is not None and b.status == "ok" else "-"]
        ours = bests.get("stepscope")
        ours_ok = ours is not None and ours.status == "ok"
        for attr in ("wall_s", "paired", "rss_mb"):
            for k in keys:
                if k == "stepscope" or (attr == "paired" and "stepscope" not in keys):
                    continue
                if attr == "paired":
                    cells.append(_paired(row["runs"]["stepscope"], row["runs"][k]))
                    continue
                b = bests[k]
                good = ours_ok and b is not None and b.status == "ok"
                cells.append(f"{getattr(b, attr) / getattr(ours, attr):.1f}x" if good else "-")
        lines.append(cells)
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"]
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    out += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in lines]
    return "\n".join(out)


def _own_hwm_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


# --- main --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "sets", nargs="*", default=list(DEFAULT_SETS), help="paths under --traces (file or folder)"
    )
    parser.add_argument("--no-shared", action="store_true", help="run only the --big inputs")
    parser.add_argument(
        "--big", nargs="+", type=Path, default=[], metavar="FILE", help="generated big traces"
    )
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--repeat", type=int, default=3, help="rounds per input (best time kept)")
    parser.add_argument(
        "--big-repeat", type=int, help="rounds per --big input (default: --repeat); the big ones take minutes"
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    parser.add_argument(
        "--max-rss-gb", type=float, default=16, help="RSS (whole process tree) that ends a run"
    )
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, of {','.join(TOOLS)}")
    parser.add_argument("--stepscope", default=str(ROOT / ".venv" / "bin" / "stepscope"))
    parser.add_argument("--hta-python", default="/work/hta-venv/bin/python")
    parser.add_argument("--traceinsight-python", default="/work/peers/traceinsight-venv/bin/python")
    parser.add_argument(
        "--tracelens", default="/work/peers/tracelens-venv/bin/TraceLens_generate_perf_report_pytorch"
    )
    parser.add_argument("--out", type=Path, help="write the report (markdown) here too")
    parser.add_argument("--json", type=Path, help="write every run here")
    parser.add_argument("--count", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.count:
        count_child(args.count)
        return 0

    exes = {
        "stepscope": args.stepscope,
        "hta": args.hta_python,
        "traceinsight": args.traceinsight_python,
        "tracelens": args.tracelens,
    }
    wanted = [k.strip() for k in args.tools.split(",") if k.strip()]
    unknown = [k for k in wanted if k not in TOOLS]
    if unknown:
        parser.error(f"unknown tools: {unknown}")
    tools = [Tool(k, exes[k]) for k in TOOLS if k in wanted]
    for t in tools:
        describe(t)
    missing = [t for t in tools if t.missing]
    tools = [t for t in tools if not t.missing]

    big_repeat = args.repeat if args.big_repeat is None else args.big_repeat
    inputs: list[Input] = []
    for name in [] if args.no_shared else args.sets:
        path = (args.traces / name).resolve()
        if not path.exists():
            print(f"skip {name}: not found", file=sys.stderr)
            continue
        files = trace_files(path)
        label = name.split("/")[0] + (f" ({len(files)} ranks)" if len(files) > 1 else "")
        if name.startswith("tracelens_"):
            label += " " + name.split("/")[1]
        inputs.append(Input(label, path, files))
    for big in args.big:
        path = big.resolve()
        if not path.exists():
            print(f"skip {big}: not found", file=sys.stderr)
            continue
        inputs.append(Input(path.name, path, [path], rounds=big_repeat))

    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_start = os.getloadavg()
    head = [
        "# stepscope and its peers: end-to-end analyze, one process per run",
        "",
        f"Command: `{shlex.join([sys.executable, *sys.argv])}` (cwd {os.getcwd()})",
        "",
        f"Started {started}; {os.cpu_count()} CPUs; load average {load_start[0]:.2f} at the start; "
        f"{args.repeat} round(s) per shared input and {big_repeat} per --big input, best time kept; "
        f"limits {args.timeout:.0f} s and "
        f"{args.max_rss_gb:g} GB RSS a run.",
        "",
    ]
    head += [f"- {NAMES[t.key]}: {t.version} (`{t.exe}`)" for t in tools]
    head += [f"- {NAMES[t.key]}: {t.missing}" for t in missing]
    print("\n".join(head), flush=True)

    rows: list[dict[str, Any]] = []
    dnf_at: dict[str, tuple[int, str]] = {}  # tool -> (JSON bytes of the input it did not finish, that input)
    t_all = time.perf_counter()
    for inp in inputs:
        measure_input(inp)
        mb = inp.json_bytes / 1e6
        print(f"\n{inp.label}: {mb:.1f} MB JSON, {inp.events:,} events", file=sys.stderr, flush=True)
        runs: dict[str, list[Run]] = {t.key: [] for t in tools}
        for rnd in range(inp.rounds or args.repeat):
            for tool in tools:
                prior = runs[tool.key]
                if prior and prior[-1].status not in ("ok",):
                    continue  # it did not finish (or failed) on this input: once is enough
                if tool.key in dnf_at and inp.json_bytes >= dnf_at[tool.key][0]:
                    if not prior:
                        prior.append(
                            Run(status="skipped", detail=f"skipped: did not finish on {dnf_at[tool.key][1]}")
                        )
                    continue
                run = run_tool(tool, inp, args)
                prior.append(run)
                what = (
                    f"{run.wall_s:.2f} s, {run.rss_mb:.0f} MB (tree {run.tree_rss_mb:.0f} MB) {run.note}"
                    if run.status == "ok"
                    else run.detail
                )
                print(f"  round {rnd + 1} {NAMES[tool.key]}: {what}", file=sys.stderr, flush=True)
                if run.status in ("oom", "timeout"):
                    dnf_at[tool.key] = min(
                        dnf_at.get(tool.key, (inp.json_bytes, inp.label)), (inp.json_bytes, inp.label)
                    )
        rows.append({"input": inp, "runs": runs})

    load_end = os.getloadavg()
    tbl = table(rows, tools)
    foot = [
        "Time: best of the rounds, start to exit of the process (MB/s: JSON MB / time; the median of the rounds "
        "beside it, from 3 rounds on). Peak RSS: the largest "
        "ru_maxrss of the successful rounds (a forked child's ru_maxrss starts from the harness's own peak, "
        f"{_own_hwm_mb():.0f} MB here). Ratios: peer / stepscope, of the best times and of the peak RSS; "
        "paired: the median (min-max) over the rounds of peer / stepscope within a round.",
        f"Load average {load_end[0]:.2f} at the end; the whole run took {time.perf_counter() - t_all:.0f} s.",
    ]
    if any(r.note for row in rows for v in row["runs"].values() for r in v):
        foot.append(
            "* failed with the tool's default rounding of ns timestamps (an AssertionError in HTA's temporal "
            f"breakdown) and ran with {NS_ENV}=1, as bench_analyze.py does; the failed try is not counted."
        )
    print("\n" + tbl + "\n\n" + "\n".join(foot))
    report = "\n".join([*head, "", tbl, "", *foot])
    # the generated big files alone (--no-shared) are the scale table, the shared sets the end-to-end one
    name = "bench_peers_big" if args.no_shared else "bench_peers"
    write_markdown_result(name, "stepscope analyze and its peers, whole processes", [*head, tbl, *foot])
    if args.out:
        args.out.write_text(report + "\n")
        print(f"\nreport written to {args.out}", file=sys.stderr)
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "input": {
                            **row["input"].__dict__,
                            "path": str(row["input"].path),
                            "files": list(map(str, row["input"].files)),
                        },
                        "runs": {k: [_asdict(r) for r in v] for k, v in row["runs"].items()},
                    }
                    for row in rows
                ],
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
