"""The one place numbers and names become text, for the CLI's tables, the findings' messages and the report.

Times: `fmt_us` picks us / ms / s (812 us, 3.41 ms, 2.05 s); bytes: B / KiB / MiB / GiB / TiB; percentages: one
decimal. Names too long for a column are shortened by `short_name` (documented in docs/cli.md, "Names"), and a
column's labels are made distinct by `distinct_labels`. Imports nothing heavy: analysis uses it too.
"""

from __future__ import annotations

from collections.abc import Sequence

ELLIPSIS = "…"


def fmt_us(us: float | None) -> str:
    """Microseconds as a short human duration: 12.3 us, 812 us, 3.41 ms, 2.05 s."""
    if us is None:
        return "-"
    a = abs(us)
    if a >= 1e6:
        return f"{us / 1e6:.2f} s"
    if a >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us" if a < 100 else f"{us:.0f} us"


def fmt_ns(ns: float | None) -> str:
    return "-" if ns is None else fmt_us(ns / 1000.0)


def fmt_ms(ms: float | None) -> str:
    return "-" if ms is None else fmt_us(ms * 1000.0)


def fmt_pct(pct: float | None) -> str:
    """One decimal; '<0.1%' for tiny non-zero shares."""
    if pct is None:
        return "-"
    return "<0.1%" if 0 < pct < 0.05 else f"{pct:.1f}%"


def fmt_bytes(n: float | None) -> str:
    """Bytes with a binary unit: 512 B, 3.00 KiB, 316.68 MiB."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


_OPEN = {"(": ")", "<": ">", "[": "]"}
_CLOSE = {v: k for k, v in _OPEN.items()}


def _param_list_start(name: str) -> int | None:
    """Where the trailing `(...)` parameter list of a C++ signature starts, when the name ends with one."""
    if not name.endswith(")"):
        return None
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        c = name[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                return i if i > 0 else None
    return None


def _drop_return_type(head: str) -> str:
    """`void ns::kernel<a, b>` -> `ns::kernel<a, b>`: drop what precedes the last space outside brackets."""
    depth = 0
    cut = -1
    for i, c in enumerate(head):
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth = max(depth - 1, 0)
        elif c == " " and depth == 0:
            cut = i
    return head[cut + 1 :] if 0 <= cut < len(head) - 1 else head


def short_name(name: str, width: int) -> str:
    """`name` in at most `width` characters. In order, until it fits: drop a C++ return type, then the parameter
    list, then cut the middle out of what remains (the template arguments of a kernel), keeping the start (the
    namespace and the kernel) and the end (the last template arguments) with an ellipsis between."""
    width = max(width, 5)
    if len(name) <= width:
        return name
    s = name
    p = _param_list_start(s)
    if p is not None:
        head = _drop_return_type(s[:p])
        s = head + s[p:]
        if len(s) <= width:
            return s
        s = head
        if len(s) <= width:
            return s
    else:
        s = _drop_return_type(s) if s.startswith(("void ", "static ")) else s
        if len(s) <= width:
            return s
    keep = width - len(ELLIPSIS)
    head_n = (keep * 3 + 4) // 5
    return s[:head_n] + ELLIPSIS + s[len(s) - (keep - head_n) :]


def distinct_labels(names: Sequence[str], width: int) -> list[str]:
    """`short_name` of every name, where two different names never print alike: colliding labels show the
    stretch where their names first differ, and a name that still collides ends with `~N`."""
    labels = [short_name(n, width) for n in names]
    groups: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, []).append(i)
    for idx in groups.values():
        if len({names[i] for i in idx}) < 2:
            continue
        for i in idx:
            others = [names[j] for j in idx if names[j] != names[i]]
            labels[i] = _around_difference(names[i], others, width)
    seen: dict[str, str] = {}
    counts: dict[str, int] = {}
    for i, label in enumerate(labels):
        owner = seen.setdefault(label, names[i])
        if owner != names[i]:
            counts[label] = counts.get(label, 1) + 1
            suffix = f"~{counts[label]}"
            labels[i] = short_name(names[i], width - len(suffix))[: width - len(suffix)] + suffix
    return labels


def _around_difference(name: str, others: list[str], width: int) -> str:
    """A label of `name` that keeps its start, its end and the stretch where it first differs from `others`."""
    first_diff = 0
    for other in others:
        k = 0
        while k < min(len(name), len(other)) and name[k] == other[k]:
            k += 1
        first_diff = max(first_diff, k)
    keep = width - 2 * len(ELLIPSIS)
    head_n = max(keep // 3, 1)
    tail_n = max(keep // 4, 1)
    mid_n = keep - head_n - tail_n
    lo = max(first_diff - mid_n // 3, head_n)
    hi = min(lo + mid_n, len(name) - tail_n)
    if lo >= hi or len(name) <= width:
        return short_name(name, width)
    return name[:head_n] + ELLIPSIS + name[lo:hi] + ELLIPSIS + name[len(name) - tail_n :]
