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


def test_the_assert_message_fits_torchs_limit_and_lists_each_check_once():
    # torch._assert_async refuses a message of 255 characters or more: a BERT training graph's
    # twelve embedding checks made the whole program fail at its first call on CUDA
    from kiln.ir.checks import Check
    from kiln.runtime.host_ops import ASSERT_MESSAGE_LIMIT, checks_message

    many = tuple(Check("embedding", 0, 30522 + i % 6, 0) for i in range(12))
    message = checks_message(many)
    assert len(message) < ASSERT_MESSAGE_LIMIT and message.endswith("more)"), message
    assert message.count("size 30522 ") == 1
    assert checks_message((Check("index", 1, 5, 0),)).endswith("(index dim 1 size 5 input 0)")
