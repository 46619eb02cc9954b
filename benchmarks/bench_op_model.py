"""The op model (`stepscope ops`, issue 46) against an independent count on the shared traces with recorded
shapes: every GEMM, convolution and attention call's FLOPs against torch.utils.flop_counter on the same shapes
(meta tensors on the CPU: the op runs under FlopCounterMode, or its registered formula takes the shapes), and the
bytes of every elementwise and normalization call against the tensors the dispatcher sees when the same op runs
on meta tensors (its inputs and outputs, each counted once).

    .venv/bin/python benchmarks/bench_op_model.py [--traces ../shared/traces]

Per trace and family: the calls compared, the largest relative difference, and the calls not compared with why
(an op torch cannot run on meta tensors, or a 2021 convolution whose stride the trace lacks: there the output
shape of the same layer's backward is what both counts use). flop_counter counts a causal attention whole; the
model counts half (the kernel skips the masked half), so a causal call is compared at twice the model's count.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path
from typing import Any

from _results import ROOT, write_result
from stepscope.analysis.ops.calls import OpCall, read_calls
from stepscope.analysis.ops.model import DTYPE_BYTES

TRACES = (
    "tracelens_qwen1.5_h100_mi300/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens_qwen1.5_h100_mi300/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "kineto_resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    "kineto_resnet50_num_workers_4/worker0.1623213129365.pt.trace.json.gz",
    # checked after the model was written (held out): a 2023 GPU trace with shapes, and an MI250 toy job
    "hta_rank_non_gpu/rank_non_gpu.json.gz",
    "hta_amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
)
FLOP_FAMILIES = ("gemm", "conv", "attention")
BYTE_FAMILIES = ("elementwise", "norm")


def _dtype(name: str) -> Any:
    import torch

    return {
        "float": torch.float32,
        "double": torch.float64,
        "c10::Half": torch.float16,
        "c10::BFloat16": torch.bfloat16,
        "long int": torch.int64,
        "long": torch.int64,
        "int": torch.int32,
        "short int": torch.int16,
        "signed char": torch.int8,
        "bool": torch.bool,
        "unsigned char": torch.uint8,
    }.get(name, torch.float32)


def _scalar(text: str) -> Any:
    text = text.strip()
    if text in ("True", "False"):
        return text == "True"
    if text.startswith("["):
        return [int(x) for x in re.findall(r"-?\d+", text)]
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _args(call: OpCall) -> list[Any]:
    """The call's arguments rebuilt: meta tensors of the recorded shapes and dtypes, scalars from their text."""
    import torch

    out: list[Any] = []
    concrete = call.inputs.concrete
    for i, d in enumerate(call.inputs.dims):
        t = call.inputs.types[i] if i < len(call.inputs.types) else ""
        if isinstance(d, list) and all(isinstance(x, int) for x in d) and t in DTYPE_BYTES:
            out.append(torch.empty(d, dtype=_dtype(t), device="meta"))
        elif t == "TensorList" and isinstance(d, list):
            out.append([torch.empty(x, device="meta") for x in d])
        elif i < len(concrete) and concrete[i]:
            out.append(_scalar(concrete[i]))
        else:  # a 2021 trace records no values: any of the type serves (bytes and FLOPs do not depend on it)
            out.append({"Int": 1, "Long": 1, "Double": 1.0, "Float": 1.0, "Bool": False, "Scalar": 1}.get(t))
    while out and out[-1] is None:
        out.pop()
    return out


def _flops_by_torch(call: OpCall, conv_out: list[int] | None) -> tuple[float | None, str]:
    """flop_counter's count for the call, or None and why it could not be made."""
    import torch
    import torch.nn.functional as F
    from torch.utils import flop_counter as fc

    args = _args(call)
    name = call.name.removeprefix("aten::")
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    try:
        if call.cost.family == "attention":
            q, k, v = tensors[:3] if "backward" not in name else tensors[1:4]
            shapes = [list(t.shape) for t in (q, k, v)]
            if name.startswith(("_flash_attention", "_efficient_attention")):  # [b, l, h, d] -> [b, h, l, d]
                shapes = [[s[0], s[2], s[1], s[3]] for s in shapes]
            if "backward" in name:
                count = fc.sdpa_backward_flop_count([*shapes[0][:3], shapes[2][3]], *shapes)
            else:
                count = fc.sdpa_flop_count(*shapes)
            return float(count) * (0.5 if call.cost.causal else 1.0), ""
        if call.cost.family == "conv":
            if "backward" in name:
                grad, x, w = (
                    (tensors[0], tensors[1], tensors[2])
                    if name == "convolution_backward"
                    else (
                        tensors[1],
                        tensors[0],
                        tensors[2],
                    )
                )
                one = fc.conv_flop_count(list(x.shape), list(w.shape), list(grad.shape))
                # the gradients it computes (1 or 2) are the model's reading of the trace (its output mask, or
                # the parts under it in a 2021 trace): compared per gradient
                grads = round((call.cost.flops or 0.0) / one) if one else 0
                if grads not in (1, 2):
                    return None, "gradients"
                return float(grads * one), "a backward per gradient"
            if conv_out is not None:
                x, w = tensors[:2]
                return float(
                    fc.conv_flop_count(list(x.shape), list(w.shape), conv_out)
                ), "output from the backward"
        with fc.FlopCounterMode(display=False) as mode:
            if name == "linear":
                F.linear(*args[:3])
            elif name == "matmul":
                torch.matmul(*args[:2])
            elif call.cost.family == "conv":
                x, w = tensors[:2]
                stride, padding, dilation = (
                    (args[3], args[4], args[5])
                    if name.startswith("conv")
                    or name
                    in (
                        "convolution",
                        "_convolution",
                    )
                    else (args[3], args[2], args[4])
                )
                groups = x.shape[1] // w.shape[1]
                spatial = x.dim() - 2
                torch.ops.aten.convolution(
                    x, w, None, stride, padding, dilation, False, [0] * spatial, groups
                )
            else:
                _run(name, args)
        return float(mode.get_total_flops()), ""
    except Exception as exc:  # an op that will not run on meta tensors, or arguments the trace lacks
        return None, f"{type(exc).__name__}"


def _run(name: str, args: list[Any]) -> Any:
    """aten's `name` called with the recorded arguments: each overload tried, its keyword-only arguments (an
    add's alpha, an addmm's beta) given by name, trailing ones the trace left empty left to their defaults."""
    import torch

    packet = getattr(torch.ops.aten, name)
    problem: Exception | None = None
    for overload in packet.overloads():
        op = getattr(packet, overload)
        params = op._schema.arguments
        if len(args) > len(params):
            continue
        positional, named = [], {}
        for param, value in zip(params, args, strict=False):
            if param.kwarg_only:
                if value is not None:
                    named[param.name] = value
            else:
                positional.append(value)
        try:
            return op(*positional, **named)
        except Exception as exc:  # the next overload
            problem = exc
    raise problem or RuntimeError(f"no overload of {name} takes these arguments")


# cuDNN's batch norm has no meta kernel: its CPU twin runs on the same tensors (the argument orders differ)
def _cudnn_twin(name: str, args: list[Any]) -> tuple[str, list[Any]]:
    if name == "cudnn_batch_norm":
        x, w, b, mean, var = args[:5]
        return "native_batch_norm", [x, w, b, mean, var, True, 0.1, 1e-5]
    if name == "cudnn_batch_norm_backward":
        x, grad, w, mean, var, save_mean, save_var = args[:7]
        return "native_batch_norm_backward", [
            grad,
            x,
            w,
            mean,
            var,
            save_mean,
            save_var,
            True,
            1e-5,
            [True] * 3,
        ]
    if name == "native_layer_norm" and len(args) > 2 and args[1] is None and args[2] is not None:
        # a trace without concrete inputs lacks normalized_shape: the weight's shape is it
        return name, [args[0], list(args[2].shape), *args[2:]]
    return name, args


def _bytes_by_torch(call: OpCall) -> tuple[float | None, str]:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    seen = [0.0]
    counted: set[int] = set()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves((args, kwargs, out)):
                if isinstance(t, torch.Tensor) and id(t) not in counted:
                    counted.add(id(t))
                    seen[0] += t.numel() * t.element_size()
            return out

    name, args = _cudnn_twin(call.name.removeprefix("aten::"), _args(call))
    try:
        with Count():
            _run(name, args)
    except Exception as exc:
        return None, type(exc).__name__
    in_place = name.endswith("_")
    # an in-place op returns its `self`: one tensor read and written (the dispatcher shows it once as the input)
    if in_place and args and isinstance(args[0], torch.Tensor):
        seen[0] += args[0].numel() * args[0].element_size()
    return seen[0], "its CPU twin (cuDNN has no meta kernel)" if name != call.name.removeprefix(
        "aten::"
    ) else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--calls", type=int, default=12, help="calls of each product in the CPU job")
    parser.add_argument("--size", default="40M", help="the smaller trace of the scale part (make_big_trace)")
    parser.add_argument("--factor", type=int, default=4, help="the larger trace: this many times the smaller")
    args = parser.parse_args()
    scale(args.traces / TRACES[0], args.size, args.factor)
    cpu_job(args.calls)
    rows = []
    figures: dict[str, Any] = {}
    for rel in TRACES:
        path = args.traces / rel
        if not path.is_file():
            print(f"{path}: missing, skipped", file=sys.stderr)
            continue
        found = read_calls(path)
        conv_out = _conv_outputs(found.calls)
        per: dict[str, dict[str, Any]] = collections.defaultdict(
            lambda: {"compared": 0, "max_diff": 0.0, "not": collections.Counter(), "notes": set()}
        )
        for call in found.calls:
            family = call.cost.family
            if family in FLOP_FAMILIES:
                theirs, note = _flops_by_torch(call, conv_out.get(_conv_key(call)))
                ours = call.cost.flops
            elif family in BYTE_FAMILIES:
                theirs, note = _bytes_by_torch(call)
                ours = call.cost.bytes
            else:
                continue
            entry = per[family]
            if theirs is None or ours is None or theirs <= 0:
                entry["not"][f"{call.name} ({note or 'nothing counted'})"] += 1
                continue
            entry["compared"] += 1
            entry["max_diff"] = max(entry["max_diff"], abs(ours - theirs) / theirs)
            if note:
                entry["notes"].add(note)
        for family, entry in sorted(per.items()):
            what = "FLOPs" if family in FLOP_FAMILIES else "bytes"
            left = ", ".join(f"{n} x{k}" for k, n in entry["not"].most_common(4)) or "-"
            rows.append(
                [
                    "/".join(Path(rel).parts[:-1]) + ": " + Path(rel).name[:20],
                    family,
                    what,
                    entry["compared"],
                    f"{100 * entry['max_diff']:.3f}%",
                    left,
                    "; ".join(sorted(entry["notes"])) or "-",
                ]
            )
            figures.setdefault(rel, {})[family] = {
                "compared": entry["compared"],
                "max_relative_difference": entry["max_diff"],
                "not_compared": dict(entry["not"]),
            }
    write_result(
        "bench_op_model",
        "The op model against torch.utils.flop_counter and the dispatcher's tensors, on the shared traces",
        ["trace", "family", "counted", "calls compared", "largest difference", "not compared", "how"],
        rows,
        figures=figures,
        notes=[
            "FLOPs: torch.utils.flop_counter on meta tensors of the recorded shapes (causal attention at half its "
            "count); bytes: the tensors an op takes and returns when it runs on meta tensors.",
        ],
    )
    for row in rows:
        print(" | ".join(map(str, row)))


def scale(base: Path, size: str, factor: int) -> None:
    """`stepscope ops` of the Qwen H100 trace repeated to SIZE and FACTOR x SIZE of JSON (make_big_trace.py):
    whole processes, the cache off; the growth exponent log(t2/t1) / log(bytes2/bytes1) and the peak memory."""
    import math
    import resource
    import subprocess
    import tempfile
    import time

    from make_big_trace import parse_size

    if not base.is_file():
        print(f"{base}: missing, the scale part skipped", file=sys.stderr)
        return
    rows, figures = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for n, target in enumerate((parse_size(size), factor * parse_size(size))):
            trace = Path(tmp) / f"{n}.json"
            subprocess.run(
                [sys.executable, str(ROOT / "benchmarks" / "make_big_trace.py"), "--base", str(base), "--size",
                 str(target), "--out", str(trace)],
                check=True, capture_output=True,
            )  # fmt: skip
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "stepscope", "--no-cache", "ops", str(trace), "--json"],
                check=True, capture_output=True,
            )  # fmt: skip
            seconds = time.perf_counter() - start
            peak_mb = (
                resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            )  # (the largest child so far)
            mb = trace.stat().st_size / 1e6
            figures.append({"json_mb": mb, "seconds": seconds, "peak_mb": peak_mb})
    exponent = math.log(figures[1]["seconds"] / figures[0]["seconds"]) / math.log(
        figures[1]["json_mb"] / figures[0]["json_mb"]
    )
    for f in figures:
        rows.append([f"{f['json_mb']:.0f} MB", f"{f['seconds']:.2f} s", f"{f['json_mb'] / f['seconds']:.0f} MB/s",
                     f"{f['peak_mb']:.0f} MB"])  # fmt: skip
    write_result(
        "bench_op_model_scale",
        "stepscope ops on a big trace: time and memory at two sizes",
        ["JSON", "stepscope ops --json (whole process)", "rate", "largest process so far"],
        rows,
        figures={"sizes": figures, "exponent": exponent},
        notes=[
            f"The Qwen H100 trace (with_stack: python_function events) repeated by make_big_trace.py; the cache "
            f"off. Growth exponent {exponent:.2f} (1: linear)."
        ],
    )


def cpu_job(calls: int) -> None:
    """A CPU job of products of good and bad sizes (1024 against 1025 and 1023): their efficiency in the table
    (any roof: on one roof the order is the achieved rates'), and their achieved GFLOP/s against a timing of
    the same product outside the profiler (the median of `calls` calls, one thread, as in the job)."""
    import statistics
    import tempfile
    import time

    import torch

    from stepscope.analysis.ops import ops_source
    from stepscope.analysis.options import AnalysisOptions

    torch.set_num_threads(1)
    sizes = {"1024": 1024, "1025": 1025, "1023": 1023}
    mats = {k: (torch.randn(n, n), torch.randn(n, n)) for k, n in sizes.items()}

    def job() -> None:
        for _ in range(calls):
            for a, b in mats.values():
                torch.mm(a, b)

    def timed(a: Any, b: Any) -> float:
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    job()  # warm up
    before = {k: timed(*m) for k, m in mats.items()}
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "job.json"
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
        ) as p:
            job()
        p.export_chrome_trace(str(trace))
        result = ops_source(trace, AnalysisOptions(peak_tflops=1.0, peak_tbps=0.02))
    after = {k: timed(*m) for k, m in mats.items()}
    groups = {g.shapes.split(",")[0].strip("["): g for g in result.ranks[0].groups if g.name == "aten::mm"}
    rows = []
    figures = {}
    for key, n in sizes.items():
        g = groups[str(n)]
        timing = 2.0 * n**3 / statistics.mean([before[key], after[key]]) / 1e9
        ours = (g.tflops or 0.0) * 1e3
        rows.append(
            [
                f"[{n}, {n}] x [{n}, {n}]",
                g.calls,
                f"{ours:.1f}",
                f"{timing:.1f}",
                f"{100 * (ours / timing - 1):+.1f}%",
                f"{100 * (g.efficiency or 0.0):.1f}%",
            ]
        )
        figures[key] = {"gflops_table": ours, "gflops_timed": timing, "efficiency": g.efficiency}
    order = sorted(sizes, key=lambda k: -(figures[k]["efficiency"] or 0.0))
    write_result(
        "bench_op_model_cpu",
        "A CPU job of products of good and bad sizes: the table's rates against a timing of the same product",
        ["product", "calls", "GFLOP/s (ops table)", "GFLOP/s (timed)", "table vs timed", "of roof"],
        rows,
        figures={"sizes": figures, "order_by_efficiency": order},
        notes=[
            f"One thread; roof given as 1 TFLOP/s (any roof orders the products as their rates); the timing is the "
            f"median of {calls} calls before and after the profiled job. Ranked by efficiency: {', '.join(order)}."
        ],
    )
    for row in rows:
        print(" | ".join(map(str, row)))


def _conv_key(call: OpCall) -> Any:
    from stepscope.analysis.ops.model import conv_forward_shapes

    return conv_forward_shapes(call.name, call.inputs)


def _conv_outputs(calls: list[OpCall]) -> dict[Any, list[int]]:
    from stepscope.analysis.ops.model import conv_backward_shapes

    out = {}
    for call in calls:
        found = conv_backward_shapes(call.name, call.inputs)
        if found is not None:
            out[(found[0], found[1])] = found[2]
    return out


if __name__ == "__main__":
    main()
