"""HTA's (or TraceInsight's: it installs the same `hta` module) "analyze this trace folder", for bench_peers.py.

Runs inside the peer's own virtual environment; never imported by stepscope:
    <venv>/bin/python _peer_hta.py TRACE_DIR
The work, as in _hta_runner.py: TraceAnalysis construction (parse every rank's file in TRACE_DIR) + temporal
breakdown + idle time breakdown of every rank, all with visualize=False. Exits non-zero when HTA raises.
"""

from __future__ import annotations

import logging
import sys
import warnings


def main() -> int:
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=sys.argv[1])
    analysis.get_temporal_breakdown(visualize=False)
    analysis.get_idle_time_breakdown(ranks=sorted(analysis.t.get_ranks()), visualize=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
