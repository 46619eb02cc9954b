"""Peak table lookup, the throughput/MFU formula and the placement of instrumented steps (no torch)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepscope.capture.collectors import mfu
from stepscope.capture.collectors._instrument import planned_steps, untraced_step_from
from stepscope.capture.collectors.flops import peak_format
from stepscope.capture.schedule import Schedule
from stepscope.devices import (
    DTYPES,
    PEAK_SOURCES,
    PEAK_TFLOPS,
    device_key,
    lookup_bandwidth,
    lookup_peak,
    name_by_properties,
    no_peak_reason,
)
from stepscope.units import fmt_flops, fmt_tflops


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10", "A10"),
        ("Tesla V100-SXM2-32GB", "V100 SXM2"),
        ("Tesla V100-PCIE-16GB", "V100 PCIe"),
        ("Tesla T4", "T4"),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI300X VF", "MI300X"),
        ("AMD Instinct MI325X", "MI325X"),
        # look-alikes that must not borrow another device's peak
        ("NVIDIA A10G", None),
        ("NVIDIA L40", None),
        ("NVIDIA GeForce RTX 4090", None),
        ("NVIDIA H800", None),
    ],
)
def test_device_names_map_to_table_keys(name: str, key: str | None) -> None:
    assert device_key(name) == key


def test_an_mi250_is_judged_per_gcd_and_known_by_its_properties_where_rocm_names_it_generically() -> None:
    # GIVEN an MI250X's GCD as torch names it (each GCD is a device with its own memory), and a ROCm 6 MI250 GCD
    # that deviceProperties call "AMD Radeon Graphics" (as the shared MI250 trace does)
    gcd = {"warpSize": 64, "computeMajor": 9, "computeMinor": 0, "numSms": 104}
    named = name_by_properties("AMD Radeon Graphics", gcd)
    # THEN the table gives one GCD's half of the package's datasheet figures
    assert lookup_peak("AMD Instinct MI250X", "bf16").tflops == 383.0 / 2  # type: ignore[union-attr]
    assert lookup_bandwidth("AMD Instinct MI250X") == 3.2768 / 2
    # AND the generic name is told apart by its compute capability and compute units, and says so
    assert named.startswith("AMD Radeon Graphics (MI250 by its properties") and device_key(named) == "MI250"
    assert lookup_peak(named, "bf16").tflops == 362.1 / 2  # type: ignore[union-attr]
    assert device_key(name_by_properties("AMD Radeon Graphics", {**gcd, "numSms": 110})) == "MI250X"
    # AND other devices, or the same name with other properties, are left as they are
    assert name_by_properties("AMD Radeon Graphics", {**gcd, "numSms": 60}) == "AMD Radeon Graphics"
    assert name_by_properties("NVIDIA H100 80GB HBM3", {**gcd, "warpSize": 32}) == "NVIDIA H100 80GB HBM3"
    assert name_by_properties("AMD Radeon Graphics", {"warpSize": 64}) == "AMD Radeon Graphics"


def test_peak_lookup_returns_dense_figures_with_sources() -> None:
    h100 = lookup_peak("NVIDIA H100 80GB HBM3", "bf16")
    assert h100 is not None and h100.tflops == 989.5 and h100.device == "H100 SXM"
    assert "datasheet" in h100.source
    assert lookup_peak("NVIDIA A100-SXM4-40GB", "tf32").tflops == 156.0  # type: ignore[union-attr]
    assert lookup_peak("AMD Instinct MI300X", "fp8").tflops == 2614.9  # type: ignore[union-attr]
    assert lookup_peak("NVIDIA B200", "bf16").tflops == 2250.0  # type: ignore[union-attr]
    assert lookup_peak("NVIDIA L4", "fp16").tflops == 121.0  # type: ignore[union-attr]
    assert lookup_peak("NVIDIA A100-SXM4-80GB", "fp8") is None  # no FP8 on Ampere
    assert lookup_peak("NVIDIA A10G", "bf16") is None
    # every device has a source and only known number formats
    assert set(PEAK_SOURCES) == set(PEAK_TFLOPS)
    assert all(set(formats) <= set(DTYPES) for formats in PEAK_TFLOPS.values())


def test_no_peak_reasons_say_why_and_how() -> None:
    assert "CPU" in no_peak_reason(None, "fp32") and "peak_tflops" in no_peak_reason(None, "fp32")
    assert "'NVIDIA A10G' is not in" in no_peak_reason("NVIDIA A10G", "bf16")
    assert "no bf16 figure for V100 SXM2" in no_peak_reason("Tesla V100-SXM2-16GB", "bf16")


def test_formula() -> None:
    # 6e12 FLOPs per step, median step 2 s -> 3 TFLOP/s; peak 10 -> MFU 30%
    peak = mfu.override_peak(10.0, "test device", "bf16")
    result = mfu.throughput(6_000_000_000_000, [3.0, 1.0, 2.0], peak)
    assert result is not None
    assert result.median_step_s == 2.0 and result.steps_timed == 3
    assert result.tflops == pytest.approx(3.0) and result.mfu == pytest.approx(0.3)
    lines = result.lines()
    assert lines[0] == (
        "achieved 3 TFLOP/s = 6,000,000,000,000 FLOPs / 2000.000 ms (median of 3 undisturbed steps; the middle "
        "half took 1500.000-2500.000 ms)"
    )
    assert "MFU 30.00%" in lines[-1] and mfu.FORMULA in lines[-1] and "peak 10 TFLOP/s" in lines[-1]
    assert lines[1] == result.spread_note  # 1-3 s steps: the middle half spans 1.5-2.5 s
    assert mfu.achieved_tflops(2_000_000_000_000, 0.5) == 4.0
    assert mfu.mfu(494.75, 989.5) == 0.5


def test_a_wide_spread_of_step_times_is_said_with_the_figure() -> None:
    # GIVEN 1 TFLOP per step and steps of 1 s, some of them slowed to 3-4 s (a busy machine)
    steady = mfu.throughput(10**12, [1.0, 1.05, 0.98, 1.02, 1.1, 3.0], None, "no MFU: x")
    busy = mfu.throughput(10**12, [1.0, 1.02, 3.0, 3.5, 4.0, 0.99, 3.2, 1.01], None, "no MFU: x")
    assert steady is not None and busy is not None
    # THEN a steady run's middle half is narrow and says nothing more
    assert steady.spread_note is None and len(steady.lines()) == 2
    # AND a busy run says its figure may not be the job's own speed, with the figure at the first quartile
    assert busy.median_step_s == pytest.approx(2.01) and busy.q1_step_s == pytest.approx(1.0075)
    assert busy.spread_note is not None and busy.lines()[1] == busy.spread_note
    assert busy.spread_note.startswith("the steps' times vary widely (the middle half took 1007.500-")
    assert busy.spread_note.endswith(f"it would be {fmt_tflops(1 / 1.0075)}")


@pytest.mark.parametrize(
    ("tflops", "text"),
    [
        (0.004290, "0.00429 TFLOP/s"),  # the HF report printed 0.00
        (8.145e-05, "0.00008145 TFLOP/s"),  # never an exponent
        (0.016338, "0.01634 TFLOP/s"),
        (412.34, "412.3 TFLOP/s"),
        (1979.0, "1,979 TFLOP/s"),
        (0.0, "0 TFLOP/s"),
        (None, "-"),
    ],
)
def test_tflops_keep_four_significant_digits(tflops: float | None, text: str) -> None:
    assert fmt_tflops(tflops) == text


def test_flop_counts_get_an_si_prefix() -> None:
    assert [fmt_flops(n) for n in (0, 512, 137_216, 107_937_792, 1_208_000_000, 8_246_337_208_320)] == [
        "0 FLOP", "512 FLOP", "137.2 kFLOP", "107.9 MFLOP", "1.208 GFLOP", "8.246 TFLOP",
    ]  # fmt: skip


def test_no_mfu_without_peak_and_no_figure_without_times() -> None:
    result = mfu.throughput(10**12, [1.0], None, "no MFU: because")
    assert result is not None and result.mfu is None and result.lines()[1] == "no MFU: because"
    assert mfu.throughput(10**12, [], None) is None
    assert mfu.throughput(0, [1.0], None) is None
    with pytest.raises(ValueError):
        mfu.achieved_tflops(1, 0.0)


def test_peak_format_of_dtypes() -> None:
    assert peak_format("torch.bfloat16", tf32=False) == "bf16"
    assert peak_format("torch.float16", tf32=True) == "fp16"
    assert peak_format("torch.float32", tf32=False) == "fp32"
    assert peak_format("torch.float32", tf32=True) == "tf32"
    assert peak_format("torch.float8_e4m3fn", tf32=False) == "fp8"
    assert peak_format("torch.int8", tf32=False) is None
    assert peak_format(None, tf32=False) is None


schedules = st.builds(
    Schedule,
    wait=st.integers(0, 4),
    warmup=st.integers(0, 3),
    active=st.integers(1, 4),
    repeat=st.integers(0, 3),
    skip_first=st.integers(0, 4),
)


@given(schedule=schedules, requested=st.integers(0, 40))
def test_instrumented_step_lies_outside_every_window(schedule: Schedule, requested: int) -> None:
    placed = untraced_step_from(schedule, requested)
    if schedule.repeat == 0 and schedule.wait == 0 and requested >= schedule.skip_first:
        assert placed is None  # every step from skip_first on is traced: refused
        return
    assert placed is not None and placed >= requested
    assert not schedule.is_traced(placed)
    assert all(not (first <= placed <= last) for first, last in schedule.windows(limit=placed + 1))
    # the first such step: everything between the request and it is traced
    assert all(schedule.is_traced(s) for s in range(requested, placed))


@given(schedule=schedules, flop=st.integers(0, 30), comm=st.integers(0, 30))
def test_flop_and_comm_steps_never_coincide(schedule: Schedule, flop: int, comm: int) -> None:
    flop_step, comm_step = planned_steps(schedule, flop, comm)
    assert flop_step == untraced_step_from(schedule, flop)
    if comm_step is not None:
        assert comm_step != flop_step and not schedule.is_traced(comm_step) and comm_step >= comm


# the undisturbed steps of two identical GEMM runs on an H200 (docs/gpu/2026-11-30_h200_run5_gemm*_metrics.jsonl,
# steps 3-11, ms): eight 8192^3 bf16 products per step, fast for the first steps, then slower as the clocks fall
H200_GEMM_STEPS_MS = [
    [11.152299, 11.689113, 11.638322, 11.677356, 11.741258, 12.664039, 12.811355, 12.77153, 12.845361],
    [11.122992, 11.240314, 11.20907, 11.21558, 11.20018, 12.947833, 12.490716, 12.715844, 12.82207],
]


@pytest.mark.parametrize("run", [0, 1])
def test_steps_at_two_speeds_say_so_with_the_figure_at_each(run: int) -> None:
    # GIVEN the steps of a real GPU run whose median fell on either speed from run to run (749 and 782 TFLOP/s)
    flops = 8 * 2 * 8192**3
    result = mfu.throughput(flops, [t / 1e3 for t in H200_GEMM_STEPS_MS[run]], None, "no MFU: x")
    assert result is not None
    # THEN the middle half is too narrow for the wide-spread note, and the two speeds are said instead
    assert result.q3_step_s < mfu.WIDE_SPREAD * result.q1_step_s
    assert result.speeds is not None
    (fast_n, fast_s), (slow_n, slow_s) = result.speeds
    assert (fast_n, slow_n) == (5, 4)
    assert 11.1e-3 < fast_s < 11.8e-3 and 12.6e-3 < slow_s < 12.9e-3
    note = result.spread_note
    assert note is not None and note in result.lines()
    assert note.startswith("the steps ran at two speeds (5 near ")
    assert f"{fmt_tflops(flops / fast_s / 1e12)} at the faster speed" in note


def test_steady_or_evenly_spread_steps_are_not_two_speeds() -> None:
    # GIVEN steady steps, steps spread evenly over 1.0-1.4 s, and one slow step among many (no quarter)
    steady = [1.0, 1.01, 0.99, 1.02, 1.0, 1.01, 0.98, 1.0]
    even = [1.0 + 0.05 * i for i in range(9)]
    one_slow = [1.0, 1.01, 0.99, 1.02, 1.0, 1.01, 0.98, 1.0, 1.3]
    for times in (steady, even, one_slow):
        result = mfu.throughput(10**12, times, None, "no MFU: x")
        # THEN no two speeds are said
        assert result is not None and result.speeds is None and result.spread_note is None, times
