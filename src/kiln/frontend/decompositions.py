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
    aten.repeat,
]

# Ops kiln lowers itself (a decomposition would only make the graph longer) or leaves to
# ATen on purpose (matmul and convolution go to the vendor libraries).
KEEP = [aten.var.correction, aten.var_mean.correction, aten.std.correction, aten.embedding.default,
        aten.index_select.default, aten.addmm.default, aten.mm.default, aten.bmm.default,
        aten.embedding_dense_backward.default,
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


def _convolution_bias_apart(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """On the GPU eager adds a convolution's bias by a kernel of its own after cuDNN's; as an
    add in the graph it fuses into the kernel that reads the convolution. On the CPU oneDNN
    adds it inside the convolution, which stays whole."""
    if bias is None or x.device.type != "cuda":
        return NotImplemented
    out = aten.convolution(x, weight, None, stride, padding, dilation, transposed, output_padding, groups)
    return out + bias.view([1, -1] + [1] * (out.dim() - 2))


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """take() as a gather through a 1-d index: PyTorch's decomposition indexes with the index
    as it is, and a 0-d index then becomes a Python number read from the tensor (.item())."""
    return x.reshape(-1)[index.reshape(-1)].reshape(index.shape)


def _frac(x: torch.Tensor) -> torch.Tensor:
    """x - trunc(x). Some PyTorch versions compute trunc as floor(|x|) * sign(x) here, which
    turns frac(-0.0) into -0.0 - 0.0 = -0.0 where eager gives 0.0."""
    return torch.sub(x, torch.trunc(x))


def _pair(value, default=None) -> tuple[int, int]:
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return default
    if isinstance(value, int):
        return value, value
    return (value[0], value[0]) if len(value) == 1 else (value[0], value[1])


def _pooled_size(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """ATen's output size of a pooling window: with ceil_mode a last partial window counts
    when it starts inside the input or its left padding."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _windows(x, kernel, stride, padding, dilation, ceil_mode, fill):
    """The window positions of a 2-d pooling as strided slices of x padded with fill, one
    [..., out_h, out_w] slice per (row, column) offset inside the window, which fuse into one
    kernel; with each slice its offsets (i, j)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    height, width = x.shape[-2], x.shape[-1]
    out_h = _pooled_size(height, kh, sh, ph, dh, ceil_mode)
    out_w = _pooled_size(width, kw, sw, pw, dw, ceil_mode)
    extra_h = max(0, (out_h - 1) * sh + dh * (kh - 1) + 1 - ph - height)
    extra_w = max(0, (out_w - 1) * sw + dw * (kw - 1) + 1 - pw - width)
    if ph or pw or extra_h or extra_w:
        x = aten.constant_pad_nd(x, [pw, extra_w, ph, extra_h], fill)
    for i in range(kh):
        for j in range(kw):
            top, left = i * dh, j * dw
            yield i, j, x[..., top:top + sh * (out_h - 1) + 1:sh, left:left + sw * (out_w - 1) + 1:sw]


def _pool_args(x, kernel_size, stride, padding, dilation=1):
    kernel = _pair(kernel_size)
    return kernel, _pair(stride, kernel), _pair(padding), _pair(dilation)


def _avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    """The mean of each window as a sum of strided slices, which fuse into one kernel. The
    divisor of each window, as ATen counts it (padding counted or not, a last window cut by
    ceil_mode), is arithmetic on the window's position."""
    if x.dim() not in (3, 4) or not x.dtype.is_floating_point:
        return NotImplemented
    kernel, stride, padding, _ = _pool_args(x, kernel_size, stride, padding)
    total = None
    for _, _, part in _windows(x, kernel, stride, padding, (1, 1), ceil_mode, 0.0):
        total = part if total is None else total + part
    if divisor_override:
        return total / divisor_override
    out_h, out_w = total.shape[-2], total.shape[-1]
    if not any(padding) and kernel[0] + stride[0] * (out_h - 1) <= x.shape[-2] and \
            kernel[1] + stride[1] * (out_w - 1) <= x.shape[-1]:
        return total / (kernel[0] * kernel[1])
    rows = _window_extent(out_h, kernel[0], stride[0], padding[0], x.shape[-2], count_include_pad, x.device)
    cols = _window_extent(out_w, kernel[1], stride[1], padding[1], x.shape[-1], count_include_pad, x.device)
    return total / (rows[:, None] * cols).to(total.dtype)


def _window_extent(out: int, kernel: int, stride: int, pad: int, size: int, count_pad: bool, device):
    """How many positions of each window along one dimension avg_pool2d divides by."""
    start = torch.arange(out, device=device) * stride - pad
    end = torch.clamp(start + kernel, max=size + pad)
    if count_pad:
        return end - start
    return torch.clamp(end, max=size) - torch.clamp(start, min=0)


def _max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """The maximum of each window as a chain of maxima over strided slices (NaN propagates),
    and its index as ATen picks it: the first maximum, or the last NaN, in row-major window
    order, starting from the window's first position inside the input."""
    if x.dim() not in (3, 4) or not x.dtype.is_floating_point:
        return NotImplemented
    kernel, stride, padding, dilation = _pool_args(x, kernel_size, stride, padding, dilation)
    parts = list(_windows(x, kernel, stride, padding, dilation, ceil_mode, float("-inf")))
    values = parts[0][2]
    for _, _, part in parts[1:]:
        values = torch.maximum(values, part)
    out_h, out_w = values.shape[-2], values.shape[-1]
    rows = (torch.arange(out_h, device=x.device) * stride[0] - padding[0])[:, None]
    cols = torch.arange(out_w, device=x.device) * stride[1] - padding[1]
    width = x.shape[-1]
    first_row = rows + dilation[0] * ((torch.clamp(-rows, min=0) + dilation[0] - 1) // dilation[0])
    first_col = cols + dilation[1] * ((torch.clamp(-cols, min=0) + dilation[1] - 1) // dilation[1])
    index = first_row * width + first_col
    best = torch.full_like(values, float("-inf"))
    for i, j, part in parts:
        better = (part > best) | torch.isnan(part)
        best = torch.where(better, part, best)
        index = torch.where(better, (rows + i * dilation[0]) * width + cols + j * dilation[1], index)
    return values, index.expand(values.shape)


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
    table[aten.max_pool2d_with_indices.default] = _max_pool2d_with_indices
    table[aten.convolution.default] = _convolution_bias_apart
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
