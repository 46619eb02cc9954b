"""Which gloo process group each of this process's gloo worker threads serves, and how many collectives each group
issued: what lets analysis put a `gloo:*` range (which names no group) in its group.

Measured on torch 2.13 (docs/capture.md, "Process groups"): constructing a group's gloo backend starts one
`gloo_tcp_loop` thread, then its worker threads (`pt_gloo_runloop`, 2 by default), which run every collective
of that group and nothing else; a rank constructs backends only for the groups it belongs to, in the order it
creates them (c10d's registry of names). Linux thread ids grow with creation, so the process's gloo threads in
tid order fall into one chunk per gloo group, each opened by its `gloo_tcp_loop`: the i-th chunk's workers are
the i-th gloo group's. The split is kept only when it is whole (as many chunks as gloo groups, each with the same
number of workers); otherwise no group gets threads (the workers of a new group start a moment after its
creation: the next look tries again). Analysis trusts a group's threads only where its trace holds as many
ranges on them as the group's sequence number says it issued.
"""

from __future__ import annotations

import os
from typing import Any

TASKS = "/proc/self/task"
TCP_LOOP = "gloo_tcp_loop"
RUN_LOOP = "pt_gloo_runloop"


def gloo_threads() -> list[tuple[int, str]] | None:
    """(tid, name) of this process's gloo threads in tid order; None where /proc/self/task cannot be read."""
    try:
        tids = os.listdir(TASKS)
    except OSError:
        return None
    found = []
    for tid in tids:
        try:
            with open(f"{TASKS}/{tid}/comm", encoding="utf-8", errors="replace") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name in (TCP_LOOP, RUN_LOOP) and tid.isdigit():
            found.append((int(tid), name))
    return sorted(found)


def split_threads(threads: list[tuple[int, str]], groups: list[str]) -> dict[str, list[int]] | None:
    """Group name -> its worker tids, `groups` being the rank's gloo groups in creation order; None when the
    threads do not fall into one whole chunk per group."""
    chunks: list[list[int]] = []
    for tid, name in threads:
        if name == TCP_LOOP:
            chunks.append([])
        elif not chunks:
            return None  # a worker before any group's tcp loop: not the layout measured
        else:
            chunks[-1].append(tid)
    if len(chunks) != len(groups) or not chunks or len({len(c) for c in chunks}) != 1 or not chunks[0]:
        return None
    return dict(zip(groups, chunks, strict=True))


def is_gloo(pg: Any) -> bool:
    """Whether `pg` runs CPU collectives on a gloo backend here."""
    try:
        import torch

        backend = pg._get_backend(torch.device("cpu"))
    except Exception:
        return False
    return type(backend).__name__ == "ProcessGroupGloo"


def sequence_number(pg: Any) -> int | None:
    """The collectives `pg` has issued so far (c10d's sequence number of the group); None where torch cannot
    say."""
    try:
        return int(pg._get_sequence_number_for_group())
    except Exception:
        return None
