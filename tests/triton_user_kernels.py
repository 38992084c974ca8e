"""Users' Triton kernels and the programs launching them, for the CPU tests (through Triton's
interpreter) and the GPU tests alike.

Dynamo captures a launch only of a JITFunction, and only where torch finds a device Triton
can use (torch.utils._triton.has_triton()):
- under TRITON_INTERPRET=1, @triton.jit returns an InterpretedFunction, which is no
  JITFunction: Dynamo traces into its run() and stops at inspect.getsourcelines, a function
  it skips ("Attempted to call function marked as skipped");
- on a machine without a GPU, has_triton() is False, so Dynamo traces into JITFunction.run()
  and stops at Triton's driver lookup (HIPDriver.is_active, skipped too).
So the kernels here are JITFunctions whatever TRITON_INTERPRET says, the CPU tests tell
Dynamo that Triton is usable (`dynamo_sees_triton`), and kiln launches the kernels on CPU
tensors through the interpreter; eager runs `interpreted(kernel)` the same way.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction


def jit(fn):
    """@triton.jit as on a GPU machine (see the module's docstring)."""
    return JITFunction(fn)


def interpreted(kernel):
    return InterpretedFunction(kernel.fn)


@pytest.fixture
def dynamo_sees_triton(monkeypatch):
    """Dynamo captures Triton launches here as it does on a GPU machine. Without a driver it
    cannot compile a kernel to find which arguments it writes: it says so (a warning with a
    traceback, kept quiet here) and takes every tensor argument as written."""
    import logging

    import torch.utils._triton as torch_triton

    monkeypatch.setattr(torch_triton, "has_triton", lambda: True)
    analysis = logging.getLogger("torch._higher_order_ops.triton_kernel_wrap")
    level = analysis.level
    analysis.setLevel(logging.ERROR)
    yield
    analysis.setLevel(level)


@jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * alpha + y, mask=mask)


@jit
def accumulate_kernel(acc_ptr, x_ptr, n, BLOCK: tl.constexpr):
    """acc += x, in place."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    acc = tl.load(acc_ptr + offsets, mask=mask)
    tl.store(acc_ptr + offsets, acc + tl.load(x_ptr + offsets, mask=mask), mask=mask)


def add_between_kernels(kernel):
    """sin, the user's add (a grid tuple), cos: kiln kernels before and after it."""

    def fn(x, y):
        a = x.sin()
        out = torch.empty_like(a)
        n = a.numel()
        kernel[(triton.cdiv(n, 64),)](a, y, out, n, BLOCK=64)
        return out.cos() * 2

    return fn


def add_with_grid_lambda(kernel):
    """A transposed operand (the kernel indexes memory flat: it must get eager's layout), a
    constexpr BLOCK and a grid computed from it."""

    def fn(x, y):
        a = x.t() * 2  # eager keeps x.t()'s strides
        out = torch.empty_like(a)
        n = a.numel()
        kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](a, y.t(), out, n, BLOCK=32)
        return torch.relu(out) + a

    return fn


def accumulate_into_input(kernel):
    """The kernel updates the caller's tensor acc in place."""

    def fn(acc, x):
        kernel[(triton.cdiv(acc.numel(), 64),)](acc, x.exp(), acc.numel(), BLOCK=64)
        return x + 1

    return fn


def scaled_add_body(launch, x, y, alpha):
    out = torch.empty_like(x)
    n = x.numel()
    launch[(triton.cdiv(n, 64),)](x, y, out, n, alpha, BLOCK=64)
    return out


@triton_op("kiln_test::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return scaled_add_body(wrap_triton(scaled_add_kernel), x, y, alpha)


def through_triton_op(op):
    def fn(x, y):
        return op(x.sigmoid(), y, 0.5).tanh()

    return fn


autotuned_add_kernel = triton.autotune(
    configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 128})], key=["n"]
)(add_kernel)


def add_autotuned(kernel):
    """An autotuned kernel: its block is chosen at run time, among configs."""

    def fn(x, y):
        a = x.sin()
        out = torch.empty_like(a)
        n = a.numel()
        kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](a, y, out, n)
        return out.cos()

    return fn


@jit
def cast_kernel(x_ptr, out_ptr, n, OUT_DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask).to(OUT_DTYPE), mask=mask)


def cast_to_half(kernel):
    """A constexpr that is a Triton dtype: a constant of the program, not a number."""

    def fn(x):
        a = x * 3
        out = torch.empty(a.shape, dtype=torch.float16, device=a.device)
        kernel[(triton.cdiv(a.numel(), 64),)](a, out, a.numel(), OUT_DTYPE=tl.float16, BLOCK=64)
        return out.float() + 1

    return fn
