"""The conformance runner tells each outcome apart: a kiln bug is never counted as a pass."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("expecttest")  # OpInfo's SampleInput lives beside op_db

from torch.testing._internal.opinfo.core import SampleInput

from kiln.frontend import importer
from kiln.tools.conformance_worker import MODES, run_op


class _Op:
    """The little of an OpInfo the runner reads."""

    def __init__(self, fn, shapes=((4, 5), (3, 7))):
        self.op, self.shapes = fn, shapes

    def supported_dtypes(self, device):
        return {torch.float32}

    def sample_inputs(self, device, dtype, requires_grad=False):
        return (SampleInput(torch.randn(s, dtype=dtype)) for s in self.shapes)


def _classify(fn, mode="per-op", **op):
    return run_op(_Op(fn, **op), "test", "float32", 3, mode)


def _graph_break(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return y.cos()


@pytest.mark.parametrize("mode", MODES)
def test_native_pass(mode):
    assert _classify(torch.sin, mode)["class"] == "native pass"


def test_op_left_to_aten_is_a_fallback_pass():
    result = _classify(lambda x: x @ x.T)
    assert result["class"] == "fallback pass"
    assert "aten.mm.default" in result["fallbacks"]


def test_graph_break_is_not_captured():
    assert _classify(_graph_break)["class"] == "not captured"


def test_wrong_result_is_a_mismatch():
    result = _classify(lambda x: x + 1 if torch.compiler.is_compiling() else x)
    assert result["class"] == "mismatch"


@pytest.mark.parametrize("mode", MODES)
def test_failing_lowering_is_a_crash(mode, monkeypatch):
    """kiln runs the op in ATen and the result is right, but a lowering raised: a kiln bug."""
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")  # the planted bug is in a compile a hit skips
    lookup = importer.lookup

    def broken(*args, **kwargs):
        raise RuntimeError("a lowering bug")

    monkeypatch.setattr(
        importer, "lookup", lambda t: broken if t == torch.ops.aten.sin.default else lookup(t)
    )
    result = _classify(torch.sin, mode)
    assert result["class"] == "crash" and "a lowering bug" in result["detail"]


def test_internal_error_running_the_graph_in_aten_is_a_crash(monkeypatch):
    from kiln.passes import pipeline

    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")  # the planted bug is in a compile a hit skips

    def broken(*args, **kwargs):
        raise RuntimeError("a compiler bug")

    monkeypatch.setattr(pipeline, "compile_graph", broken)
    result = _classify(torch.sin)
    assert result["class"] == "crash" and "a compiler bug" in result["detail"]


def test_eager_failure_is_reported_apart():
    def fails(x):
        raise ValueError("not an op")

    assert _classify(fails)["class"] == "eager fails"


def test_other_strides_are_reported():
    result = _classify(lambda x: x.t().contiguous() if torch.compiler.is_compiling() else x.t())
    assert result["class"] == "native pass" and "strides" in result["strides"]
