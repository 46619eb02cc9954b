"""The import rules of DESIGN.md, checked on the source: analysis never imports torch or capture; capture never
imports analysis; nothing heavy at `import stepscope`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "stepscope"


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def modules_of(layer: str) -> list[Path]:
    return sorted((PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("path", modules_of("analysis"), ids=lambda p: p.name)
def test_analysis_imports_neither_torch_nor_capture(path: Path) -> None:
    bad = {
        m for m in imported_modules(path) if m.split(".")[0] == "torch" or m.startswith("stepscope.capture")
    }
    assert not bad, f"{path.name} imports {sorted(bad)}"


@pytest.mark.parametrize("path", modules_of("capture"), ids=lambda p: p.name)
def test_capture_does_not_import_analysis(path: Path) -> None:
    bad = {m for m in imported_modules(path) if m.startswith("stepscope.analysis")}
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_analysis_and_cli_import_without_torch() -> None:
    modules = [f"stepscope.analysis.{p.stem}" for p in modules_of("analysis") if p.stem != "__init__"]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + (
            "import stepscope.cli, stepscope.collectives, stepscope.peaks\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
        )
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
