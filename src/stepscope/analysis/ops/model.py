"""What one op call computes and moves, from the inputs a trace recorded (`record_shapes=True`: Kineto's
`Input Dims`, `Input type`, `Concrete Inputs`): its FLOPs and the bytes it must read and write at least.

Formulas are written from the ops' definitions (docs/analysis.md, "Ops against the roofline", lists them):

- GEMMs: 2·M·K·N per product (a batch multiplies it); bytes: the operands read and the product written.
- Convolutions: 2·N·C_out·prod(output spatial)·(C_in/groups)·prod(kernel); a backward computes the input's and
  the weight's gradients (each one forward's FLOPs) where its output mask asks for them.
- Attention (scaled dot product): 2·B·H·L·S·(E + E_v) forward, 2·B·H·L·S·(3E + 2E_v) backward (the scores
  computed again, then four gradient products); a causal call counts half (the kernel skips the masked half),
  the `causal` flag says so.
- Normalizations, softmax, elementwise, reductions, copies, embeddings, foreach and fused optimizer ops: the
  bytes of their tensors (inputs read, outputs written) and a FLOP per element where the op computes one.

A model needs the shapes: an op whose shapes the trace does not hold has no cost (`None`), and `missing` says
what was missing. No torch: the dtypes are the trace's names.
"""

from __future__ import annotations

from stepscope.analysis.ops.families import (
    ADAPTIVE_POOLS,
    ATTENTION,
    COMPARISONS,
    CONV_BACKWARDS,
    CONVS,
    FILLS,
    GEMMS,
    NORM_BACKWARDS,
    POOL_BACKWARDS,
    POOLS,
    SOFTMAX,
    TENSOR_ARITY,
    family_of,
)
from stepscope.analysis.ops.inputs import (
    DTYPE_BYTES,
    DTYPE_FORMAT,
    SCALAR_TYPE_BYTES,
    Cost,
    OpInputs,
    broadcast,
    flag_of,
    ints_of,
    is_shape,
    list_dtype,
    mask_of,
    nbytes,
    numel,
    read_bytes,
    tensor_of,
    tensors_of,
    unique_numel,
)

__all__ = ["DTYPE_BYTES", "Cost", "OpInputs", "cost_of"]


# --- the formulas --------------------------------------------------------------------------------------
def cost_of(name: str, inputs: OpInputs, *, conv_output: list[int] | None = None) -> Cost | None:
    """The cost of one call of `name` with these inputs; None where the family is not modelled or the trace
    lacks what the formula needs. `conv_output`: a convolution's output shape where its arguments do not give
    it (old traces record no stride or padding; the backward of the same layer gives it)."""
    family = family_of(name)
    if family is None:
        return None
    if family == "gemm":
        return _gemm(name, inputs)
    if family == "conv":
        return _conv_backward(name, inputs) if name in CONV_BACKWARDS else _conv(name, inputs, conv_output)
    if family == "attention":
        return _attention(name, inputs)
    if family == "embedding":
        return _embedding(name, inputs)
    if family == "pool":
        return _pool(name, inputs)
    return _memory_bound(name, family, inputs)


def _gemm(name: str, inputs: OpInputs) -> Cost | None:
    ia, ib = GEMMS[name]
    a, b = tensor_of(inputs, ia), tensor_of(inputs, ib)
    if a is None or b is None:
        return None
    (sa, ta), (sb, tb) = a, b
    if name == "aten::linear":  # x [..., k] · w[n, k]^T
        if len(sb) != 2 or not sa or sa[-1] != sb[1]:
            return None
        m, k, n, batch = numel(sa[:-1]), sa[-1], sb[0], 1
        out_shape = [*sa[:-1], n]
    else:
        if not sa or not sb:
            return None
        # matmul's rules: a vector is a row (a) or a column (b); the batch dimensions broadcast
        sa2 = [1, sa[0]] if len(sa) == 1 else sa
        sb2 = [sb[0], 1] if len(sb) == 1 else sb
        if sa2[-1] != sb2[-2]:
            return None
        m, k, n = sa2[-2], sa2[-1], sb2[-1]
        batch_shape = broadcast([sa2[:-2], sb2[:-2]])
        batch = numel(batch_shape)
        out_shape = [*batch_shape, m, n]
        if name == "aten::addbmm":  # the batch is summed into one [m, n]
            out_shape = [m, n]
    flops = 2.0 * batch * m * k * n
    out_bytes = DTYPE_BYTES[ta] if name != "aten::_scaled_mm" else 2  # fp8 products are written in 16 bits
    read = nbytes(sa, ta) + nbytes(sb, tb)
    bias = tensor_of(inputs, ia - 1) if ia > 0 else tensor_of(inputs, 2) if name == "aten::linear" else None
    if bias is not None:
        read += nbytes(*bias)
    return Cost("gemm", flops, read + numel(out_shape) * out_bytes, DTYPE_FORMAT.get(ta))


def _conv(name: str, inputs: OpInputs, conv_output: list[int] | None) -> Cost | None:
    x, w = tensor_of(inputs, 0), tensor_of(inputs, 1)
    if x is None or w is None or len(x[0]) < 3 or len(w[0]) != len(x[0]):
        return None
    (sx, tx), (sw, _) = x, w
    i_stride, i_pad, i_dil, i_transposed = CONVS[name]
    transposed = flag_of(inputs, i_transposed) if i_transposed >= 0 else False
    spatial = len(sx) - 2
    out = conv_output
    if out is None and transposed:
        out = _transposed_output(inputs, sx, sw, spatial)
        if out is None:
            return None
    if out is None:
        stride = _param(inputs, i_stride, spatial)
        pad = _param(inputs, i_pad, spatial)
        dil = _param(inputs, i_dil, spatial)
        if stride is None or pad is None or dil is None:
            return None
        k = sw[2:]
        size = [(sx[2 + j] + 2 * pad[j] - dil[j] * (k[j] - 1) - 1) // stride[j] + 1 for j in range(spatial)]
        out = [sx[0], sw[0], *size]
    if transposed:  # the FLOPs of a transposed convolution run over its input's positions
        flops = 2.0 * sx[0] * numel(sx[2:]) * numel(sw)
    else:
        flops = 2.0 * out[0] * numel(out[2:]) * numel(sw)
    bias = tensor_of(inputs, 2)
    read = nbytes(sx, tx) + nbytes(*w) + (nbytes(*bias) if bias is not None and len(bias[0]) == 1 else 0)
    return Cost("conv", flops, read + numel(out) * DTYPE_BYTES[tx], DTYPE_FORMAT.get(tx))


def _transposed_output(inputs: OpInputs, sx: list[int], sw: list[int], spatial: int) -> list[int] | None:
    """A transposed convolution's output shape from its recorded arguments (`aten::convolution`'s and
    `aten::_convolution`'s: stride, padding, dilation, then output_padding and groups after the flag)."""
    stride, pad, dil = (_param(inputs, i, spatial) for i in (3, 4, 5))
    extra = _param(inputs, 7, spatial)
    groups = ints_of(inputs.concrete[8]) if len(inputs.concrete) > 8 else None
    if stride is None or pad is None or dil is None or extra is None or not groups:
        return None
    k = sw[2:]
    size = [
        (sx[2 + j] - 1) * stride[j] - 2 * pad[j] + dil[j] * (k[j] - 1) + extra[j] + 1 for j in range(spatial)
    ]
    return [sx[0], sw[1] * groups[0], *size]


def _param(inputs: OpInputs, i: int, spatial: int) -> list[int] | None:
    """A convolution's stride / padding / dilation as recorded (`"[2, 2]"`, or one value for every side)."""
    if i < 0 or i >= len(inputs.concrete):
        return None
    values = ints_of(inputs.concrete[i])
    if not values:
        return None
    return values * spatial if len(values) == 1 else values if len(values) == spatial else None


def _conv_backward(name: str, inputs: OpInputs) -> Cost | None:
    i_grad, i_x, i_w, i_mask = CONV_BACKWARDS[name]
    g, x, w = tensor_of(inputs, i_grad), tensor_of(inputs, i_x), tensor_of(inputs, i_w)
    if g is None or x is None or w is None:
        return None
    mask = _mask(inputs, i_mask)
    # each gradient is one forward's work: over the output's positions, or a transposed convolution's input's
    transposed = name == "aten::convolution_backward" and flag_of(inputs, 7)
    positions = x[0] if transposed else g[0]
    one = 2.0 * positions[0] * numel(positions[2:]) * numel(w[0])
    grads = mask[0] + mask[1]
    written = mask[0] * nbytes(*x) + mask[1] * nbytes(*w)
    read = nbytes(*g) + nbytes(*x) + nbytes(*w)
    return Cost("conv", one * grads, read + written, DTYPE_FORMAT.get(x[1]))


def _mask(inputs: OpInputs, i: int) -> tuple[int, int]:
    """Which of (the input's, the weight's) gradients a backward computes: its recorded output mask
    (`"[True, True, False]"`), else both."""
    mask = mask_of(inputs, i)
    return (int(mask[0]), int(mask[1])) if mask and len(mask) >= 2 else (1, 1)


def conv_backward_shapes(
    name: str, inputs: OpInputs
) -> tuple[tuple[int, ...], tuple[int, ...], list[int]] | None:
    """(input shape, weight shape, output shape) of a convolution backward: what its forward's FLOPs need when
    the forward's own arguments do not give its output."""
    if name not in CONV_BACKWARDS:
        return None
    i_grad, i_x, i_w, _ = CONV_BACKWARDS[name]
    g, x, w = tensor_of(inputs, i_grad), tensor_of(inputs, i_x), tensor_of(inputs, i_w)
    if g is None or x is None or w is None:
        return None
    return tuple(x[0]), tuple(w[0]), g[0]


def conv_forward_shapes(name: str, inputs: OpInputs) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(input shape, weight shape) of a convolution forward."""
    if name not in CONVS:
        return None
    x, w = tensor_of(inputs, 0), tensor_of(inputs, 1)
    return None if x is None or w is None else (tuple(x[0]), tuple(w[0]))


def _attention(name: str, inputs: OpInputs) -> Cost | None:
    iq, i_causal, backward, layout = ATTENTION[name]
    q, k, v = tensor_of(inputs, iq), tensor_of(inputs, iq + 1), tensor_of(inputs, iq + 2)
    if q is None or k is None or v is None or len(q[0]) != 4 or len(k[0]) != 4 or len(v[0]) != 4:
        return None
    if layout == "bhld":
        b, h, lq, e = q[0]
        s, ev = k[0][2], v[0][3]
    else:  # [batch, length, heads, dim]
        b, lq, h, e = q[0]
        s, ev = k[0][1], v[0][3]
    # forward: scores (q·k^T) and their product with v; backward: the scores again, then the gradients of the
    # scores, v, q and k (five products, as torch.utils.flop_counter counts it)
    flops = 2.0 * b * h * lq * s * ((3 * e + 2 * ev) if backward else (e + ev))
    causal = bool(flag_of(inputs, i_causal))
    if causal:
        flops /= 2.0
    # every tensor it is given is read: q, k and v, a mask or bias; a backward's output, its gradient and the
    # log-sum-exp too. It writes the output, or a backward the gradients of q, k and v
    read = read_bytes(inputs)
    qkv = nbytes(*q) + nbytes(*k) + nbytes(*v)
    total = read + (qkv if backward else float(b * h * lq * ev * DTYPE_BYTES[q[1]]))
    return Cost("attention", flops, total, DTYPE_FORMAT.get(q[1]), causal)


def _embedding(name: str, inputs: OpInputs) -> Cost | None:
    if name == "aten::embedding":
        w, idx = tensor_of(inputs, 0), tensor_of(inputs, 1)
        if w is None or idx is None or len(w[0]) != 2:
            return None
        rows = numel(idx[0]) * w[0][1] * DTYPE_BYTES[w[1]]
        return Cost("embedding", None, nbytes(*idx) + 2.0 * rows, None)  # rows read, the output written
    g, idx = tensor_of(inputs, 0), tensor_of(inputs, 1)
    n = ints_of(inputs.concrete[2]) if len(inputs.concrete) > 2 else None
    if g is None or idx is None or not g[0] or not n:
        return None
    written = n[0] * g[0][-1] * DTYPE_BYTES[g[1]]
    return Cost("embedding", None, nbytes(*g) + nbytes(*idx) + float(written), None)


def _out_argument(name: str, inputs: OpInputs) -> int | None:
    """The position of an `out=` tensor: an `.out` variant records it last, after the op's scalar arguments
    (`aten::clamp_min(self, Int min, out)` in a 2021 trace), or after an op's only tensors (TENSOR_ARITY), with
    the shape of the op's result."""
    last = len(inputs.dims) - 1
    out = tensor_of(inputs, last)
    arity = TENSOR_ARITY.get(name)
    if out is not None and arity is not None and last == arity:
        operands = [tensor_of(inputs, i) for i in range(arity)]
        if all(t is not None for t in operands) and out[0] == broadcast([t[0] for t in operands if t]):
            return last
    if out is None or last < 2:
        return None
    before = [tensor_of(inputs, i) for i in range(last)]
    scalar_before = any(
        t is None and i < len(inputs.types) and inputs.types[i] and inputs.types[i] not in ("TensorList",)
        for i, t in enumerate(before)
    )
    shapes = [t[0] for t in before if t is not None and t[0]]
    return last if scalar_before and shapes and out[0] == broadcast(shapes) else None


def _pool(name: str, inputs: OpInputs) -> Cost | None:
    """A pooling's bytes: the input read and the pooled output written (a max pool's int64 indices too); a
    backward reads the output's gradient (and the indices) and writes the input's. No FLOPs: comparisons and
    sums that move bytes, judged against the bandwidth."""
    tensors = [t for t in tensors_of(inputs) if t[0]]
    if not tensors:
        return None
    if name in POOL_BACKWARDS:  # (grad_output, self, ..., indices): the input's gradient is `self`'s size
        read = sum(nbytes(s, t) for s, t in tensors) - (nbytes(*tensors[1]) if len(tensors) > 1 else 0.0)
        written = nbytes(*tensors[1]) if len(tensors) > 1 else nbytes(*tensors[0])
        return Cost("pool", None, read + written, None)
    x, dtype = tensors[0]
    if name in ADAPTIVE_POOLS:
        size = ints_of(inputs.concrete[1]) if len(inputs.concrete) > 1 else None
        if not size:
            return None
        out = [*x[: len(x) - len(size)], *size]
    else:
        i_kernel, i_stride, i_pad, i_dil, i_ceil = POOLS[name]
        kernel = ints_of(inputs.concrete[i_kernel]) if len(inputs.concrete) > i_kernel else None
        if not kernel:
            return None  # (a 2021 trace records no kernel size)
        n = len(kernel)
        stride = _param(inputs, i_stride, n) or kernel  # (an empty stride is the kernel's)
        pad = _param(inputs, i_pad, n) or [0] * n
        dil = _param(inputs, i_dil, n) or [1] * n
        ceil = bool(flag_of(inputs, i_ceil))
        out = list(x[: len(x) - n])
        for j in range(n):
            length = x[len(x) - n + j]
            span = length + 2 * pad[j] - dil[j] * (kernel[j] - 1) - 1
            positions = (-(-span // stride[j]) if ceil else span // stride[j]) + 1
            if ceil and (positions - 1) * stride[j] >= length + pad[j]:
                positions -= 1  # (the last window must start inside the input or its left padding)
            out.append(positions)
    written = float(numel(out) * DTYPE_BYTES[dtype])
    if "max_pool" in name and (name.endswith("_with_indices") or name == "aten::adaptive_max_pool2d"):
        written += numel(out) * 8
    return Cost("pool", None, nbytes(x, dtype) + written, None)


def _memory_bound(name: str, family: str, inputs: OpInputs) -> Cost | None:
    at = (
        _out_argument(name, inputs)
        if family in ("elementwise", "reduction") and not name.endswith("_")
        else None
    )
    if at is not None:  # the result is written into `out`: counted as the output, not read
        inputs = OpInputs(inputs.dims[:at], inputs.types[:at], inputs.concrete[:at], inputs.strides[:at])
    tensors = tensors_of(inputs)
    if not tensors:
        return None
    shaped = [t for t in tensors if t[0]]  # 0-d tensors (a Python number wrapped) do not shape the output
    first = (shaped or tensors)[0]
    read = read_bytes(inputs)  # (an expanded tensor read once)
    if family == "optimizer":
        # a foreach op writes one list (its first, in place); a fused optimizer its params and its state
        lists = [d for d in inputs.dims if isinstance(d, list) and d and all(is_shape(x) for x in d)]
        sizes = [sum(numel(x) for x in d) * DTYPE_BYTES[list_dtype(inputs)] for d in lists]
        if not sizes:
            return None
        written = sizes[0] if "_foreach_" in name else sizes[0] + sum(sizes[2:4])
        flops = float(sum(numel(x) for x in lists[0])) if "_foreach_" in name else None
        return Cost("optimizer", flops, read + float(written), None)
    if name in FILLS:  # writes its tensor, reads nothing of it
        return Cost("copy", None, nbytes(*first), None)
    if name == "aten::copy_":
        src = tensor_of(
            inputs, 1
        )  # (an expanded source, as a bias broadcast into a product's output, read once)
        read_src = float(unique_numel(inputs, 1) * DTYPE_BYTES[src[1]]) if src else 0.0
        return Cost("copy", None, nbytes(*first) + read_src, None)
    if name == "aten::_to_copy":
        code = ints_of(inputs.concrete[1]) if len(inputs.concrete) > 1 else None
        size = SCALAR_TYPE_BYTES.get(code[0], DTYPE_BYTES[first[1]]) if code else DTYPE_BYTES[first[1]]
        return Cost("copy", None, nbytes(*first) + float(numel(first[0]) * size), None)
    if name in ("aten::cat", "aten::stack"):
        return Cost("copy", None, 2.0 * read, None)
    if name in ("aten::clone", "aten::contiguous"):
        return Cost("copy", None, 2.0 * nbytes(*first), None)
    if family == "norm":
        return _norm(name, inputs, first, read)
    if family == "softmax":
        size = DTYPE_BYTES[first[1]]
        if name in SOFTMAX and flag_of(inputs, 2):  # half_to_float
            size = 4
        return Cost("softmax", 5.0 * numel(first[0]), read + float(numel(first[0]) * size), None)
    if family == "reduction" and name in ("aten::max", "aten::min") and tensor_of(inputs, 1) is not None:
        family = "elementwise"  # max(a, b): of two tensors, elementwise (a reduction takes one, and its dim)
    if family == "reduction":
        return _reduction(name, inputs, first)
    # elementwise: the output broadcasts the tensor inputs; a comparison writes bools; in place writes `self`
    out_shape = broadcast([s for s, _ in shaped]) if shaped else []
    size = 1 if COMPARISONS.match(name) else _result_bytes(name, inputs, tensors)
    out = float(numel(out_shape) * size)
    if name in ("aten::native_dropout",):  # its mask too
        out += numel(out_shape)
    return Cost("elementwise", float(numel(out_shape)), read + out, None)


# Type promotion's categories: a 0-d tensor of a higher category than every tensor with dimensions sets the
# result's category (a long tensor plus a 0-d float is float); within one category the dimensioned ones decide.
_CATEGORY = {"bool": 0, "c10::complex<float>": 3, "c10::complex<double>": 3}
_INTEGERS = ("long int", "long", "int", "short int", "signed char", "unsigned char")


def _category(dtype: str) -> int:
    return _CATEGORY.get(dtype, 1 if dtype in _INTEGERS else 2)


def _result_bytes(name: str, inputs: OpInputs, tensors: list[tuple[list[int], str]]) -> int:
    """Bytes per element of an elementwise op's result, by torch's type promotion over its tensors (`where`'s
    condition takes no part in it; an in-place op writes its `self`'s dtype)."""
    if name in ("aten::where", "aten::where_") and len(tensors) > 1 and tensors[0][1] == "bool":
        tensors = tensors[1:]
    if name.endswith("_") and tensors:
        return DTYPE_BYTES[tensors[0][1]]
    shaped = [dtype for shape, dtype in tensors if shape] or [dtype for _, dtype in tensors]
    top = max(_category(dtype) for _, dtype in tensors)
    if max(_category(dtype) for dtype in shaped) < top:  # a 0-d tensor of a higher category
        # A Python number is recorded as a 0-d tensor too, a float as a `double` one: it makes the result of
        # the default dtype (float32), as it most often is (a real 0-d float64 tensor would make it float64)
        zero_d = [("float" if dtype == "double" else dtype) for shape, dtype in tensors if not shape]
        return max(DTYPE_BYTES[dtype] for dtype in zero_d if _category(dtype) == top)
    return max(DTYPE_BYTES[dtype] for dtype in shaped if _category(dtype) == top)


# a normalization backward: op -> (position of its input, of its output mask; -1: it computes every gradient)
_NORM_BACKWARD_ARGS = {
    "aten::native_layer_norm_backward": (1, 7),
    "aten::native_batch_norm_backward": (1, 9),
    "aten::native_group_norm_backward": (1, 9),
    "aten::_fused_rms_norm_backward": (1, 5),
    "aten::cudnn_batch_norm_backward": (0, -1),
    "aten::miopen_batch_norm_backward": (0, -1),
}


def _norm(name: str, inputs: OpInputs, first: tuple[list[int], str], read: float) -> Cost:
    """A normalization's bytes: its tensors read, the output written and the statistics it saves (fp32: a
    layer or RMS norm's per row normalized, a batch norm's per channel when training, a group norm's per
    sample and group); a backward writes the gradients its output mask asks for (the input's, the weight's and
    the bias's, a channel or a normalized row each)."""
    if name in NORM_BACKWARDS:
        i_x, i_mask = _NORM_BACKWARD_ARGS.get(name, (1, -1))
        x = tensor_of(inputs, i_x) or first
        mask = mask_of(inputs, i_mask) or [True, True, True]
        param = numel(_normalized(name, inputs, x[0])) * DTYPE_BYTES[x[1]]
        written = mask[0] * nbytes(*x) + sum(param for want in mask[1:3] if want)
        return Cost("norm", 8.0 * numel(x[0]), read + written, None)
    shape = first[0]
    if "batch_norm" in name:  # (training: a mean and an inverse deviation per channel; none in eval)
        training = flag_of(inputs, 5)
        rows = (
            (shape[1] if len(shape) > 1 else 1) if training is not False and "no_training" not in name else 0
        )
        stats = 2
    elif "group_norm" in name:
        groups = ints_of(inputs.concrete[6]) if len(inputs.concrete) > 6 else None
        rows, stats = (shape[0] if shape else 1) * (groups[0] if groups else 1), 2
    else:  # layer and RMS norms: per row of what is normalized (an RMS norm saves no mean)
        rows = numel(shape) // max(numel(_normalized(name, inputs, shape)), 1)
        stats = 1 if "rms_norm" in name else 2
    return Cost("norm", 5.0 * numel(shape), read + nbytes(*first) + 4.0 * stats * rows, None)


def _normalized(name: str, inputs: OpInputs, shape: list[int]) -> list[int]:
    """What one weight of a normalization spans: a layer or RMS norm's normalized shape (recorded, else the
    last dimension), a batch or group norm's channels."""
    if "layer_norm" in name or "rms_norm" in name:
        i = 2 if name.endswith("_backward") else 1
        recorded = ints_of(inputs.concrete[i]) if i < len(inputs.concrete) else None
        if recorded and len(recorded) <= len(shape) and shape[len(shape) - len(recorded) :] == recorded:
            return recorded
        backward_at = 4 if "rms_norm" in name else 5
        weight = tensor_of(inputs, backward_at if name.endswith("_backward") else 2)
        if weight is not None and weight[0] and shape[len(shape) - len(weight[0]) :] == weight[0]:
            return weight[0]
        return shape[-1:]
    return shape[1:2]


def _reduction(name: str, inputs: OpInputs, first: tuple[list[int], str]) -> Cost:
    """A reduction reads its input (only: a later tensor is an `out=`) and writes the input without its reduced
    dimensions (all of them when none is given): an index's int64 for argmax / argmin, bools for all / any, a
    max or min over a dimension its values and their int64 indices, var_mean / std_mean two results."""
    shape, dtype = tensor_of(inputs, 0) or first
    at = 2 if name in ("aten::norm", "aten::linalg_vector_norm") else 1  # (a norm's order comes first)
    dims = ints_of(inputs.concrete[at]) if len(inputs.concrete) > at else None
    kept = (
        [n for j, n in enumerate(shape) if j not in {d % len(shape) for d in dims}] if dims and shape else []
    )
    size = {"aten::argmax": 8, "aten::argmin": 8, "aten::all": 1, "aten::any": 1}.get(
        name, DTYPE_BYTES[dtype]
    )
    if name in ("aten::max", "aten::min") and dims:
        size += 8  # (its indices)
    elif name in ("aten::var_mean", "aten::std_mean"):
        size *= 2
    read = unique_numel(inputs, 0) * DTYPE_BYTES[dtype] if tensor_of(inputs, 0) else nbytes(shape, dtype)
    return Cost("reduction", float(numel(shape)), float(read + numel(kept) * size), None)
