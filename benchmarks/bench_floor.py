"""The floor of this machine for reading traces (issue 48, item 6): how fast one core can inflate a gzipped trace
(ISA-L, and zlib for comparison) and decode its JSON into typed events (msgspec, the loader's own event Structs, the whole document at once),
against what stepscope's loader and a whole `stepscope analyze --json` process achieve on the same file.

    .venv/bin/python benchmarks/bench_floor.py [--size 100M] [--rounds 3]

The trace is make_big_trace.py's (the V100 trace of ../shared repeated to SIZE of JSON), plain and gzipped. Rates
are MB of JSON per second, best of ROUNDS, one process, the cache of decoded tables off. The floor of a plain
file is the typed decode alone; of a gzipped one, inflate then decode on one core (1 / (1/inflate + 1/decode)).
A load can beat a one-core floor with more processes; analyze adds the analysis, and the process's start.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _results import ROOT, write_result


def best(fn: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="100M")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import msgspec
    from isal import isal_zlib

    from stepscope.analysis.read._decode import DECODERS
    from stepscope.analysis.read.loader import load_trace

    with tempfile.TemporaryDirectory(prefix="stepscope-floor-") as tmp:
        plain = Path(tmp, "big.json")
        subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "make_big_trace.py"), "--size", args.size, "--out", str(plain)],
            check=True, capture_output=True,
        )  # fmt: skip
        text = plain.read_bytes()
        packed = Path(tmp, "big.json.gz")
        packed.write_bytes(gzip.compress(text, 6))
        data = packed.read_bytes()
        mb = len(text) / 1e6
        rates: dict[str, float] = {}
        rates["inflate, ISA-L"] = mb / best(lambda: isal_zlib.decompress(data, 31), args.rounds)
        rates["inflate, zlib"] = mb / best(lambda: zlib.decompress(data, 31), args.rounds)
        # the loader's own event Structs: the strict ones (int fields hold ints), the permissive ones where not
        decoder = DECODERS[(True, False)].tail
        try:
            decoder.decode(text)
        except msgspec.ValidationError:
            decoder = DECODERS[(False, False)].tail
        rates["typed decode (msgspec)"] = mb / best(lambda: decoder.decode(text), args.rounds)
        floor_plain = rates["typed decode (msgspec)"]
        floor_gz = 1 / (1 / rates["inflate, ISA-L"] + 1 / floor_plain)
        rates["load_trace, plain"] = mb / best(lambda: load_trace(plain), args.rounds)
        rates["load_trace, gzipped"] = mb / best(lambda: load_trace(packed), args.rounds)
        env = {**os.environ, "STEPSCOPE_NO_CACHE": "1"}

        def analyze(path: Path) -> None:
            subprocess.run(
                [sys.executable, "-m", "stepscope", "analyze", str(path), "--json"],
                check=True, stdout=subprocess.DEVNULL, env=env,
            )  # fmt: skip

        rates["analyze --json, plain (process)"] = mb / best(lambda: analyze(plain), args.rounds)
        rates["analyze --json, gzipped (process)"] = mb / best(lambda: analyze(packed), args.rounds)
    floors = {
        "inflate, ISA-L": None,
        "inflate, zlib": None,
        "typed decode (msgspec)": None,
        "load_trace, plain": floor_plain,
        "load_trace, gzipped": floor_gz,
        "analyze --json, plain (process)": floor_plain,
        "analyze --json, gzipped (process)": floor_gz,
    }
    rows = []
    for name, rate in rates.items():
        floor = floors[name]
        rows.append(
            [
                name,
                f"{rate:.0f} MB/s",
                f"{floor:.0f} MB/s" if floor else "-",
                f"{rate / floor:.2f}" if floor else "-",
            ]
        )
    notes = [
        f"{mb:.0f} MB of JSON ({len(data) / 1e6:.0f} MB gzipped at zlib's level 6); best of {args.rounds}; one "
        f"core's floor: plain = the typed decode, gzipped = inflate (ISA-L) then decode ({floor_gz:.0f} MB/s)"
    ]
    write_result(
        "bench_floor",
        "The floor of this machine for reading a trace, and how close stepscope comes",
        ["what", "rate", "one core's floor", "of the floor"],
        rows,
        figures={"rates_mb_s": rates, "floor_plain_mb_s": floor_plain, "floor_gz_mb_s": floor_gz, "mb": mb},
        notes=notes,
    )
    for row in rows:
        print("  ".join(row))
    print(notes[0])


if __name__ == "__main__":
    main()
