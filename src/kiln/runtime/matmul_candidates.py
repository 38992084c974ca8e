"""cuBLAS as a candidate of a matmul template's autotuning (max-autotune): ATen's matmul into
a temporary, then the template's epilogue as a point-wise kernel of its own (ir/matmul.py's
epilogue_kernel), launched on the template's own arguments. TunedLauncher times it beside the
template's configurations and keeps whichever is fastest."""

from __future__ import annotations

from typing import Callable

import torch

from kiln.ir.matmul import OPERAND_PARAMS, MatmulKernel, Operand

CUBLAS = ("cublas",)  # the candidate's key among the launch configurations


def _matrix(t: torch.Tensor, op: Operand, rows: int, cols: int) -> torch.Tensor:
    """The operand as a strided view of the buffer it is read from."""
    return torch.as_strided(t, (rows, cols), op.stride, t.storage_offset() + op.offset)


def cublas_launch(kernel: MatmulKernel, epilogue: Callable) -> Callable:
    """A launcher taking the template's arguments that runs ATen's matmul and the epilogue."""
    operands = sum(p.name in OPERAND_PARAMS for p in kernel.params)
    m, n, k = kernel.m, kernel.n, kernel.k

    def launch(*tensors):
        rest, (a, b, *bias) = tensors[: len(tensors) - operands], tensors[len(tensors) - operands :]
        a, b = _matrix(a, kernel.a, m, k), _matrix(b, kernel.b, k, n)
        if bias:
            product = torch.addmm(_matrix(bias[0], kernel.bias, m, n), a, b)
        else:
            product = torch.mm(a, b)
        epilogue(*rest, product)

    launch.__name__ = f"{kernel.name}_cublas"
    return launch
