"""The system sampler: a background thread that writes CPU %, RSS, system memory and, where NVML is
available (`nvidia-ml-py`, optional, imported lazily), GPU utilisation, memory, power and temperature per
device to a CSV in the run folder.

It never touches the training thread: the step only pays for the GIL the sampler briefly holds, and each
sample does a fixed amount of work (a few psutil and NVML calls, one line written).
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from pathlib import Path
from typing import IO, Any

from stepscope.capture.collector import Collector, RunContext, StepscopeWarning

SYSTEM_TEMPLATE = "system/rank{rank}_system.csv"
THREAD_NAME = "stepscope-system-sampler"
BASE_COLUMNS = (
    "t_s",
    "unix_time",
    "process_cpu_percent",
    "system_cpu_percent",
    "rss_bytes",
    "sys_used_bytes",
    "sys_percent",
)
GPU_FIELDS = ("util_percent", "mem_used_bytes", "mem_total_bytes", "power_w", "temp_c")


class _Nvml:
    """The NVML devices of this host, or nothing when pynvml (nvidia-ml-py) or a driver is missing."""

    def __init__(self) -> None:
        self.lib: Any = None
        self.handles: list[Any] = []
        self.problem = ""
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.lib = pynvml
        except ImportError:
            self.problem = "nvidia-ml-py is not installed"
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.problem = f"NVML unavailable ({type(exc).__name__}: {exc})"

    def read(self) -> list[object]:
        out: list[object] = []
        nv = self.lib
        for handle in self.handles:
            out += [
                _or_blank(lambda h=handle: nv.nvmlDeviceGetUtilizationRates(h).gpu),
                _or_blank(lambda h=handle: nv.nvmlDeviceGetMemoryInfo(h).used),
                _or_blank(lambda h=handle: nv.nvmlDeviceGetMemoryInfo(h).total),
                _or_blank(lambda h=handle: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                _or_blank(lambda h=handle: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            ]
        return out

    def shutdown(self) -> None:
        if self.lib is not None:
            with contextlib.suppress(Exception):
                self.lib.nvmlShutdown()
            self.lib = None


def _or_blank(read: Any) -> object:
    # A field a device does not support (power on some boards) is left blank, the rest still sampled.
    try:
        return read()
    except Exception:
        return ""


class SystemSampler:
    """Samples every `interval` seconds into `path` (CSV) until `stop()`; usable without a monitor."""

    def __init__(self, path: str | Path, interval: float, *, use_nvml: bool = True) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds (got {interval})")
        self.path = Path(path)
        self.interval = float(interval)
        self.samples = 0
        self.nvml = _Nvml() if use_nvml else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: IO[str] | None = None
        self._process: Any = None
        self.error: BaseException | None = None

    @property
    def columns(self) -> list[str]:
        gpus = len(self.nvml.handles) if self.nvml is not None else 0
        return [*BASE_COLUMNS, *(f"gpu{i}_{f}" for i in range(gpus) for f in GPU_FIELDS)]

    def start(self) -> None:
        import psutil

        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call only sets the reference point
        psutil.cpu_percent(None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (kept open for the run)
        self._file.write(",".join(self.columns) + "\n")
        self._file.flush()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (it finishes the sample in progress), close the file and NVML."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.nvml is not None:
            self.nvml.shutdown()

    def _run(self) -> None:
        tick = 0
        try:
            while not self._stop.is_set():
                self._sample()
                tick += 1
                # Fixed-rate ticks; when a sample ran late, the missed ticks are skipped, not caught up.
                now = time.monotonic() - self._t0
                tick = max(tick, int(now / self.interval) + (1 if now % self.interval else 0))
                self._stop.wait(max(0.0, tick * self.interval - now))
        except Exception as exc:  # a failing sampler stops sampling, never training
            self.error = exc

    def _sample(self) -> None:
        import psutil

        vm = psutil.virtual_memory()
        values: list[object] = [
            f"{time.monotonic() - self._t0:.4f}",
            f"{time.time():.3f}",
            self._process.cpu_percent(None),
            psutil.cpu_percent(None),
            self._process.memory_info().rss,
            vm.used,
            vm.percent,
        ]
        if self.nvml is not None:
            values += self.nvml.read()
        assert self._file is not None
        self._file.write(",".join(str(v) for v in values) + "\n")
        self._file.flush()
        self.samples += 1


class SystemCollector(Collector):
    """Runs a `SystemSampler` for the life of the monitor (`system_sample_interval` seconds)."""

    name = "system"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.sampler: SystemSampler | None = None

    def start(self) -> None:
        ctx = self.ctx
        path = ctx.path(SYSTEM_TEMPLATE.format(rank=ctx.rank))
        self.sampler = SystemSampler(path, float(ctx.config.system_sample_interval or 1.0))
        self.sampler.start()
        ctx.add_artifact("system", path)
        nvml = self.sampler.nvml
        if nvml is not None and nvml.problem and _has_cuda():
            warnings.warn(
                f"stepscope: system sampler without GPU columns: {nvml.problem} (pip install nvidia-ml-py)",
                StepscopeWarning,
                stacklevel=2,
            )

    def close(self) -> None:
        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            sampler.stop()
            if sampler.error is not None:
                warnings.warn(
                    f"stepscope: the system sampler stopped early ({type(sampler.error).__name__}: "
                    f"{sampler.error}); {sampler.samples} samples were written",
                    StepscopeWarning,
                    stacklevel=2,
                )


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())
