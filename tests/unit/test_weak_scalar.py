"""A number kiln reads from a 0-d tensor at run time (.item()) promotes as the Python number it is."""

import pytest
import torch

from kiln.ir.tensor import Builder, Op
from kiln.lower.core import WEAK_SCALAR, promote


@pytest.mark.parametrize("tensor_dtype, number_dtype, expected", [
    (torch.float16, torch.float64, torch.float16),  # a float does not widen a 0-d float tensor
    (torch.int32, torch.float64, torch.float32),  # an integer tensor and a float: the default dtype
    (torch.int32, torch.int64, torch.int32),
    (torch.bool, torch.float64, torch.float32),
])
def test_weak_scalar_promotes_as_a_python_number(tensor_dtype, number_dtype, expected):
    b = Builder()
    tensor = b.make(Op.INPUT, (), (0, ()), (), tensor_dtype)
    source = b.make(Op.INPUT, (), (1, ()), (), number_dtype)
    number = b.make(Op.VIEW, (source,), ((), (), 0), (), number_dtype, meta={WEAK_SCALAR: True})
    assert promote(tensor, number) == expected
    assert promote(number, tensor) == expected
