"""`stepscope demo`: profile the bundled CPU demo training and say where the results are."""

from __future__ import annotations

import click


@click.command(name="demo")
@click.option("--out-dir", default="stepscope_runs", show_default=True, help="Folder for the run folder.")
@click.option("--steps", default=20, show_default=True, type=click.IntRange(1), help="Training steps to run.")
def command(out_dir: str, steps: int) -> None:
    """Profile a small MLP trained on synthetic data on the CPU (well under a minute)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        from stepscope.errors import StepscopeError

        raise StepscopeError("the demo needs torch: pip install 'stepscope[capture]' (or torch)") from None
    from stepscope.capture.demo import run_demo

    monitor = run_demo(out_dir=out_dir, steps=steps)
    click.echo(f"\nRun folder: {monitor.run_dir}")
    click.echo(f"  manifest:  {monitor.run_dir / 'manifest.json'}")
    report = monitor.run_dir / "report.html"
    if report.is_file():
        click.echo(f"  report:    {report}  (open it in a browser; it works offline)")
    else:
        click.echo(
            f"  report:    not written (see the warning above); make it with `stepscope report {monitor.run_dir}`"
        )
    me = _this_command()
    click.echo(f"  next:      {me} analyze {monitor.run_dir}")
    click.echo(f"             {me} summary {monitor.run_dir}")


def _this_command() -> str:
    """How to run stepscope again as this process was run: `stepscope` when that is on PATH, else the path of
    the script (e.g. .venv/bin/stepscope after `make demo`), else `python -m stepscope`."""
    import os
    import shlex
    import shutil
    import sys
    from pathlib import Path

    script = Path(sys.argv[0])
    on_path = shutil.which("stepscope")
    if on_path and script.name == "stepscope" and Path(on_path).resolve() == script.resolve():
        return "stepscope"
    if script.name == "stepscope" and script.exists():
        return shlex.quote(os.path.relpath(script))
    return f"{shlex.quote(os.path.relpath(sys.executable))} -m stepscope"
