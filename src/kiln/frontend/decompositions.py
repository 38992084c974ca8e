"""The decomposition table kiln hands AOTAutograd.

Start from PyTorch's core-ATen decompositions, add those of composite ops whose parts
kiln fuses better than a monolithic kernel (softmax, norms, activations), and keep whole
the ops kiln lowers natively or that are best left to vendor libraries.
"""

from __future__ import annotations

import functools

import torch
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._decomp.decompositions import native_batch_norm_helper

from kiln.frontend.foreach import foreach_decompositions

aten = torch.ops.aten

# Composite ops turned into element-wise math and reductions that fuse.
DECOMPOSE = [
    aten._softmax, aten._log_softmax, aten.gelu, aten.silu, aten.softplus, aten.mish,
    aten.hardsigmoid, aten.hardswish, aten.hardtanh, aten.elu, aten.leaky_relu, aten.logsumexp,
    aten.native_layer_norm, aten.native_group_norm, aten._softmax_backward_data,
    aten._log_softmax_backward_data, aten.gelu_backward, aten.silu_backward, aten.std_mean,
    aten.addcmul, aten.addcdiv, aten.glu, aten.threshold, aten.mse_loss, aten.logaddexp,
    aten.native_batch_norm, aten._native_batch_norm_legit_functional, aten.nll_loss_forward,
    aten.rsub, aten.lerp, aten.frac, aten.nan_to_num, aten.softshrink, aten.hardshrink,
    aten.repeat, aten.max_pool2d_with_indices,
]

# Ops kiln lowers itself (a decomposition would only make the graph longer) or leaves to
# ATen on purpose (matmul and convolution go to the vendor libraries).
KEEP = [aten.var.correction, aten.var_mean.correction, aten.std.correction, aten.embedding.default,
        aten.index_select.default, aten.addmm.default, aten.mm.default, aten.bmm.default,
        # fused attention kernels (flash / memory-efficient) beat any split into matmuls
        aten.scaled_dot_product_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default]


def _gelu_tanh_only(decomposition):
    """GELU's erf form stays one op (kiln's GPU kernels compute it as x * Phi(x) with fewer
    instructions than its decomposition into erf); the tanh form decomposes."""
    def gelu(x, approximate="none"):
        return NotImplemented if approximate == "none" else decomposition(x, approximate=approximate)
    return gelu


def _integer_value_truncated(decomposition):
    """addcmul on integers: eager converts value to the integer type (0.5 -> 0, truncating as
    a C++ cast does), where PyTorch's decomposition rejects a float value."""
    def addcmul(self, tensor1, tensor2, *, value=1):
        dtype = functools.reduce(torch.promote_types, (self.dtype, tensor1.dtype, tensor2.dtype))
        if isinstance(value, float) and not (dtype.is_floating_point or dtype.is_complex):
            value = bool(value) if dtype is torch.bool else int(value)
        return decomposition(self, tensor1, tensor2, value=value)
    return addcmul


def _batch_norm_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    """PyTorch's own decomposition goes through the mutating _native_batch_norm_legit, which
    AOTAutograd rejects below functionalization; the functional helper computes the same."""
    return native_batch_norm_helper(input, weight, bias, running_mean, running_var, False, momentum, eps,
                                    functional=True)[:3]


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """take() as a gather through a 1-d index: PyTorch's decomposition indexes with the index
    as it is, and a 0-d index then becomes a Python number read from the tensor (.item())."""
    return x.reshape(-1)[index.reshape(-1)].reshape(index.shape)


def _frac(x: torch.Tensor) -> torch.Tensor:
    """x - trunc(x). Some PyTorch versions compute trunc as floor(|x|) * sign(x) here, which
    turns frac(-0.0) into -0.0 - 0.0 = -0.0 where eager gives 0.0."""
    return torch.sub(x, torch.trunc(x))


def _avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    """The mean of each window as a sum of strided slices, one per window position, which fuse
    into one kernel; windows cut by padding or ceil_mode keep ATen's kernel."""
    kh, kw = (kernel_size * 2)[:2] if len(kernel_size) == 1 else kernel_size
    sh, sw = ((stride * 2)[:2] if len(stride) == 1 else stride) if stride else (kh, kw)
    pads = padding if isinstance(padding, (list, tuple)) else [padding]
    if any(pads) or ceil_mode or x.dim() not in (3, 4) or not x.dtype.is_floating_point:
        return NotImplemented
    height, width = x.shape[-2], x.shape[-1]
    out_h, out_w = (height - kh) // sh + 1, (width - kw) // sw + 1
    total = None
    for i in range(kh):
        for j in range(kw):
            part = x[..., i:i + sh * (out_h - 1) + 1:sh, j:j + sw * (out_w - 1) + 1:sw]
            total = part if total is None else total + part
    return total / (divisor_override or kh * kw)


@functools.cache
def decomposition_table() -> dict:
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(DECOMPOSE))
    table[aten._native_batch_norm_legit_no_training.default] = _batch_norm_no_training
    table[aten.gelu.default] = _gelu_tanh_only(table[aten.gelu.default])
    table[aten.addcmul.default] = _integer_value_truncated(table[aten.addcmul.default])
    table[aten.take.default] = _take
    table[aten.frac.default] = _frac
    table[aten.avg_pool2d.default] = _avg_pool2d
    table.update(foreach_decompositions())
    for op in KEEP:
        table.pop(op, None)
    return table


# PyTorch decomposes these interpolations inside autograd itself (whatever table we pass);
# on integer images the decomposition rounds differently from eager's fixed-point kernels.
_INTERPOLATIONS = {
    "interpolate",
    "upsample",
    "upsample_bilinear",
    "upsample_bilinear2d",
    "upsample_bicubic2d",
    "upsample_linear1d",
    "upsample_trilinear3d",
    "_upsample_bilinear2d_aa",
    "_upsample_bicubic2d_aa",
}
_SMOOTH_MODES = ("linear", "bilinear", "bicubic", "trilinear")


def eager_only_reason(gm) -> str | None:
    """Why a Dynamo graph must run in eager PyTorch to match it or to keep its speed, or None."""
    for n in gm.graph.nodes:
        if _traced_scan(n):
            return ("a traced associative_scan: its log-depth network of slices would become "
                    "kernels that recompute and reread every level; scans run in ATen")
        name = getattr(n.target, "__name__", "")
        if n.op != "call_function" or name not in _INTERPOLATIONS or not n.args:
            continue
        if name in ("interpolate", "upsample"):  # nearest modes index, they do not round
            mode = n.kwargs.get("mode", n.args[3] if len(n.args) > 3 else "nearest")
            if mode not in _SMOOTH_MODES:
                continue
        x = getattr(n.args[0], "meta", {}).get("example_value")
        if isinstance(x, torch.Tensor) and not x.is_floating_point():
            return f"{name} of an integer tensor: no decomposition rounds like eager's kernel"
    return None


def _traced_scan(n) -> bool:
    """Dynamo traces associative_scan's Python implementation (slices interleaved level by
    level) on the CPU; nothing of the scan stays in the graph but the user's call in the
    nodes' stack traces (torch's own frames are left out of them)."""
    return n.op == "call_function" and "associative_scan(" in (n.meta.get("stack_trace") or "")
