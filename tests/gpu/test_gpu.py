"""Compiled vs eager on an NVIDIA GPU (Triton kernels). Run on a GPU machine:
    PYTHONPATH=src python -m pytest -q tests/gpu -m gpu
"""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import check

import kiln

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = "cuda"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_elementwise_and_reductions(dtype):
    def f(x, y):
        return (torch.relu(x * y + 1).sum(-1), torch.softmax(x, -1), x.amax(0), x.argmax(-1),
                torch.tanh(x)[::2] * y[1::2], torch.erf(x) / (1 + y.abs()))

    x, y = torch.randn(96, 130, device=CUDA, dtype=dtype), torch.randn(96, 130, device=CUDA, dtype=dtype)
    check(f, x, y, expect_native=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms_long_rows(dtype):
    def f(x, w, b):
        xf = x.float()
        rms = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
        return rms, F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))

    n = 6000  # longer than a persistent row: looped reductions
    x = torch.randn(33, n, device=CUDA, dtype=dtype)
    w, b = torch.randn(n, device=CUDA, dtype=dtype), torch.randn(n, device=CUDA, dtype=dtype)
    check(f, x, w, b, expect_native=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rows_off_16_byte_boundaries(dtype):
    # rows of 1021 and 4093 split into an aligned body of whole vectors and an edge tile around
    # it (the weight shifted into the body's columns in registers: every shift among 67 rows);
    # rows of 37 (too short to split) load element by element
    def f(x, w):
        xf = x.float()
        rms = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
        return rms, torch.softmax(x, -1), x.amax(-1), (x * 2).sum(-1)

    def g(flat, w):  # rows 3 elements further on
        return f(flat[3:].view(67, -1), w)

    def h(x, w):  # the weight from its second element on
        return f(x, w[1:])

    # a float32 sum of thousands of terms near zero differs from eager's order by ~1e-5
    tol = dict(rtol=1e-4, atol=1e-4) if dtype is torch.float32 else None
    for n in (1021, 37, 4093):
        x, w = torch.randn(67, n, device=CUDA, dtype=dtype), torch.randn(n, device=CUDA, dtype=dtype)
        check(f, x, w, tol=tol, expect_native=True)
        check(g, torch.randn(67 * n + 3, device=CUDA, dtype=dtype), w, tol=tol, expect_native=True)
        check(h, x, torch.randn(n + 1, device=CUDA, dtype=dtype), tol=tol, expect_native=True)
        # a caller's tensor 3 elements off alignment: the launch falls back to Triton's JIT
        view = torch.randn(67 * n + 3, device=CUDA, dtype=dtype)[3:].view(67, n)
        w_view = torch.randn(n + 3, device=CUDA, dtype=dtype)[3:]
        for args in ((view, w), (x, w_view)):
            for got, want in zip(kiln.compile(f)(*args), f(*args)):
                torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_float32_gelu_is_as_accurate_as_eagers():
    x = torch.cat([torch.linspace(-10, 10, 1 << 22, device=CUDA), torch.randn(1 << 20, device=CUDA) * 3])
    ref = x.double() * 0.5 * torch.special.erfc(-x.double() / math.sqrt(2))

    def error(y):  # relative where |x| > 1, absolute below
        return ((y.double() - ref).abs() / x.double().abs().clamp(min=1)).max().item()

    ours, eager = error(kiln.compile(F.gelu)(x)), error(F.gelu(x))
    assert ours <= max(2 * eager, 3e-7), (ours, eager)


def test_conversions_and_creations_on_the_graph_device_are_native():
    def f(x):
        return (x.to(device="cuda", dtype=torch.bfloat16) * 2, x.to(device=x.device, dtype=torch.float64),
                torch.arange(33, device=x.device) * x, torch.full((64, 33), 2.0, device=x.device) + x,
                torch.zeros_like(x).scatter_(1, x.argmax(1, keepdim=True), 1.0))

    check(f, torch.randn(64, 33, device=CUDA), expect_native=True)


def test_masked_softmax_with_inf_rows_and_indexing():
    def f(s, m, table, idx):
        p = s.masked_fill(m, float("-inf")).softmax(-1)
        return p, table[idx] * 2, torch.cat([table[:3], table[-2:]], 0)

    s = torch.randn(4, 8, 64, 64, device=CUDA)
    m = torch.ones(64, 64, dtype=torch.bool, device=CUDA).triu(1)
    m[5] = True  # an all -inf row gives NaN, as in eager
    table = torch.randn(50, 16, device=CUDA)
    idx = torch.randint(-50, 50, (7, 3), device=CUDA)
    check(f, s, m, table, idx)


def test_transformer_block_matches_eager():
    from kiln.tools.demo import Block

    torch.manual_seed(0)
    model = Block().to(CUDA).eval()
    x = torch.randn(4, 128, 256, device=CUDA)
    with torch.no_grad():
        check(model, x, tol=dict(rtol=1e-3, atol=1e-3))


@pytest.mark.parametrize("n", [100, 6000])  # persistent and looped rows
def test_nan_inf_arg_reductions_int_pow_and_casts(n):
    def f(x, i, e):
        return (x.argmax(-1), x.argmin(-1), x.amax(-1), torch.sign(x), i ** 3, torch.pow(i, e),
                i.to(torch.bfloat16), x.double().to(torch.bfloat16), x.to(torch.bfloat16).float() * 3)

    x = torch.randn(8, n, device=CUDA)
    x[0, 7], x[0, 3] = float("nan"), float("inf")  # the first NaN wins over an earlier inf
    x[1, 5], x[1, 9] = float("-inf"), float("nan")
    x[2] = float("-inf")
    i = torch.randint(-5, 6, (8, n), device=CUDA)
    e = torch.randint(0, 40, (8, n), device=CUDA)
    check(f, x, i, e, expect_native=True)


def test_tensors_off_a_16_byte_boundary():
    # the binaries assume aligned tensors: a caller's view that starts 4 bytes in is
    # launched through Triton's JIT instead, and a kernel reading kiln's own buffers is not
    def f(x, y):
        return torch.softmax(torch.sin(x) @ y, -1) * 2

    base = torch.randn(64 * 96 + 1, device=CUDA)
    aligned, shifted = base[:-1].view(64, 96), base[1:].view(64, 96)
    y = torch.randn(96, 48, device=CUDA)
    compiled = kiln.compile(f)
    for x in (aligned, shifted, aligned):
        torch.testing.assert_close(compiled(x, y), f(x, y))


@pytest.mark.parametrize("n", [1, 7, 8, 12, 20])
def test_kernels_of_many_pointers_share_launchers(n):
    # one C launcher serves every kernel of up to 8, 16, 32... pointers (the rest are passed
    # as null pointers): kernels of n inputs and one output
    def f(*xs):
        out = xs[0] * 1.5
        for i, x in enumerate(xs[1:]):
            out = out + x * (i + 2)
        return torch.tanh(out)

    xs = [torch.randn(37, 129, device=CUDA) for _ in range(n)]
    torch.testing.assert_close(kiln.compile(f)(*xs), f(*xs))


def test_bf16_rounding_matches_eager_bit_for_bit():
    # eager rounds each bf16 op's float32 result to bf16; kiln rounds a product it adds to in
    # one instruction (km.round_bf16) and leaves the stored sum to the store's conversion
    special = [0.0, -0.0, 1.0, -1.5, 3e38, -3e38, float("inf"), -float("inf"), float("nan"), 1e-39, -2e-40]
    x = torch.cat([torch.tensor(special), torch.randn(1 << 16) * 100]).to(CUDA, torch.bfloat16)
    y = torch.cat([torch.tensor(special[::-1]), torch.randn(1 << 16)]).to(CUDA, torch.bfloat16)

    def f(x, y):
        return x * y + y

    got, want = kiln.compile(f)(x, y), f(x, y)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))  # -0.0 and subnormals too


@pytest.mark.parametrize("rows", [64, 1024])  # few rows split across programs; many are a program each
def test_online_softmax_over_vocabulary_rows(rows):
    x = torch.randn(rows, 50304, device=CUDA, dtype=torch.bfloat16) * 4
    x[1, :100] = float("-inf")
    x[2] = float("-inf")
    x[3, 5] = 1e38
    check(lambda x: (torch.softmax(x, -1), torch.log_softmax(x.float(), -1)), x, expect_native=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_forward_and_backward_over_vocabulary_rows(dtype):
    logits = torch.randn(1024, 50304, device=CUDA, dtype=dtype) * 3
    targets = torch.randint(0, 50304, (1024,), device=CUDA)
    targets[::7] = -100

    def loss(x, t):
        return F.cross_entropy(x.float(), t, label_smoothing=0.1)

    x, y = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    expected = loss(x, targets)
    (expected_grad,) = torch.autograd.grad(expected, x)
    torch._dynamo.reset()
    actual = kiln.compile(loss)(y, targets)
    (grad,) = torch.autograd.grad(actual, y)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype is torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(actual, expected, **tol)
    torch.testing.assert_close(grad, expected_grad, **tol)


def test_conv_bias_pooling_and_embedding_gradients_match_eager():
    """A convolution's bias as an add in the graph, max pooling with padding (values and
    indices), and an embedding's gradient over indices that repeat, forward and backward."""
    conv = torch.nn.Conv2d(8, 16, 3, padding=1).to(CUDA, memory_format=torch.channels_last)
    emb = torch.nn.Embedding(50, 16).to(CUDA)

    def f(x, ids):
        y = F.max_pool2d(torch.relu(conv(x)), 3, 2, 1)
        return (y.mean((2, 3)) * emb(ids).sum(1)).sum()

    x = torch.randn(4, 8, 15, 15, device=CUDA).to(memory_format=torch.channels_last)
    ids = torch.randint(0, 3, (4, 9), device=CUDA)
    check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x)
    grads = []
    for fn in (f, kiln.compile(f)):
        torch._dynamo.reset()
        fn(x, ids).backward()
        grads.append([p.grad.clone() for p in (*conv.parameters(), emb.weight)])
        for p in (*conv.parameters(), emb.weight):
            p.grad = None
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_vocabulary_off_16_bytes_pads_its_matmuls_and_matches_eager():
    """A language-model head over 1001 classes in bf16: the matmuls of the forward and the
    backward run on padded operands, and the loss and gradients equal eager's."""
    from kiln.frontend.backend import REPORTS

    x = torch.randn(4096, 256, device=CUDA)
    head = torch.nn.Linear(256, 1001).to(CUDA)
    target = torch.randint(0, 1001, (4096,), device=CUDA)

    def f(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return F.cross_entropy(head(x).float(), target)

    results = []
    for fn in (f, kiln.compile(f)):
        torch._dynamo.reset()
        before = len(REPORTS)
        leaf = x.clone().requires_grad_()
        loss = fn(leaf)
        loss.backward()
        results.append([loss.detach(), leaf.grad, head.weight.grad.clone(), head.bias.grad.clone()])
        head.weight.grad = head.bias.grad = None
    aligned = [p.summary for r in REPORTS[before:] for p in r.passes if p.name == "align"]
    assert aligned and not all(s.startswith("0 ") for s in aligned), aligned
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-3)
