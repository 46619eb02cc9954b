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
    click.echo(f"  next:      stepscope summary {monitor.run_dir}")
