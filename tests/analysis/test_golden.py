"""What users see does not change by accident: `analyze --json`, `summary --json`, `diff --json` and `report` on
every trace in ../shared/traces are byte for byte the outputs kept in tests/golden/ (normalised only for the
report's generation time and the traces' path). After an intended change of output, rewrite them with
`.venv/bin/python -m tests.support.golden --write` and commit them with the change."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from ..support.golden import cases, golden_path, read_golden, run_case

pytestmark = pytest.mark.shared

CASES = list(cases())


@pytest.mark.parametrize(("name", "args"), CASES, ids=[name for name, _ in CASES])
def test_output_is_unchanged(name: str, args: list[str], tmp_path: Path) -> None:
    assert golden_path(name).exists(), f"no golden output for {name}: python -m tests.support.golden --write"
    expected = read_golden(name)
    got = run_case(args, tmp_path)
    if got != expected:
        diff = difflib.unified_diff(
            expected.decode(errors="replace").splitlines(),
            got.decode(errors="replace").splitlines(),
            "golden",
            "now",
            lineterm="",
            n=1,
        )
        pytest.fail(f"{name} changed:\n" + "\n".join(list(diff)[:60]))
