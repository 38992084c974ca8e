"""Attention written out in the captured graph becomes `F.scaled_dot_product_attention`
before AOTAutograd traces it, so a training graph gets SDPA's forward and backward kernels
and never saves the [..., T, S] probabilities.

The rewrite works on Dynamo's graph (torch functions and methods, before decomposition):

    softmax((q @ k^T) * scale [+ float mask | masked_fill(bool mask, -inf)], -1) [-> cast]
        [-> dropout that keeps every value] @ v

It replaces only what computes the same function:
- an additive float mask is SDPA's float mask (added after the scale);
- a boolean mask filled with -inf is SDPA's boolean mask; a row with every key masked is NaN
  in the written-out form and 0 in SDPA, so its NaN is added back to the output;
- dropout that drops values keeps the written-out form: SDPA draws its own random stream;
- probabilities or scores read anywhere else keep the written-out form.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F

from kiln.passes.fusion import Decision

_MATMULS = (operator.matmul, torch.matmul, "matmul")
_SOFTMAXES = (F.softmax, torch.softmax, torch.Tensor.softmax, "softmax")
_MULS = (operator.mul, torch.mul, "mul")
_DIVS = (operator.truediv, torch.div, "div")
_ADDS = (operator.add, torch.add, "add")
_MASKED_FILLS = (torch.masked_fill, "masked_fill")
_CASTS = ("to", "type_as", "float", "half", "bfloat16")
_DROPOUTS = (F.dropout, torch.dropout, "dropout")


def _is(n, targets) -> bool:
    if not isinstance(n, fx.Node) or n.op not in ("call_function", "call_method"):
        return False
    return n.target in targets


def _value(n):
    """The example value Dynamo recorded for a node (a fake tensor), or None."""
    return n.meta.get("example_value") if isinstance(n, fx.Node) else None


def _arg(n: fx.Node, index: int, name: str, default=None):
    if len(n.args) > index:
        return n.args[index]
    return n.kwargs.get(name, default)


def _last_dim(n: fx.Node, dim) -> bool:
    v = _value(n)
    return isinstance(dim, int) and isinstance(v, torch.Tensor) and dim % v.dim() == v.dim() - 1


def _only_user(n: fx.Node) -> bool:
    return len(n.users) == 1


@dataclass
class _Attention:
    q: fx.Node
    k: fx.Node
    v: fx.Node
    scale: float
    mask: fx.Node | None = None  # SDPA's attn_mask: a float tensor added, or True where kept
    mask_kind: str = ""  # "float", "drop" (True is masked out) or "causal" (mask is constant)


def _transposed_key(kt) -> fx.Node | None:
    """k when kt is k with its last two dims swapped."""
    if _is(kt, ("transpose", torch.transpose)):
        v = _value(kt.args[0])
        dims = (_arg(kt, 1, "dim0"), _arg(kt, 2, "dim1"))
        if isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in dims):
            if sorted(d % v.dim() for d in dims) == [v.dim() - 2, v.dim() - 1]:
                return kt.args[0]
    return None


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _scaled(n):
    """(tensor, scale) of `tensor * c` or `tensor / c` for a number c; (n, 1.0) otherwise."""
    if _is(n, _MULS) and _only_user(n):
        a, b = n.args[0], n.args[1]
        if _number(b) is not None:
            return a, _number(b)
        if _number(a) is not None:
            return b, _number(a)
    if _is(n, _DIVS) and _only_user(n) and _number(n.args[1]) and not n.kwargs.get("rounding_mode"):
        return n.args[0], 1.0 / _number(n.args[1])
    return n, 1.0


def _scores(s) -> tuple[fx.Node, fx.Node, float] | None:
    """(q, k, scale) when s is (q @ k^T) * scale, the scale on the product or on q."""
    product, scale = _scaled(s)
    if not (_is(product, _MATMULS) and _only_user(product)):
        return None
    q, kt = product.args[0], product.args[1]
    k = _transposed_key(kt)
    if k is None:
        return None
    q, q_scale = _scaled(q) if _only_user(q) else (q, 1.0)
    return q, k, scale * q_scale


def _strip_cast(p: fx.Node) -> fx.Node:
    while _is(p, _CASTS) and _only_user(p.args[0]):
        p = p.args[0]
    return p


def _dropout_kept_reason(p: fx.Node) -> tuple[fx.Node, str]:
    """p under a dropout, and why not to rewrite when the dropout drops values."""
    if not _is(p, _DROPOUTS):
        return p, ""
    rate, training = _arg(p, 1, "p", 0.5), _arg(p, 2, "training", True)
    if training is False or rate == 0:
        return p.args[0], ""
    return p.args[0], "dropout on the probabilities: SDPA's dropout draws another random stream than eager's"


def _match(out: fx.Node) -> tuple[_Attention | None, str]:
    """The attention computed by out = probabilities @ v, or (None, why not) when the form
    is attention's but the rewrite would change the result ("" when it is not attention)."""
    if not (_is(out, _MATMULS) and len(out.args) == 2):
        return None, ""
    p, v = out.args
    p, dropout_reason = _dropout_kept_reason(p)
    p = _strip_cast(p)
    if not (_is(p, _SOFTMAXES) and _last_dim(p, _arg(p, 1, "dim"))):
        return None, ""
    if dropout_reason:
        return None, dropout_reason
    if not _only_user(p):
        return None, "the probabilities are read elsewhere"
    s = p.args[0]
    mask, kind = None, ""
    if _is(s, _ADDS) and _only_user(s) and len(s.args) == 2 and isinstance(s.args[1], fx.Node):
        s, mask, kind = s.args[0], s.args[1], "float"
    elif _is(s, _MASKED_FILLS) and _only_user(s) and _number(_arg(s, 2, "value")) == -math.inf:
        s, mask, kind = s.args[0], s.args[1], "drop"
    found = _scores(s) if isinstance(s, fx.Node) and _only_user(s) else None
    if found is None:
        return None, ""
    q, k, scale = found
    if not _shapes_fit(q, k, v, out, mask, kind):
        return None, "q, k, v, mask or output shapes or dtypes are not SDPA's"
    if kind == "drop" and _is_causal(mask, _value(q).shape[-2], _value(k).shape[-2]):
        mask, kind = None, "causal"
    return _Attention(q, k, v, scale, mask, kind), ""


# ops a constant mask is built from; nothing random, nothing with a side effect
_MASK_BUILDERS = (torch.ones, torch.zeros, torch.full, torch.arange, torch.tril, torch.triu,
                  operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
                  operator.invert, operator.getitem, torch.logical_not, "tril", "triu", "bool",
                  "to", "view", "reshape", "unsqueeze", "logical_not", "eq", "ne", "lt", "gt")


def _constant(n):
    """The value of a node built from constants only, computed now (ValueError otherwise)."""
    if not isinstance(n, fx.Node):
        return n
    if not _is(n, _MASK_BUILDERS):
        raise ValueError("reads an input or is not a mask builder")
    args = fx.node.map_arg(n.args, _constant)
    kwargs = fx.node.map_arg(n.kwargs, _constant)
    if n.op == "call_method":
        return getattr(args[0], n.target)(*args[1:], **kwargs)
    return n.target(*args, **kwargs)


def _is_causal(mask: fx.Node, t, s) -> bool:
    """Whether a boolean mask built from constants masks exactly the future (triu(1))."""
    if not (isinstance(t, int) and isinstance(s, int)):
        return False
    try:
        value = _constant(mask)
    except Exception:  # noqa: BLE001 - reads an input, or cannot run outside the trace
        return False
    future = torch.ones(t, s, dtype=torch.bool).triu(1)
    return (isinstance(value, torch.Tensor) and value.dtype == torch.bool and value.dim() >= 2
            and tuple(value.shape[-2:]) == (t, s) and value.numel() == t * s
            and bool((value.reshape(t, s).cpu() == future).all()))


def _same(a, b) -> bool:
    """Sizes equal for every size the graph serves; symbolic sizes compare by expression, so
    that no guard is added."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return str(a) == str(b)


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


def _shapes_fit(q, k, v, out, mask, kind) -> bool:
    qv, kv, vv, ov = (_value(x) for x in (q, k, v, out))
    if not all(isinstance(t, torch.Tensor) for t in (qv, kv, vv, ov)):
        return False
    if not (qv.dim() >= 3 and qv.dim() == kv.dim() == vv.dim() == ov.dim()):
        return False
    if not (qv.dtype == kv.dtype == vv.dtype == ov.dtype and qv.dtype.is_floating_point):
        return False
    if not (_same_shape(qv.shape[:-2], kv.shape[:-2]) and _same_shape(kv.shape[:-2], vv.shape[:-2])):
        return False  # SDPA broadcasts no batch dims between q, k and v
    if not (_same(qv.shape[-1], kv.shape[-1]) and _same(kv.shape[-2], vv.shape[-2])):
        return False
    if not _same_shape(ov.shape, tuple(qv.shape[:-1]) + (vv.shape[-1],)):
        return False
    if mask is None:
        return True
    mv = _value(mask)
    if not isinstance(mv, torch.Tensor) or mv.dim() > qv.dim():
        return False
    want = torch.bool if kind == "drop" else qv.dtype
    return mv.dtype == want


def _replace(gm: fx.GraphModule, out: fx.Node, a: _Attention) -> None:
    graph = gm.graph
    with graph.inserting_before(out):
        mask = a.mask
        if a.mask_kind == "drop":
            mask = graph.call_function(torch.logical_not, (a.mask,))
        kwargs = {"attn_mask": mask, "scale": a.scale, "is_causal": a.mask_kind == "causal"}
        fused = graph.call_function(F.scaled_dot_product_attention, (a.q, a.k, a.v), kwargs)
        result = fused
        if a.mask_kind == "drop":
            # rows with every key masked: NaN, as the written-out softmax gives
            any_kept = graph.call_method("any", (mask, -1), {"keepdim": True})
            nan_rows = graph.call_function(torch.where, (any_kept, 0.0, math.nan))
            result = graph.call_function(operator.add, (fused, nan_rows))
        # a matmul's result is contiguous, SDPA's may not be: views and outputs need eager's
        result = graph.call_method("contiguous", (result,))
    out.replace_all_uses_with(result)
    for n in (fused, result):
        n.meta.update({k: v for k, v in out.meta.items() if k != "example_value"})
    _erase_unused(graph, out)


_PURE = _MATMULS + _SOFTMAXES + _MULS + _DIVS + _ADDS + _MASKED_FILLS + _CASTS + _DROPOUTS + (
    "transpose", torch.transpose)


def _erase_unused(graph: fx.Graph, node: fx.Node) -> None:
    """Erase node and what only it read, among the ops the pattern is made of (an unused
    in-place method elsewhere is a side effect and stays)."""
    dead = [node]
    while dead:
        n = dead.pop()
        if n.users or not _is(n, _PURE):
            continue
        inputs = n.all_input_nodes
        graph.erase_node(n)
        dead.extend(inputs)


def rewrite_captured_attention(gm: fx.GraphModule) -> list[Decision]:
    """Rewrite each written-out attention of Dynamo's graph gm in place; one decision each."""
    decisions = []
    for node in list(gm.graph.nodes):
        found, reason = _match(node)
        if found is None:
            if reason:
                decisions.append(Decision(node.name, "kept", f"attention written out: {reason}"))
            continue
        _replace(gm, node, found)
        mask = {"float": ", float mask", "drop": ", boolean mask", "causal": ", causal"}.get(
            found.mask_kind, "")
        decisions.append(Decision(node.name, "sdpa", f"written-out attention -> SDPA (scale "
                                  f"{found.scale:.4g}{mask}): its backward saves no probabilities"))
    if any(d.verdict == "sdpa" for d in decisions):
        gm.recompile()
    return decisions
