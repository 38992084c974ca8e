"""The training split: AOTAutograd's joint graph cut into a forward and a backward graph by
the min-cut partitioner, which saves what is costly to recompute and recomputes cheap
element-wise values in the backward instead of storing them (less memory, less traffic).
kiln records what was saved and what is recomputed, for `kiln explain`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._functorch import config as functorch_config
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch.utils.checkpoint import CheckpointPolicy

from kiln.frontend.random import recompute_random_numbers
from kiln.ir.sizes import hint

aten = torch.ops.aten


@dataclass
class PartitionSummary:
    saved: list[tuple[str, str]] = field(default_factory=list)  # (forward value, type)
    saved_bytes: int = 0
    recomputed: list[str] = field(default_factory=list)  # forward ops the backward computes again

    def text(self, show: int = 12) -> str:
        saved = ", ".join(f"{name} {t}" for name, t in self.saved[:show])
        if len(self.saved) > show:
            saved += f", ... ({len(self.saved) - show} more)"
        ops = sorted({name.rstrip("_0123456789") for name in self.recomputed})
        return (f"training split (min-cut): the forward saves {len(self.saved)} tensors "
                f"({_size(self.saved_bytes)}) for the backward: {saved or '-'}\n"
                f"  the backward recomputes {len(self.recomputed)} forward values instead of saving them"
                + (f": {', '.join(ops)}" if ops else ""))


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def partition(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, summary: PartitionSummary,
              **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
    _save_what_the_backward_compares(joint)
    recompute_random_numbers(joint)
    with functorch_config.patch(cse=not _cse_would_merge_signed_zeros(joint)):
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                                     **kwargs)
    outputs = fw.graph.find_nodes(op="output")[0].args[0]
    for node in outputs[num_fwd_outputs:]:
        val = node.meta.get("val") if isinstance(node, fx.Node) else None
        if isinstance(val, torch.Tensor):
            summary.saved.append((node.name, f"{str(val.dtype).replace('torch.', '')}{list(val.shape)}"))
            summary.saved_bytes += hint(val.numel()) * val.element_size()  # no guard on a size
    forward = _forward_values(joint)
    summary.recomputed = [n.name for n in bw.graph.nodes if n.op == "call_function" and n.name in forward]
    return fw, bw


def _cse_would_merge_signed_zeros(joint: fx.GraphModule) -> bool:
    """The partitioner's CSE compares node arguments with ==, so scalar_tensor(-0.0) and
    scalar_tensor(0.0) become one node and a zero's sign changes. Graphs holding both are
    partitioned without that CSE (kiln's own CSE, which keeps the sign, runs later)."""
    zeros = set()
    for n in joint.graph.nodes:
        for leaf in pytree.tree_leaves((n.args, n.kwargs)):
            if type(leaf) in (bool, int, float) and leaf == 0:
                zeros.add(repr(leaf))
    return "-0.0" in zeros and len(zeros) > 1


def _forward_values(joint: fx.GraphModule) -> set[str]:
    """Names of the joint graph's computed nodes that do not depend on any gradient input."""
    backward = _backward_nodes(joint)
    return {n.name for n in joint.graph.nodes if n.op == "call_function" and n not in backward}


# ATen ops whose results are exactly rounded (basic arithmetic, sqrt, selection, comparisons,
# data movement): a kernel recomputing them gets the forward's bits. Math-library functions
# (erf, exp, tanh, pow...) may differ by an ulp between a kernel's vector loop and its tail.
_EXACT = frozenset({
    "add", "sub", "mul", "div", "neg", "abs", "sqrt", "where", "maximum", "minimum", "clamp",
    "clone", "_to_copy", "convert_element_type", "sign", "floor", "ceil", "round", "trunc",
    "eq", "ne", "lt", "le", "gt", "ge", "isnan", "logical_not", "logical_and", "logical_or",
    "expand", "view", "reshape", "unsqueeze", "squeeze", "permute", "transpose", "t", "slice",
    "select", "alias", "cat", "relu", "scalar_tensor", "full", "zeros", "ones", "empty",
})
_COMPARISONS = (aten.eq.Tensor, aten.eq.Scalar, aten.ne.Tensor, aten.ne.Scalar)


def _save_what_the_backward_compares(joint: fx.GraphModule) -> None:
    """The backward of max, an inf-norm or a sort compares a forward value with the result
    the forward reduced (abs(x) == norm). Recomputed by another kernel, a value from the
    math library may differ by an ulp, and the gradient vanishes: the nearest such values
    below a comparison the backward needs are saved (MUST_SAVE) instead."""
    backward = _backward_nodes(joint)
    for n in joint.graph.nodes:
        if n.op == "call_function" and n.target in _COMPARISONS and n not in backward \
                and _feeds(n, backward):
            stack = list(n.all_input_nodes)
            seen: set[fx.Node] = set()
            while stack:
                a = stack.pop()
                if a in seen or a.op != "call_function" or a in backward:
                    continue
                seen.add(a)
                name = getattr(a.target, "__name__", "").split(".")[0]
                if name in _EXACT:
                    stack.extend(a.all_input_nodes)
                else:
                    a.meta["recompute"] = CheckpointPolicy.MUST_SAVE


def _feeds(node: fx.Node, targets: set[fx.Node], depth: int = 8) -> bool:
    """Whether a user of node, or of its users (up to depth), is in targets."""
    frontier = set(node.users)
    for _ in range(depth):
        if frontier & targets:
            return True
        frontier = {u for f in frontier for u in f.users}
        if not frontier:
            return False
    return False


def _backward_nodes(joint: fx.GraphModule) -> set[fx.Node]:
    """The joint graph's nodes that depend on a gradient input."""
    backward: set[fx.Node] = set()
    for n in joint.graph.nodes:
        if (n.op == "placeholder" and n.name.startswith("tangents")) or \
                any(a in backward for a in n.all_input_nodes):
            backward.add(n)
    return backward
