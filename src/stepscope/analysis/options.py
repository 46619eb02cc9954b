"""Every option of an analysis, defined once: its type, default, help and the commands that offer it.

`AnalysisOptions` is what `analyze`, `analyze_path`, `analyze_input`, `collect_report` and `diff_paths` take, and
what travels to the workers that analyse ranks. The commands' flags are generated from its fields
(`cli/_common.analysis_options`): a field's `Flag` says which commands have it, its help and how its text reads.
Adding an option is adding a field here and reading it where the analysis uses it.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, NamedTuple

import msgspec

StepRange = tuple[int | None, int | None]


def parse_step_range(text: str) -> StepRange:
    """`A:B`, `A:`, `:B` or `A` -> (first, last), inclusive; ValueError when it is none of those."""
    first, sep, last = text.partition(":")
    try:
        bounds = (int(first) if first.strip() else None, int(last) if last.strip() else None)
    except ValueError:
        raise ValueError(f"{text!r} is not A:B (step numbers)") from None
    if not sep:
        bounds = (bounds[0], bounds[0])
    if bounds == (None, None) or (bounds[0] is not None and bounds[1] is not None and bounds[0] > bounds[1]):
        raise ValueError(f"{text!r}: give A <= B")
    return bounds


def positive_float(text: str) -> float:
    """A number above 0; ValueError otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{text!r}: give a number above 0")
    return value


class Flag(NamedTuple):
    """How an option reads on the command line."""

    help: str
    commands: tuple[str, ...]  # the commands that offer it
    flag: str | None = None  # default: --the-field-name
    short: str | None = None
    metavar: str | None = None
    minimum: int | None = None  # for a number
    parse: Callable[[str], Any] | None = None  # text -> value (ValueError: a usage error)


# every command that reads traces
_TRACES = ("analyze", "report", "diff", "merge", "summary", "whatif", "ops")
_POOLED = ("analyze", "report", "diff")  # the commands whose ranks are analysed by a pool of tasks


class AnalysisOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The options of an analysis (see each field's help); the defaults are what the commands use."""

    step: Annotated[
        int | None,
        Flag(
            "Run folders: the profiled window ending at this step (default: each rank's latest).",
            _TRACES,
            minimum=0,
        ),
    ] = None
    steps: Annotated[
        StepRange | None,
        Flag(
            "Analyse only ProfilerStep#A to #B (inclusive; A: or :B leave one end open).",
            ("analyze",),
            metavar="A:B",
            parse=parse_step_range,
        ),
    ] = None
    drop_last_step: Annotated[
        bool, Flag("Leave the last ProfilerStep out of the window (HTA's default).", ("analyze",))
    ] = False
    top: Annotated[int, Flag("Kernels to list per rank.", ("analyze",), minimum=1)] = 10
    comm_patterns: Annotated[
        tuple[str, ...],
        Flag(
            "GPU kernels whose names match REGEX are communication too (repeatable; a run folder's config adds "
            "its comm_patterns).",
            ("analyze", "report", "diff", "merge"),
            flag="--comm-pattern",
            metavar="REGEX",
        ),
    ] = ()
    jobs: Annotated[
        int | None,
        Flag(
            "Local processes analysing ranks side by side, or reading one big plain-JSON file in stretches "
            "(default: all CPUs, none for less than 8 MB of JSON; 1: none).",
            (*_POOLED, "ops"),
            short="-j",
            minimum=1,
        ),
    ] = None
    executor: Annotated[
        Literal["local", "dask"],
        Flag(
            "Where the per-rank analyses run: local processes, or a Dask cluster (stepscope[dask]).", _POOLED
        ),
    ] = "local"
    scheduler: Annotated[
        str | None,
        Flag(
            "With --executor dask: the scheduler (tcp://host:8786); the workers must see PATH at the same path. "
            "Default: a local cluster.",
            _POOLED,
            metavar="ADDRESS",
        ),
    ] = None

    peak_tflops: Annotated[
        float | None,
        Flag(
            "The device's peak dense TFLOP/s, for every number format (default: the peak table, by the trace's "
            "device name; a CPU has none).",
            ("ops", "report"),
            metavar="TFLOPS",
            parse=positive_float,
        ),
    ] = None
    peak_tbps: Annotated[
        float | None,
        Flag(
            "The device memory's peak bandwidth in TB/s (default: the peak table, by the trace's device name).",
            ("ops", "report"),
            metavar="TBPS",
            parse=positive_float,
        ),
    ] = None

    roofline: Annotated[
        bool,
        Flag(
            "Add the ops against the roofline (stepscope ops) to the page, for any input: a second pass over "
            "each trace. A run folder recorded with record_shapes has it anyway.",
            ("report",),
        ),
    ] = False

    def but(self, **changes: Any) -> AnalysisOptions:
        """A copy with `changes` (field names; TypeError naming one that is not a field)."""
        return with_changes(self, changes)


_UnionType = type(int | None)


class Field(NamedTuple):
    """A field of AnalysisOptions as a command line sees it."""

    name: str
    kind: Any  # the type, without None
    optional: bool  # None is a value
    default: Any
    flag: Flag


def fields(command: str | None = None) -> list[Field]:
    """The fields of AnalysisOptions in order (those `command` offers, when given)."""
    hints = typing.get_type_hints(AnalysisOptions, include_extras=True)
    defaults = dict(zip(AnalysisOptions.__struct_fields__, AnalysisOptions.__struct_defaults__, strict=True))
    out = []
    for name in AnalysisOptions.__struct_fields__:
        kind, flag = typing.get_args(hints[name])
        args = typing.get_args(kind)
        optional = typing.get_origin(kind) in (typing.Union, _UnionType) and type(None) in args
        if optional:
            (kind,) = [a for a in args if a is not type(None)]
        if command is None or command in flag.commands:
            out.append(Field(name, kind, optional, defaults[name], flag))
    return out


def with_changes(options: AnalysisOptions | None, changes: Mapping[str, Any]) -> AnalysisOptions:
    """`options` (None: the defaults) with `changes`; a sequence given for a tuple field becomes a tuple."""
    options = options or AnalysisOptions()
    if not changes:
        return options
    unknown = set(changes) - set(AnalysisOptions.__struct_fields__)
    if unknown:
        raise TypeError(f"not an analysis option: {', '.join(sorted(unknown))}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in changes.items()}  # (no field is a list)
    return msgspec.structs.replace(options, **values)
