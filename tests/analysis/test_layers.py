"""The import rules of docs/architecture.md, checked on the source: runfolder imports no other layer; analysis never imports
torch, rich or capture; capture never imports analysis; report never imports capture; nothing heavy at
`import stepscope`; the top level holds only the package's entry points."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "stepscope"


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


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def bad_imports(path: Path, *forbidden: str) -> set[str]:
    return {m for m in imported_modules(path) if any(m == f or m.startswith(f + ".") for f in forbidden)}


@pytest.mark.parametrize("path", modules_of("analysis"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_analysis_imports_neither_torch_nor_rich_nor_capture(path: Path) -> None:
    bad = bad_imports(path, "torch", "rich", "stepscope.capture", "stepscope.report", "stepscope.cli")
    assert not bad, f"{path.name} imports {sorted(bad)}"


@pytest.mark.parametrize("path", modules_of("runfolder"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_runfolder_imports_no_other_layer(path: Path) -> None:
    bad = bad_imports(
        path, "torch", "rich", "stepscope.capture", "stepscope.analysis", "stepscope.report", "stepscope.cli"
    )
    assert not bad, f"{path.name} imports {sorted(bad)}"


@pytest.mark.parametrize("path", modules_of("report"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_report_never_imports_capture_and_reporters_never_import_each_other(path: Path) -> None:
    bad = bad_imports(path, "stepscope.capture", "stepscope.cli", "torch")
    # shared: what a page shows (report.data), the report model with its labels and shared tables (report.model,
    # .columns, .tables and the private table builders report._*), and the two renderers' packages
    # (report.terminal, report.html); the page's own sections (report.html.*) only inside the page
    shared = {
        "stepscope.report",
        "stepscope.report.columns",
        "stepscope.report.data",
        "stepscope.report.html",
        "stepscope.report.model",
        "stepscope.report.tables",
        "stepscope.report.terminal",
    }
    name = module_name(path)
    page = name == "stepscope.report.html" or name.startswith("stepscope.report.html.")
    others = {
        m
        for m in imported_modules(path)
        if m.startswith("stepscope.report.")
        and m not in shared
        and not m.startswith("stepscope.report._")
        and not (page and m.startswith("stepscope.report.html."))
    }
    # the terminal's reporters and the page never import each other (report/memory.py, with both outputs, may)
    if page:
        others |= bad_imports(path, "stepscope.report.terminal")
    if name.startswith("stepscope.report.terminal"):
        others |= bad_imports(path, "stepscope.report.html")
    assert not bad and not others, f"{path.name} imports {sorted(bad | others)}"


def package_of(path: Path) -> str:
    """The dotted package a module of src/stepscope belongs to (a package's __init__ belongs to itself)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1])


def module_package(module: str) -> str:
    """The package of a dotted module name: itself when it is a package, else its parent."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    return module if path.is_dir() else module.rpartition(".")[0]


def test_no_private_name_is_imported_from_another_package() -> None:
    # docs/architecture.md: no private name crosses a package (`lint-imports` checks the private modules; names are here)
    crossing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stepscope")):
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if private and module_package(node.module) != package_of(path):
                crossing.append(
                    f"{path.relative_to(PACKAGE)}: from {node.module} import {', '.join(private)}"
                )
    assert not crossing, "\n".join(crossing)


@pytest.mark.parametrize(
    "package",
    [
        "stepscope.capture",
        "stepscope.capture.window",
        "stepscope.capture.collectors",
        "stepscope.capture.output",
    ],
)
def test_capture_packages_export_their_names_without_importing_torch(package: str) -> None:
    code = (
        f"import sys, {package} as package\n"
        "assert not {'torch', 'rich'} & set(sys.modules), 'imported at once'\n"
        "missing = [name for name in package.__all__ if getattr(package, name, None) is None]\n"
        "assert not missing, missing\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_top_level_holds_only_entry_points() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    # _lazy.py, _version.py, compress.py, devices.py (the accelerators' peaks), errors.py and units.py are
    # leaves every layer may use: they import nothing of stepscope
    assert top == [
        "__init__.py",
        "__main__.py",
        "_lazy.py",
        "_version.py",
        "compress.py",
        "devices.py",
        "errors.py",
        "units.py",
    ]
    for leaf in ("_lazy.py", "_version.py", "compress.py", "devices.py", "errors.py", "units.py"):
        assert not {m for m in imported_modules(PACKAGE / leaf) if m.startswith("stepscope")}
    layers = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert layers == ["analysis", "capture", "cli", "integrations", "report", "runfolder"]


@pytest.mark.parametrize("path", modules_of("capture"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_capture_does_not_import_analysis(path: Path) -> None:
    bad = {m for m in imported_modules(path) if m.startswith("stepscope.analysis")}
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_analysis_and_cli_import_without_torch() -> None:
    modules = [module_name(p) for p in modules_of("analysis")]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + (
            "import stepscope.cli, stepscope.runfolder, stepscope.runfolder.payloads\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
        )
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


ANALYSIS_PACKAGES = sorted(
    p.parent.name for p in (PACKAGE / "analysis").glob("*/__init__.py") if p.parent.name != "__pycache__"
)


@pytest.mark.parametrize("package", ["", *ANALYSIS_PACKAGES])
def test_every_public_name_of_an_analysis_package_resolves(package: str) -> None:
    import importlib

    name = "stepscope.analysis" + (f".{package}" if package else "")
    module = importlib.import_module(name)
    assert module.__all__, f"{name} exports nothing"
    for public in module.__all__:
        assert getattr(module, public) is not None, f"{name}.{public}"


def _private_crossings() -> list[str]:
    """`from stepscope.x.y import _name` (or from a private module) where the importer lives in another package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = module_name(path)
        home = importer if path.name == "__init__.py" else importer.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            if not node.module.startswith("stepscope."):
                continue
            parts = node.module.split(".")
            private_at = next((i for i, part in enumerate(parts) if part.startswith("_")), None)
            owner = ".".join(parts[:private_at]) if private_at is not None else node.module
            for alias in node.names:
                if private_at is None and not (
                    alias.name.startswith("_") and not alias.name.startswith("__")
                ):
                    continue
                if private_at is None:
                    owner = (
                        node.module
                        if (PACKAGE.parent / node.module.replace(".", "/")).is_dir()
                        else (node.module.rsplit(".", 1)[0])
                    )
                if not (home == owner or home.startswith(owner + ".")):
                    found.append(f"{importer}: {node.module}.{alias.name}")
    return found


def test_no_private_name_crosses_a_package() -> None:
    assert _private_crossings() == []


def test_no_test_module_imports_another() -> None:
    """What several test modules share lives in tests/support (its helpers and, in tests/support/jobs, the jobs),
    never in a test module another imports: running one test module never runs another's module-level code."""
    tests = Path(__file__).resolve().parents[1]
    importers = {}
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if module.split(".")[-1].startswith("test_") or any(
                    alias.name.startswith("test_") for alias in node.names if node.level and not module
                ):
                    importers[path.name] = module
    assert importers == {}


def test_tests_sit_in_their_layer_and_import_only_tests_support() -> None:
    """The tests live by layer (tests/capture, analysis, report, cli, jobs), none directly in tests/, and a test
    module imports from the tests package only tests.support (relative or absolute): never another test module,
    conftest.py or a helper of its own folder."""
    tests = Path(__file__).resolve().parents[1]
    assert sorted(p.name for p in tests.glob("test_*.py")) == []
    outside = []
    for path in sorted(tests.rglob("test_*.py")):
        package = ["tests", *path.parent.relative_to(tests).parts]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
                names = [f"{module}.{alias.name}" for alias in node.names] if module == "tests" else [module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "tests" and name.split(".")[:2] != ["tests", "support"]:
                    outside.append(f"{path.relative_to(tests)}: {name}")
    assert outside == []
