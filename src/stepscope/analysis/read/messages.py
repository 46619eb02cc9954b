"""Message sizes and peers that a trace gives only in an op's recorded inputs (`Input Dims`, `Input type`,
`Concrete Inputs`): a CPU backend's range (gloo), the all-to-all ops and the point-to-point c10d ops. The table's
reader keeps what these give in its args columns (table.py)."""

from __future__ import annotations

import re
from typing import Any

# c10d's point-to-point ops whose `Concrete Inputs` name the peer (args_peer)
P2P_OPS = frozenset({"c10d::send", "c10d::recv_"})
# (NCCL's ranges need not: record_param_comms and the kernels carry the sizes.) The all-to-all ops are read too:
# their output and split sizes are in their inputs (all_to_all_message)
SHAPED_RANGE_RE = re.compile(
    r"^(?:(?:gloo|mpi|ucc):|c10d::alltoall_base_$|_c10d_functional::all_to_all_single$)"
)
# op name -> (index of the output tensor or None, index of the input tensor, of the output splits, of the input
# splits) among its recorded inputs
ALL_TO_ALL_INPUTS: dict[str, tuple[int | None, int, int, int]] = {
    "c10d::alltoall_base_": (0, 1, 3, 4),  # (output, input, pg, output_split_sizes, input_split_sizes, ...)
    "_c10d_functional::all_to_all_single": (
        None,
        0,
        1,
        2,
    ),  # (input, output_split_sizes, input_split_sizes, ...)
}


def split_sizes(text: Any) -> list[int] | None:
    """The ints of a list written as text ("[3, 5]"; "[]": an empty list); None when `text` is not one."""
    if not isinstance(text, str) or not text.startswith("[") or not text.endswith("]"):
        return None
    try:
        return [int(x) for x in text[1:-1].split(",") if x.strip()]
    except ValueError:
        return None


def all_to_all_message(
    name: str, dims: Any, types: Any, concrete: Any
) -> tuple[int, int, str | None, str, str] | None:
    """(in elements, out elements, dtype, in splits, out splits) of an all-to-all op (`c10d::alltoall_base_`,
    `_c10d_functional::all_to_all_single`) from its recorded inputs, the splits as record_param_comms writes
    them ("[3, 5]"; "[]" for even splits); None when its inputs are not recorded or not understood."""
    spec = ALL_TO_ALL_INPUTS.get(name)
    if spec is None or not isinstance(dims, list) or not isinstance(concrete, list):
        return None
    out_at, in_at, out_split_at, in_split_at = spec
    if max(in_at, out_split_at, in_split_at) >= min(len(dims), len(concrete)):
        return None
    shape = dims[in_at]
    if not isinstance(shape, list) or not shape or not all(type(x) is int and x >= 0 for x in shape):
        return None
    row = 1
    for x in shape[1:]:
        row *= x
    in_n = row * shape[0]
    in_split, out_split = split_sizes(concrete[in_split_at]), split_sizes(concrete[out_split_at])
    if in_split is None or out_split is None:
        return None
    out_shape = dims[out_at] if out_at is not None else None
    if isinstance(out_shape, list) and out_shape and all(type(x) is int and x >= 0 for x in out_shape):
        out_n = 1
        for x in out_shape:
            out_n *= x
    elif out_split:
        out_n = row * sum(out_split)
    else:
        out_n = in_n
    first = types[in_at] if isinstance(types, list) and len(types) > in_at else None
    dtype = first if isinstance(first, str) and first and first not in ("Tensor", "TensorList") else None
    return in_n, out_n, dtype, f"[{', '.join(map(str, in_split))}]", f"[{', '.join(map(str, out_split))}]"


def p2p_peer(concrete_inputs: Any) -> int | None:
    """The peer of a c10d::send / c10d::recv_ from its `Concrete Inputs` (its third entry, a text: "1"); None
    when absent or not a rank."""
    if not isinstance(concrete_inputs, list) or len(concrete_inputs) < 3:
        return None
    text = concrete_inputs[2]
    if not isinstance(text, str) or not text.isdigit() or len(text) > 9:
        return None
    return int(text)


def shapes_message(dims: Any, types: Any) -> tuple[int, str | None] | None:
    """(elements, dtype) of the tensors listed in a backend range's `Input Dims` / `Input type`.

    `dims` holds one entry per input: a tensor's shape (a list of ints) or a tensor list's shapes (a list of
    lists). The elements of every tensor add up; the dtype is the first input's type when it names an element
    type (not `TensorList`). None when `dims` lists no tensor. This is the `In msg nelems` / `dtype` of such a
    range when its args have none (see docs/analysis.md, "Collectives")."""
    if not isinstance(dims, list):
        return None
    total = 0
    tensors = 0
    for entry in dims:
        shapes = entry if entry and all(isinstance(x, list) for x in entry) else [entry]
        for shape in shapes:
            if not isinstance(shape, list) or not shape or not all(type(x) is int and x >= 0 for x in shape):
                continue
            size = 1
            for x in shape:
                size *= x
            total += size
            tensors += 1
    if not tensors or total >= 2**62:
        return None
    dtype = None
    first = types[0] if isinstance(types, list) and types else None
    if isinstance(first, str) and first and first not in ("TensorList", "Tensor", "Scalar", "ScalarList"):
        dtype = first
    return total, dtype
