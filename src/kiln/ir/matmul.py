"""A matmul kernel: a tiled product of two buffers whose result, held in float32, feeds an
element-wise epilogue (bias, activation, residual add, casts, scaling) before anything is
stored.

A MatmulKernel is a Kernel: its outer domain, parameters and stages are the epilogue's, the
point-wise kernel that read the product from memory before the product moved inside it. The
epilogue's loads of `product` are the product's value at their point (rounded to the
product's dtype first, as eager rounds the matmul's result); every other statement is
rendered as in any point-wise kernel. The operands are read through their strides and offset,
so views (a transposed weight) need no copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kiln.ir.kernel import Kernel, Param
from kiln.ir.tensor import dtype_name


@dataclass(frozen=True)
class Operand:
    """A matrix read from a buffer: element (i, j) at offset + i * stride[0] + j * stride[1]
    (a stride of 0 broadcasts, as a bias row does along the rows)."""

    param: str
    offset: int
    stride: tuple[int, int]

    def __str__(self) -> str:
        return f"{self.param}[{self.offset} + i*{self.stride[0]} + j*{self.stride[1]}]"


@dataclass(frozen=True)
class MatmulKernel(Kernel):
    m: int = 0
    n: int = 0
    k: int = 0
    a: Operand | None = None  # m x k
    b: Operand | None = None  # k x n
    bias: Operand | None = None  # m x n (broadcast), added to the float32 product (addmm)
    product: str = ""  # the name the epilogue's loads of the product use
    product_dtype: torch.dtype = torch.float32
    operand_dtype: torch.dtype = torch.float32
    # max-autotune also times cuBLAS and the epilogue as a kernel of its own (epilogue_kernel)
    cublas_candidate: bool = False

    def template_header(self) -> list[str]:
        """The matmul's lines of the kernel's text (ir/kernel.py's kernel_str)."""
        bias = f" + {self.bias}" if self.bias is not None else ""
        return [
            f"  matmul {self.m} x {self.n} x {self.k} ({dtype_name(self.operand_dtype)}): "
            f"{self.product} = {dtype_name(self.product_dtype)}({self.a} @ {self.b}{bias})"
        ]


def loop_form(kernel: MatmulKernel) -> str | None:
    """The CPU template's loop form for the operands' layouts: "dot" where both are contiguous
    along k, "rows" where B is contiguous along n, None where neither form reads them
    contiguously (codegen/cpp_matmul.py)."""
    if kernel.a.stride[1] == 1 and kernel.b.stride[0] == 1:
        return "dot"
    if kernel.b.stride[1] == 1:
        return "rows"
    return None


def is_matmul(kernel: Kernel) -> bool:
    return isinstance(kernel, MatmulKernel)


OPERAND_PARAMS = ("mat_a", "mat_b", "mat_bias")


def epilogue_kernel(kernel: MatmulKernel) -> Kernel:
    """The epilogue as the point-wise kernel it was: it reads the product from a buffer, its
    last parameter (the cuBLAS candidate that max-autotune times against the template)."""
    params = tuple(p for p in kernel.params if p.name not in OPERAND_PARAMS)
    return Kernel(
        f"{kernel.name}_epilogue",
        kernel.outer,
        (),
        (*params, Param(kernel.product, kernel.product_dtype, False)),
        kernel.stages,
    )
