"""ATen calls as eager runs them: one launch each, reading its tensor arguments once and
writing its result once, with a matmul's or attention's FLOPs (passes/roofline.py's units).
kiln's extern calls cost the same, and eager's op-by-op run of a graph is the baseline that
a compiled program is measured against."""

from __future__ import annotations

import math
from typing import Any

import torch

from kiln.ir.sizes import hint
from kiln.passes.roofline import Ceilings, Cost, first_touch, function_cost, numel_hint, predict

# A CPU library matmul of m rows runs at m / (m + HALF_RATE_ROWS) of its rate: its blocking
# is built for many rows, and a product of a few rows is little more than its fixed work
# (oneDNN on the CPUs measured, docs/benchmarks.md).
HALF_RATE_ROWS = 16


def _matmul_flops(args: list, out) -> float:
    """2MNK for a (batched) matmul: the output's elements times twice the shared dimension."""
    first = next(a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2)
    return 2.0 * numel_hint(out.shape) * hint(first.shape[-1])


def _addmm_flops(args: list, out) -> float:
    return 2.0 * numel_hint(out.shape) * hint(args[1].shape[-1])


def _attention_flops(args: list, out) -> float:
    """QK^T and PV: 4 * batch * heads * Lq * Lk * head dim."""
    q, k = args[0], args[1]
    return 4.0 * numel_hint(q.shape[:-2]) * hint(q.shape[-2]) * hint(k.shape[-2]) * hint(q.shape[-1])


# op name (an overload packet's) -> FLOPs from the call's tensors (meta or real) and result
MATMUL_FLOPS = {
    "mm": _matmul_flops, "bmm": _matmul_flops, "matmul": _matmul_flops, "addmm": _addmm_flops,
    "baddbmm": _addmm_flops, "_scaled_dot_product_flash_attention": _attention_flops,
    "_scaled_dot_product_flash_attention_for_cpu": _attention_flops,
    "_scaled_dot_product_efficient_attention": _attention_flops,
    "_scaled_dot_product_cudnn_attention": _attention_flops,
    "scaled_dot_product_attention": _attention_flops,
}


def tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []


def tensor_bytes(t: torch.Tensor) -> int:
    return numel_hint(t.shape) * t.element_size()


def op_name(op: Any) -> str:
    """The overload packet's name of an ATen op or qualified name ("aten::mm.default" -> "mm")."""
    text = op if isinstance(op, str) else getattr(op, "__name__", str(op))
    return text.split("::")[-1].split(".")[0]


def aten_cost(op: Any, args: list, out: Any, ceilings: Ceilings) -> Cost:
    """One ATen call as eager runs it: it reads its tensor arguments, writes its result."""
    name = op_name(op)
    reads = sum(tensor_bytes(t) for t in tensors_in(args))
    writes = sum(tensor_bytes(t) for t in tensors_in(out))
    matmul = MATMUL_FLOPS.get(name)
    outputs = tensors_in(out)
    if matmul is not None and outputs:
        try:
            flops = matmul(args, outputs[0])
        except (IndexError, AttributeError, StopIteration, TypeError):
            flops = 0.0
        return predict(name, reads + writes, reads + writes, flops, flops, ceilings.launch_s, ceilings,
                       _matmul_rate(outputs[0], ceilings), "matmul")
    elements = sum(numel_hint(t.shape) for t in outputs)
    work = elements * function_cost(name, ceilings)
    c = predict(name, reads + writes, reads + writes, float(elements), work, ceilings.launch_s, ceilings,
                 ceilings.ops_per_s, "compute")
    threshold = ceilings.fresh_alloc_bytes or math.inf
    return first_touch(c, sum(n for n in map(tensor_bytes, outputs) if n >= threshold), ceilings)


def _matmul_rate(out: torch.Tensor, ceilings: Ceilings) -> float:
    if not ceilings.device.startswith("cpu") or out.dim() < 2:
        return ceilings.matmul_flop_per_s
    rows = hint(out.shape[-2])
    return ceilings.matmul_flop_per_s * rows / (rows + HALF_RATE_ROWS)


def launches_nothing(op: Any) -> bool:
    """Whether eager runs op without a kernel: a view or alias of its input (per its schema)."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return False
    returns = schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def eager_costs(gm: torch.fx.GraphModule, ceilings: Ceilings) -> list[Cost]:
    """Eager's op-by-op run of an ATen graph: one launch per op that computes (views are free),
    each reading its inputs and writing its result, from the shapes traced into the graph."""
    costs = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if launches_nothing(node.target):
            continue
        args = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
        args = [[x.meta.get("val") if isinstance(x, torch.fx.Node) else x for x in a]
                if isinstance(a, (list, tuple)) else a for a in args]
        costs.append(aten_cost(node.target, args, node.meta.get("val"), ceilings))
    return costs


def resolved_op(op: Any) -> Any:
    from kiln.ir.host import resolve_op

    try:
        return resolve_op(op) if isinstance(op, str) else op
    except Exception:  # noqa: BLE001 - unknown here: treated as computing
        return None
