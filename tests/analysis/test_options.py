"""Every analysis option defined once (analysis/options.py): the commands' flags are made from AnalysisOptions'
fields, the commands hand them on whole, and the API takes the same options."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import click
import msgspec
import pytest
from click.testing import CliRunner

from stepscope.analysis import options as analysis_options_module
from stepscope.analysis.options import AnalysisOptions, Flag, fields
from stepscope.analysis.parallel import analyze_path
from stepscope.cli import main
from stepscope.cli._common import analysis_options

from ..support.synthetic import rank_trace, two_step_trace
from ..support.traces import write_trace

COMMANDS = ("analyze", "report", "diff", "merge", "summary", "whatif")


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_offers_the_fields_that_name_it_with_their_help(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for field in fields():
        flag = field.flag.flag or "--" + field.name.replace("_", "-")
        if command in field.flag.commands:
            assert flag in text and field.flag.help.split(" (")[0][:40] in text, (command, field.name)
        elif flag != "--top":  # (diff, summary and whatif have a --top of their own: rows shown)
            assert flag not in text, (command, field.name)


def test_the_flags_reach_the_analysis_as_the_api_takes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in (0, 1):
        write_trace(folder / f"rank{rank}.json.gz", rank_trace(1000 + 300 * rank), rank=rank)
    argv = ["--json", "--top", "1", "--steps", "1:", "--drop-last-step", "--jobs", "2"]
    assert main(["analyze", str(folder), *argv]) == 0
    from_cli = json.loads(capsys.readouterr().out)
    options = AnalysisOptions(top=1, steps=(1, None), drop_last_step=True, jobs=2)
    from_api = json.loads(msgspec.json.encode(analyze_path(folder, options)))
    assert from_cli == from_api
    # the same with keyword changes of the defaults, and not the same as the defaults
    changed = analyze_path(folder, top=1, steps=[1, None], drop_last_step=True, jobs=1)
    assert json.loads(msgspec.json.encode(changed)) == from_api
    assert json.loads(msgspec.json.encode(analyze_path(folder))) != from_api
    assert [len(r["top_kernels"]) for r in from_api["ranks"]] == [1, 1]


def test_a_change_that_is_not_an_option_is_refused_by_name(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "rank0.json.gz", two_step_trace(), rank=0)
    with pytest.raises(TypeError, match="not an analysis option: topp"):
        analyze_path(path, topp=3)


def test_an_option_added_as_a_field_is_a_flag_with_its_help_and_arrives_in_the_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN one more field (the example of docs/architecture.md)
    class Extended(AnalysisOptions, frozen=True, kw_only=True):
        min_kernel_us: Annotated[
            float, Flag("Leave kernels shorter than this out of the kernel tables (us).", ("analyze",))
        ] = 0.0

    monkeypatch.setattr(analysis_options_module, "AnalysisOptions", Extended)
    seen: list[AnalysisOptions] = []

    # WHEN a command takes the analysis options
    @click.command()
    @analysis_options("analyze")
    def command(options: AnalysisOptions) -> None:
        seen.append(options)

    # THEN the field is a flag, with its help, and its value comes in the options beside the others
    runner = CliRunner()
    assert "Leave kernels shorter than this" in runner.invoke(command, ["--help"]).output
    done = runner.invoke(command, ["--min-kernel-us", "5", "--top", "3"])
    assert done.exit_code == 0, done.output
    (options,) = seen
    assert isinstance(options, Extended)
    assert (options.min_kernel_us, options.top, options.step) == (5.0, 3, None)
    assert runner.invoke(command, ["--min-kernel-us", "x"]).exit_code == 2
