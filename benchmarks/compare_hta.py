"""Compare `stepscope analyze` with HTA 0.5.0 on every trace set in ../shared/traces: temporal breakdown and overlap.

HTA runs in its own virtual environment (it is never a stepscope dependency):
    python3 -m venv /work/hta-venv && /work/hta-venv/bin/pip install holistictraceanalysis 'pandas<3'
    .venv/bin/python benchmarks/compare_hta.py [--hta-python /work/hta-venv/bin/python] [--traces DIR]
Both sides use HTA's default window (the last ProfilerStep dropped). Where HTA's numbers differ from ours by more
than 0.05 pp, HTA runs again with HTA_DISABLE_NS_ROUNDING=1 ("ns-exact"); the closer of the two counts. Exit status
1 when a difference exceeds 1 pp on a trace where HTA runs, except for the differences listed in docs/analysis.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the one trace-loading adapter lives in tests/support/traces.py

from tests.support.traces import SHARED_TRACES, load  # noqa: E402

from _results import write_result  # noqa: E402
from stepscope.analysis.analyze import analyze  # noqa: E402

TOLERANCE_PP = 1.0
RETRY_PP = 0.05  # above this, HTA also runs without its ns rounding
# Traces where we differ from HTA on purpose (docs/analysis.md, "Agreement with HTA"): label prefix -> reason.
KNOWN_DIFFERENCES = {
    "hta_critical_path/cuda_event_sync/": "cuda_sync records are not GPU activity",
    "kineto_docs_traces/": "cuda_sync records are not GPU activity",
    "hta_trace_compare/": "GPU activity without launch records is kept",
}
FIELDS = ("idle_pct", "compute_pct", "non_compute_pct", "overlap_pct")
# files that are not Kineto chrome traces of a run
SKIP_SUFFIXES = ("_et.json.gz", "_et.json")


def trace_units(root: Path) -> Iterator[tuple[str, dict[int, Path]]]:
    """(label, {rank: file}) per analysable unit: a folder of distinct-rank files is one unit, else one per file."""
    folders: dict[Path, list[Path]] = {}
    for f in sorted(root.rglob("*.json*")):
        if f.name.endswith((".json", ".json.gz")) and not f.name.endswith(SKIP_SUFFIXES):
            folders.setdefault(f.parent, []).append(f)
    for folder, files in sorted(folders.items()):
        ranks = [_distributed_rank(f) for f in files]
        label = str(folder.relative_to(root))
        if len(files) > 1 and None not in ranks and len(set(ranks)) == len(ranks):
            yield label, {r: f for r, f in zip(ranks, files, strict=True)}  # type: ignore[misc]
        else:
            for f in files:
                yield f"{label}/{f.name}", {0: f}


def _distributed_rank(path: Path) -> int | None:
    raw = path.read_bytes()
    try:
        doc = json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)
    except (OSError, ValueError):
        return None
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if isinstance(rank, int) else None


def run_hta(
    hta_python: str, files: dict[int, Path], mode: str = "compare", *, ns_exact: bool = False
) -> dict:
    """HTA's numbers for one unit, from a subprocess in HTA's venv (`ns_exact`: HTA's ns rounding turned off)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec:
        json.dump({"files": {str(r): str(p) for r, p in files.items()}}, spec)
    try:
        proc = subprocess.run(
            [hta_python, str(ROOT / "benchmarks" / "_hta_runner.py"), mode, spec.name],
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "HTA_DISABLE_NS_ROUNDING": "1" if ns_exact else "0"},
        )
    finally:
        Path(spec.name).unlink()
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"runner failed: {tail[:200]}"}
    result: dict = json.loads(lines[-1])
    return result


def ours(files: dict[int, Path]) -> dict[int, dict]:
    """Our numbers for one unit; ranks keyed like HTA's (the file's distributedInfo rank, else 0)."""
    out: dict[int, dict] = {}
    for want_rank, path in files.items():
        table = load(path)
        result = analyze(table, drop_last_step=True)
        for r in result.ranks:
            t = r.temporal
            out[want_rank] = {
                "idle_pct": t.idle_pct if t else None,
                "compute_pct": t.compute_pct if t else None,
                "non_compute_pct": t.non_compute_pct if t else None,
                "overlap_pct": r.overlap_pct,
                "span_us": t.span_us if t else None,
                "note": "; ".join(r.notes),
            }
    return out


def _verdict(rank: int, mine: dict, hta: dict) -> tuple[float | None, dict | None]:
    """(largest difference in percentage points, HTA's row) for one rank; (None, None) when HTA failed."""
    h = (hta.get("ranks") or {}).get(str(rank))
    if h is None:
        return None, None
    diffs = []
    for k in FIELDS:
        hv, mv = h.get(k), mine[k]
        if hv is None and mv is None:
            continue
        diffs.append(abs(hv - mv) if hv is not None and mv is not None else float("inf"))
    return max(diffs, default=0.0), h


def _row(values: dict | None) -> str:
    return "-" if values is None else "/".join(_fmt(values.get(k)) for k in FIELDS)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hta-python", default="/work/hta-venv/bin/python")
    parser.add_argument("--traces", type=Path, default=SHARED_TRACES)
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args(argv)
    if not args.traces.is_dir():
        print(f"no traces at {args.traces}", file=sys.stderr)
        return 2
    header = (
        "trace",
        "rank",
        "HTA idle/comp/non/ovl %",
        "HTA ns-exact",
        "stepscope idle/comp/non/ovl %",
        "|Δ| pp",
        "status",
    )
    rows: list[tuple[str, ...]] = []
    records = []
    failures = 0
    for label, files in trace_units(args.traces.resolve()):
        mine = ours(files)
        hta = run_hta(args.hta_python, files)
        default = {rank: _verdict(rank, mine[rank], hta) for rank in mine}
        exact: dict[int, tuple[float | None, dict | None]] = {}
        if any(d is None or d > RETRY_PP for d, _ in default.values()):
            # HTA rounds ns-resolution timestamps inward to whole us by default; compare with that off as well
            hta_exact = run_hta(args.hta_python, files, ns_exact=True)
            exact = {rank: _verdict(rank, mine[rank], hta_exact) for rank in mine}
        for rank in sorted(mine):
            d, h = default[rank]
            e, he = exact.get(rank, (None, None))
            diffs = [x for x in (d, e) if x is not None]
            worst = min(diffs) if diffs else None
            known = next((why for prefix, why in KNOWN_DIFFERENCES.items() if label.startswith(prefix)), None)
            if worst is None:
                status = f"HTA fails: {hta.get('error', 'no result for this rank')}"
            elif worst <= TOLERANCE_PP:
                status = "agree"
            elif known:
                status = f"differs on purpose: {known}"
            else:
                status = "DIFFER"
                failures += 1
            delta = "/".join("-" if x is None else f"{x:.2f}" for x in (d, e)) if exact else _fmt(d)
            rows.append((label, str(rank), _row(h), _row(he), _row(mine[rank]), delta, status))
            records.append(
                {
                    "trace": label,
                    "rank": rank,
                    "hta": h,
                    "hta_ns_exact": he,
                    "ours": mine[rank],
                    "diff_pp": d,
                    "diff_ns_exact_pp": e,
                    "status": status,
                }
            )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    write_result("compare_hta", "Temporal breakdown and overlap against HTA", header, rows, figures=records)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
