"""Matmul templates (passes/matmul.py) on an NVIDIA GPU: results against eager, the cost
model's choice for a GPT-2 MLP's first layer, and max-autotune's timing against cuBLAS.
    PYTHONPATH=src python -m pytest -q tests/gpu/test_matmul_templates_gpu.py -m gpu
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import check

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = "cuda"


def _bias_gelu(x, w, b):
    return F.gelu(x @ w + b)


def _verdicts(report) -> list[str]:
    return [d.verdict for d in report.decisions if d.verdict in ("template", "cuBLAS")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(8192, 768, 3072), (1000, 771, 3001), (64, 32, 48)])
def test_forced_templates_match_eager(dtype, shape):
    m, k, n = shape
    x, w = torch.randn(m, k, device=CUDA, dtype=dtype), torch.randn(k, n, device=CUDA, dtype=dtype) * k**-0.5
    b = torch.randn(n, device=CUDA, dtype=dtype)
    report = check(_bias_gelu, x, w, b, target="triton", matmul_templates=True)
    assert _verdicts(report) == ["template"]


def test_cost_model_takes_cublas_and_one_epilogue_for_a_gpt2_mlp_layer():
    # priced at 70% of cuBLAS's rate the template loses here; measured, the two are within
    # a few percent (docs/matmul_templates.md): cuBLAS, then bias and GELU in one kernel
    x = torch.randn(8192, 768, device=CUDA, dtype=torch.bfloat16)
    w = torch.randn(768, 3072, device=CUDA, dtype=torch.bfloat16) * 0.036
    b = torch.randn(3072, device=CUDA, dtype=torch.bfloat16)
    report = check(_bias_gelu, x, w, b)
    assert _verdicts(report) == ["cuBLAS"] and report.num_kernels == 1


def test_max_autotune_times_cublas_and_matches_eager():
    x = torch.randn(4096, 1024, device=CUDA, dtype=torch.bfloat16)
    w = torch.randn(1024, 4096, device=CUDA, dtype=torch.bfloat16) * 0.03
    r = torch.randn(4096, 4096, device=CUDA, dtype=torch.bfloat16)
    report = check(lambda x, w, r: x @ w + r, x, w, r, mode="max-autotune")
    (decision,) = [d for d in report.decisions if d.verdict == "template"]
    assert "timed against cuBLAS" in decision.reason
