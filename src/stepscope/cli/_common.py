"""Helpers shared by the CLI subcommands: JSON output and the console."""

from __future__ import annotations

import sys
from typing import Any

import msgspec

from stepscope.report.terminal import make_console


def print_json(document: Any) -> None:
    """Print one JSON document (msgspec Structs, dataclasses and plain containers all encode)."""
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(document), indent=2) + b"\n")
    sys.stdout.flush()


def console():  # type: ignore[no-untyped-def]
    return make_console()
