"""A launch-bound matmul with a bias becomes mm plus a bias add that fuses into the kernel
after it.

On a GPU, ATen's addmm costs more host time per call than mm (its bias likely goes through
cuBLASLt's epilogue).
A matmul that small is bound by its launch; a large one keeps the bias in the matmul's
epilogue, which saves a pass over its output. (In bf16 the product is then rounded before the
bias is added, where a fused epilogue rounds once. Inductor, timed beside kiln on the same MLP, also
called mm and added the bias in a kernel of its own.)
"""

from __future__ import annotations

import torch
import torch.fx as fx

from kiln.frontend.origin import keep_origin
from kiln.ir.sizes import hint

aten = torch.ops.aten
LAUNCH_BOUND_MACS = 1 << 24  # multiply-adds: well under a microsecond of an H200's time


def split_launch_bound_addmm(gm: fx.GraphModule) -> int:
    """Rewrites addmm(bias, a, b) with beta = alpha = 1 and at most LAUNCH_BOUND_MACS
    multiply-adds as mm(a, b) + bias; returns how many."""
    count = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not aten.addmm.default or len(n.args) != 3:
            continue
        if n.kwargs.get("beta", 1) != 1 or n.kwargs.get("alpha", 1) != 1:
            continue
        bias, a, b = n.args
        (rows, inner), cols = a.meta["val"].shape, b.meta["val"].shape[1]
        if hint(rows) * hint(inner) * hint(cols) > LAUNCH_BOUND_MACS:  # a family's by its example
            continue
        with gm.graph.inserting_before(n):
            mm = gm.graph.call_function(aten.mm.default, (a, b))
            mm.meta["val"] = aten.mm.default(a.meta["val"], b.meta["val"])
            add = gm.graph.call_function(aten.add.Tensor, (mm, bias))
            add.meta["val"] = n.meta["val"]
        keep_origin(mm, n)
        keep_origin(add, n)
        n.replace_all_uses_with(add)
        gm.graph.erase_node(n)
        count += 1
    if count:
        gm.recompile()
    return count
