"""Expert- and tensor-parallel tables of the report model (the terminal's `analyze` and the page's Parallelism
section show the same): per rank its all-to-alls and DeepEP-style kernels; per rank and layer its functional
collectives, and the fused async-TP ops."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope.report import columns as col
from stepscope.report.model import Column, Table, table

if TYPE_CHECKING:
    from stepscope.analysis.per_rank.parallelism.expert import Expert
    from stepscope.analysis.per_rank.parallelism.tensor import Tensor

__all__ = ["expert_table", "tensor_table"]

_WHAT = Column("what")
_COUNT = Column("count", "int")
_SENT = Column("sent", "bytes")
_RECEIVED = Column("received", "bytes")
_TOKENS = Column("tokens received", "int")
_EXPOSED = Column("exposed", "ms")
_LAYER = Column("layer", "name")
_OP = Column("op", "name")
_PER_STEP = Column("per step", figure=True)
_COMPUTE = Column("compute", "ms")
_COMM = Column("communication", "ms")
_OVERLAPPED = Column("overlapped", "ms")


def expert_table(expert: Expert, *, title: str = "") -> Table:
    """Per rank: its all-to-alls, then its DeepEP-style kernels by transport and phase (window totals)."""
    rows: list[list[object]] = []
    for r in expert.ranks:
        a = r.all_to_all
        if a is not None:
            what = "all-to-all" + (" (uneven splits)" if a.uneven else "")
            rows.append([r.rank, what, a.count, a.sent_bytes, a.received_bytes, a.received_tokens, a.time_ms,
                         a.exposed_ms])  # fmt: skip
        for k in r.ep_kernels:
            rows.append([r.rank, f"{k.transport} {k.phase} kernels", k.count, None, None, None, k.time_ms,
                         k.exposed_ms])  # fmt: skip
    worst = max(expert.imbalance, key=lambda i: i.ratio, default=None)
    caption = "Window totals; 'exposed': with no computation kernel running (null on CPU backends)."
    if worst is not None:
        caption += f" Most imbalanced across ranks: {worst.figure} max/mean {worst.ratio:.2f} (rank {worst.max_rank})."
    columns = [col.RANK, _WHAT, _COUNT, _SENT, _RECEIVED, _TOKENS, col.TIME_MS, _EXPOSED]
    return table("expert", columns, rows, caption=caption, title=title)


def tensor_table(tensor: Tensor, *, title: str = "") -> Table:
    """Per rank and layer: its functional collectives; then the fused async-TP ops."""
    rows: list[list[object]] = []
    for r in tensor.ranks:
        for layer in r.layers:
            rows.append([r.rank, layer.layer, f"{layer.kind} ({layer.op})", f"{layer.per_step:g}", layer.bytes,
                         layer.time_ms, None, layer.exposed_ms])  # fmt: skip
        for f in r.fused:
            rows.append([r.rank, "fused async-TP", f.op, f"{f.count} in all", None, f.time_ms, f.overlapped_ms,
                         f.exposed_ms])  # fmt: skip
    columns = [col.RANK, _LAYER, _OP, _PER_STEP, col.BYTES, col.TIME_MS, _OVERLAPPED, _EXPOSED]
    caption = (
        "Functional collectives by the module range they run in (else their position in forward / backward); "
        "bytes and time are window totals; fused async-TP ops: their communication overlapped by their matmuls."
    )
    return table("tensor", columns, rows, caption=caption, title=title)
