"""What the op model does not count, and why: an op of a modelled family left without a cost says what its
trace lacked (`lacks`); the ops of no modelled family whose work no counted op holds are named (`unmodelled`),
views, allocations and metadata aside (`NO_WORK`)."""

from __future__ import annotations

import bisect
import collections
from typing import Any

from stepscope.analysis.ops.families import family_of
from stepscope.analysis.ops.model import conv_forward_shapes

__all__ = ["NO_WORK", "lacks", "unmodelled"]

# ops that move no data of their own (views, allocations, metadata, scalars read back): not worth a note
NO_WORK = frozenset(
    "aten::" + n
    for n in (  # noqa: SIM905 (a list of names, read as one)
        "view reshape _reshape_alias _unsafe_view t transpose permute expand expand_as as_strided movedim "
        "swapaxes flatten unflatten view_as slice select unsqueeze squeeze narrow split split_with_sizes "
        "chunk unbind detach detach_ alias lift_fresh lift_fresh_copy to empty empty_like empty_strided "
        "new_empty new_empty_strided resize_ set_ item _local_scalar_dense is_nonzero result_type "
        "broadcast_tensors requires_grad_ retain_grad record_stream scalar_tensor zeros zeros_like ones "
        "ones_like full full_like new_zeros new_ones new_full arange resolve_conj resolve_neg conj "
        "as_strided_"
    ).split()
)


def unmodelled(ops: dict[Any, list[Any]], spans: dict[Any, list[tuple[float, float, str]]]) -> dict[str, int]:
    """The commonest ops of no modelled family whose work no counted op holds: neither inside a modelled op
    (`max_pool1d_with_indices` in `max_pool1d`) nor around one (`slice_backward` around its `copy_`)."""
    found: collections.Counter[str] = collections.Counter()
    for key, thread in spans.items():
        costed = sorted((op.ts, op.end) for op in ops.get(key, ()) if op.cost is not None)
        starts = [ts for ts, _ in costed]
        timeline = sorted(
            [(ts, 0, -end, "") for ts, end in costed] + [(ts, 1, -end, name) for ts, end, name in thread]
        )
        open_ends: list[float] = []
        for ts, kind, minus_end, name in timeline:
            end = -minus_end
            while open_ends and open_ends[-1] <= ts:
                open_ends.pop()
            if kind == 0:
                open_ends.append(end)
                continue
            inside = bisect.bisect_left(starts, ts)
            if open_ends or (inside < len(starts) and starts[inside] < end):
                continue
            found[name] += 1
    return dict(found.most_common(5))


def lacks(op: Any) -> str:
    if family_of(op.name) == "conv" and conv_forward_shapes(op.name, op.inputs) is not None:
        return "its stride and padding (not recorded, and no backward of the same layer in the trace)"
    if any(isinstance(d, list) and d and all(isinstance(x, int) for x in d) for d in op.inputs.dims):
        return "inputs that fit its formula (those recorded do not: other dtypes or arguments)"
    if "TensorList" in op.inputs.types:
        return "the shapes of its tensor list's members (this trace records the list without them)"
    return "the shapes of its tensors"
