"""Whether a compiled result equals eager's, within the tolerance its dtype allows."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten


def compare(actual, expected, dtype, values_undefined: bool) -> str:
    """'' when equal as eager's contract requires, else what differs."""
    a_leaves, a_spec = tree_flatten(actual)
    e_leaves, e_spec = tree_flatten(expected)
    if len(a_leaves) != len(e_leaves):
        return f"{len(a_leaves)} outputs, eager gives {len(e_leaves)}"
    for k, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        why = _compare_one(a, e, values_undefined)
        if why:
            return f"output {k}: {why}"
    return ""


def stride_difference(actual, expected) -> str:
    """'' when every output has eager's strides in its dims of size > 1 (a size-1 dim's stride
    never addresses memory), else the first difference."""
    for k, (a, e) in enumerate(zip(tree_flatten(actual)[0], tree_flatten(expected)[0])):
        if not (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor)):
            continue
        if e.layout != torch.strided or a.layout != torch.strided or e.numel() == 0 or a.shape != e.shape:
            continue
        dims = [d for d, size in enumerate(e.shape) if size > 1]
        if [a.stride(d) for d in dims] != [e.stride(d) for d in dims]:
            return f"output {k}: strides {a.stride()}, eager {e.stride()} (shape {list(e.shape)})"
    return ""


def _compare_one(a, e, values_undefined: bool) -> str:
    if not isinstance(e, torch.Tensor):
        if isinstance(a, torch.Tensor) or a != e and not (a != a and e != e):
            return f"{a!r} != {e!r}"
        return ""
    if not isinstance(a, torch.Tensor):
        return f"got {type(a).__name__}, eager gives a tensor"
    if a.shape != e.shape or a.dtype != e.dtype:
        return f"{a.dtype}{list(a.shape)} vs eager {e.dtype}{list(e.shape)}"
    if values_undefined or e.numel() == 0:
        return ""
    if e.layout != torch.strided:
        a, e = a.to_dense(), e.to_dense()
    if e.is_floating_point() or e.is_complex():
        try:
            torch.testing.assert_close(a, e, equal_nan=True, **tolerance(e))
        except AssertionError as err:
            return str(err).replace("\n", " ")[:300]
        return ""
    if not torch.equal(a, e):
        bad = (a != e).sum().item()
        return f"{bad} of {e.numel()} values differ"
    return ""


def tolerance(e: torch.Tensor) -> dict:
    """Element-wise ops round like eager; reductions may sum in another order, so the
    absolute tolerance grows with the values' magnitude."""
    finite = e[torch.isfinite(e)] if not e.is_complex() else e.abs()
    scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
    if e.dtype in (torch.bfloat16, torch.float16):
        return dict(rtol=2e-2, atol=2e-2 * scale)
    if e.dtype == torch.float64:
        return dict(rtol=1e-7, atol=1e-9 * scale)
    return dict(rtol=1e-4, atol=1e-5 * scale)

