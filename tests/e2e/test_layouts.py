"""Layouts of intermediate buffers: a channels_last network keeps channels_last between its
convolutions, kernels walk memory contiguously, and a copy between layouts happens only where
the program asks for one, named by a decision. Values are checked against eager on fresh
random inputs; layouts are read from the compile report, not from log text."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import TOLERANCE, assert_same, randomize_batchnorm, run_compiled

from kiln.ir import kernel as k
from kiln.passes.layout import dense_strides, dim_order, is_channels_last_order

CHANNELS_LAST = torch.channels_last
BF16_TOL = dict(rtol=5e-2, atol=5e-2)


class ResidualBlock(nn.Module):
    """conv -> batch norm -> relu -> conv -> batch norm -> add the input -> relu."""

    def __init__(self, c=16):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


class ConvNeXtBlock(nn.Module):
    """depthwise conv -> NHWC -> layer norm -> linear -> gelu -> linear -> NCHW -> residual."""

    def __init__(self, c=16):
        super().__init__()
        self.dwconv = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class TwoResidualBlocks(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.a, self.b = ResidualBlock(c), ResidualBlock(c)

    def forward(self, x):
        return self.b(self.a(x))


def _compile_and_check(model: nn.Module, x: torch.Tensor, dtype=torch.float32):
    model = randomize_batchnorm(model).eval().to(dtype)
    x = x.to(dtype)
    with torch.no_grad():
        expected = model(x)
        actual, report = run_compiled(model, x)
    assert report is not None, "kiln did not compile the graph"
    assert_same(actual, expected, BF16_TOL if dtype == torch.bfloat16 else TOLERANCE[dtype])
    return report


def _image_buffers(report, shape):
    """The layouts kiln chose for computed NCHW buffers of this shape."""
    return [c for c in report.layouts if c.shape == tuple(shape)]


def _transposes(report):
    return [d for d in report.decisions if d.verdict == "transpose"]


def _walks_contiguously(kernel: k.Kernel) -> bool:
    """Every load and store that moves along the kernel's innermost loop steps 1 there: its
    innermost outer dim for an element-wise kernel or a column reduction (a block of
    neighbouring outer points), its innermost row dim for a row reduction."""
    inner_x = [s for s in kernel.outer if s.extent != 1][-1:]
    inner_r = [s for s in kernel.reduce if s.extent != 1][-1:]
    innermost = inner_r if inner_r and not k.column_reduction(kernel) else inner_x
    for st in kernel.stages:
        for s in st.body:
            if isinstance(s, (k.Load, k.Store)) and not s.buf.startswith("row") and innermost:
                if abs(s.index.coef(innermost[0])) > 1:
                    return False
    return True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_block_keeps_channels_last_between_convolutions(dtype):
    torch.manual_seed(0)
    model = ResidualBlock().to(memory_format=CHANNELS_LAST)
    x = torch.randn(2, 16, 8, 8).to(memory_format=CHANNELS_LAST)
    report = _compile_and_check(model, x, dtype)
    buffers = _image_buffers(report, x.shape)
    assert len(buffers) == 2  # bn1 + relu (read by conv2) and the block's output
    for c in buffers:
        assert c.name == "channels_last", c
    assert not _transposes(report), _transposes(report)
    assert all(_walks_contiguously(kern) for kern in report.kernels)


def test_channels_last_chain_of_blocks():
    """Each block's output feeds the next block's convolution and residual channels_last."""
    torch.manual_seed(0)
    model = TwoResidualBlocks().to(memory_format=CHANNELS_LAST)
    x = torch.randn(2, 16, 6, 5).to(memory_format=CHANNELS_LAST)
    report = _compile_and_check(model, x)
    buffers = _image_buffers(report, x.shape)
    assert len(buffers) == 4 and all(c.name == "channels_last" for c in buffers), buffers
    assert any("read by ATen call" in c.reason for c in buffers)
    assert not _transposes(report)
    assert all(_walks_contiguously(kern) for kern in report.kernels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_convnext_block_in_channels_last(dtype):
    """The NHWC part is contiguous (NHWC order), the result channels_last, nothing transposed."""
    torch.manual_seed(0)
    model = ConvNeXtBlock().to(memory_format=CHANNELS_LAST)
    x = torch.randn(2, 16, 8, 8).to(memory_format=CHANNELS_LAST)
    report = _compile_and_check(model, x, dtype)
    nhwc = _image_buffers(report, (2, 8, 8, 16))
    assert nhwc and all(c.name == "contiguous" for c in nhwc), nhwc
    assert [c.name for c in _image_buffers(report, x.shape)] == ["channels_last"]
    assert not _transposes(report)
    assert all(_walks_contiguously(kern) for kern in report.kernels)


@pytest.mark.parametrize("block", [ResidualBlock, ConvNeXtBlock])
def test_contiguous_model_keeps_contiguous_buffers(block):
    """NCHW in, NCHW between the convolutions. The ConvNeXt block itself permutes to NHWC and
    back: those two copies between layouts are the model's (eager makes them too)."""
    torch.manual_seed(0)
    x = torch.randn(2, 16, 8, 8)
    report = _compile_and_check(block(), x)
    assert report.layouts and all(c.name == "contiguous" for c in report.layouts), report.layouts
    transposes = _transposes(report)
    assert len(transposes) == (2 if block is ConvNeXtBlock else 0), transposes


def test_batch_norm_statistics_of_channels_last_walk_memory_in_order():
    """Training batch norm reduces over N, H, W of a channels_last tensor: the statistics
    kernel walks channels innermost (a column reduction), not with a stride of C."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
    model = model.to(memory_format=CHANNELS_LAST).train()
    x = torch.randn(4, 8, 6, 6).to(memory_format=CHANNELS_LAST)
    expected = model(x.clone())
    torch.manual_seed(0)
    fresh = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
    fresh = fresh.to(memory_format=CHANNELS_LAST).train()
    actual, report = run_compiled(fresh, x.clone())
    assert_same(actual, expected, dict(rtol=1e-4, atol=1e-4))
    assert_same(fresh[1].running_var, model[1].running_var)
    assert any(kern.reduce for kern in report.kernels)
    assert all(_walks_contiguously(kern) for kern in report.kernels)
    assert not _transposes(report)


@pytest.mark.parametrize("norm", ["channels_mean", "group_norm"])
def test_norms_over_channels_of_channels_last(norm):
    """Statistics over the channels of a channels_last tensor (a LayerNorm2d's, a group norm's)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 16, 3, padding=1).to(memory_format=CHANNELS_LAST)
    gn = nn.GroupNorm(4, 16)

    def channels_mean(x):
        y = conv(x)
        mu = y.mean(1, keepdim=True)
        var = (y - mu).pow(2).mean(1, keepdim=True)
        return torch.relu((y - mu) * torch.rsqrt(var + 1e-6))

    def group_norm(x):
        return torch.relu(gn(conv(x)))

    fn = channels_mean if norm == "channels_mean" else group_norm
    x = torch.randn(2, 8, 6, 7).to(memory_format=CHANNELS_LAST)
    with torch.no_grad():
        expected = fn(x)
        actual, report = run_compiled(fn, x)
    assert_same(actual, expected)
    if norm == "channels_mean":  # each row of channels is contiguous in memory
        assert all(_walks_contiguously(kern) for kern in report.kernels)


def test_unavoidable_layout_change_is_one_named_copy():
    """An NHWC result (contiguous in its own dims) made from an NCHW input: one kernel copies
    between the layouts, and a decision names both buffers and their reasons."""

    def f(x):
        return (torch.sigmoid(x) * 2).permute(0, 2, 3, 1).contiguous() + 1

    x = torch.randn(2, 16, 4, 4)
    actual, report = run_compiled(f, x)
    assert_same(actual, f(x))
    transposes = _transposes(report)
    assert len(transposes) == 1, report.decisions
    assert "%0 input" in transposes[0].reason and "graph input" in transposes[0].reason
    assert "graph output" in transposes[0].reason


def test_channels_last_input_to_contiguous_output_copies_once():
    """relu of a channels_last input returned as NCHW (contiguous) output: one copying kernel."""

    def f(x):
        return torch.relu(x).contiguous() * 3

    x = torch.randn(2, 16, 4, 4).to(memory_format=CHANNELS_LAST)
    actual, report = run_compiled(f, x)
    expected = f(x)
    assert_same(actual, expected)
    assert len(_transposes(report)) == (0 if expected.is_contiguous(memory_format=CHANNELS_LAST) else 1)


def test_dim_order_follows_tensor_iterator():
    """The order kiln gives an element-wise result is eager's (TensorIterator's) for mixed inputs."""
    cases = [
        [torch.randn(2, 3, 4, 5).to(memory_format=CHANNELS_LAST), torch.randn(2, 3, 4, 5)],
        [torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5).to(memory_format=CHANNELS_LAST)],
        [torch.randn(5, 4).t(), torch.randn(4, 5)],
        [torch.randn(3, 1, 5).expand(3, 4, 5), torch.randn(5, 4, 3).permute(2, 1, 0)],
        [torch.randn(1, 3, 1, 1).expand(2, 3, 4, 5), torch.randn(2, 3, 4, 5).to(memory_format=CHANNELS_LAST)],
    ]
    for a, b in cases:
        eager = (a + b).stride()
        order = dim_order(tuple(a.shape), [a.stride(), b.stride()])
        assert dense_strides(tuple(a.shape), order) == eager, (a.stride(), b.stride(), eager)
    assert is_channels_last_order(dim_order((2, 3, 4, 5), [(60, 1, 15, 3)]))


def test_channels_last_block_trains_like_eager():
    """Forward and backward graphs of a channels_last block (batch norm in training mode):
    gradients and running statistics match eager, and the backward copies no layouts."""
    torch.manual_seed(0)
    eager = ResidualBlock(8).to(memory_format=CHANNELS_LAST).train()
    torch.manual_seed(0)
    model = ResidualBlock(8).to(memory_format=CHANNELS_LAST).train()
    x = torch.randn(2, 8, 6, 6).to(memory_format=CHANNELS_LAST)
    xe, xk = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager(xe).square().sum().backward()
    from kiln.frontend.backend import REPORTS

    with REPORTS.collect() as reports:
        out, _ = run_compiled(lambda t: model(t).square().sum(), xk)
        out.backward()
    tol = dict(rtol=1e-4, atol=1e-4)
    assert_same(xk.grad, xe.grad, tol)
    for (name, pe), pk in zip(eager.named_parameters(), model.parameters()):
        assert_same(pk.grad, pe.grad, tol)
    assert_same(model.bn2.running_mean, eager.bn2.running_mean, tol)
    assert len(reports) == 2  # forward and backward
    assert not [d for r in reports for d in _transposes(r)]
    assert all(_walks_contiguously(kern) for r in reports for kern in r.kernels)


def test_memory_format_conversion_in_the_program_is_one_named_copy():
    """An NCHW input converted to channels_last inside the program for a channels_last block:
    one kernel converts, the decision names the request, and everything after stays
    channels_last without further copies."""
    torch.manual_seed(0)
    model = randomize_batchnorm(ResidualBlock()).to(memory_format=CHANNELS_LAST).eval()

    def f(x):
        return model(x.contiguous(memory_format=CHANNELS_LAST))

    x = torch.randn(2, 16, 5, 6)
    with torch.no_grad():
        expected = f(x)
        actual, report = run_compiled(f, x)
    assert_same(actual, expected)
    transposes = _transposes(report)
    assert len(transposes) == 1, report.decisions
    assert "memory format the program asks for" in transposes[0].reason
    assert all(c.name == "channels_last" for c in _image_buffers(report, x.shape)), report.layouts


def test_nchw_input_to_a_channels_last_block_copies_layouts_once():
    """The block's weights are channels_last, its input NCHW: the convolutions (ATen) take the
    input as it is, and the one kernel that adds the NCHW input to a channels_last result is
    the only copy between layouts, named with both buffers."""
    torch.manual_seed(0)
    model = randomize_batchnorm(ResidualBlock()).to(memory_format=CHANNELS_LAST).eval()
    x = torch.randn(2, 16, 5, 6)
    with torch.no_grad():
        expected = model(x)
        actual, report = run_compiled(model, x)
    assert_same(actual, expected)
    transposes = _transposes(report)
    assert len(transposes) == 1, report.decisions
    assert "input contiguous [2, 16, 5, 6] (graph input)" in transposes[0].reason, transposes[0].reason
    assert "channels_last [2, 16, 5, 6] (graph output" in transposes[0].reason, transposes[0].reason
