"""`stepscope run`: profile a script nobody wants to edit.

The script runs in this process as `__main__` (runpy), with its own `sys.argv`, `sys.path[0]`, stdout, exit
code and exceptions. Steps are the optimizer's: the first `Optimizer.step` of the job names the optimizer that
paces training (the first one seen, when a script has several) and starts the monitor right after it; each of
its later steps ends one profiled step. So step 0 is the second training iteration; set-up and the first
iteration (compilation, autotuning, first allocations) come before it, never inside a step.

The boundary is made when `optimizer.step()` returns, outside torch's `Optimizer.step#...` range, so the
ProfilerStep ranges of the trace nest as in a hand-written loop: the optimizer is found by a global
post-step hook, whose only work after that is one identity check, and its own `step` is wrapped (an instance
attribute, as torch's LR schedulers do).
"""

from __future__ import annotations

import contextlib
import functools
import os
import runpy
import sys
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from stepscope.capture.config import ProfileConfig
from stepscope.capture.console import StepscopeWarning, console_write, warn_user
from stepscope.capture.monitor import PerformanceMonitor


class OptimizerSteps:
    """Turns the steps of the job's lead optimizer into monitor steps; `on_step` (if given) runs after each."""

    def __init__(self, monitor: Any, on_step: Callable[[], None] | None = None) -> None:
        self.monitor = monitor
        self.on_step = on_step
        self._lead: weakref.ReferenceType[Any] | None = None
        self._started = False
        self._handle: Any = None

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(self._post_hook)

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        lead = self._lead() if self._lead is not None else None
        if lead is not None:
            return
        # The first optimizer step of the job (or the first after the lead optimizer was freed).
        try:
            self._lead = weakref.ref(optimizer)
            self._wrap(optimizer)
            if not self._started and not self.monitor.schedule.is_traced(0):
                # Step 0 begins now. (Inside torch's Optimizer.step range, harmless: step 0 is not traced.)
                self._start()
        except Exception as exc:  # never into the job
            self.remove()
            warn_user(
                f"stepscope: cannot follow the optimizer's steps ({type(exc).__name__}: {exc}); profiling is "
                "off for this run, the script goes on",
                StepscopeWarning,
            )

    def _wrap(self, optimizer: Any) -> None:
        original = optimizer.step
        boundary = self._boundary
        owner = weakref.ref(optimizer)

        @functools.wraps(original)
        def step(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            if self._lead is not None and self._lead() is owner():
                boundary()
            return out

        optimizer.step = step

    def _start(self) -> None:
        self._started = True
        self.monitor.start()

    def _boundary(self) -> None:
        if self._started:
            self.monitor.step()
            if self.on_step is not None:
                self.on_step()
        else:  # step 0 is traced: it begins when this step returns, outside torch's range
            self._start()


def run_target(target: str, args: Sequence[str], *, module: bool, config: ProfileConfig) -> int:
    """Run `target` (a script path, or a module name with `module=True`) as `__main__` with `args`, profiled
    by a monitor with `config`. Returns the exit status the script would have had; an uncaught exception is
    printed as Python prints it (without stepscope's frames), status 1. KeyboardInterrupt goes on up."""
    monitor = PerformanceMonitor(None, config=config)
    steps = OptimizerSteps(monitor)
    try:
        steps.install()
    except Exception as exc:
        warn_user(
            f"stepscope: cannot hook the optimizer ({type(exc).__name__}: {exc}); the script runs unprofiled",
            StepscopeWarning,
        )
    status = 0
    try:
        run_as_main(target, args, module=module)
    except SystemExit as exc:
        status = _exit_status(exc)
    except KeyboardInterrupt:
        _finish(steps, monitor)
        raise
    except BaseException as exc:
        print_user_traceback(exc)
        status = 1
    _finish(steps, monitor)
    return status


def run_as_main(target: str, args: Sequence[str], *, module: bool) -> None:
    """Run a script path (or a module name) as `__main__` with `args`, as `python [-m] target args` would;
    its exceptions go on up, `sys.argv` and `sys.path[0]` are restored after."""
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    try:
        if module:
            sys.argv = [target, *args]  # runpy puts the module's file name in argv[0]
            sys.path[0] = os.getcwd()  # as `python -m`
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *args]
            sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python script.py`
            runpy.run_path(os.path.abspath(target), run_name="__main__")  # __file__ absolute, as Python's
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0


def _finish(steps: OptimizerSteps, monitor: Any) -> None:
    steps.remove()
    with contextlib.suppress(Exception):
        monitor.close()
    with contextlib.suppress(Exception):  # a closed stdout: Python says so at exit, as without stepscope
        sys.stdout.flush()
    if monitor.recording and monitor.run_dir is not None:
        console_write(f"stepscope: run folder: {monitor.run_dir}\n")


def _exit_status(exc: SystemExit) -> int:
    """What Python makes of `sys.exit(code)`: None is 0, an int is itself, anything else is printed, 1."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stdout.flush()
    print(code, file=sys.stderr)
    return 1


def print_user_traceback(exc: BaseException) -> None:
    """The traceback Python would print for the script: stepscope's and runpy's frames left out."""
    tb = exc.__traceback__
    skip = (
        os.path.dirname(__file__),
        os.path.dirname(runpy.__file__) + os.sep + "runpy.py",
        "<frozen runpy>",
    )
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(skip):
        tb = tb.tb_next
    sys.stdout.flush()
    traceback.print_exception(type(exc), exc, tb if tb is not None else exc.__traceback__)
    sys.stderr.flush()
