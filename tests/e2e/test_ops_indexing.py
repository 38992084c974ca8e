"""Gathers, advanced indexing, concatenation, padding, creation and splitting ops,
compiled vs eager."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same, check
from op_inputs import FLOATS, randint, randn, with_layout

import kiln
from kiln.frontend.backend import REPORTS


# ----------------------------------------------------------------------------- slice_scatter
@pytest.mark.parametrize("dtype", FLOATS)
def test_slice_scatter(dtype):
    def f(x, y):
        return (torch.slice_scatter(x, y, 1, 2, 7) * 2, torch.slice_scatter(x, y[:, :3], 1, -3),
                torch.slice_scatter(x, y[:, :0], 1, 4, 4), torch.slice_scatter(x.t(), y.t(), 0, 5))

    check(f, randn(6, 10, dtype=dtype), randn(6, 5, dtype=dtype, seed=1), expect_native=True)


def test_a_slices_gradient_is_a_slice_scatter_of_zeros():
    x = randn(4, 9).requires_grad_()
    compiled = kiln.compile(lambda x: (x[:, 1:-2] * x[:, 3:]).sum())
    compiled(x).backward()
    grad, x.grad = x.grad, None
    (x[:, 1:-2] * x[:, 3:]).sum().backward()
    assert_same(grad, x.grad)
    assert not any(r.fallbacks for r in REPORTS[-2:]), [r.fallbacks for r in REPORTS[-2:]]


# ----------------------------------------------------------------------------- gathers
@pytest.mark.parametrize("dtype", FLOATS)
def test_embedding(dtype):
    def f(w, idx, idx2):
        return F.embedding(idx, w), F.embedding(idx2, w) * 2, F.embedding(idx, w).sum(-1)

    w = randn(50, 16, dtype=dtype)
    check(f, w, randint(0, 50, 4, 7), randint(0, 50, 9, dtype=torch.int32, seed=1), expect_native=True)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_select(dim):
    def f(x, idx):
        return torch.index_select(x, dim, idx), torch.index_select(x, dim, idx.flip(0)) + 1

    x = randn(6, 8, 10)
    idx = randint(0, x.shape[dim], 5, seed=1)
    check(f, x, idx, expect_native=True)


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_index_select_native(index_dtype):
    def f(x, idx):
        return torch.index_select(x, 1, idx), torch.index_select(x.t(), 0, idx)

    check(f, randn(6, 8), randint(0, 6, 4, dtype=index_dtype), expect_native=True)


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_gather(dtype, dim):
    def f(x, idx):
        return torch.gather(x, dim, idx), torch.gather(x, dim, idx[:, :2])

    x = randn(5, 6, 7).to(dtype) if dtype.is_floating_point else randint(-100, 100, 5, 6, 7)
    shape = [4, 3, 5]
    idx = randint(0, x.shape[dim], *shape, seed=2)
    check(f, x, idx, expect_native=True)


def test_advanced_indexing():
    def f(x, i, j):
        return (x[i], x[:, i], x[i, j], x[:, :, j], x[i.view(2, 2)], x[i, :, j], x[-1, i],
                x[:, i].sum(-1), x[1:, i])

    x = randn(6, 7, 8)
    i = randint(0, 6, 4)
    j = randint(0, 8, 4, seed=1)
    check(f, x, i, j, expect_native=True)


def test_negative_indices():
    def f(x, i):
        return x[i], x[:, i], torch.index_select(x, 0, i + 6), F.embedding(i + 6, x)

    check(f, randn(6, 6), randint(-6, 0, 5), expect_native=True)


def test_boolean_mask_indexing_falls_back():
    def f(x, m):
        return x[m] * 2

    m = randint(0, 2, 5, 6).bool()
    check(f, randn(5, 6), m)


# ----------------------------------------------------------------------------- cat, pad
@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_cat(dtype):
    def f(a, b, c):
        return (torch.cat([a, b], 0), torch.cat([a, c], 1), torch.cat([a, a, b], 0), torch.cat([c, a], -1),
                torch.cat([a.t(), c.t()], 0), torch.cat([a], 0) + 1)

    def rnd(*shape, seed):
        if dtype.is_floating_point:
            return randn(*shape, dtype=dtype, seed=seed)
        return randint(-9, 9, *shape, seed=seed)

    check(f, rnd(3, 5, seed=0), rnd(2, 5, seed=1), rnd(3, 4, seed=2), expect_native=True)


def test_cat_mixed_dtypes_and_empty():
    def f(a, b, e, i):
        return torch.cat([a, b]), torch.cat([a, e]), torch.cat([i, a]), torch.cat([e, a], 0) * 2

    check(f, randn(3, 4), randn(2, 4, dtype=torch.bfloat16), torch.empty(0, 4), randint(0, 5, 1, 4),
          expect_native=True)


def test_cat_3d_middle_dim():
    def f(a, b, c):
        return torch.cat([a, b, c], 1), torch.cat([a, b, c], 1).sum(1)

    check(f, randn(2, 1, 5), randn(2, 3, 5, seed=1), randn(2, 2, 5, seed=2), expect_native=True)


@pytest.mark.parametrize("pad", [(1, 2), (2, 0, 1, 3), (-1, 2), (1, -2, -1, 0), (0, 0, 2, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_constant_pad(pad, dtype):
    def f(x):
        return F.pad(x, pad), F.pad(x, pad, value=-1.5), F.pad(x, pad, value=0.1) * 3

    check(f, randn(4, 5, 6, dtype=dtype), expect_native=True)


def test_pad_int_and_strided():
    def f(x, i):
        return F.pad(x, (1, 1, 2, 0)), F.pad(i, (3, -1), value=7), F.pad(x.t(), (0, 2))

    check(f, with_layout(randn(5, 6), "sliced"), randint(-5, 5, 3, 4), expect_native=True)


# ----------------------------------------------------------------------------- creation
def test_full_arange_like():
    def f(x):
        return (torch.full((3, 4), 2.5), torch.full((2,), 7, dtype=torch.int64), torch.zeros_like(x),
                torch.ones_like(x, dtype=torch.bfloat16), torch.full_like(x, -3.0), torch.arange(10),
                torch.arange(2, 20, 3), torch.arange(5, dtype=torch.float32) * x[0, 0],
                torch.arange(0.0, 1.0, 0.125), torch.arange(-1.5, 2.0, 0.5, dtype=torch.float64),
                torch.arange(10, 0, -2), x + torch.arange(4), torch.zeros(2, 3, dtype=torch.bool),
                torch.empty(0, 3).sum(0), torch.ones(4) + x)

    check(f, randn(3, 4), expect_native=True)


def test_arange_with_fractional_step():
    def f(x):
        return torch.arange(0, 3, 0.3) + x, torch.linspace(0, 1, 7) * x[:7]

    check(f, randn(10), expect_native=True)


# ----------------------------------------------------------------------------- split, chunk, unbind
def test_split_chunk_unbind():
    def f(x):
        a = torch.split(x, 3, dim=1)
        b = torch.split(x, [1, 4, 3], dim=1)
        c = torch.chunk(x, 3, dim=0)
        d = torch.unbind(x, dim=0)
        e = x.chunk(2, -1)
        return a + b + c + d + e

    check(f, randn(5, 8), expect_native=True)


def test_split_feeding_math():
    def f(x):
        q, k, v = x.split(4, -1)
        return q * k + v, torch.stack(x.unbind(0), -1)

    check(f, randn(3, 12), expect_native=True)


def test_narrow_select_flip_roll():
    def f(x):
        return x.narrow(1, 2, 3) + 1, x[2] * x[:, 3:4], x.select(1, -1), x.flip(-1), x.roll(2, 0)

    check(f, randn(5, 7))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_one_index_per_line(dim):
    def f(x, index, src):
        into_zeros = torch.zeros_like(x).scatter_(dim, index, 2.0)
        return x.scatter(dim, index, -1.5), x.scatter(dim, index, src), into_zeros

    x = torch.randn(7, 9)
    shape = (1, 9) if dim == 0 else (7, 1)
    index = torch.randint(0, x.shape[dim], shape)
    check(f, x, index, torch.randn(shape), expect_native=True)


def test_cross_entropy_gradient_runs_natively():
    logits, target = torch.randn(16, 37), torch.randint(0, 37, (16,))
    eager_in, kiln_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    F.cross_entropy(eager_in, target).backward()
    before = len(REPORTS)
    kiln.compile(F.cross_entropy)(kiln_in, target).backward()
    assert_same(kiln_in.grad, eager_in.grad)
    backward = REPORTS[-1]
    assert len(REPORTS) == before + 2 and not backward.fallbacks, backward.fallbacks


def test_embedding_gradient_sums_repeated_rows_in_aten_by_design():
    """Rows named many times (a token type, a position in every sequence) are summed by
    ATen's sorting kernel: an embedding's backward is an ATen call kiln chose, not a fallback."""
    weight = torch.randn(30, 8)
    ids = torch.cat([torch.zeros(40, dtype=torch.int64), torch.randint(0, 30, (24,))]).view(8, 8)
    eager_w, kiln_w = weight.clone().requires_grad_(), weight.clone().requires_grad_()

    def f(w, i):
        return (F.embedding(i, w) * torch.arange(8.0)).sum()

    f(eager_w, ids).backward()
    before = len(REPORTS)
    kiln.compile(f)(kiln_w, ids).backward()
    assert_same(kiln_w.grad, eager_w.grad)
    backward = REPORTS[-1]
    assert len(REPORTS) == before + 2
    assert list(backward.fallbacks) == ["aten.embedding_dense_backward.default"]
    assert "by design" in backward.fallbacks["aten.embedding_dense_backward.default"]
