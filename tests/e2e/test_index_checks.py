"""Indices out of range raise what eager raises (generated code checks them), and a check
never fires where eager's op would not."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same, run_compiled
from op_inputs import randint, randn

import kiln
from kiln.frontend.backend import REPORTS


def _setitem(x, i):
    y = x.clone()
    y[i] = 1.5
    return y * 2


def _scatter_add(x, i):
    return torch.scatter_add(x, 0, i.view(1, -1), torch.ones(1, i.numel())) * 2


# name -> (fn, x, index in range, bad indices). Each op reads or writes x through the index.
CASES = {
    "index_select": (lambda x, i: torch.index_select(x, 0, i) * 2, (10, 4), [1, 3], [12, -1, 2**40]),
    "index_select_dim1": (lambda x, i: torch.index_select(x, 1, i) + 1, (3, 10), [1, 3], [10, -2]),
    "gather": (lambda x, i: torch.gather(x, 0, i.view(1, -1)) * 2, (10, 2), [1, 3], [12, -1, 2**40]),
    "getitem": (lambda x, i: x[i] * 2, (10, 4), [1, -3], [10, -11, 2**40]),
    "getitem_dim1": (lambda x, i: x[:, i] * 2, (3, 10), [1, -3], [10, -11]),
    "embedding": (lambda w, i: F.embedding(i, w) * 2, (10, 4), [1, 3], [12, -1, 2**40]),
    "setitem": (_setitem, (10, 4), [1, -3], [10, -11]),
    "scatter": (lambda x, i: torch.scatter(x, 1, i[-1:].view(1, 1).expand(10, 1), 1.0) * 2, (10, 2), [1, 0],
                [2, -1]),
    "scatter_src": (lambda x, i: torch.scatter(x, 0, i.view(1, -1), torch.ones(1, 2)) * 2, (10, 2), [1, 3],
                    [12, -1]),
    "scatter_add": (_scatter_add, (10, 2), [1, 3], [12, -1]),
    # its decomposition gathers the targets; -100 is ignored
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t) * 2, (2, 10), [1, -100], [10, -1]),
    "take": (lambda x, i: torch.take(x, i) * 2, (5, 4), [1, -3], [20, -21, 2**40]),
}


def _eager_error(fn, x, i) -> Exception:
    try:
        fn(x, i)
    except Exception as e:  # noqa: BLE001 - whatever eager raises, kiln must raise too
        return e
    raise AssertionError("eager did not raise")


@pytest.mark.parametrize("name", list(CASES))
def test_out_of_range_raises_as_eager(name):
    fn, shape, good, bads = CASES[name]
    x = randn(*shape)
    compiled = kiln.compile(fn)
    good = torch.tensor(good)
    assert_same(compiled(x, good), fn(x, good))
    for bad in bads:
        index = torch.tensor([good[0].item(), bad])
        expected = _eager_error(fn, x, index)
        with pytest.raises(type(expected)) as raised:
            compiled(x, index)
        assert str(raised.value) == str(expected)
    # nothing of the failed call stays behind
    assert_same(compiled(x, good), fn(x, good))


def test_take_along_dim_matches_eager_out_of_range():
    """eager's take_along_dim reads indices modulo the size instead of raising."""
    def f(x, i):
        return torch.take_along_dim(x, i, 0) * 2

    x = randn(10, 4)
    i = torch.tensor([[1, 12, -1, 2**40]])
    out, _ = run_compiled(f, x, i)
    assert_same(out, f(x, i))


def test_padded_gather_checks_only_real_points():
    """Points of the padding, and a Triton tile's lanes past the end, read no index: an index
    computed there (0 - 1) is no error."""
    def f(x, i):
        rows = torch.index_select(x, 0, i - 1)
        return F.pad(rows, (0, 0, 2, 1), value=0.5), rows * 2

    x = randn(6, 3)
    i = randint(1, 7, 5)
    out, report = run_compiled(f, x, i)
    assert_same(out, f(x, i))
    assert report is not None and not report.fallbacks


def test_reduction_over_gather_checks():
    def f(x, i):
        return torch.index_select(x, 1, i).sum(-1)

    x, bad = randn(4, 10), torch.tensor([1, 10, 0])
    out, _ = run_compiled(f, x, torch.tensor([1, 9, 0]))
    assert_same(out, f(x, torch.tensor([1, 9, 0])))
    expected = _eager_error(f, x, bad)
    with pytest.raises(type(expected), match=str(expected)):
        kiln.compile(f)(x, bad)


def test_checks_only_where_indices_come_from_data():
    """A program without data-dependent indices reads no error buffer; one with several
    gathers reads it once per call."""
    before = len(REPORTS)
    kiln.compile(lambda x: (x * 2).sum(0))(randn(4, 5))
    assert "errors" not in REPORTS[-1].host_source

    def f(x, i, j):
        return x[i] + torch.index_select(x, 0, j).sum()

    kiln.compile(f)(randn(6, 3), randint(0, 6, 4), randint(0, 6, 2, seed=1))
    assert len(REPORTS) == before + 2
    assert REPORTS[-1].host_source.count("errors.any()") == 1


def test_gather_along_split_rows():
    """Rows of 301 gathered values, off 16-byte boundaries: Triton splits each row into an
    aligned body and an edge, whose gathered positions are the edge's own."""
    def f(x, i):
        return torch.index_select(x, 1, i).softmax(-1)

    x, i = randn(6, 70), randint(0, 70, 301)
    out, _ = run_compiled(f, x, i)
    assert_same(out, f(x, i))
    i[300] = 70
    expected = _eager_error(f, x, i)
    with pytest.raises(type(expected), match=str(expected)):
        kiln.compile(f)(x, i)


def test_first_call_out_of_range_is_the_users_error():
    """The first call of a compiled program may fail with an index out of range: that is the
    user's error, raised as eager's, and the program stays compiled (no fallback to ATen)."""
    from kiln import errors

    fn = CASES["index_select"][0]
    x = randn(10, 4)
    compiled = kiln.compile(fn)
    records = len(errors.FALLBACKS)
    with pytest.raises(IndexError, match="index out of range in self"):
        compiled(x, torch.tensor([1, 12]))
    good = torch.tensor([1, 3])
    assert_same(compiled(x, good), fn(x, good))
    assert list(errors.FALLBACKS)[records:] == []


def test_take_of_a_zero_dim_index_stays_in_the_graph():
    """PyTorch's decomposition of take indexes with the index itself: a 0-d index became a
    number read on the host (.item()), and the graph ran without kiln."""
    def f(x, i):
        return torch.take(x, i) * 2

    for x, i in ((randn(1).view(()), torch.tensor(0)), (randn(3, 4), torch.tensor(-5)),
                 (randn(3, 4), torch.tensor([[1, -2]]))):
        torch._dynamo.reset()
        before = len(REPORTS)
        assert_same(kiln.compile(f)(x, i), f(x, i))
        assert len(REPORTS) > before, "kiln compiled no graph"
