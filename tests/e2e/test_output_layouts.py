"""What the host program returns and hands to ATen: new memory where eager returns new memory,
eager's strides, and layouts that repeat elements (broadcasts), on fresh random inputs."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same

import kiln
from kiln import errors


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def check_layouts(fn, make_inputs) -> None:
    """fn compiled by kiln (no fallback of the graph, no internal one) gives eager's values and
    strides, twice, and shares memory with an input or an earlier output exactly where eager
    does; inputs updated in place match too."""
    torch._dynamo.reset()
    before = len(errors.FALLBACKS)
    compiled = kiln.compile(fn)
    for _ in range(2):  # the second call runs the compiled program without compiling
        torch.manual_seed(0)
        eager_inputs = make_inputs()
        torch.manual_seed(0)
        kiln_inputs = make_inputs()
        expected, actual = fn(*eager_inputs), compiled(*kiln_inputs)
        assert_same(actual, expected)
        assert_same(kiln_inputs, eager_inputs)
        for name, memory in (("input", eager_inputs), ("output", expected)):
            shared_in_eager = [[_storage(o) == _storage(m) for m in memory] for o in expected]
            other = kiln_inputs if name == "input" else actual
            shared_in_kiln = [[_storage(o) == _storage(m) for m in other] for o in actual]
            assert shared_in_kiln == shared_in_eager, f"memory shared with an {name}"
    bad = [f for f in list(errors.FALLBACKS)[before:] if f.scope == "graph" or f.kind == "internal"]
    assert not bad, bad


def _halves(*sizes):
    return [torch.randn(n).half() for n in sizes]


def test_cat_with_an_empty_part_is_new_memory():
    """cat returns new memory in eager: an update of its input after it does not show."""

    def f(x0, x1, x2):
        v0 = torch.cat([x0, x1], -1)
        x0[::2] = x2
        return (v0.reshape([16]),)

    check_layouts(f, lambda: _halves(16, 0, 1))


def test_clone_and_its_views_are_new_memory_shared_as_in_eager():
    """Outputs that are views of one clone share one copy; two clones are two copies."""

    def f(x, y):
        c = x.clone()
        x.mul_(y)
        return c[1:], c.t(), x.clone()[::2], torch.cat([x, torch.zeros(0, 4)])

    check_layouts(f, lambda: [torch.randn(3, 4), torch.randn(4)])


def test_copy_from_a_python_number():
    def f(x, y):
        x.copy_(2)
        y.copy_(float("inf"))
        return x * 3, y + 1

    check_layouts(f, lambda: [torch.randn(5), torch.randn(2, 3)])


def test_copy_of_a_non_finite_number_into_integers_runs_in_aten():
    """Eager's conversion of inf to an integer is undefined: kiln leaves it to eager's kernel."""

    def f(x, y):
        x.copy_(float("-inf"))
        return x + 1, y * 2

    torch._dynamo.reset()
    before = len(errors.FALLBACKS)
    x, y = torch.randint(-5, 5, (4,)), torch.randn(4)
    expected = f(x.clone(), y)
    actual = kiln.compile(f)(x.clone(), y)
    assert_same(actual, expected)
    assert not [r for r in list(errors.FALLBACKS)[before:] if r.kind == "internal"]


def test_aten_result_whose_meta_strides_repeat_elements():
    """The ATen diagonal of a broadcast input returns strides that differ from its meta
    function's, which repeat elements (stride 0): kiln must not copy into that layout."""

    def g(x):
        return x.permute(3, 1, 0, 2).diagonal(0, 1, 0) * 2

    check_layouts(g, lambda: [torch.randn(1, 1, 1, 1).expand(1, 1, 3, 1)])
    check_layouts(g, lambda: [torch.randn(1, 1, 1, 2).expand(1, 1, 3, 2)])


def test_aten_ops_on_a_permuted_intermediate_give_eager_strides():
    """index_put, scatter_add and fmax run in ATen; fed a kernel's output, whose layout kiln
    chose, they return other strides than eager's, which the program's result must not show."""
    index = torch.randperm(16)[:7]

    def f(x0, x3):
        v = (x0 * 2).index_put((index,), x3)
        w = torch.fmax(x0 + 1, x0.flip(0))
        return v, v.transpose(0, 2) + 1, w, w[::2]

    def g(x, i):
        return (x * 3).scatter_add(0, i, x.exp())

    check_layouts(f, lambda: [torch.randn(2, 1, 16).permute(2, 1, 0), torch.randn(1, 1, 1)])
    check_layouts(g, lambda: [torch.randn(3, 5).t(), torch.randint(0, 5, (5, 3))])


@pytest.mark.parametrize("shape,dims", [((1, 0), [1]), ((0, 1), [0]), ((5, 0, 10), [1])])
def test_flip_of_an_empty_dim(shape, dims):
    """A flip is a view whose offset counts from the end of each flipped dim: -1 for an empty
    one, which no storage offset may be."""
    def f(x):
        return torch.flip(x, dims)

    records = len(errors.FALLBACKS)
    x = torch.randn(shape)
    assert_same(kiln.compile(f)(x), f(x))
    assert not [r for r in list(errors.FALLBACKS)[records:] if r.kind == "internal"]


def test_flip_of_an_empty_dim_read_by_an_aten_op():
    """The view an ATen op reads keeps its storage offset within the storage too."""
    def f(x):
        return torch.flip(x * 2, [1]).repeat(2, 1), torch.flip(x, [0, 1]).repeat(1, 2)

    records = len(errors.FALLBACKS)
    x = torch.randn(3, 0)
    assert_same(kiln.compile(f)(x), f(x))
    assert not [r for r in list(errors.FALLBACKS)[records:] if r.kind == "internal"]
