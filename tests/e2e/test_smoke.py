import torch
import torch.nn.functional as F
from conftest import check


def test_fused_softmax_and_rowsum_are_one_kernel():
    def f(x, y):
        return torch.relu(x * y + 1).sum(-1), torch.softmax(x, -1)

    report = check(f, torch.randn(64, 128), torch.randn(64, 128), expect_native=True)
    assert report.num_kernels == 1


def test_layer_norm_gelu_bf16():
    def f(x, w, b):
        return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))

    x = torch.randn(8, 32, 64, dtype=torch.bfloat16)
    w, b = torch.randn(64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    report = check(f, x, w, b, expect_native=True)
    assert report.num_kernels == 1
