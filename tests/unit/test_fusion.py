"""Fusion decisions, read from the Schedule and its Decision values (no C++ is built)."""

from __future__ import annotations

import torch
from planning import plan

from kiln.passes.fusion import KernelPlan, Schedule


def kernel_plans(sched: Schedule) -> list[KernelPlan]:
    return [s for s in sched.steps if isinstance(s, KernelPlan)]


def verdicts(sched: Schedule, verdict: str) -> list:
    return [d for d in sched.decisions if d.verdict == verdict]


def test_element_wise_chain_is_one_kernel():
    sched, kernels = plan(lambda x, y: torch.sigmoid(torch.relu(x * 2 + y).exp() - 1), torch.randn(4, 8),
                          torch.randn(4, 8))
    assert len(kernels) == 1 and not kernels[0].reduce
    (only,) = kernel_plans(sched)
    assert only.axes == () and len(only.roots) == 1
    assert [n.op.value for n in sched.stored] == ["input", "input", "pointwise"]


def test_broadcast_and_views_are_recomputed_not_stored():
    sched, kernels = plan(lambda x, b: (x.t() + b).relu(), torch.randn(8, 4), torch.randn(8))
    assert len(kernels) == 1
    assert all(n.op.value in ("input", "pointwise") for n in sched.stored)


def test_softmax_is_one_kernel_with_both_reductions_fused():
    sched, kernels = plan(lambda x: torch.softmax(x, -1), torch.randn(4, 16))
    assert len(kernels) == 1 and kernels[0].is_reduction
    fused = verdicts(sched, "fused")
    assert [d.node.split()[1] for d in fused] == ["reduce.max", "reduce.expsum"]
    assert all("row by row" in d.reason for d in fused)
    assert not verdicts(sched, "stored")


def test_layer_norm_is_one_kernel():
    def f(x, w, b):
        return torch.nn.functional.layer_norm(x, (16,), w, b)

    sched, kernels = plan(f, torch.randn(4, 16), torch.randn(16), torch.randn(16))
    assert len(kernels) == 1
    assert verdicts(sched, "fused") and not verdicts(sched, "stored")


def test_reduction_along_columns_fuses_into_its_consumer():
    sched, kernels = plan(lambda x: x - x.sum(0), torch.randn(4, 8))
    assert len(kernels) == 1
    (only,) = kernel_plans(sched)
    assert only.iter_shape == (4, 8) and only.axes == (0,)


def test_reduction_read_at_another_row_is_stored_with_a_reason():
    def f(x):  # row i reads the sum of row 2 * (i % 2) + i // 2
        return x + x.sum(1).view(2, 2).t().reshape(4)[:, None]

    sched, kernels = plan(f, torch.randn(4, 8))
    assert len(kernels) == 2
    (stored,) = verdicts(sched, "stored")
    assert stored.node.endswith("reduce.sum")
    assert "not at its own row" in stored.reason and "%" in stored.reason


def test_reduction_consumed_over_another_domain_is_stored_with_a_reason():
    def f(x):
        s = x.sum(1)
        return s[:, None] * s[None, :]  # [4, 4]: no loop over the rows of x

    sched, kernels = plan(f, torch.randn(4, 8))
    assert len(kernels) == 2
    (stored,) = verdicts(sched, "stored")
    assert "iterates [4, 4] over axes []" in stored.reason


def test_extern_result_is_read_by_the_next_kernel():
    sched, kernels = plan(lambda x, w: torch.relu(x @ w) + 1, torch.randn(4, 8), torch.randn(8, 8))
    steps = ["kernel" if isinstance(s, KernelPlan) else str(s.attrs[0]) for s in sched.steps]
    assert steps == ["aten.mm.default", "kernel"]
    (extern,) = verdicts(sched, "extern")
    assert "aten.mm" in extern.node and extern.reason
    (kernel,) = kernels
    mm = next(s for s in sched.steps if not isinstance(s, KernelPlan))
    assert f"buf{mm.id}" in [a for a, p in zip(kernel.args, kernel.params) if not p.is_output]


def test_element_wise_producer_of_an_extern_is_one_kernel_before_it():
    sched, kernels = plan(lambda x, w: torch.tanh(x * 2 + 1) @ w, torch.randn(4, 8), torch.randn(8, 8))
    steps = ["kernel" if isinstance(s, KernelPlan) else str(s.attrs[0]) for s in sched.steps]
    assert steps == ["kernel", "aten.mm.default"]
    assert any("argument of ATen call aten.mm" in why for why in sched.stored.values())


def test_independent_kernels_over_the_same_domain_merge():
    sched, kernels = plan(lambda x, y: (x.sin(), y.cos()), torch.randn(4, 8), torch.randn(4, 8))
    assert len(kernels) == 1
    (only,) = kernel_plans(sched)
    assert len(only.roots) == 2
    (merged,) = verdicts(sched, "merged")
    assert "same domain [4, 8]" in merged.reason and "independent" in merged.reason


def test_unrelated_kernels_over_a_large_domain_stay_apart_where_the_backend_says():
    """A GPU merges kernels that share no buffer only over small domains (launch-bound ones);
    kernels that read a buffer in common merge at any size."""
    from planning import tensor_graph

    from kiln.passes.fusion import plan_stores, schedule
    from kiln.passes.layout import Layouts

    def f(x, y):
        return x.sin(), y.cos(), x.exp()

    graph = tensor_graph(f, torch.randn(64, 64), torch.randn(64, 64))
    stored, aliases, decisions = plan_stores(graph, Layouts(graph))
    merged_everywhere = schedule(graph, dict(stored), aliases, list(decisions))
    assert len(kernel_plans(merged_everywhere)) == 1
    small_only = schedule(graph, dict(stored), aliases, list(decisions), merge_unrelated_points=1024)
    roots = sorted(len(p.roots) for p in kernel_plans(small_only))
    assert roots == [1, 2], roots  # sin and exp read x; cos reads y alone
    assert len(kernel_plans(schedule(graph, dict(stored), aliases, list(decisions), 4096))) == 1


def test_dependent_kernels_do_not_merge():
    def f(x, w):
        h = x.sin()
        return h, (h @ w).cos()  # the cos kernel needs the mm, which needs the sin kernel

    sched, kernels = plan(f, torch.randn(4, 8), torch.randn(8, 8))
    assert len(kernels) == 2 and not verdicts(sched, "merged")


def test_kernels_over_different_domains_do_not_merge():
    sched, kernels = plan(lambda x, y: (x.sin(), y.cos()), torch.randn(4, 8), torch.randn(8, 4))
    assert len(kernels) == 2 and not verdicts(sched, "merged")


def test_output_view_of_an_input_is_an_alias():
    sched, kernels = plan(lambda x: x.t(), torch.randn(4, 8))
    assert not kernels
    (alias,) = verdicts(sched, "alias")
    assert "strided view" in alias.reason


def test_output_view_with_other_strides_than_eager_is_stored():
    # eager's .contiguous() gives strides (4, 1); an alias of x * 2 would have (1, 8)
    sched, kernels = plan(lambda x: (x * 2).t().contiguous(), torch.randn(4, 8))
    assert not verdicts(sched, "alias") and len(kernels) == 1


def test_every_decision_has_a_reason():
    def f(x, w):
        return torch.softmax(x @ w, -1), x.sum(1)[:, None] * x.sum(1)[None, :], x.t()

    sched, _ = plan(f, torch.randn(4, 8), torch.randn(8, 8))
    assert {d.verdict for d in sched.decisions} >= {"extern", "fused", "stored", "alias"}
    assert all(d.reason for d in sched.decisions)


def test_a_value_many_kernels_recompute_from_many_tensors_is_stored_once():
    def f(a, b, c, w):
        residual = a + b + c  # three reads, inlined into a kernel down columns and one along rows
        return residual.sum(0), residual.exp().sum(-1), torch.tanh(residual) @ w

    args = [torch.randn(4, 8) for _ in range(3)] + [torch.randn(8, 8)]
    sched, _ = plan(f, *args)
    stored = [d for d in verdicts(sched, "stored") if "re-reading up to 3 tensors" in d.reason]
    assert len(stored) == 1 and "pointwise.add" in stored[0].node


def test_consumers_over_one_domain_share_their_reads_and_recompute():
    """A LayerNorm's statistics, its output and its cast for the next matmul are one kernel,
    which reads the residual's inputs once: nothing is stored between them."""
    def f(a, b, c, w):
        residual = a + b + c
        return residual * 2, residual.exp().sum(-1), torch.tanh(residual) @ w

    args = [torch.randn(4, 8) for _ in range(3)] + [torch.randn(8, 8)]
    sched, _ = plan(f, *args)
    assert not [d for d in verdicts(sched, "stored") if "re-reading" in d.reason]
    kernels = kernel_plans(sched)
    assert len(kernels) == 1 and len(kernels[0].roots) == 3, kernels


def test_a_shared_value_whose_consumers_read_its_inputs_anyway_is_recomputed():
    def f(a, b, c):
        v = a + b + c  # three reads, but both consumers read a, b and c themselves
        return (v * a * b * c).sum(-1), v * (a - b + c)

    sched, _ = plan(f, *[torch.randn(4, 8) for _ in range(3)])
    assert not [d for d in verdicts(sched, "stored") if "re-reading" in d.reason]


def test_a_cheap_shared_value_is_recomputed():
    def f(a, b):
        x = a + b  # two reads only: recomputing beats storing
        return x * 2, x.exp().sum(-1)

    sched, _ = plan(f, torch.randn(4, 8), torch.randn(4, 8))
    assert not [d for d in verdicts(sched, "stored") if "re-reading" in d.reason]


def rotary(x, q, k, inv_freq):
    """A rotary embedding: cos and sin over [positions, dim], read over [batch, heads, ...]."""
    freqs = torch.arange(x.shape[-2], dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos(), emb.sin()
    return q * cos + k * sin, k * cos - q * sin


def test_math_a_broadcast_would_recompute_is_stored_once_on_the_cpu():
    from planning import tensor_graph

    from kiln.passes.fusion import plan_stores, schedule
    from kiln.passes.layout import Layouts
    from kiln.passes.roofline import NOMINAL_CPU

    def scheduled(batch: int, heads: int, positions: int, half: int):
        shape = (batch, heads, positions, 2 * half)
        graph = tensor_graph(rotary, torch.randn(shape), torch.randn(shape), torch.randn(shape),
                             torch.randn(half))
        stored, aliases, decisions = plan_stores(graph, Layouts(graph))
        cpu = schedule(graph, dict(stored), aliases, list(decisions), broadcast_math=NOMINAL_CPU)
        gpu = schedule(graph, dict(stored), aliases, list(decisions))  # a GPU recomputes them: no launch
        return cpu, gpu

    cpu, gpu = scheduled(2, 8, 128, 32)  # each consumer computes them at 16 times their points
    math_stored = [d for d in verdicts(cpu, "stored") if "stored once instead" in d.reason]
    assert sorted(d.node.split()[1] for d in math_stored) == ["pointwise.cos", "pointwise.sin"], cpu.decisions
    assert "over 8192 points would be computed at 262144 points" in math_stored[0].reason
    assert not [d for d in verdicts(gpu, "stored") if "cos" in d.node or "sin" in d.node]
    assert len(kernel_plans(gpu)) < len(kernel_plans(cpu))
    # a few thousand extra cosines cost less than the launch that storing them takes
    small, _ = scheduled(2, 4, 16, 4)
    assert not [d for d in verdicts(small, "stored") if "stored once instead" in d.reason], small.decisions


def test_math_read_at_its_own_points_stays_inlined():
    sched, _ = plan(lambda x, y: x.exp() * y + x.exp().sum(-1, keepdim=True), torch.randn(4, 8),
                    torch.randn(4, 8))
    assert not [d for d in verdicts(sched, "stored") if "exp" in d.node]
