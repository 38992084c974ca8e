"""Integer division, compiled vs eager: division by zero raises as eager does, and the
smallest integer divided by -1 wraps (it traps in C, and kiln's program must not)."""

import pytest
import torch
from conftest import assert_same, check
from op_inputs import nonzero_ints, randint

import kiln

DIVISIONS = {
    "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "floor_divide": lambda a, b: a // b,
    "remainder": torch.remainder,
    "fmod": torch.fmod,
}


def _all_divisions(a, b):
    return tuple(op(a, b) + 1 for op in DIVISIONS.values())


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8])
def test_smallest_by_minus_one(dtype):
    """Quotients by -1 are -a (wrapped: the smallest integer stays itself), remainders 0.
    (eager's own truncating division traps there on int64 and int32: the reference divides
    the other elements only.)"""
    smallest = torch.iinfo(dtype).min
    a = torch.cat([torch.tensor([smallest, smallest + 1, smallest]), randint(-100, 100, 6, seed=3)]).to(dtype)
    b = torch.cat([torch.tensor([-1, -1, 2]), nonzero_ints(6, seed=4)]).to(dtype)
    out = kiln.compile(_all_divisions)(a, b)
    by_minus_one = b == -1
    divided = _all_divisions(a, torch.where(by_minus_one, torch.ones_like(b), b))
    at_minus_one = [-a, -a, -a, torch.zeros_like(a), torch.zeros_like(a)]  # in the order of DIVISIONS
    expected = [torch.where(by_minus_one, v + 1, d) for v, d in zip(at_minus_one, divided)]
    assert_same(list(out), expected)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.uint8])
@pytest.mark.parametrize("name", list(DIVISIONS))
def test_division_by_zero_raises(name, dtype):
    def f(a, b):
        return DIVISIONS[name](a, b) * 2

    a = randint(1, 100, 7, seed=1).to(dtype)
    good = randint(1, 9, 7, seed=2).to(dtype)
    bad = good.clone()
    bad[3] = 0
    with pytest.raises(RuntimeError) as eager:
        f(a, bad)
    compiled = kiln.compile(f)
    assert_same(compiled(a, good), f(a, good))
    with pytest.raises(RuntimeError) as raised:
        compiled(a, bad)
    assert str(raised.value) == str(eager.value) == "ZeroDivisionError"
    assert_same(compiled(a, good), f(a, good))


def test_division_by_a_zero_scalar_raises():
    def f(a):
        return a // 0 + a % 3

    a = randint(-50, 50, 5)
    with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
        kiln.compile(f)(a)


def test_float_division_by_zero_does_not_raise():
    def f(x, y):
        return torch.div(x, y * 0, rounding_mode="floor"), torch.remainder(x, y * 0), torch.fmod(x, y * 0)

    check(f, randint(-5, 5, 6).float(), randint(1, 5, 6, seed=1).float())
