"""nn.functional.embedding_bag on PyTorch's OpInfo samples, compiled vs eager: every mode (sum,
mean, max) with and without offsets, per_sample_weights, padding_idx, include_last_offset and
max_norm (which renormalizes the weight in place), one sample of each kind."""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("expecttest")  # op_db needs it

from kiln.tools.conformance_worker import prepare, runner  # noqa: E402

PASSING = ("native pass", "fallback pass")
# what changes the forward's result (bags without offsets are the rows of a 2-d input)
FEATURES = ("offsets", "per_sample_weights", "padding_idx", "include_last_offset", "max_norm")


def _kind(sample) -> tuple:
    """A sample's mode and the features it uses."""
    values = {k: sample.kwargs.get(k) for k in FEATURES}
    used = tuple(k for k, v in values.items() if v is not None and v is not False)
    return sample.kwargs.get("mode", "mean"), used


@functools.cache
def _samples() -> tuple[object, dict[tuple, object]]:
    op = prepare()["nn.functional.embedding_bag"]
    torch.manual_seed(0)
    kinds: dict[tuple, object] = {}
    for sample in op.sample_inputs("cpu", torch.float32, requires_grad=False):
        kinds.setdefault(_kind(sample), sample)
    return op, kinds


def test_samples_cover_every_feature():
    _, kinds = _samples()
    assert {mode for mode, _ in kinds} == {"sum", "mean", "max"}
    assert {k for _, used in kinds for k in used} == set(FEATURES)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_samples(mode):
    op, kinds = _samples()
    ran = 0
    for kind, sample in kinds.items():
        if kind[0] != mode:
            continue
        # a compiled function per kind: one for all would meet Dynamo's recompile limit
        outcome = runner(op.op).run(sample, False, torch.float32)
        if outcome is None:  # eager rejects the sample
            continue
        ran += 1
        assert outcome.cls in PASSING, (kind, outcome.why)
    assert ran > 0
