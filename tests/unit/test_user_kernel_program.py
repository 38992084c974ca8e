"""A user's Triton kernel in the host program (ir/host.py LaunchUser): its text, its JSON form,
the sizes of its grid, and the memory plan's rule for the copies before it
(passes/memory.py drop_dead_copies)."""

from __future__ import annotations

import json

import pytest
import sympy
import torch
from torch.utils._sympy.functions import FloorDiv
from triton_user_kernels import add_kernel

from kiln.ir.host import (
    Alloc,
    CallAten,
    HostProgram,
    InputSpec,
    Item,
    LaunchUser,
    Ref,
    Return,
    View,
    constants_blob,
    find_user_kernel,
    kernel_identity,
)
from kiln.ir.sizes import parse, size_symbol
from kiln.ir.sizes import text as size_text
from kiln.passes.memory import drop_dead_copies, plan_memory, update_inputs_in_place

NAME, DIGEST = kernel_identity(add_kernel)
F32 = torch.float32


def _launch(x: str, clones=("x_ptr", "out_ptr")) -> LaunchUser:
    args = (("x_ptr", Ref(x)), ("y_ptr", Ref("arg1")), ("out_ptr", Ref("buf3")), ("n", 64), ("BLOCK", 64))
    return LaunchUser("buf4", NAME, DIGEST, (1, 1, 1), args, clones, ("x_ptr", "out_ptr"))


def _program(*body) -> HostProgram:
    inputs = tuple(InputSpec(f"arg{k}", k, F32, (64,), (1,), "cpu") for k in range(2))
    return HostProgram("cpu", "pointers", 2, inputs, tuple(body))


def _alloc(name: str) -> Alloc:
    return Alloc(name, (64,), (1,), F32)


def _tail(*later) -> tuple:
    return (*later, Item("buf5", "buf4", 1), Return((Ref("buf5"),)))


def test_its_text_names_the_kernel_grid_arguments_and_copies():
    text = str(_program(_alloc("buf2"), _alloc("buf3"), _launch("buf2"), *_tail()))
    assert (
        f"buf4 = launch_user {NAME} {DIGEST} grid [1, 1, 1](x_ptr=buf2, y_ptr=arg1, out_ptr=buf3, n=64, "
        "BLOCK=64) copies x_ptr, out_ptr returns (x_ptr, out_ptr)"
    ) in text


def test_it_round_trips_through_json():
    program = _program(_alloc("buf2"), _alloc("buf3"), _launch("buf2"), *_tail())
    again = HostProgram.from_dict(json.loads(json.dumps(program.to_dict())), constants_blob(program))
    assert again == program


def test_a_kernel_no_import_finds_cannot_be_stored():
    launch = LaunchUser("buf4", "nowhere_module:add", "0" * 16, (1,), (), (), ())
    with pytest.raises(ValueError, match="cannot be stored.*nowhere_module"):
        _program(launch, Return(())).to_dict()
    with pytest.raises(LookupError, match="another source"):
        find_user_kernel(NAME, "0" * 16)


def test_a_floor_division_in_a_grid_reads_back_as_itself():
    s = size_symbol("s0")
    for size in (FloorDiv(s + 63, 64), 3 * FloorDiv(s, 2), sympy.Mod(s, 4), 2 * s + 1):
        assert parse(size_text(size)) == size


def test_the_copies_of_buffers_dead_after_the_launch_are_dropped():
    body, dropped = drop_dead_copies((_alloc("buf2"), _alloc("buf3"), _launch("buf2"), *_tail()))
    assert dropped == 2 and next(i for i in body if isinstance(i, LaunchUser)).clones == ()


@pytest.mark.parametrize(
    "case",
    [
        "read later",  # x's buffer is read after the launch
        "an input",  # the caller's memory
        "a view",  # the buffer is read through another name
        "returned",  # the caller gets its memory
    ],
)
def test_a_copy_stays_where_the_buffer_is_needed_after(case):
    x = {"an input": "arg0", "a view": "view2"}.get(case, "buf2")
    before = [_alloc("buf2"), _alloc("buf3")]
    if case == "a view":
        before.append(View("view2", "buf2", (64,), (1,)))
    later = (
        [CallAten("buf9", "aten::neg.default", (Ref("buf2"),), may_alias=False)]
        if case == "read later"
        else []
    )
    body = [*before, _launch(x), *later, Item("buf5", "buf4", 1)]
    body.append(Return((Ref("buf5"), Ref("buf2")) if case == "returned" else (Ref("buf5"),)))
    planned, _ = drop_dead_copies(tuple(body))
    assert next(i for i in planned if isinstance(i, LaunchUser)).clones == ("x_ptr",)


def test_a_buffer_written_in_place_of_its_copy_takes_no_arena_slot():
    """The launch's result is that buffer's memory: a slot given to a later temporary would
    overwrite it while it is still read."""
    program = _program(_alloc("buf2"), _alloc("buf3"), _launch("buf2"), *_tail())
    planned, plan = plan_memory(program)
    assert plan.copies_dropped == 2
    assert all(i.slot is None for i in planned.body if isinstance(i, Alloc) and i.out in ("buf2", "buf3"))


def _updating_input(*later) -> HostProgram:
    """acc (arg0) written by the kernel through its copy, AOTAutograd's copy_ putting it back."""
    args = (("acc_ptr", Ref("arg0")), ("x_ptr", Ref("arg1")), ("n", 64), ("BLOCK", 64))
    launch = LaunchUser("buf4", NAME, DIGEST, (1, 1, 1), args, ("acc_ptr",), ("acc_ptr",))
    update = CallAten("buf6", "aten::copy_.default", (Ref("arg0"), Ref("buf5")))
    return _program(launch, Item("buf5", "buf4", 0), *later, update, Return(()))


def test_a_kernel_updating_an_input_writes_it_as_in_eager():
    body, written = update_inputs_in_place(_updating_input())
    assert written == 1 and next(i for i in body if isinstance(i, LaunchUser)).clones == ()
    assert not any(isinstance(i, CallAten) for i in body)  # the copy_ back is gone


def test_an_input_read_after_the_kernel_keeps_its_copy():
    later = CallAten("buf9", "aten::neg.default", (Ref("arg0"),), may_alias=False)  # the old value
    body, written = update_inputs_in_place(_updating_input(later))
    assert written == 0 and next(i for i in body if isinstance(i, LaunchUser)).clones == ("acc_ptr",)
    assert sum(isinstance(i, CallAten) for i in body) == 2
