"""Training with kiln: forward and backward graphs, optimizer steps, output memory."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import check

import kiln


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.ln, self.l2 = nn.Linear(32, 64), nn.LayerNorm(64), nn.Linear(64, 10)

    def forward(self, x, y):
        return F.cross_entropy(self.l2(F.gelu(self.ln(self.l1(x)))), y)


def test_training_steps_match_eager():
    torch.manual_seed(0)
    eager = Net()
    model = copy.deepcopy(eager)
    compiled = kiln.compile(model)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_k = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        loss_e, loss_k = eager(x, y), compiled(x, y)
        loss_e.backward()
        loss_k.backward()
        torch.testing.assert_close(loss_k, loss_e, rtol=1e-5, atol=1e-6)
        for (name, pe), pk in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(
                pk.grad, pe.grad, rtol=1e-4, atol=1e-6, msg=f"grad of {name}, step {step}"
            )
        for opt in (opt_e, opt_k):
            opt.step()
            opt.zero_grad()


def test_input_gradients():
    def f(x, w):
        return (torch.softmax(x @ w, -1) * torch.tanh(x).sum(-1, keepdim=True)).sum()

    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(16, 16, requires_grad=True)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    f(x, w).backward()
    kiln.compile(f)(x2, w2).backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w2.grad, w.grad, rtol=1e-4, atol=1e-5)


MAX_LIKE = {
    "inf_norm": lambda v: torch.linalg.vector_norm(v, ord=float("inf"), dim=-1),
    "amax": lambda v: v.amax(-1),
    "max": lambda v: v.max(-1).values,
}


@pytest.mark.parametrize("n", [5, 21, 37])
@pytest.mark.parametrize("name", sorted(MAX_LIKE))
def test_max_like_gradients_of_math_library_values(name, n):
    """The backward finds the winner by comparing the forward's values with the maximum: those
    values are saved, not recomputed by a kernel whose erf may differ by an ulp (a vector loop
    and its scalar tail), which would leave no winner and a zero gradient."""
    reduce = MAX_LIKE[name]

    def f(x, w):
        return reduce(torch.erf(x @ w))

    x, w = torch.randn(3, 4), torch.randn(4, n)
    grads = []
    for fn in (f, kiln.compile(f)):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(xs, ws)
        grads.append(torch.autograd.grad(out, (xs, ws), torch.ones_like(out)))
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.AdamW(p, lr=1e-2),
        lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9),
    ],
    ids=["adamw", "sgd-momentum"],
)
def test_compiled_optimizer_step(make):
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    model = copy.deepcopy(eager)
    opt_e, opt_k = make(eager.parameters()), make(model.parameters())
    step = kiln.compile(opt_k.step)
    for _ in range(3):
        for pe, pk in zip(eager.parameters(), model.parameters()):
            pe.grad = torch.randn_like(pe)
            pk.grad = pe.grad.clone()
        opt_e.step()
        step()
    for pe, pk in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(pk, pe, rtol=1e-5, atol=1e-6)


def test_outputs_eager_allocates_are_new_memory():
    def f(x, y):
        z = x * 2
        return x.clone(), z, z.clone(), y.t().contiguous()

    x, y = torch.randn(4, 5), torch.randn(5, 4)
    x_before = x.clone()
    out = kiln.compile(f)(x, y)
    assert out[0].data_ptr() != x.data_ptr()
    assert out[1].data_ptr() != out[2].data_ptr()
    out[0].add_(1)  # must not write through to the input
    assert torch.equal(x, x_before)
    check(f, x, y)


def test_explain_shows_what_the_forward_saves_and_the_backward_recomputes():
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 8))
    text = str(kiln.explain(model, torch.randn(16, 32)))
    split = next(line for line in text.splitlines() if line.startswith("training split"))
    assert "saves 0 tensors" not in split and "float32[16, 64]" in split, split
    recompute = text.splitlines()[text.splitlines().index(split) + 1]
    assert "recomputes" in recompute and "erf" in recompute, recompute  # GELU is cheap to redo


def test_explain_of_inference_has_no_training_split():
    with torch.no_grad():
        text = str(kiln.explain(nn.Linear(8, 8), torch.randn(4, 8)))
    assert "training split" not in text


def test_a_compiled_training_step_leaves_kiln_untraced():
    # loss.backward() inside a compiled function compiles and runs the backward from there:
    # Dynamo must not trace kiln's compiler or host program (a graph break at every kernel)
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    eager = Net()
    model = copy.deepcopy(eager)

    def step(m, x, y):
        m.zero_grad(set_to_none=True)
        loss = m(x, y)
        loss.backward()
        return loss.detach()

    torch._dynamo.reset()
    counters.clear()
    compiled = kiln.compile(step)
    for _ in range(2):
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        torch.testing.assert_close(compiled(model, x, y), step(eager, x, y), rtol=1e-5, atol=1e-6)
    for pe, pk in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(pk.grad, pe.grad, rtol=1e-4, atol=1e-6)
    breaks = dict(counters["graph_break"])
    assert breaks and all("Tensor.backward()" in reason for reason in breaks), breaks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_gradient_is_one_pass_over_the_logits(dtype):
    # nll_loss's one-hot gradient summed over the classes is its one non-zero term: the
    # backward reads the logits once, in one kernel, with no reduction over the classes
    from kiln.frontend.backend import REPORTS

    def f(logits, target):
        return F.cross_entropy(logits.float(), target, ignore_index=-100)

    logits = torch.randn(64, 1000, dtype=dtype, requires_grad=True)
    target = torch.randint(0, 1000, (64,))
    target[::7] = -100
    logits_k = logits.detach().clone().requires_grad_()
    f(logits, target).backward()
    torch._dynamo.reset()
    before = len(REPORTS)
    kiln.compile(f)(logits_k, target).backward()
    backward = REPORTS[-1]
    assert len(REPORTS) == before + 2 and len(backward.kernels) == 1 and not backward.kernels[0].reduce
    tol = {torch.float32: dict(rtol=1e-5, atol=1e-7), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5)}[dtype]
    torch.testing.assert_close(logits_k.grad, logits.grad, **tol)
