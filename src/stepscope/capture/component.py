"""One component at a time: `profile_component(fn_or_module, inputs)` calls it over a wait / warmup / active
schedule under a performance monitor (each call is one step) and returns its time per call and FLOPs per call,
with a normal run folder holding the traces. `stepscope bench COMPONENTS.yaml` runs each variant of a registry
of components through here, each in a process of its own (`python -m stepscope.capture.component SPEC OUT`).
"""

from __future__ import annotations

import importlib
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from stepscope.capture.monitor import PerformanceMonitor
from stepscope.errors import ConfigError


class TensorSpec(msgspec.Struct, forbid_unknown_fields=True):
    """An input tensor: random normal for floating dtypes, random integers in [0, high) otherwise."""

    shape: list[int]
    dtype: str = "float32"
    high: int = 100
    requires_grad: bool = False


class ComponentSpec(msgspec.Struct, forbid_unknown_fields=True):
    """One variant of one component, as `stepscope bench` hands it to a child process."""

    name: str
    target: str  # "package.module:attribute": a class (built with kwargs) or a function
    kwargs: dict[str, Any] = {}
    inputs: list[TensorSpec] = []
    device: str = "cpu"
    dtype: str | None = None  # cast the module (and floating inputs) to this dtype
    compile: bool = False  # torch.compile the module or function
    backward: bool = False  # also run backward of the output's sum
    out_dir: str = "stepscope_runs"
    wait: int = 1
    warmup: int = 2
    active: int = 5
    seed: int = 0


class ComponentRun(msgspec.Struct):
    """What profiling one component gave."""

    name: str
    run_dir: str
    device: str
    calls: int  # active calls timed
    ms_per_call: float  # median wall time of the active calls (device synchronized)
    ms_min: float
    ms_max: float
    flops_per_call: int | None  # FlopCounterMode on one call (None when it could not count)
    flops_note: str | None = None


def resolve_target(target: str) -> Any:
    """`package.module:attribute` (or `package.module.attribute`) to the object."""
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"target {target!r}: expected 'package.module:attribute'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"target {target!r}: cannot import {module_name} ({exc})") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"target {target!r}: {module_name} has no attribute {attr!r}") from None
    return obj


def make_inputs(
    specs: Sequence[TensorSpec], device: str, dtype: str | None = None, seed: int = 0
) -> list[Any]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    out = []
    for spec in specs:
        kind = getattr(torch, spec.dtype, None)
        if not isinstance(kind, torch.dtype):
            raise ConfigError(f"input dtype {spec.dtype!r} is not a torch dtype")
        if kind.is_floating_point:
            tensor = torch.randn(spec.shape, generator=generator, dtype=torch.float32).to(kind)
            if dtype is not None:
                tensor = tensor.to(getattr(torch, dtype))
        else:
            tensor = torch.randint(0, spec.high, spec.shape, generator=generator, dtype=kind)
        tensor = tensor.to(device)
        if spec.requires_grad and tensor.is_floating_point():
            tensor.requires_grad_(True)
        out.append(tensor)
    return out


def profile_component(
    target: Any,
    inputs: Any = (),
    *,
    wait: int = 1,
    warmup: int = 2,
    active: int = 5,
    backward: bool = False,
    name: str | None = None,
    **options: Any,
) -> ComponentRun:
    """Profile `target(*inputs)` (a module or a function; `inputs` a tensor, a sequence of arguments or a
    mapping of keyword arguments) over `wait + warmup + active` calls, each one step of a performance monitor.
    With `backward=True` each call also runs backward of the output's sum. Other keyword arguments are monitor
    options (out_dir, record_shapes, ...); the report is off unless `report=True`."""
    import torch

    args, kwargs = _split_inputs(inputs)
    device = _device_of(args, kwargs)
    cuda = device.startswith("cuda")

    def call() -> Any:
        out = target(*args, **kwargs)
        if backward:
            _first_tensor(out).float().sum().backward()
        if cuda:
            torch.cuda.synchronize()
        return out

    flops, flops_note = _count_flops(call)
    options.setdefault("report", False)
    options.setdefault("console", False)
    monitor = PerformanceMonitor(
        target if isinstance(target, torch.nn.Module) else None,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=1,
        **options,
    )
    active_ms: list[float] = []
    monitor.add_step_listener(
        lambda line: active_ms.append(line.wall_ms) if line.phase in ("record", "record_and_save") else None
    )
    stepped = monitor(call)
    for _ in range(wait + warmup + active):
        stepped()
    monitor.close()
    label = name or getattr(target, "__qualname__", None) or type(target).__name__
    return ComponentRun(
        name=label,
        run_dir=str(monitor.run_dir),
        device=device,
        calls=len(active_ms),
        ms_per_call=statistics.median(active_ms) if active_ms else float("nan"),
        ms_min=min(active_ms, default=float("nan")),
        ms_max=max(active_ms, default=float("nan")),
        flops_per_call=flops,
        flops_note=flops_note,
    )


def _split_inputs(inputs: Any) -> tuple[list[Any], dict[str, Any]]:
    import torch

    if isinstance(inputs, torch.Tensor):
        return [inputs], {}
    if isinstance(inputs, Mapping):
        return [], dict(inputs)
    return list(inputs), {}


def _device_of(args: list[Any], kwargs: dict[str, Any]) -> str:
    import torch

    for value in [*args, *kwargs.values()]:
        if isinstance(value, torch.Tensor):
            return str(value.device)
    return "cpu"


def _first_tensor(out: Any) -> Any:
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        out = list(out.values())
    for item in out:
        if isinstance(item, torch.Tensor):
            return item
    raise TypeError("backward=True needs the component to return a tensor")


def _count_flops(call: Any) -> tuple[int | None, str | None]:
    """FLOPs of one call (an extra call before the schedule); None and why when torch cannot count them."""
    try:
        from stepscope.capture.collectors.flops import flop_counter

        with flop_counter() as mode:
            call()
        return int(mode.get_total_flops()), None
    except Exception as exc:  # e.g. a compiled function FlopCounterMode cannot see into
        return None, f"FLOPs not counted ({type(exc).__name__}: {exc})"


def run_spec(spec: ComponentSpec) -> ComponentRun:
    """Build the variant `spec` describes and profile it."""
    import torch

    torch.manual_seed(spec.seed)
    obj = resolve_target(spec.target)
    if isinstance(obj, type):
        obj = obj(**spec.kwargs)
    elif spec.kwargs:
        import functools

        obj = functools.partial(obj, **spec.kwargs)
    if isinstance(obj, torch.nn.Module):
        obj = obj.to(spec.device)
        if spec.dtype is not None:
            obj = obj.to(getattr(torch, spec.dtype))
    if spec.compile:
        obj = torch.compile(obj)
    inputs = make_inputs(spec.inputs, spec.device, spec.dtype, spec.seed)
    return profile_component(
        obj,
        inputs,
        wait=spec.wait,
        warmup=spec.warmup,
        active=spec.active,
        backward=spec.backward,
        name=spec.name,
        out_dir=spec.out_dir,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m stepscope.capture.component SPEC.json OUT.json`: one variant, in a process of its own."""
    argv = list(sys.argv[1:] if argv is None else argv)
    spec = msgspec.json.decode(Path(argv[0]).read_bytes(), type=ComponentSpec)
    try:
        result = run_spec(spec)
    except ConfigError as exc:
        sys.stderr.write(f"stepscope: error: {spec.name}: {exc}\n")
        return 2
    Path(argv[1]).write_bytes(msgspec.json.encode(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
