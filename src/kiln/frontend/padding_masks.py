"""The masked graph a padded run needs: reductions along a padded size skip its grown part.

frontend/padding.py lets a size symbol s be padded past ops that mix positions along s when
their operands are masked (its `Mask`s). This module writes that graph: a copy of the ATen
graph that takes one more input, an int64 tensor of each masked symbol's real value, and
- fills a reduction's (or a matmul's) operand along s, past the real size, with what the
  reduction ignores (0 for a sum, the lowest value for a max, ...);
- computes a mean along s as a sum over the real positions divided by their count;
- gives attention over s keys a mask that hides the grown keys;
- takes s's real value where s is an operand of an element-wise op.
The real sizes are a tensor, not ints, so one CUDA graph recorded at the bucket's size serves
every size in the bucket.
"""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch._guards import detect_fake_mode

from kiln.frontend.padding import (
    HIGHEST,
    LOWEST,
    MASK_FILL,
    MASKABLE_ATTENTION,
    Mask,
    PaddingPlan,
    argument,
    attention_mask,
)

aten = torch.ops.aten


def _fill(kind: Any, dtype: torch.dtype) -> Any:
    """The value of kind (MASK_FILL's) in dtype."""
    if kind not in (LOWEST, HIGHEST):
        return kind
    lowest = kind == LOWEST
    if dtype.is_floating_point:
        return -math.inf if lowest else math.inf
    if dtype is torch.bool:
        return not lowest
    info = torch.iinfo(dtype)
    return info.min if lowest else info.max


class _Writer:
    """Adds nodes to a graph with their fake values, as the ATen graph's own nodes carry."""

    def __init__(self, graph: fx.Graph, fake_mode: Any):
        self.graph, self.fake_mode = graph, fake_mode

    def call(self, target: Any, args: tuple, kwargs: dict | None = None) -> fx.Node:
        kwargs = kwargs or {}
        node = self.graph.call_function(target, args, kwargs)
        values = fx.node.map_arg((args, kwargs), lambda a: a.meta["val"])
        with self.fake_mode:
            node.meta["val"] = target(*values[0], **values[1])
        return node


class _Masker:
    def __init__(self, gm: fx.GraphModule, plan: PaddingPlan, device: torch.device, fake_mode: Any):
        self.plan, self.device = plan, device
        self.graph = fx.Graph()
        self.copied: dict[fx.Node, fx.Node] = {}
        out = self.graph.graph_copy(gm.graph, self.copied)
        self.graph.output(out)
        self.write = _Writer(self.graph, fake_mode)
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        with self.graph.inserting_after(placeholders[-1]):
            self.real = self.graph.placeholder("kiln_real_sizes")
        with fake_mode:
            self.real.meta["val"] = torch.zeros(len(plan.masked), dtype=torch.int64, device=device)
        self.valid: dict[sympy.Symbol, fx.Node] = {}
        self.real_size: dict[sympy.Symbol, fx.Node] = {}
        first = next(n for n in self.graph.nodes if n.op != "placeholder")
        with self.graph.inserting_before(first):  # in order, ahead of every use
            self._positions(placeholders)

    def _positions(self, placeholders: list[fx.Node]) -> None:
        """Per symbol, its real size (a 0-d tensor) and which positions along it are real."""
        for i, s in enumerate(self.plan.masked):
            position, dim = self.plan.bound[s]
            holder = placeholders[position]
            size = holder if dim is None else self.write.call(aten.sym_size.int, (holder, dim))
            self.real_size[s] = self.write.call(aten.select.int, (self.real, 0, i))
            along = self.write.call(aten.arange.default, (size,),
                                    {"dtype": torch.int64, "device": self.device})
            self.valid[s] = self.write.call(aten.lt.Tensor, (along, self.real_size[s]))

    def _valid_along(self, s: sympy.Symbol, dim: int, rank: int) -> fx.Node:
        """s's real positions as a bool tensor that broadcasts along dim of a rank-`rank` tensor."""
        valid = self.valid[s]
        for _ in range(rank - 1 - dim):
            valid = self.write.call(aten.unsqueeze.default, (valid, -1))
        return valid

    def _masked(self, x: fx.Node, masks: list[Mask], kind: Any) -> fx.Node:
        dtype, rank = x.meta["val"].dtype, x.meta["val"].dim()
        fill = self.write.call(aten.scalar_tensor.default, (_fill(kind, dtype),),
                               {"dtype": dtype, "device": self.device})
        for m in masks:
            x = self.write.call(aten.where.self, (self._valid_along(m.symbol, m.dim, rank), x, fill))
        return x

    def rewrite(self, n: fx.Node, masks: list[Mask]) -> None:
        args = list(n.args)
        for m in (m for m in masks if m.dim is None):
            args[m.operand] = self.real_size[m.symbol]
        operands = sorted({m.operand for m in masks if m.dim is not None and m.operand != "attn_mask"})
        for i in operands:
            args[i] = self._masked(args[i], [m for m in masks if m.operand == i], MASK_FILL[n.target])
        n.args = tuple(args)
        keys = [m for m in masks if m.operand == "attn_mask"]
        if keys:
            self._mask_keys(n, keys[0])
        if n.target in (aten.mean.dim, aten.mean.default):
            self._mean_over_real(n, [m for m in masks if m.dim is not None])

    def _mask_keys(self, n: fx.Node, m: Mask) -> None:
        """Attention over s keys: the grown keys hidden through attn_mask; a fused attention op
        that takes no mask (only its output read) becomes scaled_dot_product_attention."""
        valid, given = self.valid[m.symbol], attention_mask(n)
        dtype = n.args[0].meta["val"].dtype  # an additive mask of the query's type: every kernel takes one
        low, zero = (self.write.call(aten.scalar_tensor.default, (v,),
                                     {"dtype": dtype, "device": self.device}) for v in (-math.inf, 0.0))
        if given is not None and given.meta["val"].dtype is torch.bool:
            valid = self.write.call(aten.logical_and.default, (given, valid))
        kept = zero if given is None or given.meta["val"].dtype is torch.bool else given
        mask = self.write.call(aten.where.self, (valid, kept, low))  # [s] broadcasts over the queries
        while mask.meta["val"].dim() in (1, 3):  # fused kernels take masks of rank 2 or 4
            mask = self.write.call(aten.unsqueeze.default, (mask, 0))
        if n.target is aten.scaled_dot_product_attention.default and len(n.args) > 3:
            n.args = (*n.args[:3], mask, *n.args[4:])
        elif n.target in MASKABLE_ATTENTION:
            n.kwargs = {**n.kwargs, "attn_mask": mask}
        else:
            fused = self.write.call(aten.scaled_dot_product_attention.default, tuple(n.args[:3]),
                                    {"attn_mask": mask, "scale": argument(n, "scale")})
            for user in list(n.users):  # each reads output 0 (padding.py's condition)
                user.replace_all_uses_with(fused)
                self.graph.erase_node(user)
            self.graph.erase_node(n)

    def _mean_over_real(self, n: fx.Node, masks: list[Mask]) -> None:
        """A mean along s: the (masked) sum over the dims, divided by the real positions' count."""
        x = n.args[0]
        rank = x.meta["val"].dim()
        dims = [d % max(rank, 1) for d in (n.args[1] if len(n.args) > 1 and n.args[1] else range(rank))]
        keepdim = bool(n.args[2]) if len(n.args) > 2 else n.kwargs.get("keepdim", False)
        out_dtype = n.meta["val"].dtype
        wide = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
        total = self.write.call(aten.sum.dim_IntList, (x, dims, keepdim), {"dtype": wide})
        masked = {m.dim: m.symbol for m in masks}
        first = next(iter(masked))
        count = self.real_size[masked[first]]
        for d in dims:
            if d != first:
                factor = (self.real_size[masked[d]] if d in masked
                          else self.write.call(aten.sym_size.int, (x, d)))
                count = self.write.call(aten.mul.Tensor, (count, factor))
        mean = self.write.call(aten.div.Tensor, (total, count))
        if wide != out_dtype:
            mean = self.write.call(aten._to_copy.default, (mean,), {"dtype": out_dtype})
        n.replace_all_uses_with(mean)
        self.graph.erase_node(n)


def masked_graph(gm: fx.GraphModule, plan: PaddingPlan, example_inputs: list) -> tuple[fx.GraphModule, list]:
    """gm with the plan's masks and a last input of the masked symbols' real sizes (an int64
    tensor in plan.masked's order), and example_inputs with that input's fake value; gm and
    example_inputs themselves where nothing is masked."""
    if not plan.masks:
        return gm, example_inputs
    fake_mode = detect_fake_mode(example_inputs)
    device = next((x.device for x in example_inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
    masker = _Masker(gm, plan, device, fake_mode)
    by_node: dict[fx.Node, list[Mask]] = {}
    for m in plan.masks:
        by_node.setdefault(m.node, []).append(m)
    for node, masks in by_node.items():
        copy = masker.copied[node]
        with masker.graph.inserting_before(copy):
            masker.rewrite(copy, masks)
    masker.graph.lint()
    masked = fx.GraphModule(gm, masker.graph)
    plan.device = device
    return masked, [*example_inputs, masker.real.meta["val"]]
