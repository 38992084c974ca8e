"""The online softmax sum: rule sum_of_exp_in_one_pass on its own, the kernel IR it leads to
(the row's maximum and its sum of exp in one loop), and both renderers' text for it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from planning import plan, tensor_graph
from test_rules import inp, pw, row_of, row_reduce

from kiln.codegen import cpp, triton
from kiln.codegen import triton_launch as launch
from kiln.ir import index as ix
from kiln.ir import kernel as k
from kiln.ir.evaluate import evaluate
from kiln.ir.tensor import Builder, Op, dim_syms
from kiln.lower import core
from kiln.passes import simplify as s
from kiln.passes.split_reductions import split_reductions

SHAPE = (2, 3)


def sum_of_shifted_exp(b: Builder, x, shift=None):
    """sum(exp(x - max shift)) over dimension 1 (shift: x by default)."""
    row_max = row_reduce(b, "max", shift if shift is not None else x)
    return row_reduce(b, "sum", pw(b, "exp", pw(b, "sub", x, row_of(b, row_max))))


def test_sum_of_exp_less_the_row_maximum_is_one_online_reduction():
    b = Builder()
    x = inp(b)
    out = s.sum_of_exp_in_one_pass(b, sum_of_shifted_exp(b, x))
    assert out is not None and out.op is Op.REDUCE and out.attrs == ("expsum", (1,))
    assert out.inputs == (x,)  # reads the row itself, not its maximum
    values = torch.randn(SHAPE) * 30
    got = evaluate([out], {x: values}, wide=False)[out]
    expected = torch.exp(values - values.amax(1, keepdim=True)).sum(1)
    torch.testing.assert_close(got.float(), expected)


def test_sum_of_exp_needs_its_own_rows_maximum_of_the_same_values():
    b = Builder()
    x, y = inp(b, 0), inp(b, 1)
    assert s.sum_of_exp_in_one_pass(b, sum_of_shifted_exp(b, x, shift=y)) is None
    assert s.sum_of_exp_in_one_pass(b, row_reduce(b, "sum", pw(b, "exp", x))) is None
    flipped = ix.as_expr(SHAPE[0] - 1) - ix.as_expr(dim_syms(SHAPE)[0])
    other_rows = core.view(b, row_reduce(b, "max", x), [flipped], SHAPE)
    shifted = pw(b, "exp", pw(b, "sub", x, other_rows))
    assert s.sum_of_exp_in_one_pass(b, row_reduce(b, "sum", shifted)) is None
    # a maximum over other axes than the sum's
    col_max = b.make(Op.REDUCE, (x,), ("max", (0,)), (SHAPE[1],), x.dtype)
    shifted = pw(b, "exp", pw(b, "sub", x, core.expand(b, core.unsqueeze(b, col_max, 0), SHAPE)))
    assert s.sum_of_exp_in_one_pass(b, row_reduce(b, "sum", shifted)) is None


def test_rows_a_backend_keeps_whole_stay_in_two_passes():
    # a row kept whole (registers, a local array) is read once either way; its exps, computed
    # once, serve a softmax's numerator too
    b = Builder()
    x = inp(b)
    total = sum_of_shifted_exp(b, x)
    assert s.sum_of_exp_in_one_pass(b, total, row_kept=SHAPE[1]) is None
    assert s.sum_of_exp_in_one_pass(b, total, row_kept=SHAPE[1] - 1) is not None
    (online,) = [r for r in s.all_rules(row_kept=SHAPE[1]) if r.__name__ == "sum_of_exp_in_one_pass"]
    assert online(b, total) is None and online.__doc__


def test_sum_of_exp_in_low_precision_is_left_alone():
    b = Builder()
    x = inp(b, dtype=torch.bfloat16)
    assert s.sum_of_exp_in_one_pass(b, sum_of_shifted_exp(b, x)) is None


def test_softmax_still_divides_once_per_row_by_the_online_sum():
    b = Builder()
    x = inp(b)
    total = s.sum_of_exp_in_one_pass(b, sum_of_shifted_exp(b, x))
    e = pw(b, "exp", pw(b, "sub", x, row_of(b, row_reduce(b, "max", x))))
    out = s.divide_by_softmax_sum(b, pw(b, "div", e, row_of(b, total)))
    assert out is not None and out.fn == "mul"


def _row_stages(kernel: k.Kernel, param: str) -> list[int]:
    """The loop stages of kernel that load param along its rows."""
    return [i for i, st in enumerate(kernel.stages) if st.loop and any(
        isinstance(x, k.Load) and x.buf == param and any(x.index.coef(r) == 1 for r in kernel.reduce)
        for x in st.body)]


def _reduce_kinds(stage: k.Stage) -> list[str]:
    return [x.kind for x in stage.body if isinstance(x, k.Reduce)]


def test_log_softmax_reads_its_row_once_before_writing():
    _, kernels = plan(lambda x: torch.log_softmax(x, -1), torch.randn(4, 64))
    (kernel,) = kernels
    stages = _row_stages(kernel, "in0")
    assert len(stages) == 2  # one pass for max and sum, one writing the result
    assert _reduce_kinds(kernel.stages[stages[0]]) == ["max", "expsum"]
    assert "reduce.expsum(t1)" in k.kernel_str(kernel)


def test_cross_entropy_forward_reads_the_logits_once():
    def loss(x, t):
        return F.cross_entropy(x, t, ignore_index=2)

    _, kernels = plan(loss, torch.randn(4, 64), torch.randint(0, 64, (4,)))
    over_rows = [kern for kern in kernels if kern.reduce_numel == 64]
    (kernel,) = over_rows
    (stage,) = _row_stages(kernel, "in0")
    assert _reduce_kinds(kernel.stages[stage]) == ["max", "expsum"]


def _softmax_kernel(cols: int) -> k.Kernel:
    _, kernels = plan(lambda x: torch.softmax(x, -1), torch.randn(4, cols))
    (kernel,) = kernels
    return kernel


def test_cpp_rescales_the_sum_once_per_block():
    source = cpp.render_kernel(_softmax_kernel(3000))
    assert "reduction(max:t3_bmax)" in source  # the block's maximum, from values in L1
    assert "t3 *= expf(t3_max - t3_shift);" in source
    assert "t3_block += expf(t1 - t3_shift);" in source
    assert source.count("for (int64_t r0_block") == 1


def test_triton_loops_rows_too_long_for_one_tile_once_for_max_and_sum():
    kernel = _softmax_kernel(launch.PERSISTENT_MAX + 100)
    assert not launch.is_persistent(kernel)
    source = triton.render_kernel(kernel)
    assert source.count("for roffset in range") == 2  # max and sum, then the normalization
    assert "t3_acc = t3_acc * tl.exp(t3_max - t3_shift)" in source
    persistent = triton.render_kernel(_softmax_kernel(1000))
    assert "for roffset" not in persistent and "t3_shift" in persistent


def test_long_rows_read_again_keep_few_rows_in_flight():
    # softmax over bf16 rows of 50304: after the max and sum, the normalization reads the row
    # again, which comes from L2 only while the rows in flight fit there
    softmax = _softmax_kernel_of(torch.randn(2, 50304, dtype=torch.bfloat16))
    tile = launch.long_row_tile(softmax)
    assert tile.config == (8192, 32) and "read again" in tile.reason
    assert launch.launch_config(softmax, False) == (1, 8192, 32)
    assert launch.candidate_configs(softmax)[0] == (1, 8192, 32)
    # cross-entropy's forward reads each row once: the default tile
    _, kernels = plan(lambda x, t: F.cross_entropy(x.float(), t), torch.randn(2, 50304, dtype=torch.bfloat16),
                      torch.tensor([0, 5]))
    (forward,) = [kern for kern in kernels if kern.reduce_numel == 50304]
    assert launch.long_row_tile(forward).config == (2048, 8)


def _softmax_kernel_of(x: torch.Tensor) -> k.Kernel:
    _, kernels = plan(lambda x: torch.softmax(x, -1), x)
    (kernel,) = kernels
    return kernel


def test_an_online_sum_over_few_rows_splits_as_its_two_passes():
    graph = tensor_graph(lambda x: torch.log_softmax(x, -1), torch.randn(4, 8192))
    assert "reduce.expsum" in str(graph)
    split, count = split_reductions(graph, busy_programs=1024, column_block=32)
    kinds = [n.attrs[0] for n in split.nodes if n.op is Op.REDUCE]
    assert count == 2 and "expsum" not in kinds
    assert kinds.count("max") == 2 and kinds.count("sum") == 2  # partials, then their totals
    x = torch.randn(4, 8192) * 5
    (root,) = split.output_nodes()
    (inp_node,) = [n for n in split.nodes if n.op is Op.INPUT]
    got = evaluate([root], {inp_node: x}, wide=False)[root]
    torch.testing.assert_close(got.float(), torch.log_softmax(x, -1), rtol=1e-5, atol=1e-5)
    # rows enough to keep the GPU busy: one online pass a row
    _, count = split_reductions(graph, busy_programs=4, column_block=32)
    assert count == 0
