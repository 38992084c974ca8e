"""What a lowering function receives besides the op's arguments."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kiln.ir.tensor import Builder


@dataclass
class LowerCtx:
    b: Builder
    target: object  # the ATen overload being lowered
    out_shape: tuple[int, ...] | None  # from the FX node's fake tensor, when it has one
    out_dtype: torch.dtype | None
