"""The one place numbers and names become text, for the CLI's tables, the findings' messages and the report.

Times: `fmt_us` picks us / ms / s with three significant digits (812 us, 3.41 ms, 60.7 ms, 2.05 s); bytes: B / KiB / MiB / GiB / TiB; percentages: one
decimal. Names too long for a column are shortened by `short_name` (documented in docs/cli.md, "Names"), and a
column's labels are made distinct by `distinct_labels`. Imports nothing heavy: analysis uses it too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

ELLIPSIS = "…"

# C0 and C1 control characters and DEL, shown as visible escapes: a name from a trace never drives the terminal
# (ESC starts a sequence that can clear the screen, set the window title or make a hyperlink; U+009B is a CSI on
# many terminals).
_CONTROL_CODES = (*range(0x20), 0x7F, *range(0x80, 0xA0))
# Bidirectional-text controls and the line and paragraph separators: invisible, yet they reorder or break what
# a reader sees (U+202E prints the rest of a line right to left).
BIDI_CODES = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)
_CONTROLS = {c: f"\\x{c:02x}" for c in _CONTROL_CODES} | {c: f"\\u{c:04x}" for c in BIDI_CODES}


def plain(value: object) -> str:
    """`value` as printable text, the one escaping of every text from a file before it is printed: control
    characters (ESC, BEL, C1) become visible escapes like \\x1b, bidirectional controls like \\u202e."""
    return str(value).translate(_CONTROLS)


_CONTROLS_BUT_NEWLINES = {c: e for c, e in _CONTROLS.items() if c != 0x0A}


def plain_lines(value: object) -> str:
    """`plain`, keeping its newlines: for a message of several lines that holds a name (a path, an op)."""
    return str(value).translate(_CONTROLS_BUT_NEWLINES)


def fmt_us(us: float | None) -> str:
    """Microseconds as a short human duration with three significant digits: 12.3 us, 812 us, 3.41 ms,
    60.7 ms, 2.05 s (0 is "0 us")."""
    if us is None:
        return "-"
    if us == 0:
        return "0 us"
    a = abs(us)
    k = 0 if a < 1e3 else 1 if a < 1e6 else 2
    while True:
        unit, scale = _TIME_UNITS[k]
        text = _three_digits(us / scale)
        if abs(float(text)) >= 1000 and k < len(_TIME_UNITS) - 1:
            k += 1  # 999.96 us is 1.00 ms
            continue
        return f"{text} {unit}"


_TIME_UNITS = (("us", 1.0), ("ms", 1e3), ("s", 1e6))


def _three_digits(v: float) -> str:
    a = abs(v)
    return f"{v:.2f}" if a < 9.995 else f"{v:.1f}" if a < 99.95 else f"{v:.0f}"


def fmt_ns(ns: float | None) -> str:
    return "-" if ns is None else fmt_us(ns / 1000.0)


def fmt_ms(ms: float | None) -> str:
    return "-" if ms is None else fmt_us(ms * 1000.0)


def fmt_pct(pct: float | None) -> str:
    """One decimal; '<0.1%' for tiny non-zero shares."""
    if pct is None:
        return "-"
    return "<0.1%" if 0 < pct < 0.05 else f"{pct:.1f}%"


LISTED_RANKS = 16  # a list of more ranks (or runs of ranks) is cut, with its count


def fmt_members(ranks: Sequence[int]) -> str:
    """A group's ranks as `{0, 1, 3}`; beyond LISTED_RANKS ranks, in runs and cut as fmt_ranks does."""
    return "{" + list_ranks(ranks) + "}"


def list_ranks(ranks: Sequence[int]) -> str:
    """Ranks as `0, 1, 3` (each named); beyond LISTED_RANKS ranks, as fmt_ranks gives them."""
    return ", ".join(map(str, ranks)) if len(ranks) <= LISTED_RANKS else fmt_ranks(ranks)


def fmt_ranks(ranks: Sequence[int]) -> str:
    """Ranks as `0, 1, 3`, with runs of three or more as `0-3` (`0-3, 8`); beyond LISTED_RANKS parts, the first
    ones, `...`, the last and the count (`0, 2, 4, ..., 998 (500 ranks)`): a line, never a page."""
    parts: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ranks[i]}-{ranks[j]}")
        else:
            parts.extend(str(r) for r in ranks[i : j + 1])
        i = j + 1
    if len(parts) > LISTED_RANKS:
        return ", ".join([*parts[: LISTED_RANKS - 2], "...", parts[-1]]) + f" ({len(ranks):,} ranks)"
    return ", ".join(parts)


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


def fmt_mb(n: float) -> str:
    """Bytes in decimal megabytes (10^6 bytes, as `trace_budget_mb` counts them): 0.078 MB, 4.56 MB, 48.3 MB."""
    value = n / 1e6
    return f"{value:.3f} MB" if abs(value) < 1 else f"{_three_digits(value)} MB"


_OPEN = {"(": ")", "<": ">", "[": "]"}
_CLOSE = {v: k for k, v in _OPEN.items()}


def fmt_tflops(tflops: float | None) -> str:
    """TFLOP/s with four significant digits, neither rounded to zero nor in exponent form: 0.00429 TFLOP/s,
    0.01634 TFLOP/s, 412.3 TFLOP/s, 1,979 TFLOP/s."""
    return "-" if tflops is None else f"{significant(tflops)} TFLOP/s"


def fmt_flops(flops: float | None) -> str:
    """A FLOP count with an SI prefix and four significant digits: 137.2 kFLOP, 107.9 MFLOP, 1.208 GFLOP."""
    if flops is None:
        return "-"
    value = float(flops)
    for unit in ("FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP"):
        if abs(value) < 999.95:
            return f"{significant(value)} {unit}"
        value /= 1000
    return f"{significant(value)} PFLOP"


def significant(v: float, digits: int = 4) -> str:
    """`v` with `digits` significant digits in positional form, without trailing zeros (thousands separated
    from 1,000 on): a small rate stays readable (0.00429, not 0.00 or 4.29e-03)."""
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    if abs(v) >= 10 ** (digits - 1):
        return f"{v:,.0f}"
    decimals = digits - 1 - math.floor(math.log10(abs(v)))
    text = f"{v:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


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
        reduced = {i: _reduced(names[i]) for i in idx}
        use = (
            reduced
            if len(set(reduced.values())) == len({names[i] for i in idx})
            else {i: names[i] for i in idx}
        )
        for i in idx:
            others = [use[j] for j in idx if names[j] != names[i]]
            labels[i] = _around_difference(use[i], others, width)
    # what still collides (names that differ in several places) gets ~2, ~3, ... in order
    owner: dict[str, str] = {}
    for i, label in enumerate(labels):
        if owner.setdefault(label, names[i]) == names[i]:
            continue
        k = 2
        while True:
            suffix = f"~{k}"
            candidate = (
                label if len(label) + len(suffix) <= width else label[: width - len(suffix)]
            ) + suffix
            if owner.setdefault(candidate, names[i]) == names[i]:
                labels[i] = candidate
                break
            k += 1
    return labels


def _reduced(name: str) -> str:
    """A C++ signature without its return type and parameter list."""
    p = _param_list_start(name)
    return _drop_return_type(name[:p]) if p is not None else name


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
