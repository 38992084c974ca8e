"""Random numbers generated inside kiln's kernels (docs/random.md): dropout, rand, randn and
bernoulli. kiln's stream is not eager's, so these tests check distributions, repeatability
under torch.manual_seed, independence of two ops and the backward's regenerated mask; the
stream itself is checked bit for bit against the Philox reference (ir/philox.py), which is
what both the C++ and the Triton kernels compute."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import REPORTS, assert_same, run_compiled

import kiln
from kiln.frontend.random import SEED_BOUND
from kiln.ir import philox
from kiln.options import Options

SHAPE = (32, 64)  # small: the Triton interpreter runs one program per block


def _seed_after(seed: int) -> torch.Tensor:
    """The Philox key kiln's first random op draws after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    return torch.randint(0, SEED_BOUND, (), dtype=torch.int64)


def _within(rate: float, expected: float, n: int, sigmas: float = 5.0) -> bool:
    return abs(rate - expected) <= sigmas * math.sqrt(expected * (1 - expected) / n)


def test_rand_is_the_philox_stream_bit_for_bit():
    x = torch.randn(SHAPE)
    torch.manual_seed(3)
    out, report = run_compiled(lambda x: torch.rand_like(x), x)
    offsets = torch.arange(x.numel(), dtype=torch.int64)
    expected = philox.uniform(_seed_after(3), offsets).reshape(SHAPE)
    assert torch.equal(out, expected)
    assert not [name for name in report.fallbacks if "rand" in name]


def test_randn_follows_the_philox_stream():
    x = torch.randn(SHAPE)
    torch.manual_seed(4)
    out, _ = run_compiled(lambda x: torch.randn_like(x) * 2 + 1, x)
    offsets = torch.arange(x.numel(), dtype=torch.int64)
    expected = philox.normal(_seed_after(4), offsets).reshape(SHAPE) * 2 + 1
    assert_same(out, expected, dict(rtol=1e-5, atol=1e-5))  # log and cos may differ by an ulp


def test_rand_and_randn_distributions():
    def fn(x):
        return torch.rand(4096, device=x.device), torch.randn(4096, device=x.device), \
            torch.randn_like(x, dtype=torch.bfloat16)

    (u, z, zb), _ = run_compiled(fn, torch.randn(SHAPE))
    assert 0.0 <= u.min().item() and u.max().item() < 1.0
    se = 1 / math.sqrt(4096)
    assert abs(u.mean().item() - 0.5) < 5 * se * math.sqrt(1 / 12)
    assert abs(u.std().item() - math.sqrt(1 / 12)) < 0.02
    assert abs(z.mean().item()) < 5 * se and abs(z.std().item() - 1) < 0.05
    assert zb.dtype is torch.bfloat16 and abs(zb.float().std().item() - 1) < 0.06


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_keep_rate_and_scale(p):
    x = torch.rand(SHAPE) + 0.5  # never zero: a zero output is a dropped element
    out, report = run_compiled(lambda x: F.dropout(x, p, training=True), x)
    kept = out != 0
    assert _within(kept.float().mean().item(), 1 - p, x.numel())
    assert_same(out[kept], x[kept] / (1 - p))
    assert not [name for name in report.fallbacks if "dropout" in name or "bernoulli" in name]


def test_dropout_is_repeatable_under_manual_seed():
    x = torch.randn(SHAPE)
    compiled = kiln.compile(lambda x: F.dropout(x, 0.3, training=True))
    torch._dynamo.reset()
    runs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        runs.append(compiled(x))
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0] != 0, runs[2] != 0)


def test_two_dropouts_in_one_graph_are_independent():
    x = torch.rand(SHAPE) + 0.5
    def fn(x):
        return F.dropout(x, 0.5, training=True), F.dropout(x, 0.5, training=True)

    (a, b), report = run_compiled(fn, x)
    agree = ((a != 0) == (b != 0)).float().mean().item()
    assert _within(agree, 0.5, x.numel())  # independent masks agree on half the elements
    # both seeds come from one draw per call
    assert "kiln.seeds.default" in report.fallbacks and "kiln.seed.default" not in report.fallbacks


@pytest.mark.parametrize("p,training", [(0.0, True), (1.0, True), (0.4, False)])
def test_dropout_edge_cases_as_eager(p, training):
    x = torch.randn(SHAPE)
    out, _ = run_compiled(lambda x: F.dropout(x, p, training=training) + 1, x)
    assert_same(out, F.dropout(x, p, training=training) + 1)


def test_dropout_backward_regenerates_the_mask():
    x = torch.rand(SHAPE, requires_grad=True)
    w = torch.randn(SHAPE[1])

    def fn(x):
        return F.dropout(torch.tanh(x) * w, 0.25, training=True)

    out, report = run_compiled(fn, x)
    grad = torch.randn(SHAPE)
    out.backward(grad)
    kept = (out != 0).float()
    expected = grad * kept / 0.75 * w * (1 - torch.tanh(x.detach()) ** 2)
    assert_same(x.grad, expected)
    saved = report.partition.saved
    assert not [t for _, t in saved if t.startswith("bool")], saved  # no mask is saved
    assert ("int64[]" in [t for _, t in saved]), saved  # the seed is


def test_bernoulli_float_and_tensor_probabilities():
    probs = torch.rand(SHAPE)
    probs[0] = 0.0
    probs[1] = 1.0

    def fn(probs):
        return torch.bernoulli(probs), torch.bernoulli(probs, 0.3), probs.bernoulli_(0.8) * 1

    (b, b3, b8), report = run_compiled(fn, probs.clone())
    assert set(b.unique().tolist()) <= {0.0, 1.0}
    assert (b[0] == 0).all() and (b[1] == 1).all()
    assert _within(b.mean().item(), probs.mean().item(), probs.numel())
    assert _within(b3.mean().item(), 0.3, probs.numel())
    assert _within(b8.mean().item(), 0.8, probs.numel())
    assert not [name for name in report.fallbacks if "bernoulli" in name]


def test_training_an_mlp_with_dropout():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(32, 16), torch.nn.LayerNorm(16), torch.nn.Dropout(0.1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    compiled = kiln.compile(model)
    torch._dynamo.reset()
    x, target = torch.randn(8, 16), torch.randn(8, 16)
    first = [p.detach().clone() for p in model.parameters()]
    before = len(REPORTS)
    for _ in range(3):
        loss = F.mse_loss(compiled(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert torch.isfinite(loss)
    assert all(not torch.equal(a, b) for a, b in zip(first, model.parameters()))
    forward = REPORTS[before]
    assert forward.partition is not None
    saved = forward.partition.saved
    assert len([t for _, t in saved if t == "int64[]"]) == 2, saved  # a seed per dropout
    assert not [name for name, _ in saved if name.startswith(("gt", "philox"))], saved  # no mask
    assert not [n for r in REPORTS[before:] for n in r.fallbacks if "dropout" in n or "bernoulli" in n]
    model.eval()
    assert_same(compiled(x), model(x))  # eval mode: dropout is the identity


def test_eager_random_option_keeps_eagers_stream():
    x = torch.randn(SHAPE)

    def fn(x):
        return F.dropout(x, 0.3, training=True) + torch.rand_like(x)

    torch.manual_seed(5)
    expected = fn(x)
    torch.manual_seed(5)
    out, report = run_compiled(fn, x, eager_random=True)
    assert torch.equal(out, expected)
    assert report.fallbacks  # the random ops ran in ATen
    assert Options(eager_random=True).cache_key() != Options().cache_key()


def test_high_offsets_and_seeds_match_the_reference():
    """Offsets past 2**32 and seeds with both halves set: the counter's and the key's high
    words reach the kernels as the reference computes them."""
    seed = torch.tensor(0x0123_4567_89AB_CDEF, dtype=torch.int64)

    u, report = run_compiled(lambda seed: torch.ops.kiln.philox(seed, 2**33 + 5, [4, 16], 0), seed)
    assert report is not None and not [n for n in report.fallbacks if "philox" in n]
    z, report = run_compiled(lambda seed: torch.ops.kiln.philox(seed, 2**40, [64], 1), seed)
    assert report is not None and not [n for n in report.fallbacks if "philox" in n]
    assert torch.equal(u, philox.uniform(seed, 2**33 + 5 + torch.arange(64)).reshape(4, 16))
    assert_same(z, philox.normal(seed, 2**40 + torch.arange(64)), dict(rtol=1e-5, atol=1e-5))


def test_shape_family_keeps_the_stream():
    """Compiled once for symbolic sizes: offsets come from strides read at run time."""
    compiled = kiln.compile(lambda x: torch.rand_like(x) + x, dynamic=True)
    torch._dynamo.reset()
    for rows in (6, 10):
        x = torch.randn(rows, 24)
        torch.manual_seed(rows)
        out = compiled(x)
        expected = philox.uniform(_seed_after(rows), torch.arange(x.numel())).reshape(x.shape) + x
        assert torch.equal(out, expected)


def test_float64_numbers_stay_in_aten():
    """Philox numbers are float32; eager's float64 rand has 53 random bits: left to ATen."""
    x = torch.randn(4, 8, dtype=torch.float64)
    torch.manual_seed(9)
    expected = torch.rand_like(x) + x
    torch.manual_seed(9)
    out, report = run_compiled(lambda x: torch.rand_like(x) + x, x)
    assert torch.equal(out, expected)
    assert [name for name in report.fallbacks if "rand" in name]


def test_random_ops_of_two_shapes_in_one_graph():
    """Independent kernels of one graph may run as one grouped launch: each keeps its stream."""
    seed = torch.tensor(12345, dtype=torch.int64)

    def fn(seed):
        return torch.ops.kiln.philox(seed, 0, [4, 16], 0), torch.ops.kiln.philox(seed, 64, [64], 0)

    (u, v), report = run_compiled(fn, seed)
    assert report is not None and not [n for n in report.fallbacks if "philox" in n]
    assert torch.equal(u, philox.uniform(seed, torch.arange(64)).reshape(4, 16))
    assert torch.equal(v, philox.uniform(seed, 64 + torch.arange(64)))
