"""Long floating-point sums split into chunks of at most MAX_SUM_CHUNK terms
(passes/split_reductions.py), whatever their parallelism, padding an extent no chunk count
divides; C++ kernels add each block of SUM_BLOCK terms into a fresh partial sum."""

import math

import torch
from planning import plan, tensor_graph

from kiln.codegen import cpp, cpp_reductions
from kiln.ir.tensor import Op
from kiln.passes.split_reductions import MAX_SUM_CHUNK, split_reductions


def _sum_extents(graph) -> list[int]:
    return [math.prod(n.inputs[0].shape[a] for a in n.attrs[1]) for n in graph.nodes
            if n.op is Op.REDUCE and n.attrs[0] == "sum"]


def test_a_long_sum_over_a_prime_extent_is_padded_and_split_in_chunks():
    n = 200_003  # prime: no chunk count divides it
    graph, split = split_reductions(tensor_graph(lambda x: x.sum(0), torch.randn(n, 3)), 0, 64)
    extents = _sum_extents(graph)
    assert split >= 1 and len(extents) == 2 and max(extents) <= MAX_SUM_CHUNK
    assert math.prod(extents) >= n


def test_sums_of_integers_and_short_sums_are_not_split():
    graph = tensor_graph(lambda x, i: (x.sum(-1), i.sum(0)), torch.randn(8, 4096),
                         torch.randint(0, 9, (200_003,)))
    assert split_reductions(graph, 0, 64)[1] == 0


def test_cpp_sums_long_rows_in_blocks_with_64_bit_counters():
    _, (row,) = plan(lambda x: x.sum(-1), torch.randn(4, 3 * cpp_reductions.SUM_BLOCK + 5))
    _, (column,) = plan(lambda x: x.sum(0), torch.randn(3 * cpp_reductions.SUM_BLOCK + 5, 70))
    for kernel in (row, column):
        source = cpp.render_kernel(kernel)
        assert f"+= {cpp_reductions.SUM_BLOCK})" in source and "_block" in source, source
        assert "for (int " not in source and "int32_t" not in source  # counts may pass 2**31
