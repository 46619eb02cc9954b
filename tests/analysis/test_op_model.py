"""The op model (`stepscope ops`): FLOPs per GEMM, convolution and attention call against torch's own FLOP
counter, bytes of elementwise and normalization ops against the tensors the dispatcher sees, on traces recorded
here; the grouping, the roofline and what the model says when the trace lacks shapes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.ops import ops_source
from stepscope.analysis.ops.calls import read_calls
from stepscope.analysis.ops.model import OpInputs, cost_of
from stepscope.analysis.options import AnalysisOptions

from ..support.ops import counted_flops, record, tensor_bytes

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _flop_cases() -> dict[str, Callable[[], Any]]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int, grad: bool = False) -> Any:
        return torch.randn(*shape, generator=g).requires_grad_(grad)

    a, b, bias = r(96, 80), r(80, 72), r(72)
    x3, w = r(4, 24, 40), r(56, 40)
    bm1, bm2, bb = r(3, 20, 36), r(3, 36, 28), r(3, 20, 28)
    img, ker = r(2, 6, 30, 34), r(12, 3, 5, 5)
    img_g, ker_g = r(2, 4, 17, 17, grad=True), r(8, 4, 3, 3, grad=True)
    q, k, v = r(2, 4, 48, 16), r(2, 4, 40, 16), r(2, 4, 40, 24)
    qg, kg, vg = r(2, 3, 32, 16, grad=True), r(2, 3, 32, 16, grad=True), r(2, 3, 32, 16, grad=True)

    def conv_backward() -> None:
        F.conv2d(img_g, ker_g, stride=2, padding=1).sum().backward()

    img_t, ker_t = r(2, 8, 9, 9, grad=True), r(8, 4, 4, 4, grad=True)

    def conv_transpose_backward() -> None:  # (its gradients run over the input's positions, not the output's)
        F.conv_transpose2d(img_t, ker_t, stride=2, padding=1).sum().backward()

    def sdpa_backward() -> None:
        F.scaled_dot_product_attention(qg, kg, vg).sum().backward()

    return {
        "mm": lambda: torch.mm(a, b),
        "addmm": lambda: torch.addmm(bias, a, b),
        "linear 3-d": lambda: F.linear(x3, w),
        "linear with bias": lambda: F.linear(x3, w, r(56)),
        "matmul broadcast": lambda: torch.matmul(x3, w.t()),
        "bmm": lambda: torch.bmm(bm1, bm2),
        "baddbmm": lambda: torch.baddbmm(bb, bm1, bm2),
        "conv2d stride 2 pad 3 groups 2": lambda: F.conv2d(img, ker, stride=2, padding=3, groups=2),
        "conv2d dilation 2": lambda: F.conv2d(img, ker[:, :3].repeat(1, 2, 1, 1), dilation=2),
        "conv2d forward and backward": conv_backward,
        "transposed conv2d stride 2, forward and backward": conv_transpose_backward,
        "transposed conv2d with groups and output padding, no backward": lambda: F.conv_transpose2d(
            img_t.detach(), ker_t.detach().repeat(1, 2, 1, 1), stride=2, padding=1, output_padding=1, groups=2
        ),
        "attention": lambda: F.scaled_dot_product_attention(q, k, v),
        "attention forward and backward": sdpa_backward,
    }


def _counted(trace: Path, families: set[str]) -> tuple[float, list[str]]:
    found = read_calls(trace)
    calls = [c for c in found.calls if c.cost.family in families]
    return sum(c.cost.flops or 0.0 for c in calls), [c.name for c in calls]


@pytest.mark.parametrize("case", list(_flop_cases()))
def test_flops_of_gemms_convolutions_and_attention_agree_with_torchs_flop_counter(
    case: str, tmp_path: Path
) -> None:
    fn = _flop_cases()[case]
    trace = record(fn, tmp_path / "trace.json")
    ours, names = _counted(trace, {"gemm", "conv", "attention"})
    if "attention" in case:
        # torch's counter has no formula for the CPU's flash attention op: its formula for the same shapes
        from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

        q, k, v = ((2, 4, 48, 16), (2, 4, 40, 16), (2, 4, 40, 24))
        expected = sdpa_flop_count(q, k, v)
        if "backward" in case:
            q = k = v = (2, 3, 32, 16)
            expected = sdpa_flop_count(q, k, v) + sdpa_backward_flop_count(q, q, k, v)
    else:
        expected = counted_flops(fn)
    assert expected > 0
    assert abs(ours - expected) <= 0.01 * expected, (case, ours, expected, names)


def test_a_causal_attention_counts_half_of_the_full_product(tmp_path: Path) -> None:
    q = torch.randn(1, 2, 64, 32)
    full, _ = _counted(
        record(lambda: F.scaled_dot_product_attention(q, q, q), tmp_path / "a.json"), {"attention"}
    )
    causal_trace = record(
        lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True), tmp_path / "b.json"
    )
    causal, _ = _counted(causal_trace, {"attention"})
    assert causal == pytest.approx(full / 2)
    (call,) = [c for c in read_calls(causal_trace).calls if c.cost.family == "attention"]
    assert call.cost.causal


def _byte_cases() -> dict[str, tuple[Callable[[], Any], set[str]]]:
    x = torch.randn(64, 96)
    y = torch.randn(96)
    h = torch.randn(8, 12, 40, dtype=torch.bfloat16)
    ln_w, ln_b = torch.randn(40, dtype=torch.bfloat16), torch.randn(40, dtype=torch.bfloat16)
    img = torch.randn(4, 6, 11, 11)  # (odd: a ceil-mode pool's last window is partial)
    bn = torch.nn.BatchNorm2d(6)
    mask, idx = x > 0, torch.arange(64 * 96).reshape(64, 96)
    return {
        # the result's dtype by type promotion: `where`'s condition takes no part; a 0-d float makes a long
        # tensor's result float; an in-place op writes its own dtype
        "where of two numbers": (lambda: torch.where(mask, 0.0, 1.0), {"aten::where"}),
        "long times a 0-d float": (lambda: idx * torch.tensor(0.5), {"aten::mul"}),
        "bf16 plus float in place": (lambda: h.clone().add_(torch.randn(40)), {"aten::add_"}),
        "add broadcast": (lambda: x + y, {"aten::add"}),
        "mul in place": (lambda: x.clone().mul_(2.0), {"aten::mul_"}),
        "relu": (lambda: F.relu(x), {"aten::relu"}),
        "silu bf16": (lambda: F.silu(h), {"aten::silu"}),
        "layer norm bf16": (lambda: F.layer_norm(h, (40,), ln_w, ln_b), {"aten::native_layer_norm"}),
        "batch norm": (lambda: bn(img), {"aten::native_batch_norm", "aten::_native_batch_norm_legit"}),
        "softmax": (lambda: torch.softmax(x, dim=-1), {"aten::_softmax"}),
        "to bf16": (lambda: x.to(torch.bfloat16), {"aten::_to_copy"}),
        "max pool with indices": (
            lambda: F.max_pool2d(img, 3, 2, 1, return_indices=True),
            {"aten::max_pool2d_with_indices"},
        ),
        "max pool, ceil mode": (
            lambda: F.max_pool2d(img, 3, 2, 0, ceil_mode=True, return_indices=True),
            {"aten::max_pool2d_with_indices"},
        ),
        "average pool": (lambda: F.avg_pool2d(img, 2), {"aten::avg_pool2d"}),
        "adaptive average pool": (lambda: F.adaptive_avg_pool2d(img, (3, 3)), {"aten::_adaptive_avg_pool2d"}),
    }


# the op the dispatcher sees, counted as the op of the same family it runs inside (its kernel's call)
_COUNTED_AS = {
    "aten::_to_copy": "aten::copy_",
    "aten::relu": "aten::clamp_min",
    "aten::adaptive_avg_pool2d": "aten::_adaptive_avg_pool2d",
    "aten::_native_batch_norm_legit": "aten::native_batch_norm",
}


@pytest.mark.parametrize("case", list(_byte_cases()))
def test_bytes_of_elementwise_and_normalization_ops_agree_with_their_tensors(
    case: str, tmp_path: Path
) -> None:
    fn, ops = _byte_cases()[case]
    found = read_calls(record(fn, tmp_path / "trace.json"))
    ours = sum(c.cost.bytes for c in found.calls if c.name in ops | {_COUNTED_AS.get(o, o) for o in ops})
    expected = tensor_bytes(fn, ops)
    assert expected > 0
    assert abs(ours - expected) <= 0.05 * expected, (case, ours, expected, [c.name for c in found.calls])


def _least_bytes_cases() -> dict[str, tuple[Callable[[], Any], str, float]]:
    """(what runs, the op, the bytes each call must read and write, by hand)."""
    x, y, o = torch.randn(64, 96), torch.randn(64, 96), torch.empty(64, 96)
    ints = torch.arange(64 * 96, dtype=torch.int32).reshape(64, 96)
    img, gn = torch.randn(2, 16, 9, 9), torch.nn.GroupNorm(4, 16)
    ln_x, ln_g, ln = (
        torch.randn(8, 40),
        torch.randn(8, 40),
        torch.nn.LayerNorm(40),
    )  # (the input needs no gradient)
    plane = 64 * 96 * 4
    lin_x, lin_w, lin_b = torch.randn(128, 64), torch.randn(192, 64), torch.randn(192)
    short, q, mask = torch.randn(4096, 4), torch.randn(2, 4, 24, 16), torch.randn(2, 4, 24, 24)

    return {
        # an out= tensor is written, not read
        "mul into out=": (lambda: torch.mul(x, y, out=o), "aten::mul", 3.0 * plane),
        # max of two tensors is elementwise, not a reduction: counted once, as the maximum it runs
        "max of two tensors": (lambda: torch.max(x, y), "aten::maximum", 3.0 * plane),
        # a Python float makes an int tensor's result float32 (it is recorded as a 0-d double)
        "int32 times a Python float": (lambda: ints * 0.5, "aten::mul", 2.0 * plane + 8),
        # a bias broadcast into a CPU product's output (a copy from a view of stride 0) is read once
        "a bias copied into a product's output": (
            lambda: F.linear(lin_x, lin_w, lin_b),
            "aten::copy_",
            128 * 192 * 4 + 192 * 4,
        ),
        # reductions read their input only, and write its reduced shape in their result's dtype
        "norm over a dim": (lambda: short.norm(dim=1), "aten::linalg_vector_norm", 4096 * 4 * 4 + 4096 * 4),
        "argmax over a dim": (lambda: short.argmax(dim=1), "aten::argmax", 4096 * 4 * 4 + 4096 * 8),
        "max over a dim": (lambda: short.max(dim=1), "aten::max", 4096 * 4 * 4 + 4096 * (4 + 8)),
        # an attention reads its mask too
        "attention with a mask": (
            lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=mask),
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            (3 * 2 * 4 * 24 * 16 + 2 * 4 * 24 * 24 + 2 * 4 * 24 * 16) * 4,
        ),
        # a group norm saves a mean and an inverse deviation per sample and group
        "group norm": (
            lambda: gn(img),
            "aten::native_group_norm",
            2.0 * img.numel() * 4 + 2 * 16 * 4 + 2 * 4 * 2 * 4,
        ),
        # a layer norm's backward that the input's gradient is not asked of writes only the parameters'
        "layer norm backward, no input gradient": (
            lambda: (ln(ln_x) * ln_g).sum().backward(),  # (a dense gradient: a sum's is one number, expanded)
            "aten::native_layer_norm_backward",
            2.0 * ln_x.numel() * 4 + 2 * 8 * 4 + 2 * 40 * 4 + 2 * 40 * 4,
        ),
    }


@pytest.mark.parametrize("case", list(_least_bytes_cases()))
def test_bytes_are_what_each_call_must_read_and_write(case: str, tmp_path: Path) -> None:
    fn, op, expected = _least_bytes_cases()[case]
    found = read_calls(record(fn, tmp_path / "trace.json"))
    (call,) = [c for c in found.calls if c.name == op]
    if case == "max of two tensors":  # (not also as the reduction it is not)
        assert [c.name for c in found.calls] == [op]
    assert call.cost.bytes == pytest.approx(expected), (case, call.cost)
    families = {"aten::copy_": "copy", "aten::_scaled_dot_product_flash_attention_for_cpu": "attention"}
    reductions = ("aten::linalg_vector_norm", "aten::argmax", "aten::max")
    family = (
        "reduction"
        if op in reductions and "over a dim" in case
        else "norm"
        if "norm" in op
        else "elementwise"
    )
    assert call.cost.family == families.get(op, family)


@pytest.mark.parametrize("groups", [1, 4, 16])
def test_a_grouped_convolutions_backward_is_two_forwards(groups: int, tmp_path: Path) -> None:
    # GIVEN a convolution of 16 channels in `groups` groups, its input and weight needing gradients (torch's own
    # counter multiplies the weight's gradient by the groups: the count here is the definition's)
    x = torch.randn(2, 16, 12, 12, requires_grad=True)
    w = torch.randn(16, 16 // groups, 3, 3, requires_grad=True)

    def step() -> None:
        F.conv2d(x, w, padding=1, groups=groups).sum().backward()

    calls = read_calls(record(step, tmp_path / "t.json")).calls
    forward = 2 * 2 * 16 * 12 * 12 * (16 // groups) * 9
    conv = {c.name: c.cost.flops for c in calls if c.cost.family == "conv"}
    assert sorted(conv.values()) == [forward, 2 * forward], conv


def test_a_linear_is_counted_once_as_the_product_it_runs(tmp_path: Path) -> None:
    x, w, b = torch.randn(16, 32), torch.randn(24, 32), torch.randn(24)
    found = read_calls(record(lambda: F.linear(x, w, b), tmp_path / "t.json"))
    gemms = [c for c in found.calls if c.cost.family == "gemm"]
    assert len(gemms) == 1 and gemms[0].cost.flops == 2 * 16 * 32 * 24


def test_ops_group_calls_by_shape_and_rank_a_badly_shaped_product_lower_given_a_roof(tmp_path: Path) -> None:
    # GIVEN a CPU job of good (64-aligned) and bad (65) products, several calls each, with a roof given
    good = (torch.randn(256, 256), torch.randn(256, 256))
    bad = (torch.randn(255, 257), torch.randn(257, 255))

    def job() -> None:
        for _ in range(3):
            torch.mm(*good)
            torch.mm(*bad)

    trace = record(job, tmp_path / "job.json")
    result = ops_source(trace, AnalysisOptions(peak_tflops=1.0, peak_tbps=0.05))
    (rank,) = result.ranks
    mms = {g.shapes: g for g in rank.groups if g.name == "aten::mm"}
    assert set(mms) == {"[256, 256] x [256, 256]", "[255, 257] x [257, 255]"}
    assert all(g.calls == 3 for g in mms.values())
    assert rank.time_kind == "wall" and rank.device is None
    g = mms["[256, 256] x [256, 256]"]
    assert g.flops == 3 * 2 * 256**3
    assert g.tflops == pytest.approx(g.flops / (g.time_us * 1e-6) / 1e12)
    assert g.efficiency is not None and g.bound == "compute"
    assert "given" in rank.roofline.source


def test_without_a_roof_a_cpu_trace_gives_rates_and_says_how_to_get_one(tmp_path: Path) -> None:
    a = torch.randn(64, 64)
    result = ops_source(record(lambda: torch.mm(a, a), tmp_path / "t.json"))
    (rank,) = result.ranks
    (g,) = [g for g in rank.groups if g.name == "aten::mm"]
    assert g.tflops is not None and g.efficiency is None and g.bound is None
    assert any("--peak-tflops" in n for n in rank.notes)


def test_a_trace_without_recorded_shapes_says_so(tmp_path: Path) -> None:
    import torch.profiler as tp

    a = torch.randn(64, 64)
    with tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=False) as prof:
        torch.mm(a, a)
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    (rank,) = ops_source(path).ranks
    assert rank.groups == []
    assert any("record_shapes=True" in n for n in rank.notes)


def test_an_ops_own_time_takes_off_the_counted_ops_inside_it_once(tmp_path: Path) -> None:
    # GIVEN an embedding's backward on a CPU: it zeroes its big gradient (a zero_ running a fill_, both counted
    # as one) before it adds the few rows it was given
    emb, idx = torch.nn.Embedding(100_000, 64), torch.randint(0, 100_000, (16,))
    (rank,) = ops_source(record(lambda: emb(idx).sum().backward(), tmp_path / "t.json")).ranks
    # THEN its own time is its wall time less the fill's, once (twice took it to nothing)
    (own,) = [g for g in rank.groups if g.name == "aten::embedding_dense_backward"]
    assert own.time_us > 0


def test_ops_the_model_does_not_count_are_named_in_a_note(tmp_path: Path) -> None:
    # GIVEN a product, a cumulative sum (not modelled) and views (no work of their own)
    a = torch.randn(64, 64)
    (rank,) = ops_source(record(lambda: (a @ a, a.cumsum(0), a.t().reshape(-1)), tmp_path / "t.json")).ranks
    # THEN the cumulative sum is named as not counted; the views are not
    (note,) = [n for n in rank.notes if "does not count" in n]
    assert "aten::cumsum x1" in note and "aten::reshape" not in note and "aten::t " not in note


def test_a_trace_of_ops_the_model_does_not_count_says_which_it_holds(tmp_path: Path) -> None:
    a = torch.randn(64, 64)
    (rank,) = ops_source(record(lambda: a.view(16, 256).t(), tmp_path / "t.json")).ranks
    assert rank.groups == []
    (note,) = [n for n in rank.notes if "of a family the model counts" in n]
    assert "aten::view" in note and "aten::t" in note


def test_the_model_needs_the_shapes_it_names() -> None:
    # a product whose inner sizes disagree, a convolution without stride or padding, a tensor list of nothing
    assert cost_of("aten::mm", OpInputs([[4, 5], [6, 7]], ["float", "float"])) is None
    conv = OpInputs([[1, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], []], ["float", "float", "", "", "", "", ""])
    assert cost_of("aten::conv2d", conv) is None
    assert cost_of("aten::conv2d", conv, conv_output=[1, 4, 6, 6]) is not None
    assert cost_of("aten::view", OpInputs([[4, 5]], ["float"])) is None


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x: Any) -> Any:
        return self.down(torch.relu(self.up(x)))


def test_stacks_name_the_users_own_code_and_modules_hold_their_forward_and_backward(tmp_path: Path) -> None:
    # GIVEN two blocks of the same class trained a step under with_stack and with_modules
    model = torch.nn.Sequential(_Block(), _Block())
    x = torch.randn(16, 32)

    def train_step() -> None:
        model(x).sum().backward()

    train_step()
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts, record_shapes=True, with_stack=True, with_modules=True) as p:
        train_step()
    trace = tmp_path / "t.json"
    p.export_chrome_trace(str(trace))
    (rank,) = ops_source(trace).ranks
    # THEN the costliest products were issued from this test's train_step (the user's own frame)
    assert rank.stacks and all(s.user for s in rank.stacks)
    assert any(any("train_step" in f for f in s.frames) for s in rank.stacks)
    assert not any("torch/" in f for s in rank.stacks for f in s.frames)
    # AND the module tree holds each block's products, forward and backward, its instances also as one type
    by_name = {m.name: m for m in rank.modules}
    assert {"Sequential_0", "_Block_0", "_Block_1", "Linear_0", "Linear_3"} <= set(by_name)
    block = by_name["_Block_0"]
    assert block.forward_us > 0 and block.backward_us > 0
    # five products of 2·16·32·64 (two forward; the first layer's weight gradient, the input needs none; the
    # second layer's input and weight gradients), the relu and its backward, the two bias gradients' sums
    assert block.flops == 5 * 2 * 16 * 32 * 64 + 16 * 64 * 3 + 16 * 32
    types = {m.path: m for m in rank.module_types}
    assert types["Sequential/_Block"].calls == by_name["_Block_0"].calls + by_name["_Block_1"].calls
    assert not [n for n in rank.notes if "with_stack" in n or "with_modules" in n]


class _ScalesFirst(torch.nn.Module):
    """A module that first runs an op needing no gradient (it makes no autograd node, and records the sequence
    number its child's convolution then takes), then its child."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x: Any, aux: Any) -> Any:
        scaled = aux * 2  # (first: it records the number the product's node then takes)
        return self.inner(x).sum() + scaled.sum()


def test_a_backward_goes_to_the_module_whose_op_made_its_autograd_node(tmp_path: Path) -> None:
    # GIVEN a parent module whose own op needing no gradient runs just before its child's product
    model, x, aux = _ScalesFirst(), torch.randn(2, 4, 8, 8), torch.randn(64)
    model(x, aux).backward()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, with_stack=True
    ) as p:
        model(x, aux).backward()
    trace = tmp_path / "t.json"
    p.export_chrome_trace(str(trace))
    (rank,) = ops_source(trace).ranks
    # THEN the convolution's backward (the weight's gradient: the input needs none) is the child's
    by_name = {m.name: m for m in rank.modules}
    assert by_name["Conv2d_0"].backward_us > 0
    assert by_name["Conv2d_0"].flops == 2 * (
        2 * 2 * 8 * 8 * 8 * 4 * 9
    )  # the forward and the weight's gradient


def test_groups_and_their_stacks_keep_apart_what_differs_in_dtype_or_mask(tmp_path: Path) -> None:
    # GIVEN an fp32 and a bf16 add of the same shapes, and an attention with and without its causal mask,
    # issued from one function
    x = torch.randn(64, 128)
    h = x.to(torch.bfloat16)
    q = torch.randn(1, 2, 32, 16)

    def step() -> None:
        x + x
        h + h
        F.scaled_dot_product_attention(q, q, q)
        F.scaled_dot_product_attention(q, q, q, is_causal=True)

    trace = record(step, tmp_path / "t.json", with_stack=True)
    (rank,) = ops_source(trace, AnalysisOptions(top=0)).ranks
    # THEN the two adds are two groups, the bf16 one saying its dtype
    adds = sorted(g.shapes for g in rank.groups if g.name == "aten::add")
    assert adds == ["[64, 128], [64, 128]", "[64, 128], [64, 128] bf16"]
    # AND the attention's stacks are listed per group: the causal one apart, with its own time
    attention = {s.name: s for s in rank.stacks if "attention" in s.name}
    assert len(attention) == 2 and sum("(causal)" in name for name in attention) == 1
    for g in rank.groups:
        if g.family == "attention":
            name = g.name + (" (causal)" if g.causal else "")
            assert attention[name].time_us == pytest.approx(g.time_us) and attention[name].share == 1.0


def test_a_cpus_foreach_op_is_counted_once_as_the_per_tensor_ops_it_runs(tmp_path: Path) -> None:
    # GIVEN a CPU foreach optimizer step (its _foreach_ ops run per-tensor ops inside them)
    params = [torch.nn.Parameter(torch.randn(64, 32)), torch.nn.Parameter(torch.randn(32))]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, foreach=True)
    (rank,) = ops_source(record(opt.step, tmp_path / "t.json")).ranks
    # THEN the per-tensor ops are counted, once: the foreach ops that ran them are not counted again
    assert {g.family for g in rank.groups} >= {"elementwise"}
    assert not [g.name for g in rank.groups if g.name.startswith("aten::_foreach_")]
    # AND no note says the foreach ops' work is missing
    assert not [n for n in rank.notes if "_foreach_" in n and "no cost" in n], rank.notes


def test_without_stacks_or_modules_the_views_say_what_records_them(tmp_path: Path) -> None:
    a = torch.randn(64, 64)
    (rank,) = ops_source(record(lambda: torch.mm(a, a), tmp_path / "t.json")).ranks
    assert rank.stacks == [] and rank.modules == []
    notes = " ".join(rank.notes)
    assert "no Python stacks" in notes and "no nn.Module frames" in notes and "with_stack=True" in notes
