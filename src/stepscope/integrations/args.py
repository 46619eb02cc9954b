"""Command-line flags for a training script's own parser: `stepscope.add_profiling_args(parser)` adds them,
`ProfileConfig.from_args(args)` reads them back (flags not given keep the YAML / default value).
"""

from __future__ import annotations

import argparse
from typing import Any

from stepscope.capture.config import ProfileConfig


def config_from_args(cls: type[ProfileConfig], args: argparse.Namespace) -> ProfileConfig:
    """The config the flags of `add_profiling_args` describe."""
    values = vars(args)
    base_path = values.get("profiler_config")
    data: dict[str, Any] = cls.from_yaml(base_path).model_dump() if base_path else {"enabled": False}
    for flag, field_name, _kind in _FLAGS:
        value = values.get(_dest(flag))
        if value is not None:
            data[field_name] = value
    if values.get("enable_memory_logging") and data.get("memory_log_every") is None:
        data["memory_log_every"] = DEFAULT_MEMORY_LOG_STEPS
    if not data.get("enabled"):
        given = [
            flag
            for flag, field_name, _ in _FLAGS
            if field_name != "enabled" and values.get(_dest(flag)) is not None
        ]
        if values.get("enable_memory_logging"):
            given.append("--enable-memory-logging")
        if given:
            from stepscope.capture.collector import warn_user

            warn_user(
                f"stepscope: {', '.join(given)} given without --enable-profiling (or enabled: true in "
                "--profiler-config): profiling is off, so they do nothing"
            )
    return cls.validated(data)


DEFAULT_MEMORY_LOG_STEPS = 10

# (flag, field, kind) for add_profiling_args; kind: "flag" (on when given), "int", "float", "str", "ranks".
_FLAGS: list[tuple[str, str, str]] = [
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
    ("--profiler-trace-budget-mb", "trace_budget_mb", "float"),
    ("--profiler-tensorboard", "tensorboard", "flag"),
    ("--profiler-wandb", "wandb", "flag"),
]


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _parse_ranks(text: str) -> list[int] | str:
    if text.strip().lower() == "all":
        return "all"
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'all' or comma-separated ranks, got {text!r}") from None


def add_profiling_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add stepscope's flags to a training script's parser (in their own argument group)."""
    group = parser.add_argument_group("stepscope profiling")
    fields = ProfileConfig.model_fields
    group.add_argument(
        "--profiler-config", default=None, metavar="YAML", help="Read options from a YAML file first."
    )
    group.add_argument(
        "--enable-memory-logging",
        action="store_const",
        const=True,
        default=None,
        help=f"Log memory every --memory-log-steps steps (default {DEFAULT_MEMORY_LOG_STEPS}).",
    )
    for flag, field_name, kind in _FLAGS:
        help_text = fields[field_name].description
        dest = _dest(flag)
        if kind == "flag":
            group.add_argument(
                flag, dest=dest, action="store_const", const=True, default=None, help=help_text
            )
        else:
            kind_type: Any = {"int": int, "float": float, "str": str, "ranks": _parse_ranks}[kind]
            group.add_argument(flag, dest=dest, type=kind_type, default=None, help=help_text)
    return parser
