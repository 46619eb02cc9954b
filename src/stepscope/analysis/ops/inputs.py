"""An op call's recorded inputs (`record_shapes=True`: Kineto's `Input Dims`, `Input type`, `Concrete Inputs`)
and how the op model reads them: tensors' shapes and dtypes, ints, flags, broadcasting; the cost it gives a
call (`Cost`). No torch: the dtypes are the trace's names."""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

__all__ = [
    "DTYPE_BYTES",
    "DTYPE_FORMAT",
    "SCALAR_TYPE_BYTES",
    "Cost",
    "OpInputs",
    "broadcast",
    "flag_of",
    "ints_of",
    "is_shape",
    "list_dtype",
    "mask_of",
    "nbytes",
    "numel",
    "read_bytes",
    "tensor_of",
    "tensors_of",
    "unique_numel",
]

# Bytes per element of a tensor's dtype as the trace names it (case matters: the 2021 schema names its scalar
# arguments "Int", "Double", "Bool", and only lower-case names are tensors there).
DTYPE_BYTES: dict[str, int] = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "long": 8,  # (some 2023 traces)
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}
# The number format of a dtype for the peak table (devices.DTYPES); others have no peak.
DTYPE_FORMAT: dict[str, str] = {
    "float": "fp32",
    "c10::BFloat16": "bf16",
    "c10::Half": "fp16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
}
# torch's ScalarType codes, as a `dtype` argument is recorded in `Concrete Inputs` (aten::_to_copy): bytes.
SCALAR_TYPE_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2, 23: 1, 24: 1}


class OpInputs(msgspec.Struct, frozen=True):
    """An op call's recorded inputs, as the trace lists them (one entry per argument)."""

    dims: list[Any]
    types: list[str]
    concrete: list[str] = msgspec.field(default_factory=list)
    strides: list[Any] = msgspec.field(default_factory=list)  # `Input Strides` where recorded


class Cost(msgspec.Struct, frozen=True):
    """What one call computes and moves. `flops` None: the family has no FLOP count (copies, embeddings,
    optimizers); `dtype`: the number format its FLOPs run in (the peak it is judged against)."""

    family: str
    flops: float | None
    bytes: float
    dtype: str | None
    causal: bool = False


# --- reading the recorded inputs -----------------------------------------------------------------------
def is_shape(d: Any) -> bool:
    return isinstance(d, list) and all(isinstance(x, int) for x in d)


def tensor_of(inputs: OpInputs, i: int) -> tuple[list[int], str] | None:
    """Argument `i` as (shape, dtype name) when it is a tensor the trace gives the shape of."""
    if i < 0 or i >= len(inputs.dims) or i >= len(inputs.types):
        return None
    d, t = inputs.dims[i], inputs.types[i]
    if not is_shape(d) or t not in DTYPE_BYTES:
        return None
    return d, t


def tensors_of(inputs: OpInputs) -> list[tuple[list[int], str]]:
    """Every tensor argument (a tensor list's members too)."""
    out = []
    for i, d in enumerate(inputs.dims):
        t = inputs.types[i] if i < len(inputs.types) else ""
        if is_shape(d) and t in DTYPE_BYTES:
            out.append((d, t))
        elif isinstance(d, list) and d and all(is_shape(x) for x in d):
            # a TensorList: its members' dtype is not recorded; the list's neighbours' is the best guess
            out.extend((x, list_dtype(inputs)) for x in d)
    return out


def read_bytes(inputs: OpInputs) -> float:
    """What reading every tensor argument takes at least: a tensor expanded over a dimension (stride 0, as
    `expand` and broadcasting views make) is read once, not once per element it is seen at."""
    total = 0.0
    for i, d in enumerate(inputs.dims):
        t = inputs.types[i] if i < len(inputs.types) else ""
        if is_shape(d) and t in DTYPE_BYTES:
            total += unique_numel(inputs, i) * DTYPE_BYTES[t]
        elif isinstance(d, list) and d and all(is_shape(x) for x in d):
            total += sum(nbytes(x, list_dtype(inputs)) for x in d)
    return total


def unique_numel(inputs: OpInputs, i: int) -> int:
    """The distinct elements tensor argument `i` holds: its dimensions with a stride of 0 hold one."""
    shape = inputs.dims[i]
    strides: Any = inputs.strides[i] if i < len(inputs.strides) else None
    if strides is None or not is_shape(strides) or len(strides) != len(shape):
        return numel(shape)
    return numel([n for n, stride in zip(shape, strides, strict=True) if stride != 0])


def list_dtype(inputs: OpInputs) -> str:
    for t in inputs.types:
        if t in DTYPE_BYTES:
            return t
    return "float"


def numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def nbytes(shape: list[int], dtype: str) -> float:
    return float(numel(shape) * DTYPE_BYTES[dtype])


def ints_of(text: str) -> list[int] | None:
    """A recorded list of ints (`"[1, 1]"`) or one int (`"2"`); None when it is neither."""
    text = text.strip()
    if not text:
        return None
    found = re.findall(r"-?\d+", text)
    if text.startswith("["):
        return [int(x) for x in found]
    try:
        return [int(text)]
    except ValueError:
        return None


def flag_of(inputs: OpInputs, i: int) -> bool | None:
    if i < 0 or i >= len(inputs.concrete):
        return None
    text = inputs.concrete[i].strip()
    return {"True": True, "False": False, "1": True, "0": False}.get(text)


def mask_of(inputs: OpInputs, i: int) -> list[bool] | None:
    """A backward's recorded output mask (`"[True, True, False]"`: which gradients it computes); None where the
    trace does not give it."""
    if not 0 <= i < len(inputs.concrete):
        return None
    flags = re.findall(r"True|False", inputs.concrete[i])
    return [f == "True" for f in flags] or None


def broadcast(shapes: list[list[int]]) -> list[int]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for j, n in enumerate(s):
            at = rank - len(s) + j
            out[at] = max(out[at], n) if n != 1 else out[at]
    return out
