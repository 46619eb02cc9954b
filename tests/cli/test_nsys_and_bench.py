"""`stepscope nsys-command` (snapshots of the printed command), `stepscope run --nsys` without nsys, and one
component at a time: `profile_component` and `stepscope bench` comparing two variants."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

NSYS = (
    "nsys profile --trace=cuda,nvtx,osrt --capture-range=cudaProfilerApi --capture-range-end={end} "
    "--output={out}/nsys/stepscope_%h_%p --force-overwrite=true"
)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--", "python", "train.py", "--lr", "0.1"],
            NSYS.format(end="stop", out="stepscope_runs")
            + " python -m stepscope run --nsight --no-trace train.py --lr 0.1",
        ),
        (
            ["--wait", "10", "--active", "2", "--repeat", "3", "--out-dir", "runs", "--", "train.py"],
            NSYS.format(end="repeat:3", out="runs")
            + " python -m stepscope run --out-dir runs --wait 10 --active 2 --repeat 3 --nsight --no-trace train.py",
        ),
        (
            ["--profile-memory", "--profiled-ranks", "0,1", "--", "python3", "-m", "pkg.train", "-x"],
            NSYS.format(end="stop", out="stepscope_runs")
            + " --cuda-memory-usage=true python3 -m stepscope run --profiled-ranks 0,1 --profile-memory "
            "--nsight --no-trace -m pkg.train -x",
        ),
        (
            ["--on-demand", "--", "python", "train.py"],
            NSYS.format(end="repeat", out="stepscope_runs")
            + " python -m stepscope run --nsight --no-trace --on-demand train.py",
        ),
        (
            ["--active", "2", "--", "python", "-u", "train.py"],
            NSYS.format(end="stop", out="stepscope_runs")
            + " python -u -m stepscope run --active 2 --nsight --no-trace train.py",
        ),
        (["--", "./my_job", "--flag"], NSYS.format(end="stop", out="stepscope_runs") + " ./my_job --flag"),
    ],
    ids=["script", "schedule", "module-memory", "on-demand", "interpreter-flags", "other-command"],
)
def test_nsys_command_snapshots(args: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nsys-command", *args]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == expected
    if args[-2:] == ["./my_job", "--flag"]:
        assert "the options given here are not passed to it" in captured.err


def test_run_nsys_without_nsys_says_so(tmp_path: Path) -> None:
    if shutil.which("nsys"):
        pytest.skip("nsys is installed here")
    done = subprocess.run(
        [sys.executable, "-m", "stepscope", "run", "--nsys", str(EXAMPLES / "plain_train.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "stepscope: error: --nsys: nsys (Nsight Systems) is not on PATH; install it, or print the command with "
        "`stepscope nsys-command` and run it where nsys is"
    ]
    assert not (tmp_path / "stepscope_runs").exists()


def test_profile_component_times_calls_and_counts_flops(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import stepscope

    layer = torch.nn.Linear(64, 128)
    result = stepscope.profile_component(
        layer, torch.randn(32, 64), wait=1, warmup=1, active=4, out_dir=str(tmp_path), name="linear"
    )
    assert result.name == "linear" and result.calls == 4 and result.device == "cpu"
    assert result.flops_per_call == 2 * 32 * 64 * 128  # the GEMM; the bias add is not a FLOP torch counts
    assert 0 < result.ms_min <= result.ms_per_call <= result.ms_max
    run_dir = Path(result.run_dir)
    from ..support.output import profiler_steps

    assert profiler_steps(run_dir / "traces/rank0_step5.json.gz") == [2, 3, 4, 5]


@pytest.mark.slow
def test_bench_compares_two_variants(tmp_path: Path) -> None:
    registry = tmp_path / "components.yaml"
    registry.write_text((EXAMPLES / "components.yaml").read_text())
    shutil.copy(EXAMPLES / "components.py", tmp_path / "components.py")

    def bench(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "stepscope", "bench", str(registry), *args]
        return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, check=False)

    done = bench("--only", "linear", "--json", "--out-dir", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    assert document["schema"] == "stepscope.bench/1"
    rows = document["results"]
    assert [(r["component"], r["variant"]) for r in rows] == [("linear", "fp32"), ("linear", "no-bias")]
    for row in rows:
        assert row["error"] is None and row["calls"] == 5 and row["ms_per_call"] > 0
        # forward and the weight gradient of a 512x1024 @ 1024x4096 GEMM (the input needs no gradient)
        assert row["flops_per_call"] == 2 * 2 * 512 * 1024 * 4096
        assert row["gflops_per_s"] == pytest.approx(row["flops_per_call"] / row["ms_per_call"] / 1e6)
        assert row["top_ops"] and not any(name.startswith("ProfilerStep") for name, _ in row["top_ops"])
        assert Path(row["run_dir"]).is_relative_to(tmp_path / "runs" / "linear" / row["variant"])
        assert (Path(row["run_dir"]) / "manifest.json").is_file()
    assert rows[0]["vs_first"] == 1.0
    assert rows[1]["vs_first"] == pytest.approx(rows[1]["ms_per_call"] / rows[0]["ms_per_call"])
    # the terminal table names both variants
    table = bench("--only", "rmsnorm", "--out-dir", str(tmp_path / "runs2"))
    assert table.returncode == 0, table.stderr[-3000:]
    assert "naive" in table.stdout and "fused" in table.stdout


def test_bench_bad_registry_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    registry = tmp_path / "bad.yaml"
    registry.write_text("components:\n  - name: x\n    targt: a.b:C\n")
    assert main(["bench", str(registry)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(registry) in err[0] and "target" in err[0]
