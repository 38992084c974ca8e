"""Matmuls with leading dimensions off 16 bytes run on padded operands: the rewritten graph
computes what the original did, in eager's layouts, and pads only where the copies pay."""

import dataclasses

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.frontend.matmul_alignment import align_matmuls
from kiln.passes.roofline import NOMINAL_GPU

aten = torch.ops.aten
SLOW_MATMULS = dataclasses.replace(NOMINAL_GPU, matmul_flop_per_s=1e6)  # padding always pays


def lm_head_step(x, w, b, g):
    logits = torch.nn.functional.linear(x, w, b)  # N = 30: the product's rows
    grad_x = g @ w  # K = 30, left operand row-major
    grad_w = g.t() @ x  # M = 30, left operand column-major
    return logits.view(2, 32, -1), grad_x, grad_w


def traced(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


def test_padded_matmuls_compute_the_same_in_eagers_layouts():
    args = torch.randn(64, 16), torch.randn(30, 16), torch.randn(30), torch.randn(64, 30)
    gm = traced(lm_head_step, *args)
    assert align_matmuls(gm, SLOW_MATMULS, devices=("cpu",)) == 3
    for got, want in zip(gm(*args), lm_head_step(*args)):
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
    for n in calls(gm, aten.mm.default) + calls(gm, aten.addmm.default):
        a, b = (arg.meta["val"] for arg in n.args[-2:])
        assert all(s % 4 == 0 for s in (*a.shape, *b.shape)), (a.shape, b.shape)
    # w padded once for the forward and grad_x; g padded once for grad_x and grad_w
    assert len(calls(gm, aten.constant_pad_nd.default)) == 3  # w, g, the bias


def test_graph_on_another_device_or_aligned_is_left_alone():
    args = torch.randn(64, 16), torch.randn(32, 16), torch.randn(32), torch.randn(64, 32)
    assert align_matmuls(traced(lm_head_step, *args), SLOW_MATMULS, devices=("cpu",)) == 0
    args = torch.randn(64, 16), torch.randn(30, 16), torch.randn(30), torch.randn(64, 30)
    assert align_matmuls(traced(lm_head_step, *args), SLOW_MATMULS) == 0  # CUDA only by default


def test_decode_step_does_not_copy_a_weight_to_pad_it():
    """A few rows against a large weight: the product is over in less time than copying the
    weight would take."""
    def head(x, w):
        return x @ w.t()

    x, w = torch.randn(4, 768, dtype=torch.bfloat16), torch.randn(50257, 768, dtype=torch.bfloat16)
    assert align_matmuls(traced(head, x, w), NOMINAL_GPU, devices=("cpu",)) == 0
    x = torch.randn(16384, 768, dtype=torch.bfloat16)  # a training batch: the copy pays
    assert align_matmuls(traced(head, x, w), NOMINAL_GPU, devices=("cpu",)) == 1


def test_compiled_training_step_with_padded_matmuls_matches_eager(monkeypatch):
    """Through the whole pipeline (here on the CPU, where kiln otherwise never pads): the
    padded forward and backward give eager's loss, logits and gradients."""
    import functools

    import kiln
    from kiln.frontend.backend import REPORTS
    from kiln.passes import pipeline

    monkeypatch.setattr(pipeline, "align_matmuls", functools.partial(align_matmuls, devices=("cpu",)))
    monkeypatch.setattr(pipeline, "_gpu_ceilings", lambda example_inputs: SLOW_MATMULS)
    head = torch.nn.Linear(16, 30)
    x, target = torch.randn(64, 16), torch.randint(0, 30, (64,))

    def step(x):
        logits = head(x)
        return logits, torch.nn.functional.cross_entropy(logits, target)

    results = []
    before = len(REPORTS)
    for fn in (step, kiln.compile(step)):
        torch._dynamo.reset()
        leaf = x.clone().requires_grad_()
        logits, loss = fn(leaf)
        loss.backward()
        grads = [leaf.grad, head.weight.grad.clone(), head.bias.grad.clone()]
        results.append([logits.detach(), loss.detach(), *grads])
        head.weight.grad = head.bias.grad = None
    aligned = [p.summary.split()[0] for r in REPORTS[before:] for p in r.passes if p.name == "align"]
    assert aligned == ["1", "2"], aligned  # the forward's product; the backward's two
    # the padded logits' gradient is one buffer, read as it is by one matmul, transposed by the other
    transposed = [d for r in REPORTS[before:] for d in r.decisions
                  if d.verdict == "alias" and d.reason.startswith("a transpose of")]
    assert len(transposed) == 1, transposed
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()


def test_one_pad_for_every_view_of_a_tensor_alike():
    """A backward views a gradient once per reader; views alike share one padded copy."""
    def backward(g, w, x):
        return g.view(64, 30) @ w, g.view(64, 30).t() @ x

    args = torch.randn(2, 32, 30), torch.randn(30, 16), torch.randn(64, 16)
    gm = traced(backward, *args)
    assert len(calls(gm, aten.view.default)) == 2
    assert align_matmuls(gm, SLOW_MATMULS, devices=("cpu",)) == 2
    for got, want in zip(gm(*args), backward(*args)):
        torch.testing.assert_close(got, want)
    pads = calls(gm, aten.constant_pad_nd.default)
    assert len(pads) == 2, pads  # g once, w once
