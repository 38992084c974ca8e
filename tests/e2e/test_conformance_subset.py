"""A fast slice of the OpInfo conformance sweep (python -m kiln.tools.conformance).

SUBSET reaches every kiln lowering that the full sweep reaches, in float32, bfloat16 and an
integer dtype (chosen by kiln.tools.conformance_table.choose_subset from a sweep's results);
PAST_FAILURES are the ops that once crashed or mismatched. Each runs its first samples
exactly as the sweep does, and must land in the class recorded for it, with eager's output
strides: a native pass that becomes a fallback, a graph break or a crash fails, and so does
an improvement until its expectation is updated here.
"""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("expecttest")  # op_db needs it

from kiln.options import env_target
from kiln.tools.conformance_worker import prepare, run_op

SAMPLES = 2
# Outcomes that check nothing: an entry that gets one must go.
USELESS = ("eager fails", "unsupported dtype", "skipped")

_FLOAT32 = [
    "nn.functional.scaled_dot_product_attention", "nanquantile", "isclose",
    "nn.functional.binary_cross_entropy", "nn.functional.interpolate.bicubic",
    "_native_batch_norm_legit", "logaddexp2", "roll", "signal.windows.cosine", "masked.argmin",
    "nn.functional.elu", "nn.functional.multilabel_margin_loss", "prod", "nn.functional.gelu",
    "nn.functional.local_response_norm", "nn.functional.instance_norm", "min.reduction_no_dim", "sinh",
    "tan", "sgn", "min.reduction_with_dim", "round", "trunc", "trapezoid", "as_strided", "log10",
    "max.reduction_no_dim", "masked.argmax", "asinh", "logspace.tensor_overload", "atan",
    "floor_divide", "special.log_ndtr", "log2", "unsafe_split", "max.reduction_with_dim", "asin",
    "sigmoid", "isin", "logical_xor", "atanh", "minimum", "logical_or", "__getitem__", "gt", "flipud",
    "nn.functional.multi_margin_loss", "__rmod__", "__rpow__", "nn.functional.cosine_similarity",
    "copysign", "std", "var", "_unsafe_masked_index_put_accumulate", "nn.functional.relu",
    "linalg.cross", "fmod", "acosh", "atan2", "cos", "cosh", "acos", "any", "nn.functional.embedding",
]

_BFLOAT16 = [
    "nn.functional.scaled_dot_product_attention", "isclose", "nn.functional.instance_norm",
    "nn.functional.binary_cross_entropy", "nn.functional.interpolate.bicubic", "roll", "logaddexp2",
    "renorm", "heaviside", "masked.argmin", "nn.functional.local_response_norm",
    "nn.functional.dropout2d", "nn.functional.gelu", "prod", "take_along_dim",
    "nn.functional.cosine_embedding_loss", "frac", "asin", "asinh", "atan", "atanh", "ceil", "sinh",
    "unsafe_chunk", "floor_divide", "nn.functional.celu", "__getitem__", "flipud", "sign", "tan",
    "masked.amin", "bernoulli", "sin", "masked.argmax", "round", "remainder",
    "_unsafe_masked_index_put_accumulate", "as_strided.partial_views", "atan2", "nn.functional.silu",
    "clamp", "all", "fmod", "any", "copysign", "cos", "nanmean", "acos", "minimum", "acosh", "cosh",
    "nn.functional.relu", "logspace", "gt", "lerp", "min.reduction_no_dim", "max.reduction_no_dim",
    "nn.functional.embedding", "__rpow__", "var.unbiased", "std.unbiased", "erfc", "logical_xor",
    "max.reduction_with_dim", "min.reduction_with_dim", "log2", "log10",
]

_INT = [
    "nn.functional.cosine_embedding_loss", "diag_embed", "masked.logsumexp", "isclose",
    "special.log_ndtr", "linalg.cross", "unravel_index", "all", "alias_copy", "prod", "__getitem__",
    "special.entr", "nn.functional.pad.circular", "nn.functional.local_response_norm", "sgn", "ceil",
    "floor", "round", "split", "sinh", "trunc", "flipud", "asin", "nn.functional.poisson_nll_loss",
    "asinh", "atan", "sin", "atanh", "erf", "ne", "roll", "__rpow__", "__rxor__", "gt", "tanh", "ge",
    "bitwise_right_shift", "as_strided.partial_views", "copysign", "any", "bitwise_not",
    "bitwise_left_shift", "amin", "argmin", "tan", "isinf", "argmax", "expm1", "trapezoid", "acos",
    "clamp", "acosh", "cosh", "max.binary", "gather", "fmod", "logspace", "min.binary", "cos",
    'min.reduction_no_dim', 'atan2', '__rdiv__', 'max.reduction_no_dim', 'triu', 'sigmoid', 'log10',
    'log2', 'lt', 'rsqrt', 'exp2', 'heaviside', 'min.reduction_with_dim', 'logical_and',
    'nn.functional.relu', 'logical_xor', 'max.reduction_with_dim',
]
SUBSET = (
    [(n, "float32") for n in _FLOAT32] + [(n, "bfloat16") for n in _BFLOAT16] + [(n, "int") for n in _INT]
)

PAST_FAILURES = [
    # AOTAutograd's data-dependent errors are Dynamo's to handle (a graph break), not a fallback
    ("narrow", "float32"),
    ("tensor_split", "float32"),
    ("take", "float32"),
    ("take", "int"),
    # complex values between ATen calls: kernels have no complex types
    ("cfloat", "float32"),
    ("cdouble", "float32"),
    ("chalf", "float32"),
    ("fft.fft2", "float32"),
    ("fft.irfft", "float32"),
    ("fft.hfftn", "float32"),
    # an ATen kernel returning another dtype than its meta function (bf16 running stats)
    ("_batch_norm_with_update", "bfloat16"),
    # integer images: PyTorch's own decomposition rounds unlike eager's kernel
    ("nn.functional.interpolate.bilinear", "int"),
    ("nn.functional.interpolate.bicubic", "int"),
    ("nn.functional.upsample_bilinear", "int"),
    # a symbolic shift, -(n // 2) % n, rendered with C's remainder: a negative gather index
    ("fft.fftshift", "float32"),
    ("fft.ifftshift", "float32"),
    # dropout and random samples drawn from kiln's own stream: compared on shape and dtype
    ("nn.functional.multi_head_attention_forward", "float32"),
    ("nn.functional.fractional_max_pool3d", "float32"),
]


# Every entry is expected to pass with every op lowered by kiln, except these.
FALLBACK_PASS = {
    "float32": {
        "nn.functional.scaled_dot_product_attention",
        "nanquantile",
        "special.log_ndtr",
        "isin",
        "_unsafe_masked_index_put_accumulate",
        "cfloat",
        "cdouble",
        "chalf",
        "fft.fft2",
        "fft.irfft",
        "fft.hfftn",
        "nn.functional.multi_head_attention_forward",
        "nn.functional.fractional_max_pool3d",
    },
    "bfloat16": {
        "nn.functional.scaled_dot_product_attention",
        "nn.functional.cosine_embedding_loss",
        "bernoulli",
        "_unsafe_masked_index_put_accumulate",
        "_batch_norm_with_update",  # a momentum that changes between calls: compiled per value
    },
    "int": {
        "nn.functional.cosine_embedding_loss",
        "special.log_ndtr",
        "nn.functional.local_response_norm",
        "nn.functional.interpolate.bilinear",
        "nn.functional.interpolate.bicubic",
        "nn.functional.upsample_bilinear",
    },
}
# The Triton generator has no inverse trigonometric functions: they run in ATen there.
TRITON_FALLBACK_PASS = {"asin", "acos", "atan", "atan2"}
# Dynamo breaks the graph on a tensor used as a Python int (an .item() in the op).
NOT_CAPTURED = {("narrow", "float32"), ("tensor_split", "float32")}
# entries Dynamo captures from a torch version on: before it, a graph break (nanquantile's
# data-dependent aten.equal)
NOT_CAPTURED_BEFORE = {("nanquantile", "float32"): "2.13"}

# Known kiln bugs, by entry and target (None: every target); the test is a strict xfail,
# so a fix shows up as an unexpected pass and its line here must go.
KNOWN_BUGS: dict[tuple, str] = {}


def _target() -> str:
    return "triton" if env_target() == "triton" else "cpp"


def expected_class(name: str, dtype: str, target: str) -> str:
    if (name, dtype) in NOT_CAPTURED or torch.__version__ < NOT_CAPTURED_BEFORE.get((name, dtype), "0"):
        return "not captured"
    if name in FALLBACK_PASS[dtype] or (target == "triton" and name in TRITON_FALLBACK_PASS):
        return "fallback pass"
    return "native pass"


def _params() -> list:
    params = []
    for name, dtype in SUBSET + PAST_FAILURES:
        bug = KNOWN_BUGS.get((name, dtype, None)) or KNOWN_BUGS.get((name, dtype, _target()))
        marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
        params.append(pytest.param(name, dtype, marks=marks, id=f"{name}-{dtype}"))
    return params


@functools.cache
def _ops():
    return prepare()


@pytest.mark.parametrize("name,dtype", _params())
def test_op_matches_eager(name, dtype):
    result = run_op(_ops()[name], name, dtype, SAMPLES)
    got, want = result["class"], expected_class(name, dtype, _target())
    assert got not in USELESS, f"{got}: this entry checks nothing, drop it ({result['detail']})"
    assert got == want, f"expected {want}, got {got}: {result['detail']}"
    assert not result["strides"], f"an output is laid out unlike eager's: {result['strides']}"
