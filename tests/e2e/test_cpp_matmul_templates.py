"""The C++ matmul template (codegen/cpp_matmul.py): a matmul and the element-wise kernel that
reads its product in one kernel, on random inputs equal to eager, in both loop forms and at
sizes off every block; and the cost model's choice against ATen's matmul."""

import os

import pytest
import torch
from conftest import assert_same

import kiln

pytestmark = pytest.mark.skipif(os.environ.get("KILN_TARGET") == "triton", reason="the C++ target's template")


def _randn(*shape, dtype=torch.float32):
    return (torch.randn(*shape) / shape[-1] ** 0.5 * 2).to(dtype)


def _linear_gelu(x, w, b):  # "dot": a Linear's weight as stored, both operands along k
    return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))


def _rows_relu(x, w, b):  # "rows": B contiguous along n
    return torch.relu(x @ w + b) * 3


def _residual(x, w, r):
    return x @ w + r


def _product_returned(x, w):  # the product is an output too: stored beside the epilogue
    p = x @ w
    return p, torch.sigmoid(p)


def _transposed_both(x, w):  # A along m, B along k: neither form reads both contiguously
    return torch.tanh(x.t() @ w.t())


def _scaled_cast(x, w, s):
    return ((x @ w) * s[:, None]).to(torch.bfloat16)


BF16, F16 = torch.bfloat16, torch.float16
CASES = {
    "dot_f32": (_linear_gelu, lambda: [_randn(5, 37), _randn(23, 37), _randn(23)]),
    "dot_bf16_3d": (_linear_gelu, lambda: [_randn(2, 3, 40, dtype=BF16), _randn(67, 40, dtype=BF16),
                                           _randn(67, dtype=BF16)]),
    "rows_f32": (_rows_relu, lambda: [_randn(7, 19), _randn(19, 70), _randn(70)]),
    "rows_bf16": (_rows_relu, lambda: [_randn(9, 33, dtype=BF16), _randn(33, 130, dtype=BF16),
                                       _randn(130, dtype=BF16)]),
    "residual_f16": (_residual, lambda: [_randn(6, 24, dtype=F16), _randn(24, 65, dtype=F16),
                                         _randn(6, 65, dtype=F16)]),
    "product_returned": (_product_returned, lambda: [_randn(4, 16), _randn(16, 9)]),
    "transposed_both": (_transposed_both, lambda: [_randn(21, 5), _randn(11, 21)]),
    "scaled_cast": (_scaled_cast, lambda: [_randn(10, 12), _randn(12, 68), _randn(10)]),
}


def _decisions(fn, inputs, options):
    explanation = kiln.explain(fn, *inputs, options=options)
    return [(d.verdict, d.reason) for g in explanation.graphs for d in g.decisions if " aten.mm" in d.node
            or " aten.addmm" in d.node]


@pytest.mark.parametrize("case", list(CASES))
def test_forced_templates_equal_eager(case):
    fn, make = CASES[case]
    inputs = make()
    torch._dynamo.reset()
    with torch.no_grad():
        assert_same(kiln.compile(fn, matmul_templates=True)(*inputs), fn(*inputs))
    torch._dynamo.reset()
    decisions = _decisions(fn, inputs, {"matmul_templates": True})
    assert decisions and all(v == "template" for v, _ in decisions), decisions


def test_a_few_rows_take_the_template_and_many_keep_atens_matmul():
    """A product of a few rows costs ATen's library more than the template's slower loops;
    one of many rows runs at ATen's rate, which the template does not reach."""
    w, b = _randn(256, 256), _randn(256)
    torch._dynamo.reset()
    few = _decisions(_linear_gelu, [_randn(2, 256), w, b], {})
    torch._dynamo.reset()
    many = _decisions(_linear_gelu, [_randn(1024, 256), w, b], {})
    assert few[0][0] == "template" and "ATen + epilogue kernel" in few[0][1], few
    assert many[0][0] == "ATen" and many[0][1].startswith("ATen: template"), many


def test_an_operand_layout_neither_form_reads_keeps_atens_matmul():
    torch._dynamo.reset()
    decisions = _decisions(_transposed_both, CASES["transposed_both"][1](), {})
    assert decisions[0][0] == "ATen" and "contiguously" in decisions[0][1], decisions
