"""Buckets under reduce-overhead: which sizes may be padded, and padded runs equal eager's.

The padded runs go through BucketedGraphs without CUDA graphs: each call's inputs are grown to
the bucket's sizes (filled with random values, so a padded position that leaked into a real one
would show) and the outputs cut back.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._guards import detect_fake_mode

from kiln.frontend.padding import padding_plan
from kiln.frontend.padding_masks import masked_graph
from kiln.runtime import buckets
from kiln.runtime.buckets import BucketedGraphs, bucket, symbol_ranges


class _Capture:
    """A Dynamo backend whose forward runs padded by bucket; remembers plans and run sizes."""

    def __init__(self):
        self.plans, self.programs, self.run_shapes = [], [], []
        self.pad = True
        self.backend = aot_autograd(fw_compiler=self._compile)

    def _compile(self, gm, inputs):
        plan = padding_plan(gm, inputs)
        env = detect_fake_mode(inputs).shape_env
        gm, inputs = masked_graph(gm, plan, inputs)

        def run(args):
            self.run_shapes.append([tuple(a.shape) for a in args if isinstance(a, torch.Tensor)])
            return list(gm(*args))

        program = BucketedGraphs(run, plan, symbol_ranges(env, plan.bound), pad=self.pad, graphs=False)
        self.plans.append(plan)
        self.programs.append(program)
        return program


@pytest.fixture
def capture(monkeypatch):
    grown = buckets.padded_buffer

    def noisy(a, shape):  # the grown part holds values, never a convenient zero
        b = grown(a, shape)
        mask = torch.ones(shape, dtype=torch.bool)
        mask[tuple(slice(0, n) for n in a.shape)] = False
        fill = torch.randn(int(mask.sum())).to(b.dtype) if b.is_floating_point() else 1
        b[mask] = fill
        return b

    monkeypatch.setattr(buckets, "padded_buffer", noisy)
    torch._dynamo.reset()
    yield _Capture()
    torch._dynamo.reset()


def _plan_of(capture, fn, *args):
    compiled = torch.compile(fn, backend=capture.backend, dynamic=True)
    with torch.no_grad():
        compiled(*args)
    return capture.plans[-1]


def _sizes_of_input(plan):
    """The size symbols of the function's argument: the graph's input of rank 3."""
    return next(e for e in plan.inputs if isinstance(e, list) and len(e) == 3)


def test_bucket_is_the_next_power_of_two_within_range():
    assert [bucket(n, 1, None) for n in (1, 2, 3, 17, 64, 1000, 4097)] == [1, 2, 4, 32, 64, 1024, 8192]
    assert bucket(3, 8, None) == 8  # Dynamo's lower bound
    assert bucket(100, 2, 120) == 100  # past the upper bound the size runs as it is


W = torch.randn(64, 48)


@pytest.mark.parametrize("fn, why", [
    (lambda x: x.var(dim=1), "reduces along a padded dimension"),
    (lambda x: x.argmax(), "reduces along a padded dimension"),  # an index into the padded shape
    (lambda x: x * (x.shape[1] + 1), "takes a size as a value"),
    (lambda x: torch.flip(x, [1]), "not known to keep positions apart"),
    (lambda x: torch.cat([x, x], dim=1), "joins along a padded dimension"),
    (lambda x: x[:, 1:], "cuts a padded dimension"),
])
def test_ops_that_mix_positions_refuse_the_sequence_size(capture, fn, why):
    plan = _plan_of(capture, fn, torch.randn(4, 10, 64))
    sequence = _sizes_of_input(plan)[1]
    assert sequence in plan.bound and sequence not in plan.padded, plan.text()
    assert any(why in reason for reason in plan.refused.values()), plan.text()


def test_row_wise_ops_let_the_sequence_size_be_padded(capture):
    plan = _plan_of(capture, lambda x: torch.softmax(x @ W, dim=-1) * x.sum(-1, keepdim=True),
                    torch.randn(4, 10, 64))
    batch, sequence, features = _sizes_of_input(plan)
    assert {batch, sequence, features} <= set(plan.padded), plan.text()
    assert sequence not in plan.masked and features in plan.masked, plan.text()  # x @ W sums over features


def _mlp(x):
    return torch.nn.functional.gelu(x @ W) * torch.sigmoid(x[..., :48])


def _flattened(x):  # a view that merges the batch and the sequence, then splits them again
    return (x.reshape(-1, 64) @ W).view(x.shape[0], x.shape[1], 48).amax(-1)


EMBEDDING = torch.nn.Embedding(100, 32)


def _embedded(ids):
    return EMBEDDING(ids) * 2 + torch.arange(ids.shape[1])[None, :, None]


def _normed(x):
    return torch.nn.functional.layer_norm(x, (64,)) * 3 + 1


@pytest.mark.parametrize("fn, make", [
    (_mlp, lambda n: torch.randn(3, n, 64)),
    (_flattened, lambda n: torch.randn(3, n, 64)),
    (_embedded, lambda n: torch.randint(0, 100, (3, n))),
    (_normed, lambda n: torch.randn(n, 5, 64, dtype=torch.float64)),
])
def test_padded_runs_equal_eager_at_every_size(capture, fn, make):
    compiled = torch.compile(fn, backend=capture.backend, dynamic=True)
    sizes = [40, 37, 2, 3, 17, 64, 100]
    with torch.no_grad():
        for n in sizes:
            x = make(n)
            torch.testing.assert_close(compiled(x), fn(x))
    program = capture.programs[-1]
    assert program.padded, program.plan.text()
    assert len(program.replays) == len({bucket(n, 2, None) for n in sizes})


def _softmax_mean_max(x):
    return torch.softmax(x, dim=1) * x.mean(dim=1, keepdim=True) + x.amax(dim=1, keepdim=True)


def _gram(x):  # a matmul summing over the sequence
    return x.transpose(-1, -2) @ x


def _attention(x):  # attention written out, over keys of the padded length
    return torch.softmax(x @ x.transpose(-1, -2) / 8, dim=-1) @ x


def _causal(x):  # queries and keys of the same length: a real query sees only real keys
    q = x.view(x.shape[0], x.shape[1], 4, 16).transpose(1, 2)
    return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


def _reductions(x):
    return torch.stack([x.sum(1), x.amin(1), torch.logsumexp(x, 1), (x.sigmoid() + 0.5).prod(1),
                        x.argmax(1).to(x.dtype), x.max(1).values, (x > 2).any(1).to(x.dtype),
                        (x > -3).all(1).to(x.dtype), x.sum(1) / x.shape[1],
                        x.mean((1, 2))[:, None].expand_as(x[:, 0])])


def _scans(x):
    return torch.cumsum(x, dim=1) + torch.log_softmax(x, dim=1)


@pytest.mark.parametrize("fn", [_softmax_mean_max, _gram, _attention, _causal, _reductions, _scans])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_reductions_along_the_padded_size_equal_eager(capture, fn, dtype):
    """Reductions, matmuls and attention along the padded size ignore its grown part (filled
    with random values by the fixture), at every size of a bucket."""
    compiled = torch.compile(fn, backend=capture.backend, dynamic=True)
    sizes = [40, 37, 2, 3, 17, 64, 100]
    tolerance = {} if dtype is torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    with torch.no_grad():
        for n in sizes:
            x = torch.randn(3, n, 64).to(dtype)
            torch.testing.assert_close(compiled(x), fn(x), **tolerance)
    program = capture.programs[-1]
    sequence = _sizes_of_input(program.plan)[1]
    assert sequence in program.padded, program.plan.text()
    assert len(program.replays) == len({bucket(n, 2, None) for n in sizes})
    if fn is not _causal:
        assert sequence in program.plan.masked, program.plan.text()


def test_masked_integer_sums_and_a_size_as_a_value(capture):
    def fn(ids):
        return ids.sum(1) * ids.shape[1] + ids.amax(1)

    compiled = torch.compile(fn, backend=capture.backend, dynamic=True)
    with torch.no_grad():
        for n in (5, 9, 30):
            ids = torch.randint(-50, 50, (3, n))
            torch.testing.assert_close(compiled(ids), fn(ids))
    plan = capture.programs[-1].plan
    sequence = next(e for e in plan.inputs if isinstance(e, list) and len(e) == 2)[1]
    assert sequence in plan.padded and sequence in plan.masked, plan.text()


def _views_and_picks(x):
    q, k = x.split([32, 32], dim=-1)  # along the features
    table = torch.arange(64.0).expand(x.shape[0], 64)
    positions = torch.arange(x.shape[1]).expand(x.shape[0], -1)
    types = torch.gather(table, 1, positions)  # a fixed table read at each position
    cached = torch.cat([torch.tensor([]), k], dim=1)  # a key cache's first step
    return q * cached + types[..., None] + x.select(1, 0)[:, None, :32]  # the first position: real


def test_splits_gathers_and_the_first_position_keep_positions_apart(capture):
    compiled = torch.compile(_views_and_picks, backend=capture.backend, dynamic=True)
    with torch.no_grad():
        for n in (5, 9, 30):
            x = torch.randn(3, n, 64)
            torch.testing.assert_close(compiled(x), _views_and_picks(x))
    program = capture.programs[-1]
    assert _sizes_of_input(program.plan)[1] in program.padded, program.plan.text()


def test_a_graph_not_bound_by_launches_keeps_each_size(capture):
    capture.pad = False
    compiled = torch.compile(_mlp, backend=capture.backend, dynamic=True)
    with torch.no_grad():
        for n in (5, 6, 7):
            x = torch.randn(3, n, 64)
            torch.testing.assert_close(compiled(x), _mlp(x))
    program = capture.programs[-1]
    assert "not bound by its launches" in program.text()
    assert len(program.replays) == 3
    assert {shapes[0] for shapes in capture.run_shapes} == {(3, 5, 64), (3, 6, 64), (3, 7, 64)}


def test_padding_a_refused_size_would_change_the_result(capture):
    """The check above can fail: forcing the sequence of a variance over it to pad does."""
    compiled = torch.compile(lambda x: torch.var(x, dim=1), backend=capture.backend, dynamic=True)
    with torch.no_grad():
        compiled(torch.randn(3, 9, 16))
        program = capture.programs[-1]
        sequence = _sizes_of_input(program.plan)[1]
        program.plan.padded[sequence] = program.plan.bound[sequence]
        program.padded.add(sequence)
        x = torch.randn(3, 5, 16)
        assert not torch.allclose(compiled(x), torch.var(x, dim=1))


def test_an_op_the_analysis_misreads_refuses_every_size(capture, monkeypatch):
    from kiln.frontend import padding

    def misread(*args):
        raise RuntimeError("misread")

    monkeypatch.setitem(padding._HANDLERS, torch.ops.aten.mm.default, misread)
    plan = _plan_of(capture, _mlp, torch.randn(3, 9, 64))
    assert not plan.padded and plan.refused
    assert all("misread" in why for why in plan.refused.values()), plan.text()


def test_a_recordings_real_sizes_are_filled_in_its_own_buffer():
    """After a recording, each replay fills the buffer the graph reads the real sizes from, and
    the runner does not copy an input that already is its recorded buffer."""
    from types import SimpleNamespace

    from kiln.runtime.cudagraphs import CudaGraphRunner

    runner = CudaGraphRunner(lambda args: args)
    assert runner.recorded_input(1) is None  # not recorded yet
    replays = []
    runner.graph = SimpleNamespace(replay=lambda: replays.append(1))  # as recorded
    runner.inputs = [torch.zeros(4), torch.zeros(2, dtype=torch.int64)]
    program = BucketedGraphs(lambda args: args, SimpleNamespace(padded=(), device=torch.device("cpu")), {},
                             pad=False, graphs=False)
    sizes = program._real_sizes([7, 3], runner)
    assert sizes is runner.recorded_input(1) and sizes.tolist() == [7, 3]
    x = torch.randn(4)
    runner.replay([x, sizes])
    assert replays == [1] and torch.equal(runner.inputs[0], x) and runner.inputs[1].tolist() == [7, 3]
    fresh = program._real_sizes([5], None)  # no recording: a tensor of its own
    assert fresh.tolist() == [5] and fresh is not sizes
