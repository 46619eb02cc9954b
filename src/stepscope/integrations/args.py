"""Command-line flags for a training script's own parser: `stepscope.add_profiling_args(parser)` adds them,
`ProfileConfig.from_args(args)` reads them back (flags not given keep the YAML / default value). The flags
themselves are `ProfileConfig`'s (capture.config.SCRIPT_FLAGS): this adapter only puts them on a parser.
"""

from __future__ import annotations

import argparse
from typing import Any

from stepscope.capture.config import DEFAULT_MEMORY_LOG_STEPS, SCRIPT_FLAGS, ProfileConfig, flag_dest


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
    for flag, field_name, kind in SCRIPT_FLAGS:
        help_text = fields[field_name].description
        dest = flag_dest(flag)
        if kind == "flag":
            group.add_argument(
                flag, dest=dest, action="store_const", const=True, default=None, help=help_text
            )
        else:
            kind_type: Any = {"int": int, "float": float, "str": str, "ranks": _parse_ranks}[kind]
            group.add_argument(flag, dest=dest, type=kind_type, default=None, help=help_text)
    return parser
