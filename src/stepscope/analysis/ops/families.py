"""The op families of the model (`model`): which aten ops each holds, where its formula finds its arguments,
and an op's family by its name."""

from __future__ import annotations

import re

__all__ = ["COMPUTE_FAMILIES", "FAMILIES", "family_of"]

FAMILIES = (
    "gemm",
    "conv",
    "attention",
    "norm",
    "softmax",
    "elementwise",
    "reduction",
    "copy",
    "embedding",
    "pool",
    "optimizer",
    "transfer",  # a copy between the host and the device (told by its device activity, not its name)
)
# The families whose time is arithmetic on tensor cores (or the CPU's vector units): judged against the peak
# FLOP/s of their number format; the others run on the memory's bandwidth.
COMPUTE_FAMILIES = frozenset({"gemm", "conv", "attention"})

# op name -> (family, positions of the tensors the formula reads): GEMMs (a, b) and their bias
GEMMS: dict[str, tuple[int, int]] = {
    "aten::mm": (0, 1),
    "aten::addmm": (1, 2),
    "aten::bmm": (0, 1),
    "aten::baddbmm": (1, 2),
    "aten::addbmm": (1, 2),
    "aten::matmul": (0, 1),
    "aten::linear": (0, 1),
    "aten::_scaled_mm": (0, 1),
    "aten::mv": (0, 1),
    "aten::addmv": (1, 2),
}
# convolutions: op -> index of (stride, padding, dilation, transposed) in its arguments (-1: absent); the
# groups are in the weight's shape (its second dimension is C_in / groups)
CONVS: dict[str, tuple[int, int, int, int]] = {
    "aten::conv1d": (3, 4, 5, -1),
    "aten::conv2d": (3, 4, 5, -1),
    "aten::conv3d": (3, 4, 5, -1),
    "aten::convolution": (3, 4, 5, 6),
    "aten::_convolution": (3, 4, 5, 6),
    "aten::cudnn_convolution": (3, 2, 4, -1),
    "aten::miopen_convolution": (4, 3, 5, -1),
    "aten::mkldnn_convolution": (4, 3, 5, -1),
}
# convolution backwards: op -> (grad_output, input, weight positions, output mask position)
CONV_BACKWARDS: dict[str, tuple[int, int, int, int]] = {
    "aten::convolution_backward": (0, 1, 2, 10),
    "aten::cudnn_convolution_backward": (1, 0, 2, 10),
    "aten::miopen_convolution_backward": (1, 0, 2, 9),
}
# attention: op -> (index of q, index of is_causal, backward, layout "bhld" or "blhd")
ATTENTION: dict[str, tuple[int, int, bool, str]] = {
    "aten::scaled_dot_product_attention": (0, 5, False, "bhld"),
    "aten::_scaled_dot_product_flash_attention": (0, 4, False, "bhld"),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (0, 4, False, "bhld"),
    "aten::_scaled_dot_product_efficient_attention": (0, 6, False, "bhld"),
    "aten::_scaled_dot_product_cudnn_attention": (0, 6, False, "bhld"),
    "aten::_flash_attention_forward": (0, 8, False, "blhd"),
    "aten::_efficient_attention_forward": (0, 9, False, "blhd"),
    "aten::_scaled_dot_product_flash_attention_backward": (1, 11, True, "bhld"),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (1, 7, True, "bhld"),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, 11, True, "bhld"),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, -1, True, "bhld"),
}
NORMS = {
    "aten::native_layer_norm",
    "aten::layer_norm",
    "aten::native_batch_norm",
    "aten::batch_norm",
    "aten::_batch_norm_impl_index",
    "aten::cudnn_batch_norm",
    "aten::miopen_batch_norm",
    "aten::_native_batch_norm_legit",
    "aten::_native_batch_norm_legit_no_training",
    "aten::native_group_norm",
    "aten::group_norm",
    "aten::rms_norm",
    "aten::_fused_rms_norm",
}
NORM_BACKWARDS = {
    "aten::native_layer_norm_backward",
    "aten::native_batch_norm_backward",
    "aten::cudnn_batch_norm_backward",
    "aten::miopen_batch_norm_backward",
    "aten::native_group_norm_backward",
    "aten::_fused_rms_norm_backward",
}
SOFTMAX = {"aten::softmax", "aten::_softmax", "aten::log_softmax", "aten::_log_softmax"}
SOFTMAX_BACKWARDS = {"aten::_softmax_backward_data", "aten::_log_softmax_backward_data"}
REDUCTIONS = {
    "aten::sum",
    "aten::mean",
    "aten::amax",
    "aten::amin",
    "aten::max",
    "aten::min",
    "aten::prod",
    "aten::norm",
    "aten::linalg_vector_norm",
    "aten::var",
    "aten::std",
    "aten::var_mean",
    "aten::argmax",
    "aten::argmin",
    "aten::all",
    "aten::any",
    "aten::logsumexp",
}
COPIES = {"aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::cat", "aten::stack"}
FILLS = {"aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_", "aten::bernoulli_"}
EMBEDDINGS = {"aten::embedding", "aten::embedding_dense_backward", "aten::embedding_backward"}
# pooling: op -> (index of kernel_size, stride, padding, dilation, ceil_mode; -1: absent) in its arguments
POOLS: dict[str, tuple[int, int, int, int, int]] = {
    "aten::max_pool1d": (1, 2, 3, 4, 5),
    "aten::max_pool2d": (1, 2, 3, 4, 5),
    "aten::max_pool2d_with_indices": (1, 2, 3, 4, 5),
    "aten::max_pool3d_with_indices": (1, 2, 3, 4, 5),
    "aten::avg_pool1d": (1, 2, 3, -1, 4),
    "aten::avg_pool2d": (1, 2, 3, -1, 4),
    "aten::avg_pool3d": (1, 2, 3, -1, 4),
}
ADAPTIVE_POOLS = {"aten::adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d", "aten::adaptive_max_pool2d"}
# pooling backwards: each reads the output's gradient (and a max pool's indices) and writes the input's
POOL_BACKWARDS = {
    "aten::max_pool2d_with_indices_backward",
    "aten::max_pool3d_with_indices_backward",
    "aten::avg_pool2d_backward",
    "aten::avg_pool3d_backward",
    "aten::_adaptive_avg_pool2d_backward",
    "aten::adaptive_max_pool2d_backward",
}
COMPARISONS = re.compile(r"^aten::(eq|ne|lt|le|gt|ge|isnan|isinf|isfinite|logical_\w+)_?$")
# elementwise: one FLOP per output element (arithmetic, activations and their backwards)
ELEMENTWISE = re.compile(
    r"^aten::(add|sub|rsub|mul|div|neg|exp|exp2|expm1|log|log1p|log2|sqrt|rsqrt|pow|abs|sign|reciprocal|"
    r"relu|relu6|silu|gelu|sigmoid|tanh|hardswish|hardsigmoid|leaky_relu|elu|mish|softplus|erf|sin|cos|"
    r"clamp|clamp_min|clamp_max|clip|where|masked_fill|lerp|addcmul|addcdiv|maximum|minimum|floor|ceil|round|"
    r"trunc|remainder|fmod|bitwise_and|bitwise_or|bitwise_xor|bitwise_not|threshold|threshold_backward|"
    r"gelu_backward|silu_backward|sigmoid_backward|tanh_backward|hardswish_backward|native_dropout|dropout|"
    r"native_dropout_backward|square|eq|ne|lt|le|gt|ge|isnan|isinf|isfinite|logical_and|logical_or|"
    r"logical_not|logical_xor)_?$"
)
# elementwise ops of one and of two tensors and nothing else (no scalar after them): one more tensor, of their
# result's shape, is an `out=` (`aten::mul(self, other, out)`: foreach optimizers run so on a CPU)
TENSOR_ARITY: dict[str, int] = {
    **{
        f"aten::{n}": 1
        for n in [
            "neg",
            "exp",
            "exp2",
            "expm1",
            "log",
            "log1p",
            "log2",
            "sqrt",
            "rsqrt",
            "abs",
            "sign",
            "reciprocal",
            "sigmoid",
            "tanh",
            "erf",
            "sin",
            "cos",
            "floor",
            "ceil",
            "round",
            "trunc",
            "bitwise_not",
            "logical_not",
        ]
    },
    **{
        f"aten::{n}": 2
        for n in [
            "mul",
            "div",
            "maximum",
            "minimum",
            "pow",
            "remainder",
            "fmod",
            "bitwise_and",
            "bitwise_or",
            "bitwise_xor",
            "eq",
            "ne",
            "lt",
            "le",
            "gt",
            "ge",
            "logical_and",
            "logical_or",
            "logical_xor",
        ]
    },
}
FOREACH = re.compile(r"^aten::_foreach_\w+$")
FUSED_OPTIMIZERS = re.compile(r"^aten::_fused_(adam|adamw|sgd|adagrad)_?$")


# op name -> family, for the families named op by op
_BY_NAME: dict[str, str] = {
    name: family
    for family, names in (
        ("gemm", GEMMS),
        ("conv", {*CONVS, *CONV_BACKWARDS}),
        ("attention", ATTENTION),
        ("norm", NORMS | NORM_BACKWARDS),
        ("softmax", SOFTMAX | SOFTMAX_BACKWARDS),
        ("reduction", REDUCTIONS),
        ("copy", COPIES | FILLS),
        ("embedding", EMBEDDINGS),
        ("pool", {*POOLS, *ADAPTIVE_POOLS, *POOL_BACKWARDS}),
    )
    for name in names
}


def family_of(name: str) -> str | None:
    """The family of an op by its name; None for ops the model does not cover (views, metadata, ...)."""
    family = _BY_NAME.get(name)
    if family is not None:
        return family
    if FOREACH.match(name) or FUSED_OPTIMIZERS.match(name):
        return "optimizer"
    return "elementwise" if ELEMENTWISE.match(name) else None
