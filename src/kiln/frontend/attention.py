"""Attention written out as matmul, scale, causal mask and softmax becomes one fused
attention call (PyTorch's scaled_dot_product_attention: flash or memory-efficient kernels).

Rewritten only where the result is the same function: no mask, or a mask built from
constants that is exactly causal (a fully masked row, which a general mask allows, is NaN
in the written-out form and may differ in a fused kernel).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from kiln.frontend.effects import has_side_effects
from kiln.frontend.origin import keep_origin

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.expand.default, aten.clone.default)
# low-precision softmax is computed in float32 between two casts
_CASTS = (torch.ops.prims.convert_element_type.default, aten._to_copy.default)


def _only_user(n: fx.Node) -> bool:
    return len(n.users) == 1


def _strip(n, ops=_VIEWS):
    """The tensor under a chain of views and expands."""
    while isinstance(n, fx.Node) and n.op == "call_function" and n.target in ops:
        n = n.args[0]
    return n


def _call(n, target) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target == target


def _constant_float(n) -> float | None:
    """The value of a scalar built from constants, or None. Evaluated with real tensors:
    the compiler runs under AOTAutograd's fake mode."""
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        try:
            return float(_evaluate(n))
        except Exception:  # noqa: BLE001 - depends on an input, or not a scalar
            return None


def _evaluate(n):
    """Evaluate a node that depends on no graph input (call under unset_fake_temporarily)."""
    if not isinstance(n, fx.Node):
        return n
    if n.op != "call_function":
        raise ValueError("depends on an input")
    return n.target(*fx.node.map_arg(n.args, _evaluate), **fx.node.map_arg(n.kwargs, _evaluate))


def _is_causal_mask(mask: fx.Node, t: int, s_len: int) -> bool:
    """Whether mask is built from constants and hides exactly the future (triu(1))."""
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        try:
            value = _evaluate(mask).to("cpu")
        except Exception:  # noqa: BLE001 - a mask computed from inputs
            return False
        causal = torch.ones(t, s_len, dtype=torch.bool).triu(1)
        return (value.dtype == torch.bool and tuple(value.shape[-2:]) == (t, s_len)
                and bool((value == causal).all()))


def _batches_heads(arg) -> bool:
    """Whether a bmm operand is a 4-D tensor with its first two dims merged (B*H, T, D)."""
    if not (_call(arg, aten.view.default) or _call(arg, aten._unsafe_view.default)):
        return False
    src, out = arg.args[0].meta.get("val"), arg.meta.get("val")
    if not (isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor) and src.dim() == 4):
        return False
    return tuple(out.shape) == (src.shape[0] * src.shape[1], src.shape[2], src.shape[3])


def _softmax_input(p: fx.Node):
    """s when p is exp(s - amax(s, -1)) / sum(exp(...), -1) (the decomposed softmax)."""
    if not _call(p, aten.div.Tensor):
        return None
    e, total = p.args
    if not (_call(e, aten.exp.default) and _call(total, aten.sum.dim_IntList) and total.args[0] is e):
        return None
    shifted = e.args[0]
    if not _call(shifted, aten.sub.Tensor):
        return None
    s, peak = shifted.args
    if not (_call(peak, aten.amax.default) and peak.args[0] is s):
        return None
    last = s.meta["val"].dim() - 1 if isinstance(s.meta.get("val"), torch.Tensor) else None
    for reduction in (peak, total):  # over the last dim, keeping it
        dims = [d % (last + 1) for d in reduction.args[1]] if last is not None else None
        if dims != [last] or not (len(reduction.args) > 2 and reduction.args[2]):
            return None
    return s


def _match(out_view: fx.Node):
    """(q, k, v, scale, is_causal) or None."""
    bmm2 = out_view.args[0]
    if not (_call(bmm2, aten.bmm.default) and _only_user(bmm2)):
        return None
    s = _softmax_input(_strip(bmm2.args[0], _VIEWS + _CASTS))
    if s is None:
        return None
    s = _strip(s, _CASTS)
    mask = None
    if _call(s, aten.where.self):
        mask, fill, s = s.args
        if _constant_float(fill) != float("-inf"):
            return None
    scale = None
    if _call(s, aten.mul.Tensor) and isinstance(s.args[1], (int, float)):
        s, scale = s.args[0], float(s.args[1])
    elif _call(s, aten.div.Tensor) and isinstance(s.args[1], (int, float)):
        s, scale = s.args[0], 1.0 / float(s.args[1])
    bmm1 = _strip(s)
    if not _call(bmm1, aten.bmm.default):
        return None
    if not all(_batches_heads(x) for x in (bmm1.args[0], bmm1.args[1], bmm2.args[1])):
        return None
    q, kt, v = _strip(bmm1.args[0]), _strip(bmm1.args[1]), _strip(bmm2.args[1])
    if not (_call(kt, aten.permute.default) and list(kt.args[1]) == [0, 1, 3, 2]):
        return None
    k = kt.args[0]
    shapes = [x.meta.get("val") for x in (q, k, v, out_view)]
    if any(not isinstance(t, torch.Tensor) or t.dim() != 4 for t in shapes):
        return None
    if tuple(shapes[3].shape) != tuple(shapes[0].shape[:3]) + (shapes[2].shape[3],):
        return None
    is_causal = False
    if mask is not None:
        if not _is_causal_mask(mask, shapes[0].shape[2], shapes[1].shape[2]):
            return None
        is_causal = True
    return q, k, v, scale, is_causal


def rewrite_attention(gm: fx.GraphModule) -> int:
    """Replace each written-out attention in gm; returns how many were replaced."""
    count = 0
    for node in list(gm.graph.nodes):
        if not (_call(node, aten.view.default) or _call(node, aten._unsafe_view.default)):
            continue
        found = _match(node)
        if found is None:
            continue
        q, k, v, scale, is_causal = found
        qv = q.meta["val"]
        if scale is None:  # no scale written: SDPA's default 1/sqrt(d) must not apply
            scale = 1.0
        with gm.graph.inserting_before(node):
            fused = gm.graph.call_function(aten.scaled_dot_product_attention.default, (q, k, v),
                                           {"is_causal": is_causal, "scale": scale})
        with qv.fake_mode:
            fused.meta["val"] = aten.scaled_dot_product_attention.default(
                qv, k.meta["val"], v.meta["val"], is_causal=is_causal, scale=scale)
        keep_origin(fused, node)
        node.replace_all_uses_with(fused)
        count += 1
    if count:
        gm.graph.eliminate_dead_code(is_impure_node=has_side_effects)
        gm.recompile()
    return count

