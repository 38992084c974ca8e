"""2-d pooling: max_pool2d and avg_pool2d decompose into window reads that fuse (avg_pool2d
with padding or ceil_mode keeps ATen's kernel), forward and backward, against eager."""

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
    (F.avg_pool2d, dict(kernel_size=3, stride=2, padding=1), False),
    (F.avg_pool2d, dict(kernel_size=3, stride=2, ceil_mode=True), False),
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
