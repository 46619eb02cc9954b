"""The accelerators' peaks: dense FLOP/s by number format (MFU, the per-op roofline) and memory bandwidth (the
roofline's slope). A leaf, without torch: capture and analysis both read it.

Numbers are the vendors' datasheet figures without structured sparsity, in TFLOP/s per device; where a
datasheet prints only the with-sparsity figure (NVIDIA marks them with an asterisk and a footnote that dense
is one half of it), the dense figure is that half. Sources are listed per device in `PEAK_SOURCES` and in
docs/flops.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")

# device key -> number format -> dense TFLOP/s (fp32 is the non-tensor-core figure on NVIDIA).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 SXM": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
    "H200 SXM": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "B200": {"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
    "GB200": {"fp32": 80.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 366.5, "fp16": 366.5, "fp8": 733.0},
    "A10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    "V100 SXM2": {"fp32": 15.7, "fp16": 125.0},
    "V100 PCIe": {"fp32": 14.0, "fp16": 112.0},
    "T4": {"fp32": 8.1, "fp16": 65.0},
    # one GCD: an MI250(X) is two, and torch sees each as a device (its own memory, half the compute units)
    "MI250X": {"fp32": 47.85, "bf16": 191.5, "fp16": 191.5},
    "MI250": {"fp32": 45.25, "bf16": 181.05, "fp16": 181.05},
    "MI300X": {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
    "MI325X": {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
}

PEAK_SOURCES: dict[str, str] = {
    "H100 SXM": "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column; tensor figures with sparsity, halved)",
    "H100 PCIe": "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe column; tensor figures with sparsity, halved)",
    "H100 NVL": "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL column; tensor figures with sparsity, halved)",
    "H200 SXM": "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column; tensor figures with sparsity, halved)",
    "H200 NVL": "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL column; tensor figures with sparsity, halved)",
    "A100": "NVIDIA A100 Tensor Core GPU datasheet (dense figures; same for SXM and PCIe, 40 and 80 GB)",
    "B200": "NVIDIA HGX B200 datasheet, per-GPU figures (with sparsity, halved)",
    "GB200": "NVIDIA GB200 NVL72 datasheet, per-GPU figures (with sparsity, halved)",
    "L4": "NVIDIA L4 Tensor Core GPU datasheet (with sparsity, halved)",
    "L40S": "NVIDIA L40S GPU datasheet (with sparsity, halved)",
    "A10": "NVIDIA A10 Tensor Core GPU datasheet (dense figures)",
    "V100 SXM2": "NVIDIA Tesla V100 datasheet (SXM2 column; fp16 = tensor performance)",
    "V100 PCIe": "NVIDIA Tesla V100 datasheet (PCIe column; fp16 = tensor performance)",
    "T4": "NVIDIA T4 Tensor Core GPU datasheet (fp16 = mixed-precision tensor performance)",
    "MI250X": "AMD Instinct MI250X accelerator data sheet (peak matrix figures of its two GCDs, halved: one GCD)",
    "MI250": "AMD Instinct MI250 accelerator data sheet (peak matrix figures of its two GCDs, halved: one GCD)",
    "MI300X": "AMD Instinct MI300X accelerator data sheet (peak dense matrix figures)",
    "MI325X": "AMD Instinct MI325X accelerator data sheet (peak dense matrix figures)",
}

# device key -> peak memory bandwidth in TB/s (10^12 bytes/s), from the same datasheets. A100 and H100 PCIe come
# in two memory sizes with different bandwidths: the larger part's figure is `BANDWIDTH_BIG` where the device's
# memory is over 60 GiB (deviceProperties' totalGlobalMem).
PEAK_TBPS: dict[str, float] = {
    "H100 SXM": 3.35,
    "H100 PCIe": 2.0,
    "H100 NVL": 3.9,
    "H200 SXM": 4.8,
    "H200 NVL": 4.8,
    "A100": 1.555,
    "B200": 8.0,
    "GB200": 8.0,
    "L4": 0.3,
    "L40S": 0.864,
    "A10": 0.6,
    "V100 SXM2": 0.9,
    "V100 PCIe": 0.9,
    "T4": 0.32,
    "MI250X": 1.6384,  # one GCD (half of the package's 3.2768)
    "MI250": 1.6384,
    "MI300X": 5.3,
    "MI325X": 6.0,
}
BANDWIDTH_BIG: dict[str, float] = {"A100": 2.039}  # the 80 GB A100 SXM
BIG_MEMORY_BYTES = 60 << 30

# (pattern on the upper-cased device name, device key), first match wins: specific variants before the family.
_DEVICE_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), key)
    for p, key in [
        (r"\bGB200\b", "GB200"),
        (r"\bB200\b", "B200"),
        (r"\bH200\b.*\bNVL\b", "H200 NVL"),
        (r"\bH200\b", "H200 SXM"),
        (r"\bH100\b.*\bNVL\b", "H100 NVL"),
        (r"\bH100\b.*\bPCIE\b", "H100 PCIe"),
        (r"\bH100\b", "H100 SXM"),
        (r"\bA100\b", "A100"),
        (r"\bL40S\b", "L40S"),
        (r"\bL4\b", "L4"),
        (r"\bA10\b", "A10"),
        (r"\bV100\b.*\bPCIE\b", "V100 PCIe"),
        (r"\bV100\b", "V100 SXM2"),
        (r"\bT4\b", "T4"),
        (r"\bMI325X\b", "MI325X"),
        (r"\bMI300X\b", "MI300X"),
        (r"\bMI250X\b", "MI250X"),
        (r"\bMI250\b", "MI250"),
    ]
]


@dataclass(frozen=True)
class Peak:
    """The peak used for an MFU figure, and where it came from (printed next to every MFU)."""

    tflops: float
    device: str  # table key, or the device name for an override
    dtype: str | None
    source: str

    def describe(self) -> str:
        fmt = f" {self.dtype}" if self.dtype else ""
        return f"{self.tflops:g} TFLOP/s ({self.device}{fmt}; {self.source})"


def device_key(device_name: str) -> str | None:
    """The table key for a device name as torch.cuda.get_device_name() reports it; None when unknown."""
    upper = device_name.upper()
    for pattern, key in _DEVICE_PATTERNS:
        if pattern.search(upper):
            return key
    return None


# AMD devices that ROCm names only "AMD Radeon Graphics" (ROCm 6 on an MI250), told apart by deviceProperties:
# (computeMajor, computeMinor, compute units) -> device key. gfx90a with 104 compute units is one GCD of an MI250
# (an MI210 has the same figures); with 110, of an MI250X; gfx942 with 304 is an MI300X.
_AMD_BY_PROPERTIES: dict[tuple[int, int, int], str] = {
    (9, 0, 104): "MI250",
    (9, 0, 110): "MI250X",
    (9, 4, 304): "MI300X",
}


def name_by_properties(name: str, properties: dict[str, object]) -> str:
    """`name` as a trace's deviceProperties give it, with the table's device added where the name alone does
    not say it (`AMD Radeon Graphics (MI250 by its properties: ...)`); the name unchanged otherwise."""
    if device_key(name) is not None or properties.get("warpSize") != 64:
        return name
    major, minor, units = (properties.get(k) for k in ("computeMajor", "computeMinor", "numSms"))
    if not all(isinstance(v, int) for v in (major, minor, units)):
        return name
    key = _AMD_BY_PROPERTIES.get((major, minor, units))  # type: ignore[arg-type]
    if key is None:
        return name
    return f"{name} ({key} by its properties: compute {major}.{minor}, {units} compute units)"


def lookup_bandwidth(device_name: str, memory_bytes: int | None = None) -> float | None:
    """The peak memory bandwidth of `device_name` in TB/s; None when not in the table. `memory_bytes` (the
    device's memory) picks the larger part's figure where a family has two."""
    key = device_key(device_name)
    if key is None:
        return None
    if memory_bytes is not None and memory_bytes > BIG_MEMORY_BYTES and key in BANDWIDTH_BIG:
        return BANDWIDTH_BIG[key]
    return PEAK_TBPS.get(key)


def lookup_peak(device_name: str, dtype: str) -> Peak | None:
    """The dense peak of `device_name` for number format `dtype` (one of DTYPES); None when not in the table."""
    key = device_key(device_name)
    if key is None:
        return None
    tflops = PEAK_TFLOPS[key].get(dtype)
    if tflops is None:
        return None
    return Peak(tflops=tflops, device=key, dtype=dtype, source=PEAK_SOURCES[key])


def no_peak_reason(device_name: str | None, dtype: str | None) -> str:
    """Why there is no MFU for this device and format, in one sentence with the way out."""
    hint = "pass peak_tflops=<dense TFLOP/s of your device> to get one"
    if device_name is None:
        return f"no MFU: this run is on the CPU, and stepscope has no peak FLOP/s table for CPUs; {hint}"
    key = device_key(device_name)
    if key is None:
        return f"no MFU: {device_name!r} is not in stepscope's peak table (docs/flops.md); {hint}"
    return f"no MFU: the peak table has no {dtype} figure for {key} (docs/flops.md); {hint}"
