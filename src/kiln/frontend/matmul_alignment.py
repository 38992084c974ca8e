"""Matmuls whose rows cuBLAS would read or write off a 16-byte boundary run on operands padded
to whole 16 bytes, and their product is sliced back.

cuBLAS picks its kernels by the alignment of each matrix's leading dimension: a vocabulary of
30522 bf16 columns leaves it kernels that move 4 bytes at a time, several times slower than
those it runs for 30528. Which dimensions lead depends on the layouts: the product's rows (N)
always; the inner dimension (K) where the left operand is row-major or the right one
column-major; the product's columns (M) where the left operand is column-major.

Padding is with zeros, so a padded K adds nothing to the product. A pad is one of kiln's
kernels, which fuses into the kernel producing the operand (a weight's bf16 cast writes the
padded copy); an operand that is a graph input (a parameter, a saved tensor) is copied, and a
product the graph returns with its columns cut is copied back to eager's contiguous layout.
A matmul is padded only where the cost model predicts that those copies cost less than the
time the misaligned kernels lose, which is taken as the aligned product's own time. A tensor
padded for two matmuls (a gradient read as it is and transposed, or viewed alike twice) is
padded once.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from kiln.frontend.origin import keep_origin
from kiln.passes.roofline import Ceilings

aten = torch.ops.aten
ALIGN_BYTES = 16
_TRANSPOSES = (aten.t.default, aten.permute.default, aten.transpose.int)
_VIEWS = _TRANSPOSES + (aten.view.default, aten._unsafe_view.default, aten.expand.default)


def align_matmuls(gm: fx.GraphModule, ceilings: Ceilings, devices: tuple[str, ...] = ("cuda",)) -> int:
    """Pads the operands of mm and addmm (2-D, floating, static sizes, on one of devices) whose
    leading dimensions are off a 16-byte boundary; returns how many were padded."""
    pads = _Pads(gm)
    count = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in (aten.mm.default, aten.addmm.default):
            continue
        plan = _plan(n, devices)
        if plan is None or not _pays(n, plan, _returned(n), ceilings):
            continue
        _rewrite(n, plan, pads, _returned(n))
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return count


def _plan(n: fx.Node, devices) -> tuple[int, int, int] | None:
    """(pad M, pad K, pad N) for matmul n, or None where nothing needs padding."""
    if n.target is aten.addmm.default and (n.kwargs.get("beta", 1) != 1 or n.kwargs.get("alpha", 1) != 1):
        return None
    a, b = n.args[-2:]
    va, vb = a.meta.get("val"), b.meta.get("val")
    if not all(isinstance(v, torch.Tensor) and v.dim() == 2 for v in (va, vb)):
        return None
    if va.device.type not in devices or va.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return None
    if not all(isinstance(s, int) for s in (*va.shape, *vb.shape, *va.stride(), *vb.stride())):
        return None  # a shape family's sizes (SymInts)
    align = ALIGN_BYTES // va.element_size()
    (m, k), ncols = va.shape, vb.shape[1]
    a_column_major = va.stride(0) == 1 and va.stride(1) != 1 and m > 1
    b_column_major = vb.stride(0) == 1 and vb.stride(1) != 1 and ncols > 1
    pad_m = -m % align if a_column_major else 0
    pad_k = -k % align if (not a_column_major or b_column_major) else 0
    pad_n = -ncols % align
    return (pad_m, pad_k, pad_n) if pad_m or pad_k or pad_n else None


def _pays(n: fx.Node, plan: tuple[int, int, int], returned: bool, ceilings: Ceilings) -> bool:
    a, b = n.args[-2:]
    va, vb = a.meta["val"], b.meta["val"]
    (m, k), ncols = va.shape, vb.shape[1]
    lost = 2 * m * k * ncols / ceilings.matmul_flop_per_s
    pad_m, pad_k, pad_n = plan
    copied = 0
    if (pad_m or pad_k) and _is_input(a):
        copied += va.numel() * va.element_size()
    if (pad_k or pad_n) and _is_input(b):
        copied += vb.numel() * vb.element_size()
    if returned and pad_n:
        copied += m * ncols * va.element_size()
    return 2 * copied / ceilings.copy_bytes_per_s < lost


def _is_input(node: fx.Node) -> bool:
    """Whether node is a graph input seen through views: padding it is a copy of its own."""
    while node.op == "call_function" and node.target in _VIEWS:
        node = node.args[0]
    return node.op in ("placeholder", "get_attr")


class _Pads:
    """Zero-padded versions of tensors, one per (tensor, rows, columns); a transposed view is
    padded as the transpose of its padded source."""

    def __init__(self, gm: fx.GraphModule):
        self.gm = gm
        self.made: dict[tuple, fx.Node] = {}

    def __call__(self, node: fx.Node, rows: int, cols: int, before: fx.Node) -> fx.Node:
        if not rows and not cols:
            return node
        source = _transposed_source(node)
        if source is not None:
            padded = self(source, cols, rows, before)
            return self._node(before, aten.t.default, (padded,), node)
        key = (_structure(node), rows, cols)
        if key not in self.made:
            after = node if node.op != "placeholder" else _last_placeholder(self.gm)
            with self.gm.graph.inserting_after(after):
                pad = (node, [0, cols, 0, rows], 0.0)
                self.made[key] = self._make(aten.constant_pad_nd.default, pad, node)
        return self.made[key]

    def _node(self, before: fx.Node, target, args, like: fx.Node, kwargs: dict | None = None) -> fx.Node:
        with self.gm.graph.inserting_before(before):
            return self._make(target, args, like, kwargs or {})

    def _make(self, target, args, like: fx.Node, kwargs: dict | None = None) -> fx.Node:
        kwargs = kwargs or {}
        made = self.gm.graph.call_function(target, args, kwargs)
        made.meta["val"] = target(*[a.meta["val"] if isinstance(a, fx.Node) else a for a in args], **kwargs)
        keep_origin(made, like)
        return made


def _structure(node: fx.Node):
    """A key equal for views alike of one tensor: AOTAutograd views a tensor once per reader."""
    if node.op != "call_function" or node.target not in _VIEWS:
        return node
    rest = tuple(tuple(a) if isinstance(a, (list, tuple)) else a for a in node.args[1:])
    return (node.target, _structure(node.args[0]), rest)


def _transposed_source(node: fx.Node) -> fx.Node | None:
    if node.op != "call_function" or node.target not in _TRANSPOSES:
        return None
    if node.target is aten.permute.default and list(node.args[1]) not in ([1, 0], [-1, -2], [-1, 0], [1, -2]):
        return None
    source = node.args[0]
    return source if source.meta["val"].dim() == 2 else None


def _last_placeholder(gm: fx.GraphModule) -> fx.Node:
    return [p for p in gm.graph.nodes if p.op == "placeholder"][-1]


def _rewrite(n: fx.Node, plan: tuple[int, int, int], pads: _Pads, returned: bool) -> None:
    pad_m, pad_k, pad_n = plan
    a, b = n.args[-2:]
    m, ncols = a.meta["val"].shape[0], b.meta["val"].shape[1]
    args = [pads(a, pad_m, pad_k, n), pads(b, pad_k, pad_n, n)]
    if n.target is aten.addmm.default:
        bias = n.args[0]
        shape = bias.meta["val"].shape
        bias_rows = pad_m if len(shape) == 2 and shape[0] == m and m > 1 else 0
        bias_cols = pad_n if shape and shape[-1] == ncols and ncols > 1 else 0
        if len(shape) == 1 and bias_cols:
            bias = pads._node(n, aten.constant_pad_nd.default, (bias, [0, bias_cols], 0.0), n)
        else:
            bias = pads(bias, bias_rows, bias_cols, n) if len(shape) == 2 else bias
        args.insert(0, bias)
    product = pads._node(n, n.target, tuple(args), n)
    out = product
    if pad_m:
        out = pads._node(n, aten.slice.Tensor, (out, 0, 0, m), n)
    if pad_n:
        out = pads._node(n, aten.slice.Tensor, (out, 1, 0, ncols), n)
    if returned and pad_n:  # the graph returns it (or a view of it) contiguous, as eager
        out = pads._node(n, aten.clone.default, (out,), n, {"memory_format": torch.contiguous_format})
    n.replace_all_uses_with(out)
    n.graph.erase_node(n)


def _returned(n: fx.Node) -> bool:
    """Whether the graph returns n or a view of it."""
    return any(u.op == "output" or (u.op == "call_function" and u.target in _VIEWS and _returned(u))
               for u in n.users)
