"""glibc's malloc set up for loading and analysing big traces: freed memory kept for the next arrays.

By default glibc serves every block above its mmap threshold (128 KB at first, raised to the largest block
freed so far) with a fresh mmap, and gives the top of the heap back to the system whenever more than twice
that threshold is free there. The loader and the analyses allocate and free arrays of a few MB all the
time (a column of a rank, a temporary of a numpy expression), so the same memory was unmapped and mapped
again, each of its pages faulted in and zeroed by the kernel on first touch: 100,000 page faults for 8
ranks of 55 MB, 0.2 s of system time on 1.9 s of CPU. Keeping up to 128 MB of freed heap and serving
blocks below 32 MB from the heap cuts the faults to a quarter and the system time to a third
(docs/scale.md). Peak memory hardly moves: freed memory is kept to be reused, not added to.

Linux with glibc only (elsewhere `mallopt` is missing or does nothing); a user's own MALLOC_* settings in
the environment are left as they are.
"""

from __future__ import annotations

import os
import sys

__all__ = ["HEAP_TUNING_MIN_BYTES", "keep_freed_memory"]

HEAP_TUNING_MIN_BYTES = 64 << 20  # JSON to load before tuning is worth a ctypes import (~1.5 ms)
_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_SETTINGS = ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 128 << 20), (_M_TOP_PAD, 64 << 20))
_done = False


def keep_freed_memory() -> None:
    """Tune this process's malloc (and that of the workers it forks afterwards), once."""
    global _done
    if _done:
        return
    _done = True
    if not sys.platform.startswith("linux") or any(key.startswith("MALLOC_") for key in os.environ):
        return
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library to be had, or one without mallopt
        return
    for param, value in _SETTINGS:
        mallopt(param, value)
