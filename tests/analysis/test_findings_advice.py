"""Advice that matches the cause, and figures that add up (#42 items 7 and 8): a phase whose time is Python, not
torch ops, is said to be Python (py-spy, python_sampling=True), and that time is one finding, not two; the step's
breakdown splits one step and adds up to 100%; long kernel names are shortened in finding text."""

from __future__ import annotations

import re

import pytest

from stepscope.analysis.analyze import analyze
from stepscope.analysis.findings import Finding

from ..support.traces import cpu, launched, step, table_of

T0 = 1_000_000.0
OPTIMIZER = "Optimizer.step#SGD.step"


def cpu_steps(optimizer_ops: list[tuple[str, float, float]], *, steps: int = 4) -> list[dict]:
    """CPU-only steps of 1000 us: a forward of one 300 us op, a backward of 240 us, then a 450 us optimizer
    step with the given ops inside it ((name, start after the optimizer's start, duration) in us)."""
    ev: list[dict] = []
    for i in range(steps):
        t = T0 + 1000 * i
        ev += [
            step(i + 1, t, 1000),
            cpu("forward", t, 300, cat="user_annotation"),
            cpu("aten::mm", t + 1, 298),
            cpu("## backward ##", t + 300, 240, cat="user_annotation"),
            cpu("aten::mm", t + 301, 238),
            cpu(OPTIMIZER, t + 545, 450, cat="user_annotation"),
            *(cpu(name, t + 545 + at, dur) for name, at, dur in optimizer_ops),
        ]
    return ev


def findings_of(events: list[dict]) -> list[Finding]:
    return analyze(table_of({0: events})).findings


def by_id(findings: list[Finding], id_: str) -> Finding:
    (found,) = [f for f in findings if f.id == id_]
    return found


def test_an_optimizer_step_of_python_is_said_to_be_python() -> None:
    # GIVEN an optimizer step of 450 us in which one 10 us aten::add_ is the only torch op (98% Python)
    findings = findings_of(cpu_steps([("aten::add_", 100, 10)]))
    optimizer = by_id(findings, "optimizer_bound")
    # THEN the finding says the time is Python in the step and how to find it, not "use a fused optimizer"
    assert optimizer.severity == "high" and optimizer.cost_ms_per_step == pytest.approx(0.45)
    assert "98% of it runs no torch op" in optimizer.message
    assert "python_sampling=True" in optimizer.action and "py-spy" in optimizer.action
    assert "fused" not in optimizer.message
    assert optimizer.evidence["outside_ops_pct"] == pytest.approx(97.8, abs=0.1)
    # AND the same time is not priced again: no second finding holds the optimizer's Python
    assert [f.id for f in findings if f.severity in ("high", "medium")] == ["optimizer_bound"]
    priced = sum(f.cost_ms_per_step or 0.0 for f in findings)
    assert priced <= 1.0


def test_an_optimizer_step_of_many_small_ops_keeps_the_fused_advice() -> None:
    # GIVEN an optimizer step whose 450 us are 44 calls of 9.5 us, aten::add_ and aten::mul_ in turn (93% in
    # torch ops, neither op half of it)
    ops = [("aten::add_" if k % 2 else "aten::mul_", 2 + 10 * k, 9.5) for k in range(44)]
    optimizer = by_id(findings_of(cpu_steps(ops)), "optimizer_bound")
    # THEN the advice is the fused optimizer's, naming the top op
    assert "fused optimizer" in optimizer.action and "its top op is `aten::" in optimizer.message
    assert "no torch op" not in optimizer.message


def test_the_step_breakdown_splits_one_step_and_adds_up() -> None:
    # GIVEN steps whose phases are long in different steps: forward 300 / 100 / 100 / 300 us, the optimizer
    # 100 / 400 / 400 / 100 us, steps 1000 / 900 / 1100 / 1200 us
    ev: list[dict] = []
    t = T0
    for i, (dur, fwd, opt) in enumerate(
        [(1000, 300, 100), (900, 100, 400), (1100, 100, 400), (1200, 300, 100)]
    ):
        ev += [
            step(i + 1, t, dur),
            cpu("forward", t, fwd, cat="user_annotation"),
            cpu("aten::mm", t + 1, fwd - 2),
            cpu(OPTIMIZER, t + fwd + 10, opt, cat="user_annotation"),
            cpu("aten::add_", t + fwd + 11, opt - 2),
        ]
        t += dur
    breakdown = by_id(findings_of(ev), "step_breakdown")
    # THEN it is the median step's (the lower middle: 1000 us, step 1) split, phases from that same step
    evidence = breakdown.evidence
    assert (evidence["step_ms"], evidence["step"]) == (1.0, 1)
    assert (evidence["forward_ms_per_step"], evidence["optimizer_ms_per_step"]) == (0.3, 0.1)
    assert evidence["other_ms_per_step"] == 0.6
    # AND its shares add up to 100%
    shares = [int(p) for p in re.findall(r"\((\d+)%\)", breakdown.message)]
    assert sum(shares) == 100, breakdown.message
    assert "the median of its 4 steps (step 1, 1.00 ms) goes to forward 300 us (30%)" in breakdown.message


def test_a_gpu_waiting_for_python_in_the_optimizer_is_told_to_find_the_python() -> None:
    # GIVEN GPU steps of 1000 us: the forward launches a 300 us kernel, then the optimizer's region runs 600 us
    # of Python (no torch op) before the next launch: the GPU idles in it
    ev: list[dict] = []
    for i in range(3):
        t = T0 + 1000 * i
        ev += [
            step(i + 1, t, 1000),
            cpu("forward", t, 20, cat="user_annotation"),
            *launched("gemm", t + 5, t + 10, 300, 2 * i + 1),
            cpu(OPTIMIZER, t + 320, 600, cat="user_annotation"),
            cpu("aten::add_", t + 330, 5),
            *launched("gemm", t + 950, t + 955, 40, 2 * i + 2),
        ]
    host_bound = by_id(findings_of(ev), "host_bound")
    # THEN the finding says the CPU is in Python in the optimizer, and the action is to find that Python
    assert (
        "in optimizer for" in host_bound.message
        and "(no torch op runs in 99.2% of it: Python)" in host_bound.message
    )
    assert "python_sampling=True" in host_bound.action and "fused" not in host_bound.action
    assert host_bound.evidence["outside_ops_pct"] >= 90


LONG_KERNEL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
    "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int, "
    "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, "
    "at::detail::Array<char*, 3>, TrivialOffsetCalculator<2, unsigned int>, TrivialOffsetCalculator<1, unsigned "
    "int>, at::native::memory::LoadWithoutCast, at::native::memory::StoreWithoutCast)"
)


def test_a_long_templated_kernel_name_is_shortened_in_the_message_and_kept_in_the_evidence() -> None:
    # GIVEN 150 tiny kernels queued at once, named by a 400-character template
    assert len(LONG_KERNEL) > 300
    ev = [step(1, T0, 455)]
    for i in range(150):
        ev += launched(LONG_KERNEL, T0 + 1, T0 + 2 + 3 * i, 2, i + 1)
    tiny = by_id(analyze(table_of({0: ev})).findings, "tiny_kernels")
    # THEN the message names it in at most 80 characters: its namespace and kernel, the middle cut out
    (named,) = re.findall(r"most often `([^`]*)`", tiny.message)
    assert (
        len(named) <= 80 and named.startswith("at::native::vectorized_elementwise_kernel<4") and "…" in named
    )
    assert LONG_KERNEL not in tiny.message
    # AND the evidence keeps the full name
    assert tiny.evidence["most_frequent"] == LONG_KERNEL
