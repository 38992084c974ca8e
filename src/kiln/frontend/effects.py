"""Which ATen calls have effects beyond their result: they run even when nothing reads
what they return, in program order. Dead-code elimination keeps them."""

from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten


def _known_effectful() -> frozenset:
    """Ops with effects that torch's purity check does not report: a collective's wait
    (the collective may still be in flight), a functional assert (its token is often
    unused) and printing."""
    ops = [aten._functional_assert_async.msg, aten._print.default]
    c10d = getattr(torch.ops, "_c10d_functional", None)
    if c10d is not None and hasattr(c10d, "wait_tensor"):
        ops.append(c10d.wait_tensor.default)
    return frozenset(ops)


KNOWN_EFFECTFUL = _known_effectful()


def has_side_effects(n: fx.Node) -> bool:
    """An assert, a print, a collective's wait, a mutation of an argument, or a random op
    (it advances the generator's state): torch's own rule (Node.is_impure, which reads
    op schemas' mutability and its table of effectful functions) and kiln's table. As in
    torch's rule, placeholders and the output count too (FX's dead-code elimination asks)."""
    if n.op != "call_function":
        return n.op in ("placeholder", "output")
    if n.target in KNOWN_EFFECTFUL:
        return True
    try:
        return n.is_impure()
    except Exception:  # noqa: BLE001 - an unusual target: decide from its schema alone
        schema = getattr(n.target, "_schema", None)
        return schema is None or schema.is_mutable
