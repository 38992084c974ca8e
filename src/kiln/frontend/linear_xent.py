"""A linear layer whose only reader is a cross-entropy loss runs in row chunks, so the
[N, V] logits (and their gradient) never exist whole.

Rewritten in Dynamo's graph, before AOTAutograd:

    cross_entropy(linear(x, W, b)[.view(-1, V)][.float()], target, ...)

becomes one call of `ChunkedLinearCrossEntropy`, which for each chunk of rows computes the
logits, the loss, and (when a gradient is wanted) the logits' gradient, from which it adds up
dx, dW and db at once. The backward only scales those by the loss's gradient. The loss is
computed in float32, as ATen's cross-entropy accumulates; its dtype is the logits'.

Rewritten only where it pays and is the same function: logits of at least MIN_LOGITS_BYTES,
static sizes, reduction "mean" or "sum", no class weights, logits read by nothing else.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F

from kiln.passes.fusion import Decision

MIN_LOGITS_BYTES = 256 * 2**20  # smaller logits: the unchunked kernels are as fast, and fit
CHUNK_LOGITS_BYTES = 64 * 2**20  # float32 logits of one chunk


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """cross_entropy(x @ weight.T + bias, target) over chunks of `rows` rows."""

    @staticmethod
    def forward(ctx, x, weight, bias, target, ignore_index: int, reduction: str, smoothing: float,
                out_dtype: torch.dtype, rows: int):
        wants = ctx.needs_input_grad[:3]
        x2 = x.reshape(-1, x.shape[-1])
        target = target.reshape(-1)
        valid = target != ignore_index
        count = valid.sum()
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        dx = torch.empty_like(x2) if wants[0] else None
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=x.device) if wants[1] else None
        db = torch.zeros(weight.shape[0], dtype=torch.float32, device=x.device) if wants[2] else None
        scale = 1.0 / count.float() if reduction == "mean" else torch.ones((), device=x.device)
        for start in range(0, x2.shape[0], rows):
            xc, tc, vc = x2[start:start + rows], target[start:start + rows], valid[start:start + rows]
            z = F.linear(xc, weight, bias).float()
            lse = torch.logsumexp(z, -1)
            picked = z.gather(1, torch.where(vc, tc, 0).unsqueeze(1)).squeeze(1)
            loss = lse - picked
            if smoothing:
                loss = (1 - smoothing) * loss + smoothing * (lse - z.mean(-1))
            total = total + torch.where(vc, loss, 0.0).sum()
            if not any(wants):
                continue
            grad = torch.softmax(z, -1)
            grad = grad - F.one_hot(torch.where(vc, tc, 0), z.shape[-1]).float() * (1 - smoothing)
            if smoothing:
                grad = grad - smoothing / z.shape[-1]
            grad = torch.where(vc.unsqueeze(1), grad, 0.0) * scale
            low = grad.to(x.dtype)
            if dx is not None:
                dx[start:start + rows] = low @ weight
            if dw is not None:
                dw += (low.t() @ xc).float()
            if db is not None:
                db += grad.sum(0)
        ctx.save_for_backward(*(t for t in (dx, dw, db) if t is not None))
        ctx.shapes = (x.shape, weight.dtype, None if bias is None else bias.dtype)
        return (total * scale).to(out_dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        """The gradients were computed with the loss: scale them by the loss's gradient."""
        saved = list(ctx.saved_tensors)
        wants = ctx.needs_input_grad[:3]
        x_shape, w_dtype, b_dtype = ctx.shapes
        g = grad_loss.float()
        dx = (saved.pop(0) * g).reshape(x_shape) if wants[0] else None
        dw = (saved.pop(0) * g).to(w_dtype) if wants[1] else None
        db = (saved.pop(0) * g).to(b_dtype) if wants[2] else None
        return dx, dw, db, None, None, None, None, None, None


_VIEWS = ("view", "reshape", torch.reshape)
_FLOATS = ("float",)


def _is(n, targets) -> bool:
    return isinstance(n, fx.Node) and n.op in ("call_function", "call_method") and n.target in targets


def _value(n):
    return n.meta.get("example_value") if isinstance(n, fx.Node) else None


def _arg(n: fx.Node, index: int, name: str, default=None):
    return n.args[index] if len(n.args) > index else n.kwargs.get(name, default)


@dataclass
class _LinearLoss:
    x: fx.Node
    weight: fx.Node
    bias: fx.Node | None
    target: fx.Node
    ignore_index: int
    reduction: str
    smoothing: float
    out_dtype: torch.dtype
    rows: int
    logits_bytes: int


def _linear(n):
    """(x, weight, bias) when n computes x @ weight.T (+ bias)."""
    if _is(n, (F.linear, torch._C._nn.linear)):
        return n.args[0], n.args[1], _arg(n, 2, "bias")
    if _is(n, (operator.matmul, torch.matmul)) and _is(n.args[1], ("t",)):
        w = _value(n.args[1].args[0])
        if isinstance(w, torch.Tensor) and w.dim() == 2:
            return n.args[0], n.args[1].args[0], None
    return None


def _match(loss: fx.Node) -> tuple[_LinearLoss | None, str]:
    if not _is(loss, (F.cross_entropy,)):
        return None, ""
    logits = loss.args[0]
    chain = []
    while _is(logits, _VIEWS + _FLOATS) and len(logits.users) == 1:
        chain.append(logits)
        logits = logits.args[0]
    found = _linear(logits) if isinstance(logits, fx.Node) else None
    if found is None:
        return None, ""
    if len(logits.users) != 1:
        return None, "linear + cross-entropy: the logits are read elsewhere"
    x, weight, bias = found
    target = _arg(loss, 1, "target")
    reduction = _arg(loss, 7, "reduction", "mean")
    if _arg(loss, 2, "weight") is not None or reduction not in ("mean", "sum"):
        return None, "linear + cross-entropy: class weights or reduction 'none' are computed whole"
    if _arg(loss, 3, "size_average") is not None or _arg(loss, 5, "reduce") is not None:
        return None, ""
    ce_in, xv, wv, tv = _value(loss.args[0]), _value(x), _value(weight), _value(target)
    if not all(isinstance(t, torch.Tensor) for t in (ce_in, xv, wv, tv)) or ce_in.dim() != 2:
        return None, ""
    sizes = (*ce_in.shape, *xv.shape, *wv.shape, *tv.shape)
    if not all(isinstance(s, int) for s in sizes):
        return None, "linear + cross-entropy: symbolic sizes are computed whole"
    n, v = ce_in.shape
    if tv.numel() != n or tv.dtype != torch.int64 or xv.numel() // xv.shape[-1] != n:
        return None, ""
    logits_bytes = n * v * 4
    if logits_bytes < MIN_LOGITS_BYTES:
        return None, ""
    rows = max(1, CHUNK_LOGITS_BYTES // (v * 4))
    return _LinearLoss(x, weight, bias, target, _arg(loss, 4, "ignore_index", -100), reduction,
                       float(_arg(loss, 8, "label_smoothing", 0.0)), ce_in.dtype, rows, logits_bytes), ""


def rewrite_linear_cross_entropy(gm: fx.GraphModule) -> list[Decision]:
    """Chunk each linear + cross-entropy of Dynamo's graph gm in place; one decision each."""
    decisions = []
    for node in list(gm.graph.nodes):
        found, reason = _match(node)
        if found is None:
            if reason:
                decisions.append(Decision(node.name, "kept", reason))
            continue
        f = found
        with gm.graph.inserting_before(node):
            chunked = gm.graph.call_function(
                ChunkedLinearCrossEntropy.apply,
                (f.x, f.weight, f.bias, f.target, f.ignore_index, f.reduction, f.smoothing, f.out_dtype,
                 f.rows))
        chunked.meta.update({k: v for k, v in node.meta.items() if k != "example_value"})
        node.replace_all_uses_with(chunked)
        dead = [node]
        while dead:
            n = dead.pop()
            if not n.users and n.op in ("call_function", "call_method"):
                dead.extend(n.all_input_nodes)
                gm.graph.erase_node(n)
        chunks = -(-_value(f.target).numel() // f.rows)
        decisions.append(Decision(node.name, "chunked", (
            f"linear + cross-entropy over {f.logits_bytes / 2**20:.0f} MiB of float32 logits: "
            f"{chunks} chunks of {f.rows} rows, gradients computed with the loss")))
    if any(d.verdict == "chunked" for d in decisions):
        gm.recompile()
    return decisions
