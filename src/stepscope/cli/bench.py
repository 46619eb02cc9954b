"""`stepscope bench COMPONENTS.yaml`: profile each variant of a registry of components in isolation (a process
and a run folder of its own) and compare them side by side: time per call, FLOPs, top ops and kernels.

The registry:

    out_dir: stepscope_runs/bench      # optional; each variant gets a run folder under it
    device: cpu                        # optional default for every component
    schedule: {wait: 1, warmup: 2, active: 5}
    components:
      - name: rmsnorm
        target: my_models.norms:RMSNorm    # a class (built with kwargs) or a function; found next to the YAML too
        kwargs: {dim: 1024}
        inputs: [{shape: [8, 512, 1024], dtype: float32}]
        backward: false
        variants:                      # optional; each overrides the component's fields
          - {name: eager}
          - {name: compiled, compile: true}
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stepscope.cli._common import print_json
from stepscope.errors import InputError
from stepscope.units import plain

BENCH_SCHEMA = "stepscope.bench/1"
TOP = 3


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputSpec(_Strict):
    shape: list[int]
    dtype: str = "float32"
    high: int = 100
    requires_grad: bool = False


class Variant(_Strict):
    name: str
    kwargs: dict[str, Any] = Field(default_factory=dict)  # merged over the component's
    compile: bool | None = None
    dtype: str | None = None
    device: str | None = None
    backward: bool | None = None


class Component(_Strict):
    name: str
    target: str
    kwargs: dict[str, Any] = Field(default_factory=dict)
    inputs: list[InputSpec] = Field(default_factory=list)
    device: str | None = None
    dtype: str | None = None
    compile: bool = False
    backward: bool = False
    variants: list[Variant] = Field(default_factory=list)


class Schedule(_Strict):
    wait: int = Field(1, ge=0)
    warmup: int = Field(2, ge=0)
    active: int = Field(5, ge=1)


class Registry(_Strict):
    out_dir: str = "stepscope_runs/bench"
    device: str = "cpu"
    schedule: Schedule = Field(default_factory=lambda: Schedule.model_validate({}))
    components: list[Component] = Field(min_length=1)


class VariantResult(msgspec.Struct):
    component: str
    variant: str
    run_dir: str | None
    ms_per_call: float | None
    ms_min: float | None
    ms_max: float | None
    calls: int
    flops_per_call: int | None
    gflops_per_s: float | None
    vs_first: float | None  # time per call / the component's first variant's
    top_ops: list[list[Any]]  # [name, self us per call]
    top_kernels: list[list[Any]]  # [name, us per call]
    error: str | None = None


class BenchResult(msgspec.Struct):
    schema: str
    registry: str
    results: list[VariantResult]


def read_registry(path: Path) -> Registry:
    from stepscope.capture.config import read_yaml_mapping

    data = read_yaml_mapping(path, "expected a mapping with `components:` at the top level")
    try:
        return Registry.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InputError(path, f"{where}: {first['msg']} ({exc.error_count()} problem(s))") from None


def specs(registry: Registry) -> list[tuple[str, str, dict[str, Any]]]:
    """(component, variant, ComponentSpec fields) for every variant, in file order."""
    out = []
    for comp in registry.components:
        variants = comp.variants or [Variant(name="default")]
        for var in variants:
            fields = {
                "name": f"{comp.name}/{var.name}",
                "target": comp.target,
                "kwargs": {**comp.kwargs, **var.kwargs},
                "inputs": [i.model_dump() for i in comp.inputs],
                "device": var.device or comp.device or registry.device,
                "dtype": var.dtype or comp.dtype,
                "compile": comp.compile if var.compile is None else var.compile,
                "backward": comp.backward if var.backward is None else var.backward,
                "out_dir": str(Path(registry.out_dir) / comp.name / var.name),
                **registry.schedule.model_dump(),
            }
            out.append((comp.name, var.name, fields))
    return out


def run_variant(fields: dict[str, Any], search_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """Profile one variant in a child process; (ComponentRun as a dict, None) or (None, why not)."""
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-") as tmp:
        spec, out = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec.write_bytes(msgspec.json.encode(fields))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(search_dir), env.get("PYTHONPATH", "")) if p)
        done = subprocess.run(
            [sys.executable, "-m", "stepscope.capture.component", str(spec), str(out)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 or not out.is_file():
            lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
            return None, (lines[-1] if lines else f"exited {done.returncode}")
        result: dict[str, Any] = msgspec.json.decode(out.read_bytes())
        return result, None


def _tops(run_dir: str, calls: int) -> tuple[list[list[Any]], list[list[Any]]]:
    from stepscope.analysis.per_rank.summary import summarize
    from stepscope.analysis.read.loader import load_trace

    summary = summarize(load_trace(run_dir), top=TOP + 1)  # + the ProfilerStep row, left out
    per = max(calls, 1)
    rank = summary.ranks[0] if summary.ranks else None
    if rank is None:
        return [], []
    ops = [[op.name, op.self_us / per] for op in rank.ops if not op.name.startswith("ProfilerStep")]
    kernels = [[k.name, k.total_us / per] for k in rank.kernels[:TOP]]
    return ops[:TOP], kernels


@click.command(name="bench")
@click.argument("registry_path", metavar="COMPONENTS.yaml", type=click.Path(path_type=Path))
@click.option("--only", multiple=True, metavar="NAME", help="Only these components (repeatable).")
@click.option("--out-dir", default=None, help="Folder for the run folders (default: the registry's out_dir).")
@click.option("--json", "as_json", is_flag=True, help=f'Print one JSON document (schema "{BENCH_SCHEMA}").')
def command(registry_path: Path, only: tuple[str, ...], out_dir: str | None, as_json: bool) -> int:
    """Profile every variant of the components in COMPONENTS.yaml, each in its own process and run folder,
    and compare them: median time per call, FLOPs per call, throughput, top ops and kernels per call."""
    registry = read_registry(registry_path)
    if out_dir is not None:
        registry.out_dir = out_dir
    known = {c.name for c in registry.components}
    unknown = [name for name in only if name not in known]
    if unknown:
        raise InputError(registry_path, f"no component named {', '.join(map(repr, unknown))}")
    todo = [s for s in specs(registry) if not only or s[0] in only]
    results: list[VariantResult] = []
    first_ms: dict[str, float] = {}
    for comp, var, fields in todo:
        sys.stderr.write(f"stepscope: bench: {plain(comp)}/{plain(var)} ...\n")
        run, error = run_variant(fields, registry_path.resolve().parent)
        if run is None:
            results.append(
                VariantResult(comp, var, None, None, None, None, 0, None, None, None, [], [], error)
            )
            continue
        ms, flops = run["ms_per_call"], run["flops_per_call"]
        first_ms.setdefault(comp, ms)
        ops, kernels = _tops(run["run_dir"], run["calls"])
        results.append(
            VariantResult(
                component=comp,
                variant=var,
                run_dir=run["run_dir"],
                ms_per_call=ms,
                ms_min=run["ms_min"],
                ms_max=run["ms_max"],
                calls=run["calls"],
                flops_per_call=flops,
                gflops_per_s=flops / ms / 1e6 if flops and ms else None,
                vs_first=ms / first_ms[comp] if first_ms[comp] else None,
                top_ops=ops,
                top_kernels=kernels,
            )
        )
    document = BenchResult(schema=BENCH_SCHEMA, registry=str(registry_path), results=results)
    if as_json:
        print_json(document)
    else:
        _print(document)
    return 1 if any(r.error for r in results) else 0


def _print(document: BenchResult) -> None:
    from stepscope.cli._common import console
    from stepscope.report.terminal import fmt_ms, fmt_us, make_table
    from stepscope.units import significant

    rows = []
    for r in document.results:
        if r.error:
            rows.append([r.component, r.variant, "failed: " + r.error, "", "", "", ""])
            continue
        top = "; ".join(f"{name} {fmt_us(us)}" for name, us in (r.top_kernels or r.top_ops)[:TOP])
        rows.append(
            [
                r.component,
                r.variant,
                top,
                fmt_ms(r.ms_per_call),
                f"{r.vs_first:.2f}x" if r.vs_first is not None else "-",
                significant(r.flops_per_call / 1e6) if r.flops_per_call is not None else "-",
                significant(r.gflops_per_s) if r.gflops_per_s is not None else "-",
            ]
        )
    columns = [
        "component",
        "variant",
        "top kernels (or ops), per call",
        "time\nper call",
        "vs\nfirst",
        "MFLOP\nper call",
        "GFLOP/s",
    ]
    out = console()
    out.print(make_table("stepscope bench: median of the active calls", columns, rows, numeric_from=3))
    for r in document.results:
        if r.run_dir:
            out.print(plain(f"  {r.component}/{r.variant}: {r.run_dir}"), markup=False, highlight=False)
