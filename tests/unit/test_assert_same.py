"""The comparison every e2e test relies on fails where eager's result differs."""

import pytest
import torch
from conftest import assert_same


def test_strides_differ():
    expected = torch.randn(4, 3)
    column_major = expected.t().contiguous().t()  # same values, same shape
    with pytest.raises(AssertionError, match="strides"):
        assert_same(column_major, expected)


def test_size_one_dims_have_no_stride_to_match():
    expected = torch.randn(4, 1)
    assert_same(expected.as_strided((4, 1), (1, 7)), expected)


def test_values_differ():
    expected = torch.randn(4, 3)
    with pytest.raises(AssertionError):
        assert_same(expected + 1e-2, expected)
