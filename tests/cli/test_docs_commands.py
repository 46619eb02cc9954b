"""The `stepscope` commands in docs/analysis.md run as written (from the repository root)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from stepscope.cli import main

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "analysis.md"


def doc_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.startswith("stepscope ")]


def test_doc_has_commands() -> None:
    assert len(doc_commands()) >= 4


@pytest.mark.shared
@pytest.mark.parametrize("command", doc_commands())
def test_doc_command_runs(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a command whose documented exit status is not 0 says so at its end: `  # exit 4`
    expected = re.search(r"#\s*exit (\d+)\s*$", command)
    monkeypatch.chdir(REPO)
    assert main(shlex.split(command, comments=True)[1:]) == (int(expected[1]) if expected else 0), (
        capsys.readouterr().err
    )
    assert capsys.readouterr().out
