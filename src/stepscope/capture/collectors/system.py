"""The system sampler: a background thread that writes CPU %, RSS, system memory and, where NVML is
available (`nvidia-ml-py`, optional, imported lazily), GPU utilisation, memory, power and temperature per
device (nvidia-smi's utilization.gpu / .memory, memory.used / .free, temperature.gpu, power.draw) to a
JSON-lines file in the run folder (one SystemRow per sample, kind `system`).

It never touches the training thread: the step only pays for the GIL the sampler briefly holds, and each
sample does a fixed amount of work (a few psutil and NVML calls, one line written).
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

from stepscope.capture.collector import Collector, RunContext
from stepscope.capture.console import StepscopeWarning, warn_user
from stepscope.capture.output.writer import JsonLines
from stepscope.runfolder import ArtifactKind
from stepscope.runfolder.payloads import GpuSample, SystemRow

THREAD_NAME = "stepscope-system-sampler"


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

    def read(self) -> list[GpuSample]:
        out: list[GpuSample] = []
        nv = self.lib
        for index, handle in enumerate(self.handles):
            # the columns of nvidia-smi --query-gpu=utilization.gpu,utilization.memory,memory.used,memory.free,
            # temperature.gpu,power.draw (and memory.total)
            memory = _or_none(lambda h=handle: nv.nvmlDeviceGetMemoryInfo(h))
            rates = _or_none(lambda h=handle: nv.nvmlDeviceGetUtilizationRates(h))
            out.append(
                GpuSample(
                    index=index,
                    util_percent=_or_none(lambda r=rates: float(r.gpu)),
                    util_mem_percent=_or_none(lambda r=rates: float(r.memory)),
                    mem_used_bytes=int(memory.used) if memory is not None else None,
                    mem_free_bytes=_or_none(lambda m=memory: int(m.free)),
                    mem_total_bytes=int(memory.total) if memory is not None else None,
                    power_w=_or_none(lambda h=handle: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                    temp_c=_or_none(
                        lambda h=handle: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
                    ),
                )
            )
        return out

    def shutdown(self) -> None:
        if self.lib is not None:
            with contextlib.suppress(Exception):
                self.lib.nvmlShutdown()
            self.lib = None


def _or_none(read: Any) -> Any:
    # A field a device does not support (power on some boards) is left out, the rest still sampled.
    try:
        return read()
    except Exception:
        return None


class SystemSampler:
    """Samples every `interval` seconds into `path` (JSON lines of SystemRow) until `stop()`; usable without a
    monitor."""

    def __init__(self, path: str | Path, interval: float, *, use_nvml: bool = True) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds (got {interval})")
        self.path = Path(path)
        self.interval = float(interval)
        self.samples = 0
        self.nvml = _Nvml() if use_nvml else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: JsonLines | None = None
        self._process: Any = None
        self.error: BaseException | None = None

    def start(self) -> None:
        import psutil

        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call only sets the reference point
        psutil.cpu_percent(None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = JsonLines(self.path)
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
        row = SystemRow(
            t_s=round(time.monotonic() - self._t0, 4),
            unix_time=round(time.time(), 3),
            process_cpu_percent=float(self._process.cpu_percent(None)),
            system_cpu_percent=float(psutil.cpu_percent(None)),
            rss_bytes=int(self._process.memory_info().rss),
            sys_used_bytes=int(vm.used),
            sys_percent=float(vm.percent),
            gpus=self.nvml.read() if self.nvml is not None else [],
        )
        assert self._file is not None
        self._file.write(row)
        self.samples += 1


class SystemCollector(Collector):
    """Runs a `SystemSampler` for the life of the monitor (`system_sample_interval` seconds)."""

    name = "system"

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.sampler: SystemSampler | None = None

    def start(self) -> None:
        ctx = self.ctx
        path = ctx.writer.path(ArtifactKind.SYSTEM)
        self.sampler = SystemSampler(path, float(ctx.config.system_sample_interval or 1.0))
        self.sampler.start()
        ctx.writer.add(ArtifactKind.SYSTEM, path)
        nvml = self.sampler.nvml
        if nvml is not None and nvml.problem and _has_cuda():
            warn_user(
                f"stepscope: system sampler without GPU columns: {nvml.problem} (pip install nvidia-ml-py)",
                StepscopeWarning,
            )

    def close(self) -> None:
        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            sampler.stop()
            if sampler.error is not None:
                warn_user(
                    f"stepscope: the system sampler stopped early ({type(sampler.error).__name__}: "
                    f"{sampler.error}); {sampler.samples} samples were written",
                    StepscopeWarning,
                )


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())
