"""Which error slots a GPU program asserts on: a slice where the checked rows run in a
sequence, else a tensor made outside the compile's fake mode (the program runs on real slots)."""

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from kiln.codegen.host import _index_flags


class _Emitter:
    def __init__(self):
        self.program = type("Program", (), {"device": "cpu"})()
        self.helpers = {}

    def helper(self, name, value):
        self.helpers[name] = value
        return name


def test_rows_in_a_sequence_are_a_slice():
    e = _Emitter()
    assert _index_flags(e, [1, 2, 3]) == "2:8:2"
    errors = torch.arange(10)
    assert errors[2:8:2].tolist() == [2, 4, 6]
    assert not e.helpers


def test_other_rows_are_a_real_tensor_even_inside_a_fake_mode():
    e = _Emitter()
    with FakeTensorMode():
        name = _index_flags(e, [0, 2])
    flags = e.helpers[name]
    assert not isinstance(flags, FakeTensor)
    assert flags.tolist() == [0, 4]
