"""What a lowering function receives besides the op's arguments."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from kiln.ir.tensor import Builder


@dataclass
class LowerCtx:
    b: Builder
    target: object  # the ATen overload being lowered
    out_shape: tuple[int, ...] | None  # from the FX node's fake tensor, when it has one
    out_dtype: torch.dtype | None
    fx_node: fx.Node | None = None  # the call being lowered; its inputs' fake tensors tell their layouts
    device: torch.device | None = None  # where the graph's kernels run

    def result_on_graph_device(self) -> bool:
        """Whether the tensor this op makes (a creation, a copy) lives where the kernels run."""
        val = self.fx_node.meta.get("val") if self.fx_node is not None else None
        return isinstance(val, torch.Tensor) and self.device is not None and val.device == self.device

    def arg_val(self, k: int) -> torch.Tensor | None:
        """The fake tensor of the k-th positional argument, when it has one."""
        args = self.fx_node.args if self.fx_node is not None else ()
        if len(args) <= k or not isinstance(args[k], fx.Node):
            return None
        val = args[k].meta.get("val")
        return val if isinstance(val, torch.Tensor) else None
