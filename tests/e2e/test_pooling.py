"""2-d pooling: max_pool2d and avg_pool2d decompose into window reads that fuse, forward and
backward, against eager; max_pool2d's indices equal eager's, NaN and -inf included."""

import pytest
import torch
import torch.nn.functional as F
from conftest import check

import kiln

POOLS = [
    (F.max_pool2d, dict(kernel_size=2), True),
    (F.max_pool2d, dict(kernel_size=3, stride=2, padding=1), True),
    (F.avg_pool2d, dict(kernel_size=2), True),
    (F.avg_pool2d, dict(kernel_size=(2, 3), stride=(1, 2)), True),
    (F.avg_pool2d, dict(kernel_size=2, divisor_override=3), True),
    (F.avg_pool2d, dict(kernel_size=3, stride=2, padding=1), True),
    (F.avg_pool2d, dict(kernel_size=3, stride=2, padding=1, count_include_pad=False), True),
    (F.avg_pool2d, dict(kernel_size=3, stride=2, ceil_mode=True), True),
    (F.max_pool2d, dict(kernel_size=3, stride=2, ceil_mode=True), True),
    (F.max_pool2d, dict(kernel_size=2, stride=1, padding=1, dilation=2), True),
]


@pytest.mark.parametrize("shape", [(2, 3, 9, 10), (3, 7, 8)])
@pytest.mark.parametrize("pool,kwargs,native", POOLS)
def test_pooling_matches_eager_forward_and_backward(pool, kwargs, native, shape):
    def f(x):
        return pool(x, **kwargs)

    x = torch.randn(shape)
    check(f, x, expect_native=native)
    grads = []
    for fn in (f, kiln.compile(f)):
        torch._dynamo.reset()
        leaf = x.clone().requires_grad_()
        fn(leaf).square().sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("kwargs", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                    dict(kernel_size=3, stride=2, dilation=2, ceil_mode=True)])
def test_max_pool_indices_match_eager_with_nan_and_infinities(kwargs):
    def f(x):
        return F.max_pool2d(x, return_indices=True, **kwargs)

    x = torch.randn(2, 3, 11, 9)
    x.view(-1)[::7] = float("nan")
    x.view(-1)[::5] = float("-inf")
    x[0, 0] = float("-inf")  # windows of -inf alone: the index is the window's first position
    check(f, x, expect_native=True)  # values with NaN in place, indices exactly


def test_channels_last_max_pool_runs_its_lines_unchecked_inside_the_image():
    """Channels-last, a window's row and column checks hold for a whole line of channels: the
    lines inside the image run without them (and vectorize), the border's with them; NaN and
    -inf propagate as in eager either way."""
    from kiln.frontend.backend import REPORTS

    def f(x):
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)

    x = torch.randn(2, 32, 15, 14)
    x.view(-1)[::7] = float("nan")
    x.view(-1)[::5] = float("-inf")
    x = x.to(memory_format=torch.channels_last)
    torch._dynamo.reset()
    before = len(REPORTS)
    out = kiln.compile(f)(x)
    torch.testing.assert_close(out, f(x), equal_nan=True, rtol=0, atol=0)
    (report,) = REPORTS[before:]
    if report.backend == "cpp":
        (kernel,) = report.kernels
        assert "= true;" in report.sources[kernel.name], report.sources[kernel.name]
