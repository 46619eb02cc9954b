"""`ProfileConfig`: every option of the performance monitor as one validated object (pydantic v2).

The same options come from keyword arguments, a YAML file (`ProfileConfig.from_yaml`) or command-line
flags (`add_profiling_args` / `ProfileConfig.from_args`); the run folder keeps the resolved copy in
`config.yaml`, which `from_yaml` reads back.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from stepscope.capture.console import warn_user
from stepscope.errors import ConfigError, InputError
from stepscope.runfolder.files import read_regular_text


class ProfileConfig(BaseModel):
    """Options of `stepscope.performance_monitor`; each field's description is its CLI help."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(True, description="Profile at all; False makes the monitor a plain pass-through.")
    out_dir: str = Field("stepscope_runs", description="Folder under which each run gets its own run folder.")
    wait: int = Field(5, ge=0, description="Steps to skip at the start of each cycle before warming up.")
    warmup: int = Field(
        2, ge=0, description="Steps traced but discarded, so that the active steps are steady."
    )
    # (at most schedule.MAX_ACTIVE: the Schedule made from these options refuses more)
    active: int = Field(3, ge=1, description="Steps recorded and exported in each cycle (at most 100,000).")
    repeat: int = Field(
        1, ge=0, description="Number of wait/warmup/active cycles; 0 repeats until the job ends."
    )
    skip_first: int = Field(0, ge=0, description="Steps ignored once, before the first cycle.")
    profiled_ranks: list[int] | Literal["all"] = Field(
        default_factory=lambda: [0],
        description='Global ranks that record ("all" for every rank); others pay nothing.',
    )
    record_shapes: bool = Field(False, description="Record input shapes of operators.")
    profile_memory: bool = Field(False, description="Record tensor allocations and frees.")
    with_stack: bool = Field(False, description="Record Python/C++ stacks of operators.")
    with_flops: bool = Field(False, description="Estimate FLOPs of matrix multiplications and convolutions.")
    with_modules: bool = Field(False, description="Record the nn.Module hierarchy of operators.")
    flop_counter_step: int | None = Field(
        None,
        ge=0,
        description="Step at which FLOPs are counted with FlopCounterMode (kept outside traced windows).",
    )
    flop_table_depth: int = Field(
        2, ge=1, description="Module depth of the FLOP table: 1 the model only, 2 also its children, ..."
    )
    peak_tflops: float | None = Field(
        None, gt=0, description="Peak dense TFLOP/s of one device for MFU; overrides the built-in peak table."
    )
    peak_dtype: Literal["auto", "fp32", "tf32", "bf16", "fp16", "fp8"] = Field(
        "auto",
        description="Number format whose peak MFU divides by; auto: the main matmul input type of the counted step.",
    )
    comm_logger_step: int | None = Field(
        None, ge=0, description="Step at which collectives are logged (kept outside traced windows)."
    )
    comm_noise_level: int = Field(
        1, ge=0, le=3, description="Detail of the collective log: 0 collectives only ... 3 every operation."
    )
    memory_log_every: int | None = Field(None, ge=1, description="Log memory every N steps.")
    memory_snapshot: bool = Field(
        False, description="Record CUDA memory history over active windows; snapshot on OOM."
    )
    memory_timeline: bool = Field(
        False, description="Export a memory timeline (HTML + raw JSON) per active window."
    )
    system_sample_interval: float | None = Field(
        None, gt=0, description="Seconds between samples of CPU, RSS and GPU utilisation (background thread)."
    )
    nsight: bool = Field(
        False,
        description="NVTX ranges (steps and regions) and cudaProfilerStart/Stop around active windows, for "
        "`nsys profile --capture-range=cudaProfilerApi`.",
    )
    python_sampling: bool = Field(
        False,
        description="Sample the training process's Python stacks with py-spy (pip install 'stepscope[pyspy]') "
        "during each active window, about 100 times a second (python_samples/): analyze names the Python "
        "functions that hold the step. Needs ptrace permission (docs/integrations.md).",
    )
    host_memory: bool = Field(
        False,
        description="Trace Python heap allocations with tracemalloc from each window's first traced step to its "
        "end (host_memory/): the top allocation sites by size and by growth; analyze names sites that grow "
        "window after window.",
    )
    trace: bool = Field(
        True,
        description="Record torch.profiler traces of the windows; `stepscope run --nsys` turns it off, since "
        "Nsight Systems and torch.profiler both need CUPTI.",
    )
    trace_budget_mb: float | None = Field(
        None,
        gt=0,
        description="Warn once, before a window is exported, when its trace would exceed this many MB of JSON "
        "(10^6 bytes), saying which options to drop and how many active steps fit (measured at a warmup step).",
    )
    tensorboard: bool = Field(False, description="Log scalars to TensorBoard in the run folder.")
    wandb: bool = Field(False, description="Log scalars and top ops to Weights & Biases.")
    console: bool = Field(
        True, description="Print the top-ops table of each window on the first profiled rank."
    )
    top_n: int = Field(10, ge=1, description="Rows of the console top-ops table.")
    process_groups: bool = Field(
        True,
        description="Record the job's process groups and device meshes (process_groups/rank{R}.json) when "
        "torch.distributed is initialised; looked at the first step, after windows and at close.",
    )
    report: bool = Field(
        True,
        description="Write the run's HTML report (report.html) when the monitor closes, on the first profiled "
        "rank, from what the run folder holds then.",
    )
    on_demand: bool = Field(
        False,
        description="Record nothing until asked: `stepscope trigger RUN_DIR` (or SIGUSR2) makes every profiled "
        "rank record the next warmup + active window, from the same step; the wait/repeat schedule is unused.",
    )
    trigger_poll_steps: int = Field(
        10,
        ge=1,
        description="With on_demand: look for a trigger request every N steps (one stat() of a file).",
    )
    watch: bool = Field(
        False,
        description="Watch every step's time and record a window by itself, on every profiled rank from the "
        "same step, when steps turn slower than the job's own noise allows (docs/capture.md: the watch).",
    )
    watch_windows_per_hour: int = Field(
        4, ge=1, description="With watch: the most windows the watch opens on a rank in an hour."
    )
    watch_cooldown_steps: int = Field(
        100, ge=0, description="With watch: steps after a window's last step before the watch opens another."
    )
    watch_max_mb: float = Field(
        1000.0,
        gt=0,
        description="With watch: no more windows once this rank's traces in the run folder take this many MB.",
    )
    comm_patterns: list[str] = Field(
        default_factory=list,
        description="Regexes naming more GPU kernels as communication when the run is analysed "
        "(as `stepscope analyze --comm-pattern`).",
    )

    @field_validator("profiled_ranks")
    @classmethod
    def _ranks_non_negative(cls, value: list[int] | str) -> list[int] | str:
        if isinstance(value, list) and any(r < 0 for r in value):
            raise ValueError("ranks must be >= 0")
        return value

    @field_validator("comm_patterns")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        import re

        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression ({exc})") from None
        return value

    @field_validator("watch")
    @classmethod
    def _watch_needs_an_end(cls, value: bool, info: ValidationInfo) -> bool:
        if not value:
            return value
        if not info.data.get("trace", True):
            raise ValueError("the watch records windows: it needs trace=True")
        if info.data.get("repeat") == 0 and not info.data.get("on_demand"):
            raise ValueError(
                "the watch opens windows once the scheduled ones are over; with repeat=0 they never are (set "
                "repeat >= 1, or on_demand=True)"
            )
        return value

    # --- construction -----------------------------------------------------------------------------
    @classmethod
    def build(cls, base: ProfileConfig | str | Path | None = None, **overrides: Any) -> ProfileConfig:
        """A config from an optional base (object or YAML path) with keyword overrides; ConfigError on bad values."""
        if base is None:
            data: dict[str, Any] = {}
        elif isinstance(base, ProfileConfig):
            data = base.model_dump()
        elif isinstance(base, (str, Path)):
            data = cls.from_yaml(base).model_dump()
        else:
            raise ConfigError(f"config must be a ProfileConfig or a YAML path, not {type(base).__name__}")
        data.update(overrides)
        return cls.validated(data)

    @classmethod
    def validated(
        cls, data: Mapping[str, Any], source: str | None = None, lines: Mapping[str, int] | None = None
    ) -> ProfileConfig:
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            message = _one_line(exc, lines)
            if source is not None:
                raise InputError(source, message) from None
            raise ConfigError(message) from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> ProfileConfig:
        path = Path(path)
        data = read_yaml_mapping(path, "expected a mapping of option: value at the top level")
        return cls.validated(data, source=str(path), lines=_key_lines(path))

    def to_yaml(self) -> str:
        header = "# stepscope configuration of this run; reload with stepscope.ProfileConfig.from_yaml\n"
        return header + yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ProfileConfig:
        """Read back the flags added by `add_profiling_args` (flags not given keep the config/YAML value)."""
        values = vars(args)
        base_path = values.get("profiler_config")
        data: dict[str, Any] = cls.from_yaml(base_path).model_dump() if base_path else {"enabled": False}
        for flag, field_name, _kind in SCRIPT_FLAGS:
            value = values.get(flag_dest(flag))
            if value is not None:
                data[field_name] = value
        if values.get("enable_memory_logging") and data.get("memory_log_every") is None:
            data["memory_log_every"] = DEFAULT_MEMORY_LOG_STEPS
        if not data.get("enabled"):
            given = [
                flag
                for flag, field_name, _ in SCRIPT_FLAGS
                if field_name != "enabled" and values.get(flag_dest(flag)) is not None
            ]
            if values.get("enable_memory_logging"):
                given.append("--enable-memory-logging")
            if given:
                warn_user(
                    f"stepscope: {', '.join(given)} given without --enable-profiling (or enabled: true in "
                    "--profiler-config): profiling is off, so they do nothing"
                )
        return cls.validated(data)


DEFAULT_MEMORY_LOG_STEPS = 10

# The flags of a training script's parser (integrations.args.add_profiling_args puts them there; from_args
# reads them back), as (flag, field, kind); kind: "flag" (on when given), "int", "float", "str", "ranks".
SCRIPT_FLAGS: list[tuple[str, str, str]] = [
    ("--enable-profiling", "enabled", "flag"),
    ("--profiler-output-dir", "out_dir", "str"),
    ("--profiler-wait-steps", "wait", "int"),
    ("--profiler-warmup-steps", "warmup", "int"),
    ("--profiler-active-steps", "active", "int"),
    ("--profiler-repeat", "repeat", "int"),
    ("--profiler-skip-first", "skip_first", "int"),
    ("--profiler-ranks", "profiled_ranks", "ranks"),
    ("--profiler-record-shapes", "record_shapes", "flag"),
    ("--profiler-profile-memory", "profile_memory", "flag"),
    ("--profiler-with-stack", "with_stack", "flag"),
    ("--profiler-with-flops", "with_flops", "flag"),
    ("--profiler-with-modules", "with_modules", "flag"),
    ("--flop-counter-step", "flop_counter_step", "int"),
    ("--comm-logger-step", "comm_logger_step", "int"),
    ("--flop-table-depth", "flop_table_depth", "int"),
    ("--peak-tflops", "peak_tflops", "float"),
    ("--memory-log-steps", "memory_log_every", "int"),
    ("--memory-snapshot", "memory_snapshot", "flag"),
    ("--memory-timeline", "memory_timeline", "flag"),
    ("--system-sample-interval", "system_sample_interval", "float"),
    ("--nsight", "nsight", "flag"),
    ("--python-sampling", "python_sampling", "flag"),
    ("--host-memory", "host_memory", "flag"),
    ("--profiler-trace-budget-mb", "trace_budget_mb", "float"),
    ("--profiler-watch", "watch", "flag"),
    ("--profiler-tensorboard", "tensorboard", "flag"),
    ("--profiler-wandb", "wandb", "flag"),
]


def flag_dest(flag: str) -> str:
    """The argparse destination of a script flag (`--profiler-wait-steps` -> `profiler_wait_steps`)."""
    return flag.lstrip("-").replace("-", "_")


def read_yaml_mapping(path: Path, not_a_mapping: str) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (an empty file is {}); InputError naming the file, and the line
    of a syntax error, otherwise."""
    text = read_regular_text(
        path, "a YAML file"
    )  # a FIFO or a device is refused, not waited on or read forever
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise InputError(path, f"not valid YAML{where}: {problem}") from None
    except (ValueError, RecursionError) as exc:  # (an integer of 5,000 digits: Python's int() refuses it)
        raise InputError(
            path, f"not usable YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(path, not_a_mapping)
    return data


def _key_lines(path: Path) -> dict[str, int]:
    """The line (1-based) of each top-level key of a YAML mapping that already parsed."""
    try:
        node = yaml.compose(read_regular_text(path, "a YAML file"))
    except (InputError, yaml.YAMLError):
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(k.value): k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def _one_line(exc: ValidationError, lines: Mapping[str, int] | None = None) -> str:
    """Pydantic's errors as one line: the plain option name (list positions as [i], never the union members
    pydantic tried, such as `list[int]`), what it should be, what it got, and the YAML line when known."""
    by_option: dict[str, list[str]] = {}
    got: dict[str, str] = {}
    for err in exc.errors():
        loc = err["loc"]
        name = str(loc[0]) if loc else "config"
        name += "".join(f"[{p}]" for p in loc[1:] if isinstance(p, int))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown option"
        elif "input" in err and err["type"] != "missing":
            got[name] = repr(err["input"])
        msg = msg.removeprefix("Input ").removeprefix("Value error, ")
        if msg not in by_option.setdefault(name, []):
            by_option[name].append(msg)
    parts = []
    for name, msgs in by_option.items():
        text = msgs[0] + "".join(" or " + m.removeprefix("should be ") for m in msgs[1:])
        where = f" (line {lines[name.split('[')[0]]})" if lines and name.split("[")[0] in lines else ""
        parts.append(
            f"invalid option '{name}'{where}: {text}" + (f" (got {got[name]})" if name in got else "")
        )
    return "; ".join(parts)
