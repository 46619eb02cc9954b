"""Make big traces out of a real one, for the scale benchmarks (nothing it writes is committed).

One big file: the base trace's events repeated, each copy shifted in time by the base's span and given fresh
ids (correlation, External id, flow ids, ...), its ProfilerSteps renumbered, until the JSON reaches --size:

    .venv/bin/python benchmarks/make_big_trace.py --size 1G --out /tmp/big/1g.json

Many ranks: N files (one per rank, gzipped), each the base trace (times --copies) with its own clock offset;
every rank's NCCL kernels start a random --jitter-ms late, except on rank --slow-rank (default N // 2), whose
collectives the others reach --slow-ms earlier: the others wait for it (their NCCL kernels start earlier and
end together with its own):

    .venv/bin/python benchmarks/make_big_trace.py --ranks 64 --out /tmp/ranks64

Tiny events (--tiny): one file of CPU ops of about 80 bytes each (12.7 M events per GB of JSON, the worst case
of memory per byte), a ProfilerStep every 10,000 of them; --members N writes a .gz of N gzip members (as pigz
and bgzip do); --one-step puts them all under one ProfilerStep instead (one nesting group of millions):

    .venv/bin/python benchmarks/make_big_trace.py --size 1G --tiny --out /tmp/big/tiny1g.json

The default base is ../shared/traces/hta_nccl_parser_config/nccl_data.json.gz (9.8 MB of JSON, 40,573 events,
3 ProfilerSteps, NCCL kernels on their own stream). Deterministic for a given --seed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASE = ROOT.parent / "shared" / "traces" / "hta_nccl_parser_config" / "nccl_data.json.gz"
ID_ARGS = ("correlation", "External id", "Record function id", "Ev Idx", "Fwd thread id", "Sequence number")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_JSON = json.JSONEncoder(separators=(", ", ": "), ensure_ascii=False)


def _ENCODE(event: dict[str, Any]) -> bytes:
    """One event in Kineto's own layout (an indented object, keys on one line): bytes per event as in the base."""
    return b"  {\n    " + _JSON.encode(event)[1:-1].encode() + b"\n  }"


def parse_size(text: str) -> int:
    """'1G', '250M', '0.5G', '123456' -> bytes (powers of 1000, as "1 GB of JSON" is meant)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kKmMgG]?)[bB]?\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 250M, 1G)")
    return int(float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()])


class Base:
    """The base trace, split into header, metadata events (written once) and timed events (repeated)."""

    def __init__(self, path: Path) -> None:
        opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
        with opener(path, "rb") as fh:
            doc = json.load(fh)
        events = doc.pop("traceEvents")
        self.header: dict[str, Any] = doc
        self.meta = [e for e in events if e.get("ph") == "M"]
        self.events = [e for e in events if e.get("ph") != "M" and "ts" in e]
        starts = [float(e["ts"]) for e in self.events]
        ends = [float(e["ts"]) + float(e.get("dur", 0) or 0) for e in self.events]
        self.t0 = min(starts)
        self.span = max(ends) - self.t0 + 1.0  # µs: one copy's length, plus a gap
        self.id_step = {
            key: 1 + max((i for e in self.events for i in _ints(e, key)), default=0) for key in ID_ARGS
        }
        self.flow_step = 1 + max((int(e["id"]) for e in self.events if type(e.get("id")) is int), default=0)
        self.room = _room_before_nccl(self.events)
        steps = [int(m.group(1)) for e in self.events if (m := _STEP.match(str(e.get("name", ""))))]
        self.step_first = min(steps, default=0)
        self.step_count = max(steps, default=-1) - self.step_first + 1

    def copy(
        self, k: int, offset_us: float = 0.0, early_us: float = 0.0, jitter_us: float = 0.0, seed: int = 0
    ) -> Iterator[dict[str, Any]]:
        """Copy `k` of the timed events: shifted by k spans plus `offset_us`, with fresh ids. NCCL kernels start
        `early_us` (plus up to `jitter_us`) earlier, keeping their end (at most 90% of the idle time before
        them on their stream): the rank reached the collective early and waited."""
        shift = k * self.span + offset_us
        rng = random.Random(seed)
        for e in self.events:
            out = dict(e)
            out["ts"] = round(float(e["ts"]) + shift, 3)
            room = self.room.get(id(e))
            if room is not None and (early_us or jitter_us):
                early = min(early_us + rng.uniform(0.0, jitter_us), 0.9 * room)
                out["ts"] = round(out["ts"] - early, 3)
                out["dur"] = round(float(e["dur"]) + early, 3)
            if k and type(e.get("id")) is int:
                out["id"] = e["id"] + k * self.flow_step
            args = e.get("args")
            if k and isinstance(args, dict):
                args = dict(args)
                for key in ID_ARGS:
                    if type(args.get(key)) is int and args[key] >= 0:
                        args[key] += k * self.id_step[key]
                out["args"] = args
            if k and self.step_count > 0 and (m := _STEP.match(str(e.get("name", "")))):
                out["name"] = f"ProfilerStep#{int(m.group(1)) + k * self.step_count}"
            yield out


def _room_before_nccl(events: list[dict[str, Any]]) -> dict[int, float]:
    """id() of each NCCL kernel -> idle µs on its stream before it."""
    by_stream: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X":
            by_stream.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    room = {}
    for stream in by_stream.values():
        stream.sort(key=lambda e: float(e["ts"]))
        end = None
        for e in stream:
            if "nccl" in str(e.get("name", "")).lower() and end is not None:
                room[id(e)] = max(float(e["ts"]) - end, 0.0)
            end = max(end or 0.0, float(e["ts"]) + float(e.get("dur", 0) or 0))
    return room


def _ints(e: dict[str, Any], key: str) -> Iterator[int]:
    args = e.get("args")
    if isinstance(args, dict) and type(args.get(key)) is int:
        yield args[key]


class _Counter:
    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.n = fh, 0

    def write(self, data: bytes) -> None:
        self.fh.write(data)
        self.n += len(data)


def write_trace(
    fh: BinaryIO, base: Base, header: dict[str, Any], copies: Iterator[Iterator[dict[str, Any]]], size: int
) -> tuple[int, int]:
    """Write header, metadata and copies until `size` bytes (or the copies run out): (bytes, events)."""
    out = _Counter(fh)
    head = msgspec.json.format(msgspec.json.encode(header), indent=2)
    out.write(head.rstrip()[:-1].rstrip() + (b',\n  "traceEvents": [\n' if header else b'"traceEvents": [\n'))
    n = 0
    first = True
    for e in base.meta:
        out.write((b"" if first else b",\n") + _ENCODE(e))
        first, n = False, n + 1
    for copy in copies:
        if out.n >= size:
            break
        batch = list(copy)
        out.write((b"" if first else b",\n") + b",\n".join(map(_ENCODE, batch)))
        first, n = False, n + len(batch)
    out.write(b"\n]}\n")
    return out.n, n


def big_file(base: Base, size: int, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    copies = (base.copy(k) for k in range(1 << 30))
    opener = gzip.open if out.name.endswith(".gz") else open
    with opener(out, "wb") as fh:
        written, events = write_trace(fh, base, dict(base.header), copies, size)
    print(
        f"{out}: {written / 1e6:,.1f} MB of JSON, {events:,} events, "
        f"{out.stat().st_size / 1e6:,.1f} MB on disk, {time.perf_counter() - start:.1f} s"
    )


TINY_NAMES = [f"aten::op{i}" for i in range(50)]


def tiny_file(size: int, out: Path, members: int, one_step: bool = False) -> None:
    """A trace of tiny CPU ops (about 80 bytes of JSON each) and a ProfilerStep every 10,000 of them (or one
    around them all)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    parts = [b'{"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [\n']
    written, events, t = len(parts[0]), 0, 1_000_000
    if one_step:  # (each op takes more than 2 bytes of JSON for its 2 us: `size` us hold them all)
        parts.append(
            b'{"ph":"X","cat":"user_annotation","name":"ProfilerStep#0","pid":1,"tid":1,'
            + f'"ts":{t},"dur":{size}}},\n'.encode()
        )
        written, events = written + len(parts[-1]), 1
    while written < size:
        lines = []
        if not one_step:
            lines.append(
                f'{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{events // 10_000}",'
                f'"pid":1,"tid":1,"ts":{t},"dur":{2 * 10_000}}}'
            )
        for i in range(10_000):
            lines.append(
                f'{{"ph":"X","cat":"cpu_op","name":"{TINY_NAMES[i % 50]}","pid":1,"tid":1,'
                f'"ts":{t + 2 * i},"dur":1}}'
            )
        t += 2 * 10_000 + 5
        chunk = (",\n".join(lines) + ",\n").encode()
        parts.append(chunk)
        written += len(chunk)
        events += len(lines)
    parts[-1] = parts[-1][:-2] + b"\n]}\n"
    data = b"".join(parts)
    del parts
    if out.name.endswith(".gz"):
        step = -(-len(data) // max(members, 1))
        with open(out, "wb") as fh:
            for at in range(0, len(data), step):
                fh.write(gzip.compress(data[at : at + step], compresslevel=1))
    else:
        out.write_bytes(data)
    print(
        f"{out}: {len(data) / 1e6:,.1f} MB of JSON, {events:,} tiny events, "
        f"{out.stat().st_size / 1e6:,.1f} MB on disk, {time.perf_counter() - start:.1f} s"
    )


def rank_files(base: Base, args: argparse.Namespace) -> None:
    n = args.ranks
    slow = n // 2 if args.slow_rank is None else args.slow_rank
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    total = 0
    for rank in range(n):
        offset = rng.uniform(-50.0, 50.0)  # µs of clock skew
        header = dict(base.header)
        info = dict(header.get("distributedInfo") or {"backend": "nccl"})
        info.update(rank=rank, world_size=n)
        info["pg_config"] = [
            {
                "pg_name": "0",
                "pg_desc": "default_pg",
                "backend_config": "cuda:nccl",
                "pg_size": n,
                "ranks": list(range(n)),
            }
        ]
        header["distributedInfo"] = info
        early = 0.0 if rank == slow else args.slow_ms * 1e3  # the others arrive early: they wait for `slow`
        copies = (
            base.copy(k, offset, early, args.jitter_ms * 1e3, seed=args.seed * 100_003 + rank * 101 + k)
            for k in range(args.copies)
        )
        path = args.out / f"rank{rank}.json.gz"
        with gzip.open(path, "wb", compresslevel=1) as fh:
            written, _ = write_trace(fh, base, header, copies, 1 << 62)
        total += written
    print(
        f"{args.out}: {n} ranks (slow rank {slow}, {args.slow_ms} ms late), {total / 1e6:,.1f} MB of JSON, "
        f"{time.perf_counter() - start:.1f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", type=Path, default=DEFAULT_BASE, help="the real trace to repeat")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--size", type=parse_size, help="one file of about this much JSON (250M, 1G, 2G)")
    what.add_argument("--ranks", type=int, help="this many rank files (8, 64, 256)")
    parser.add_argument("--out", type=Path, required=True, help="the file (--size; .gz compresses) or folder")
    parser.add_argument("--copies", type=int, default=1, help="copies of the base per rank file (--ranks)")
    parser.add_argument("--jitter-ms", type=float, default=0.05, help="random lateness of every rank, up to")
    parser.add_argument("--slow-rank", type=int, default=None, help="the slow rank (default: ranks // 2)")
    parser.add_argument(
        "--slow-ms", type=float, default=5.0, help="how late the slow rank arrives at every collective"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tiny", action="store_true", help="tiny CPU ops instead of copies of the base (--size)"
    )
    parser.add_argument(
        "--one-step", action="store_true", help="every --tiny op under one ProfilerStep (one nesting group)"
    )
    parser.add_argument(
        "--members", type=int, default=1, help="gzip members of a --tiny .gz (pigz / bgzip style)"
    )
    args = parser.parse_args(argv)
    if args.tiny and args.size is not None:
        tiny_file(args.size, args.out, args.members, args.one_step)
        return 0
    if not args.base.is_file():
        where = (
            "the default, in the shared trace set ../shared/traces beside the clone"
            if args.base == DEFAULT_BASE
            else "given"
        )
        parser.error(f"--base {args.base}: no such file ({where}); give a Kineto trace with --base")
    base = Base(args.base)
    if args.size is not None:
        big_file(base, args.size, args.out)
    else:
        rank_files(base, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
