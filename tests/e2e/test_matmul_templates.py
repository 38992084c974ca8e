"""Matmul templates (passes/matmul.py, codegen/templates/matmul.py) through Triton's
interpreter: every case's result matches eager on random inputs, with the matmul and its
epilogue in one kernel. The cases run in one process of their own (matmul_cases.py), which
sets TRITON_INTERPRET=1 before Triton is imported."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("matmul_cases.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path_factory.mktemp("kiln-cache")))
    env.pop("KILN_MATMUL_TEMPLATES", None)
    proc = subprocess.run(
        [sys.executable, str(CASES)], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


FUSED = [
    "addmm_gelu_f32",
    "bias_gelu_bf16",
    "residual_f16",
    "linear_relu_3d",
    "row_scale_cast",
    "two_readers",
]


OTHERS = [
    "mm_f32",
    "mm_odd_bf16",
    "product_returned",
    "product_read_later",
    "update_operand",
    "off",
    "default_on_cpu",
]


@pytest.mark.parametrize("case", [*FUSED, *OTHERS])
def test_matches_eager(results, case):
    assert results[case]["error"] == ""


@pytest.mark.parametrize("case", FUSED)
def test_epilogue_runs_inside_the_matmul_kernel(results, case):
    """One kernel, a template, whose source has the tl.dot and the epilogue's stores; no
    ATen matmul left in the host program."""
    r = results[case]
    assert len(r["kernels"]) == 1 and r["templates"] == r["kernels"], r["kernels"]
    source = r["sources"][r["kernels"][0]]
    assert "tl.dot(" in source and "tl.store(" in source
    assert source.index("tl.dot(") < source.index("product = ")
    assert "op_0(" not in r["host"]  # the host program's ATen calls are op_0, op_1, ...
    assert any(
        verdict == "template" and reason.startswith("with its epilogue")
        for _, verdict, reason in r["decisions"]
    )


def test_bias_and_activation_are_in_the_epilogue(results):
    source = results["addmm_gelu_f32"]["sources"]["kiln_addmm_gelu_0"]
    assert "acc = acc + " in source and "mat_bias" in source  # addmm's bias, added in float32
    assert "km.gelu(" in source
    assert 'input_precision="ieee"' in source  # float32 operands as eager's IEEE float32 matmul
    bf16 = results["bias_gelu_bf16"]["sources"]
    (source,) = bf16.values()
    assert "product = km.round_bf16(acc)" in source  # rounded as eager's bf16 mm result


def test_a_product_read_elsewhere_is_stored_by_the_template_too(results):
    """A returned product (a training forward saves it) or one a later kernel reduces: the
    template stores it beside its epilogue's results."""
    for case, kernels in (("product_returned", 1), ("product_read_later", 3)):
        r = results[case]
        assert r["templates"] and len(r["kernels"]) == kernels, r["kernels"]
        assert any(
            verdict == "template" and "storing the product too" in reason
            for _, verdict, reason in r["decisions"]
        ), r["decisions"]


def test_off_and_default_keep_atens_matmul_on_the_cpu(results):
    for case in ("off", "default_on_cpu"):
        r = results[case]
        assert not r["templates"] and not any(v == "template" for _, v, _ in r["decisions"])
        assert "op_0(arg0, arg1)" in r["host"]  # ATen's mm


def test_max_autotunes_cublas_candidate_matches_eager(results):
    """ATen's addmm on the template's strided operands (a transposed weight), then the
    epilogue as a kernel of its own, on the template's own arguments."""
    r = results["cublas_candidate"]
    assert r["error"] == "" and r["bias"] and r["b_stride"] == [1, 264]


def test_an_epilogue_that_overwrites_an_operand_keeps_cublas(results):
    """x += x @ w: programs of a template would still read rows of x that others overwrite."""
    r = results["update_operand"]
    assert r["error"] == "" and not r["templates"]
    assert any(v == "cuBLAS" and "overwrites an operand" in reason for _, v, reason in r["decisions"])
