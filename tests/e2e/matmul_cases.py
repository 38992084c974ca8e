"""Matmul template cases run in Triton's interpreter (test_matmul_templates.py runs this file
in a process of its own, with TRITON_INTERPRET=1 set before Triton is imported). Prints one
JSON object: per case, whether kiln matched eager, the decisions and the kernels' sources."""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kiln  # noqa: E402
from kiln.frontend.backend import REPORTS  # noqa: E402
from kiln.ir.matmul import is_matmul  # noqa: E402

TOLERANCE = {
    torch.float32: dict(rtol=1e-4, atol=1e-4),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
}


def _mm(x, w):
    return x @ w


def _addmm_gelu(x, w, b):
    return F.gelu(torch.addmm(b, x, w))


def _bias_gelu(x, w, b):
    return F.gelu(x @ w + b)


def _residual(x, w, r):
    return x @ w + r


def _linear_relu_3d(x, w, b):
    return torch.relu(F.linear(x, w, b))


def _scaled_cast(x, w, s):
    return ((x @ w) * s[:, None]).to(torch.float32)


def _two_readers(x, w):
    y = x @ w
    return y.sin(), y.cos()


def _product_returned(x, w):
    y = x @ w
    return y, torch.relu(y)


def _update_operand(x, w):
    x.add_(x @ w)
    return w * 2


def _product_read_later(x, w, v):
    y = x @ w
    return torch.relu(y) @ v + y.sum()


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def cases():
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    # name -> (fn, inputs, options)
    return {
        "mm_f32": (_mm, [_randn(64, 32), _randn(32, 48)], {}),
        "mm_odd_bf16": (_mm, [_randn(50, 37, dtype=bf16), _randn(37, 70, dtype=bf16)], {}),
        # above frontend/addmm.py's launch-bound size: the bias stays in addmm
        "addmm_gelu_f32": (_addmm_gelu, [_randn(200, 264), _randn(264, 328), _randn(328)], {}),
        "bias_gelu_bf16": (
            _bias_gelu,
            [_randn(64, 32, dtype=bf16), _randn(32, 48, dtype=bf16), _randn(48, dtype=bf16)],
            {},
        ),
        "residual_f16": (
            _residual,
            [_randn(40, 24, dtype=f16), _randn(24, 56, dtype=f16), _randn(40, 56, dtype=f16)],
            {},
        ),
        "linear_relu_3d": (_linear_relu_3d, [_randn(2, 24, 32), _randn(40, 32), _randn(40)], {}),
        "row_scale_cast": (
            _scaled_cast,
            [_randn(48, 32, dtype=bf16), _randn(32, 40, dtype=bf16), _randn(48, dtype=bf16)],
            {},
        ),
        "two_readers": (_two_readers, [_randn(32, 16, dtype=f32), _randn(16, 24, dtype=f32)], {}),
        "product_returned": (_product_returned, [_randn(32, 16), _randn(16, 24)], {}),
        "product_read_later": (_product_read_later, [_randn(32, 16), _randn(16, 24), _randn(24, 40)], {}),
        "update_operand": (_update_operand, [_randn(32, 32), _randn(32, 32)], {}),
        "off": (_bias_gelu, [_randn(64, 32), _randn(32, 48), _randn(48)], {"matmul_templates": False}),
        "default_on_cpu": (
            _bias_gelu,
            [_randn(64, 32), _randn(32, 48), _randn(48)],
            {"matmul_templates": None},
        ),
    }


def run(name, fn, inputs, options):
    options = {"target": "triton", "matmul_templates": True, **options}
    torch._dynamo.reset()
    expected = fn(*[t.clone() for t in inputs])
    before = len(REPORTS)
    actual = kiln.compile(fn, **options)(*[t.clone() for t in inputs])
    report = REPORTS[-1] if len(REPORTS) > before else None
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    error = ""
    try:
        for a, e in zip(actual, expected, strict=True):
            assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, e.dtype, a.shape, e.shape)
            torch.testing.assert_close(a, e, **TOLERANCE[e.dtype])
    except AssertionError as e:
        error = str(e)[:2000]
    return {
        "error": error,
        "decisions": [[d.node, d.verdict, d.reason] for d in report.decisions] if report else [],
        "templates": [k.name for k in report.kernels if is_matmul(k)] if report else [],
        "kernels": [k.name for k in report.kernels] if report else [],
        "sources": dict(report.sources) if report else {},
        "host": report.host_source if report else "",
    }


def cublas_candidate():
    """max-autotune's cuBLAS candidate (runtime/matmul_candidates.py) on a template's own
    arguments: ATen's addmm on the strided operands, then the epilogue as a kernel of its own."""
    from kiln.codegen.triton import render_source
    from kiln.ir.matmul import epilogue_kernel
    from kiln.runtime.matmul_candidates import cublas_launch
    from kiln.runtime.triton_build import build_all

    def linear_gelu(x, w, b):
        return F.gelu(F.linear(x, w, b))

    inputs = [_randn(200, 264), _randn(328, 264), _randn(328)]  # w.t(): a strided operand
    torch._dynamo.reset()
    before = len(REPORTS)
    kiln.compile(linear_gelu, target="triton", matmul_templates=True)(*inputs)
    (kern,) = [k for k in REPORTS[before:][-1].kernels if is_matmul(k)]
    epilogue = epilogue_kernel(kern)
    (built,) = build_all([(epilogue, render_source(epilogue))])
    tensors, out = [], None
    for arg, param in zip(kern.args, kern.params):
        if param.is_output:
            out = torch.empty(200, 328)
            tensors.append(out)
        else:
            tensors.append(inputs[int(arg.removeprefix("arg"))])
    cublas_launch(kern, built.fn)(*tensors)
    error = ""
    try:
        torch.testing.assert_close(out, linear_gelu(*inputs), **TOLERANCE[torch.float32])
    except AssertionError as e:
        error = str(e)[:2000]
    return {"error": error, "bias": kern.bias is not None, "b_stride": list(kern.b.stride)}


if __name__ == "__main__":
    torch.manual_seed(0)
    wanted = sys.argv[1:]
    results = {name: run(name, *case) for name, case in cases().items() if not wanted or name in wanted}
    if not wanted or "cublas_candidate" in wanted:
        results["cublas_candidate"] = cublas_candidate()
    print(json.dumps(results))
