"""Channels_last convolution nets and ConvNeXtV2's GRN block on the CPU: kiln vs eager (and
Inductor for reference), one process, calls interleaved, medians.

    PYTHONPATH=src python -m benchmarks.layouts [--repeat 200] [--no-inductor]

Prints one line per case: median milliseconds of eager, kiln and Inductor, and kiln's
kernels, copies between layouts and ATen fallbacks (from its compile report).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.measure import check_close, time_interleaved


class ResidualBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


class ConvNeXtBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.dwconv = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


def grn(x, gamma, beta):
    gx = torch.norm(x, p=2, dim=(1, 2), keepdim=True)
    nx = gx / (gx.mean(dim=-1, keepdim=True) + 1e-6)
    return gamma * (x * nx) + beta + x


def _conv_case(block: nn.Module, shape, channels_last: bool):
    torch.manual_seed(0)
    for m in block.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    block = block.eval()
    x = torch.randn(*shape)
    if channels_last:
        block, x = block.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    return block, (x,)


def cases():
    torch.manual_seed(0)
    c = 64
    yield "resnet block, channels_last, 8x64x28x28", *_conv_case(ResidualBlock(c), (8, c, 28, 28), True)
    yield "resnet block, NCHW, 8x64x28x28", *_conv_case(ResidualBlock(c), (8, c, 28, 28), False)
    yield "convnext block, channels_last, 8x96x28x28", *_conv_case(ConvNeXtBlock(96), (8, 96, 28, 28), True)
    x = torch.randn(8, 28, 28, 192)
    yield "GRN, 8x28x28x192 (NHWC)", grn, (x, torch.randn(1, 1, 1, 192), torch.randn(1, 1, 1, 192))


def _kiln_summary(reports) -> str:
    kernels = sum(r.num_kernels for r in reports)
    copies = sum(1 for r in reports for d in r.decisions if d.verdict == "transpose")
    aten = sorted({op for r in reports for op in r.fallbacks})
    return f"{kernels} kernels, {copies} layout copies, ATen: {', '.join(aten) or '-'}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--no-inductor", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-"))
    import kiln
    from kiln.frontend.backend import REPORTS

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeat} calls (ms)")
    for name, fn, inputs in cases():
        torch._dynamo.reset()
        with torch.no_grad():
            with REPORTS.collect() as reports:
                compiled = kiln.compile(fn)
                compiled(*inputs)
            variants = {"eager": fn, "kiln": compiled}
            if not args.no_inductor:
                variants["inductor"] = torch.compile(fn)
            expected = fn(*inputs)
            for label, variant in variants.items():
                bad = check_close(variant(*inputs), expected)
                assert bad is None, f"{name}: {label} differs from eager: {bad}"
            samples = time_interleaved(variants, inputs, args.repeat)
        times = "  ".join(f"{k} {statistics.median(v) * 1e3:7.3f}" for k, v in samples.items())
        print(f"{name:<44} {times}   [{_kiln_summary(reports)}]")


if __name__ == "__main__":
    main()
