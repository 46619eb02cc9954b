"""Where a command writes a file the user named (report, report --compare, merge, memory --html): the one check
and the one way of writing for all of them.

Only a regular file is ever replaced, and only by a rename of a complete temp file written beside it: a reader
never sees half a page, and what was there stays whole when the write fails. A symbolic link is refused, whether
it points to a file or nowhere: writing through it would change a file elsewhere, and renaming over it would
silently turn the link into a file. A device, a FIFO or a folder is refused too (a rename would replace
/dev/null with a plain file).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from stepscope.errors import InputError


def output_target(path: Path, what: str) -> Path:
    """`path` when `what` (e.g. "the report") may be written there: nothing there yet, or a regular file. Anything
    else is an InputError naming the path, one line."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise InputError(path, f"cannot write {what} ({exc.strerror or exc})") from None
    if stat.S_ISLNK(mode):
        raise InputError(
            path, f"a symbolic link: {what} is never written through a link (choose another name)"
        )
    if not stat.S_ISREG(mode):
        raise InputError(
            path, f"not a regular file: {what} replaces only a regular file (choose another name)"
        )
    return path


def write_output(path: Path, data: str | bytes, what: str) -> Path:
    """Write `data` (text is UTF-8) to `path` through a temp file and a rename, after `output_target`'s check; a
    failure (no such folder, no permission, a full disk) is an InputError naming the path."""
    from stepscope.runfolder.atomic import atomic_write_bytes

    output_target(path, what)
    try:
        return atomic_write_bytes(path, data.encode("utf-8") if isinstance(data, str) else data)
    except OSError as exc:
        raise InputError(path, f"cannot write {what} ({exc.strerror or exc})") from None
