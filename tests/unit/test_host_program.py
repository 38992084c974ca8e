"""The host program as data (ir/host.py): its text, its JSON form, the Python generated from it
(codegen/host.py) and its memory plan (passes/memory.py)."""

from __future__ import annotations

import gc
import json
import os
import re
import threading

import pytest
import torch
from conftest import assert_same, run_compiled

from kiln.codegen import host as host_codegen
from kiln.codegen.backends import get_backend
from kiln.ir.checks import Check
from kiln.ir.host import (
    NAN,
    Alloc,
    CallAten,
    CheckErrors,
    ConstRef,
    CopyMemory,
    EagerLayout,
    EnsureLayout,
    Free,
    HostProgram,
    InputSpec,
    Item,
    Launch,
    Ref,
    Restride,
    Return,
    Slot,
    View,
    arena_bytes,
    constants_blob,
    op_name,
    resolve_op,
)
from kiln.options import Options
from kiln.passes.host_plan import kernel_digest
from kiln.passes.memory import pack_arena, plan_memory
from kiln.runtime import host_ops
from kiln.tools.explain import report_text


def _kernel_aten_view(x, w):
    """A kernel (tanh), an ATen call (the matmul), a kernel (relu + 1), and a view of an input."""
    return torch.relu(torch.tanh(x) @ w) + 1, x.t()


GOLDEN = """\
host program on cpu, launchers take pointers, 2 args
input arg0 = args[0] : f32[8, 16] stride [16, 1] on cpu
input arg1 = args[1] : f32[16, 4] stride [4, 1] on cpu
kernel kiln_tanh_0 <digest>
kernel kiln_relu_add_1 <digest>
slot 0 : f32[128] at byte 0
  buf2 = alloc f32[8, 16] stride [16, 1] in slot 0
  launch kiln_tanh_0(arg0, buf2) writes buf2
  buf3 = call aten::mm.default(buf2, arg1) fresh
  free arg1
  buf3 = ensure_layout buf3 f32[8, 4] stride [4, 1]
  buf7 = alloc f32[8, 4] stride [4, 1]
  launch kiln_relu_add_1(buf3, buf7) writes buf7 aligned
  free buf3
  out1 = view arg0 [16, 8] stride [1, 16] offset 0
  return (buf7, out1)"""


# Triton launchers take tensors; without a GPU they run in Triton's interpreter only
TARGETS = ["cpp", pytest.param("triton", marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton on the CPU needs TRITON_INTERPRET=1"))]


def _compiled_report(fn, *args, target: str = "cpp"):
    out, report = run_compiled(fn, *args, target=target)
    assert_same(out, fn(*args))
    return report


def test_golden_text_of_a_kernel_an_aten_call_and_a_view_output():
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    out, report = run_compiled(_kernel_aten_view, x, w, matmul_templates=False)  # the mm as an ATen call
    assert_same(out, _kernel_aten_view(x, w))
    text = str(report.host_program)
    assert text in report_text(report, show_kernels=True)  # what kiln explain shows
    assert re.sub(r"(kernel \w+) [0-9a-f]{16}", r"\1 <digest>", text) == GOLDEN
    # kernels are named by content: the digest is the kernel IR's
    assert [line.split()[2] for line in text.splitlines() if line.startswith("kernel ")] == [
        kernel_digest(k) for k in report.kernels
    ]


def _every_instruction() -> HostProgram:
    """A program using every instruction and every kind of literal (not meant to run)."""
    f32 = torch.float32
    body = (
        Alloc("buf1", (4, 4), (4, 1), f32, slot=0),
        Alloc("buf2", (4, 4), (1, 4), f32),
        View("view3", "buf1", (2, 4), (8, 1), 2),
        Launch("kernel0", ("arg0", "view3", "buf2"), ("buf2",), (0, 2), True),
        CallAten("buf4", "aten::full.default", ([4, 4], float("inf")),
                 (("dtype", torch.float16), ("layout", torch.strided), ("device", torch.device("cpu")),
                  ("pin_memory", False)), may_alias=False),
        CallAten("buf5", "aten::add.Tensor", (Ref("buf2"), ConstRef("const0")), (("alpha", -0.5),)),
        CallAten("buf12", "aten::fill.Scalar", (Ref("buf2"), NAN), may_alias=False),
        CallAten("buf6", "aten::split.Tensor", (Ref("buf5"), 2)),
        CallAten("buf10", "aten::clone.default", (Ref("buf5"),),
                 (("memory_format", torch.contiguous_format),), may_alias=False),
        CallAten("buf11", "aten::cat.default", ([Ref("buf5"), Ref("buf2")], 1j + 2.5), may_alias=False),
        Item("buf7", "buf6", 1),
        EnsureLayout("buf7", "buf7", (2, 4), (4, 1), f32),
        EagerLayout("out0", "buf4", (4, 4), (1, 4)),
        Restride("out1", "buf2", (1, 4)),
        CopyMemory("copy0", "arg0"),
        Free("buf1"),
        CheckErrors(),
        Return((Ref("out0"), Ref("out1"), Ref("buf7"), None, 3, 2.0, ConstRef("const0"))),
    )
    inputs = (InputSpec("arg0", 0, f32, (4, 4), (4, 1), "cpu"),)
    return HostProgram("cpu", "pointers", 2, inputs, body, (("kernel0", "0123456789abcdef"),),
                       (Slot(f32, 16, 0),), (Check("index_select", 0, 4, 0), Check("divide_by_zero")),
                       {"const0": torch.randn(4, 4)})


def _through_json(program: HostProgram) -> HostProgram:
    data = json.loads(json.dumps(program.to_dict(), allow_nan=False))
    return HostProgram.from_dict(data, constants_blob(program))


def test_round_trip_through_json_gives_an_equal_program_and_text():
    program = _every_instruction()
    again = _through_json(program)
    assert again == program
    assert str(again) == str(program)
    changed = HostProgram(**{**program.__dict__, "constants": {"const0": torch.randn(4, 4)}})
    assert str(changed) != str(program)  # the text (a cache key) covers constants' values
    assert set(again.constants) == {"const0"}
    assert torch.equal(again.constants["const0"], program.constants["const0"])
    calls = {i.out: i for i in again.body if isinstance(i, CallAten)}
    assert calls["buf4"].args[1] == float("inf") and dict(calls["buf4"].kwargs)["dtype"] is torch.float16
    assert isinstance(calls["buf11"].args[0], list)  # lists stay lists, tuples tuples


def test_a_program_with_an_unnamed_callable_runs_but_does_not_serialize():
    body = (CallAten("buf0", ConstRef("fn0"), ()), Return((Ref("buf0"),)))
    program = HostProgram("cpu", "pointers", 0, (), body, constants={"fn0": lambda: torch.ones(2)})
    assert torch.equal(host_codegen.load(program, {})([])[0], torch.ones(2))
    with pytest.raises(ValueError, match="cannot be serialized: fn0"):
        program.to_dict()


def test_bad_serialized_programs_are_refused_with_the_reason():
    data = _every_instruction().to_dict()
    with pytest.raises(ValueError, match="format 0"):
        HostProgram.from_dict({**data, "version": 0})
    with pytest.raises(ValueError, match="does not know: \\['Prefetch'\\]"):
        HostProgram.from_dict({**data, "body": [{"instr": "Prefetch"}]})
    with pytest.raises(ValueError, match="constants \\['const0'\\] are missing"):
        HostProgram.from_dict(data)
    call = CallAten("buf0", "aten::no_such_op.default", ())
    program = HostProgram("cpu", "pointers", 0, (), (call, Return((Ref("buf0"),))))
    with pytest.raises(ValueError, match="calls aten::no_such_op.default, which this PyTorch does not have"):
        host_codegen.load(program, {})


def test_constants_inside_argument_lists_are_passed_as_their_values():
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    body = (
        CallAten("buf0", "aten::cat.default", ([ConstRef("const0"), ConstRef("const1")], 1), may_alias=False),
        CallAten("buf1", "aten::stack.default", ([Ref("arg0"), ConstRef("const1")],), may_alias=False),
        Return((Ref("buf0"), Ref("buf1"))),
    )
    program = HostProgram("cpu", "pointers", 1, (), body, constants={"const0": a, "const1": b})
    x = torch.randn(2, 3)
    cat, stack = host_codegen.load(_through_json(program), {})([x])
    assert_same(cat, torch.cat([a, b], 1))
    assert_same(stack, torch.stack([x, b]))


def test_ops_are_found_again_by_their_qualified_names():
    for op in (torch.ops.aten.add.Tensor, torch.ops.aten.mm.default, torch.ops.aten.split.Tensor):
        assert resolve_op(op_name(op)) is op
    assert op_name(torch.ops.aten.mm.default) == "aten::mm.default"
    assert op_name(lambda x: x) is None  # no name leads back to a lambda


def _launchers(report) -> dict:
    """Launchers of the report's kernels, looked up by name (built before: from the cache)."""
    backend = get_backend(report.backend, Options())
    fns, _ = backend.build(report.kernels, [report.sources[k.name] for k in report.kernels])
    return {k.name: fn for k, fn in zip(report.kernels, fns)}


def _gather_and_constant(x, i):
    return torch.index_select(x, 0, i).sum(1), x.new_tensor([1.0, 2.0, 3.0]) * x[0, :3], x.t() * 2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn, make_inputs", [
    (_kernel_aten_view, lambda: (torch.randn(8, 16), torch.randn(16, 4))),
    (_gather_and_constant, lambda: (torch.randn(8, 5), torch.randint(0, 8, (6,)))),
])
def test_a_program_rebuilt_from_json_runs_like_eager(fn, make_inputs, target):
    report = _compiled_report(fn, *make_inputs(), target=target)
    assert report.host_program.launch_abi == ("pointers" if target == "cpp" else "tensors")
    program = _through_json(report.host_program)
    assert str(program) == str(report.host_program)
    call = host_codegen.load(program, _launchers(report), check_inputs=True)
    for _ in range(2):  # fresh inputs each call; the arena is reused across calls
        args = make_inputs()
        expected = fn(*args)
        assert_same(call(list(args)), expected)


def test_a_rebuilt_program_checks_its_inputs_and_raises_eager_errors():
    report = _compiled_report(_gather_and_constant, torch.randn(8, 5), torch.randint(0, 8, (6,)))
    call = host_codegen.load(_through_json(report.host_program), _launchers(report), check_inputs=True)
    with pytest.raises(TypeError, match=r"input 0 \(arg0\) has dtype torch.float64"):
        call([torch.randn(8, 5, dtype=torch.float64), torch.randint(0, 8, (6,))])
    with pytest.raises(ValueError, match=r"input 1 \(arg1\) has sizes \(5,\)"):
        call([torch.randn(8, 5), torch.randint(0, 8, (5,))])
    with pytest.raises(ValueError, match=r"input 0 \(arg0\) has strides \(1, 8\)"):
        call([torch.randn(5, 8).t(), torch.randint(0, 8, (6,))])
    with pytest.raises(TypeError, match="takes 2 arguments, got 1"):
        call([torch.randn(8, 5)])
    with pytest.raises(IndexError, match="index out of range in self"):
        call([torch.randn(8, 5), torch.tensor([0, 8, 1, 2, 3, 4])])


# --- the memory pass, on programs whose "kernels" are Python functions of tensors ---


def _double(src, dst):
    dst.copy_(src * 2)


def _chain(keep_middle_as_view: bool = False) -> HostProgram:
    """t1 = 2 x; t2 = 2 t1; t3 = 2 t2 (t1's slot is free again); out = 2 t3 + its transpose by ATen."""
    f32, shape, stride = torch.float32, (4, 4), (4, 1)
    body = [Alloc(f"t{k}", shape, stride, f32) for k in (1,)]
    body += [Launch("double", ("arg0", "t1"), ("t1",), aligned=True)]
    body += [Alloc("t2", shape, stride, f32), Launch("double", ("t1", "t2"), ("t2",), aligned=True)]
    if keep_middle_as_view:  # returned at the end, read last by the next launch
        body += [View("out_t2", "t2", (16,), (1,), 0)]
    body += [Alloc("t3", shape, stride, f32), Launch("double", ("t2", "t3"), ("t3",), aligned=True)]
    body += [Alloc("t4", shape, stride, f32), Launch("double", ("t3", "t4"), ("t4",), aligned=True)]
    body += [CallAten("t5", "aten::t.default", (Ref("t4"),))]  # a view of t4: t4's memory stays t4's
    body += [Alloc("t6", shape, stride, f32), Launch("double", ("t5", "t6"), ("t6",), aligned=True)]
    body += [Alloc("out", shape, stride, f32), Launch("double", ("t6", "out"), ("out",), aligned=True)]
    body.append(Return((Ref("out"), Ref("out_t2")) if keep_middle_as_view else (Ref("out"),)))
    inputs = (InputSpec("arg0", 0, f32, shape, stride, "cpu"),)
    return HostProgram("cpu", "tensors", 1, inputs, tuple(body))


def _slots(program: HostProgram) -> dict[str, int | None]:
    return {i.out: i.slot for i in program.body if isinstance(i, Alloc)}


def _run(program: HostProgram, x: torch.Tensor) -> list:
    _double.aligned = _double
    return host_codegen.load(program, {"double": _double})([x])


def test_the_memory_pass_reuses_a_dead_buffers_slot():
    planned, plan = plan_memory(_chain())
    slots = _slots(planned)
    assert slots["t3"] == slots["t1"] != slots["t2"]  # t1 is dead once t2 is computed
    assert slots["t6"] in (slots["t1"], slots["t2"])
    assert plan.reused == 2 and planned.arena == (Slot(torch.float32, 16, 0), Slot(torch.float32, 16, 64))
    with pytest.raises(ValueError, match="planned already"):
        plan_memory(planned)
    assert Free("arg0") in planned.body and Free("t5") in planned.body
    x = torch.randn(4, 4)
    first = _run(planned, x.clone())
    keep = first[0].clone()
    second = _run(planned, torch.randn(4, 4))  # the arena is reused: the first output is not in it
    assert torch.equal(first[0], keep) and torch.equal(keep, x.t() * 64) and not torch.equal(second[0], keep)


def test_temporaries_never_alive_together_share_arena_bytes_whatever_their_shapes():
    f32, f64, f16 = torch.float32, torch.float64, torch.float16
    # a 128-byte temporary alive over instructions 2-3 takes offset 0; a 64-byte one alive
    # over 0-5 overlaps it in time and goes above it; one alive over 4-8 meets only the second
    assert pack_arena([(f32, 16, 0, 5), (f32, 32, 2, 3), (f32, 16, 4, 8)]) == [128, 0, 0]
    shape, stride = (4, 4), (4, 1)
    body, src = [], "arg0"
    for out, dtype in (("t1", f32), ("t2", f64), ("t3", f16), ("out", f32)):
        body += [Alloc(out, shape, stride, dtype), Launch("double", (src, out), (out,), aligned=True)]
        src = out
    body.append(Return((Ref("out"),)))
    inputs = (InputSpec("arg0", 0, f32, shape, stride, "cpu"),)
    planned, plan = plan_memory(HostProgram("cpu", "tensors", 1, inputs, tuple(body)))
    # t2 (128 bytes) meets t1 and t3, which never meet: one offset for both, though their
    # dtypes differ (slots one per dtype and extent would take 64 + 128 + 64 bytes)
    assert plan.pooled == 3 and arena_bytes(planned.arena) == 128 + 64
    assert {s.offset for s in planned.arena} == {0, 128} and len(planned.arena) == 3
    x = torch.randn(4, 4)
    expected = (((x * 2).double() * 2).half() * 2).float() * 2
    assert torch.equal(_run(planned, x.clone())[0], expected)


def _doublings(side: int) -> HostProgram:
    """x doubled three times through temporaries of side x side (two slots), then into the output."""
    f32, shape, stride = torch.float32, (side, side), (side, 1)
    body, src = [], "arg0"
    for out in ("t1", "t2", "t3", "out"):
        body += [Alloc(out, shape, stride, f32), Launch("double", (src, out), (out,), aligned=True)]
        src = out
    body.append(Return((Ref("out"),)))
    return HostProgram("cpu", "tensors", 1, (InputSpec("arg0", 0, f32, shape, stride, "cpu"),), tuple(body))


def test_programs_on_a_thread_share_one_arena_freed_with_them():
    small, large = (plan_memory(_doublings(side))[0] for side in (4, 8))
    assert arena_bytes(small.arena) == 2 * 64 and arena_bytes(large.arena) == 2 * 256
    seen = {}

    def on_a_new_thread():  # a thread of its own: no other test's program holds its arena
        _double.aligned = _double
        calls = {side: host_codegen.load(p, {"double": _double}) for side, p in ((4, small), (8, large))}
        for side in (4, 8, 4):
            x = torch.randn(side, side)
            seen.setdefault("results", []).append(torch.equal(calls[side]([x.clone()])[0], x * 16))
        seen["held"] = host_ops.shared_arena_bytes()
        calls.clear()
        gc.collect()
        seen["after"] = host_ops.shared_arena_bytes()

    thread = threading.Thread(target=on_a_new_thread)
    thread.start()
    thread.join()
    assert seen == {"results": [True] * 3, "held": 2 * 256, "after": 0}  # the largest, not the sum


def test_a_program_started_inside_another_gets_memory_of_its_own():
    _double.aligned = _double
    inner = host_codegen.load(plan_memory(_doublings(4))[0], {"double": _double})
    inner_results = []

    def double_around_inner(src, dst):  # a "kernel" that runs another compiled program midway
        inner_results.append(torch.equal(inner([src.clone()])[0], src * 16))
        dst.copy_(src * 2)  # src lies in the outer program's arena: the inner one must not touch it

    double_around_inner.aligned = double_around_inner
    outer = host_codegen.load(plan_memory(_doublings(4))[0], {"double": double_around_inner})
    x = torch.randn(4, 4)
    assert torch.equal(outer([x.clone()])[0], x * 16) and inner_results == [True] * 4


def test_a_program_that_raises_hands_its_arena_back():
    def failing(src, dst):
        raise RuntimeError("the kernel failed")

    failing.aligned = failing
    call = host_codegen.load(plan_memory(_doublings(4))[0], {"double": failing})
    with pytest.raises(RuntimeError, match="the kernel failed"):
        call([torch.randn(4, 4)])
    assert not host_ops._SHARED.busy
    assert torch.equal(_run(plan_memory(_chain())[0], torch.ones(4, 4))[0], torch.full((4, 4), 64.0))


def test_the_memory_pass_never_pools_an_output_or_a_buffer_an_aten_view_shares():
    planned, plan = plan_memory(_chain(keep_middle_as_view=True))
    slots = _slots(planned)
    assert slots["out"] is None and slots["t4"] is None  # returned; viewed by aten::t's result
    assert slots["t2"] is None  # returned through a view of it
    assert plan.returned >= {"out", "out_t2", "t2"} and plan.shared == {"t4"}
    assert slots["t3"] == slots["t1"] is not None
    assert not any(isinstance(i, Free) and i.name in ("t2", "out") for i in planned.body)
    x = torch.randn(4, 4)
    out, middle = _run(planned, x)
    torch.testing.assert_close(middle, (x * 4).reshape(16))
    torch.testing.assert_close(out, x.t() * 64)


def test_without_an_arena_a_slot_is_its_first_buffer_viewed_again():
    planned, _ = plan_memory(_chain(), arena=False)
    assert planned.arena == ()
    assert View("t3", "t1", (4, 4), (4, 1), 0) in planned.body
    x = torch.randn(4, 4)
    torch.testing.assert_close(_run(planned, x)[0], x.t() * 64)


def _slot_kept_across_aten_results() -> HostProgram:
    """t1 dies at the first ATen call; t2, of its dtype and extent, begins after the third,
    where the program's peak is (big, big2 and their sum)."""
    f32, shape, stride = torch.float32, (4, 4), (4, 1)
    body = [Alloc("t1", shape, stride, f32), Launch("double", ("arg0", "t1"), ("t1",), aligned=True),
            CallAten("big", "aten::repeat.default", (Ref("t1"), [8, 1]), may_alias=False),
            CallAten("big2", "aten::repeat.default", (Ref("arg0"), [8, 1]), may_alias=False),
            CallAten("sum", "aten::add.Tensor", (Ref("big"), Ref("big2")), may_alias=False),
            Alloc("t2", shape, stride, f32), Launch("double", ("arg0", "t2"), ("t2",), aligned=True),
            Alloc("out", shape, stride, f32), Launch("double", ("t2", "out"), ("out",), aligned=True),
            Return((Ref("sum"), Ref("out")))]
    return HostProgram("cpu", "tensors", 1, (InputSpec("arg0", 0, f32, shape, stride, "cpu"),), tuple(body))


def test_without_an_arena_a_dead_slot_is_kept_only_where_it_raises_no_peak():
    """Kept for t2, t1's memory would be alive beside the three ATen results, the peak."""
    program = _slot_kept_across_aten_results()
    kept, _ = plan_memory(program, arena=False)
    assert View("t2", "t1", (4, 4), (4, 1), 0) in kept.body  # results of unknown size: no peak seen
    results = {name: (torch.float32, (32, 4)) for name in ("big", "big2", "sum")}
    freed, _ = plan_memory(program, arena=False, layouts=results)
    assert not any(isinstance(i, View) for i in freed.body), freed.body
    outs = [getattr(i, "out", None) for i in freed.body]
    assert freed.body.index(Free("t1")) < outs.index("big2"), freed.body
    x = torch.randn(4, 4)
    for planned in (kept, freed):
        total, out = _run(planned, x)
        torch.testing.assert_close(total, (x * 3).repeat(8, 1))
        torch.testing.assert_close(out, x * 4)


def _row_kernels(x):
    """Temporaries only kernels read: softmax rows, a layer norm, a column scan."""
    y = torch.softmax(x * 2, -1)
    return (torch.layer_norm(y + x, (16,)).cumsum(0) * y).sum(0)


def test_temporaries_only_kernels_read_are_passed_by_their_slots_address_in_each_thread():
    report = _compiled_report(_row_kernels, torch.randn(8, 16))
    assert "arena_address[0]" in report.host_source and "as_strided(arena[0]" not in report.host_source
    call = host_codegen.load(report.host_program, _launchers(report))
    inputs = [torch.randn(8, 16) for _ in range(4)]
    results: dict[int, list] = {}

    def work(k: int) -> None:
        results[k] = [call([inputs[k]]) for _ in range(20)]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, outs in results.items():
        for out in outs:
            assert_same(out[0], _row_kernels(inputs[k]))


def test_an_aten_result_of_another_rank_than_its_shape_function_is_pytorchs_error():
    from kiln import errors
    from kiln.runtime import host_ops

    with pytest.raises(errors.MetaMismatch, match="returned a 0-d result"):
        host_ops.restride(torch.tensor(1.0), (1,))
    assert_same(host_ops.restride(torch.randn(3, 4), (1, 3)).stride(), (1, 3))
