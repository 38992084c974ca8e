"""Shape families on the GPU: one compiled program (Triton kernels taking their sizes as
arguments) serves every size, through every binary a launch may pick. Run on a GPU machine:
    PYTHONPATH=src python -m pytest -q tests/gpu/test_symbolic_sizes_gpu.py -m gpu
"""

import pytest
import torch
from conftest import assert_same

import kiln
from kiln.frontend.backend import REPORTS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
LENGTHS = (2, 3, 16, 17, 64, 1000, 4096, 4097)  # multiples of 16 and not: both binaries


@pytest.fixture(autouse=True)
def fresh_stats():
    torch._dynamo.reset()
    kiln.reset_stats()


def randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).to("cuda", dtype)


def assert_one_family(graphs: int = 1):
    s = kiln.stats()
    assert (s.graphs_compiled, s.graphs_symbolic, s.specialized) == (graphs, graphs, 0), s
    assert not s.per_shape and not s.graphs_in_aten, s


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_element_wise_matmul_softmax_and_layer_norm_serve_every_length(dtype):
    w = randn(64, 64, dtype=dtype, seed=1)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype is torch.bfloat16 else None

    def f(x):
        y = torch.nn.functional.gelu(x @ w) * torch.sigmoid(x)
        return y, torch.softmax(x.transpose(1, 2), -1), torch.nn.functional.layer_norm(x, (64,)), x.sum(1)

    compiled = kiln.compile(f, dynamic=True)
    for n in LENGTHS:
        x = randn(5, n, 64, dtype=dtype)
        # a sum of n values in another order: float32 rounding grows with the sum's sqrt(n) size
        sum_tol = tol or {"rtol": 1e-4, "atol": 1e-5 * n**0.5}
        for got, want, t in zip(compiled(x), f(x), (tol, tol, tol, sum_tol)):
            assert_same(got, want, t)
    assert_one_family()


def test_layer_norm_backward_serves_every_length():
    ln = torch.nn.LayerNorm(64).cuda()
    compiled = kiln.compile(ln, dynamic=True)
    for n in LENGTHS[1:]:
        x = randn(5, n, 64).requires_grad_()
        x_eager = x.detach().clone().requires_grad_()
        grad = randn(5, n, 64, seed=4)
        compiled(x).backward(grad)
        ln(x_eager).backward(grad)
        assert_same(x.grad, x_eager.grad, {"rtol": 1e-4, "atol": 1e-4})
    assert_one_family(graphs=2)


def test_a_module_float_attribute_is_a_cpu_scalar_of_the_family():
    """Under dynamic=True Dynamo passes a module's float attribute (an RMSNorm's eps) as a 0-d
    CPU tensor beside the GPU's: the family compiles, with that scalar copied over per call."""

    class RMSNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.eps, self.weight = 1e-6, torch.nn.Parameter(randn(64, seed=2))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    norm = RMSNorm()
    compiled = kiln.compile(norm, dynamic=True)
    with torch.no_grad():
        for n in LENGTHS:
            x = randn(5, n, 64)
            assert_same(compiled(x), norm(x))
    s = kiln.stats()
    assert s.graphs_symbolic and not s.per_shape and not s.graphs_in_aten, s


def test_indices_past_2_to_the_31_take_the_wide_binary():
    """A launch whose indices reach 2^31 runs the int64 binary, compiled at that launch."""

    def f(x):
        return x * 2 + 1

    compiled = kiln.compile(f, dynamic=True)
    before = len(REPORTS)
    small = torch.ones(3, 5, device="cuda", dtype=torch.int8)
    assert_same(compiled(small), f(small))
    big = torch.ones(2**16 + 3, 2**15, device="cuda", dtype=torch.int8)  # 2^31 + 98304 elements
    big[-1, -1] = 3
    got = compiled(big)
    assert got[-1, -1].item() == 7 and got[0, 0].item() == 3 and bool((got[:, :-1] == 3).all())
    assert_one_family()
    launcher = REPORTS[before].program().__globals__[REPORTS[before].kernels[0].name]
    launcher = getattr(launcher, "launcher", launcher)  # under a profiler's ranges
    assert any(key[1] for key in launcher.launches), launcher.launches
