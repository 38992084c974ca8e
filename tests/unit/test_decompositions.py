"""Decompositions kiln adds to PyTorch's: what they turn an op into, per device."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.frontend.decompositions import decomposition_table

aten = torch.ops.aten


class _Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, args))
        return func(*args, **(kwargs or {}))


def _convolution_calls(device: str):
    decompose = decomposition_table()[aten.convolution.default]
    with FakeTensorMode(), _Calls() as seen:
        x = torch.empty(2, 3, 8, 8, device=device)
        w, b = torch.empty(4, 3, 3, 3, device=device), torch.empty(4, device=device)
        out = decompose(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return out, [(f, a) for f, a in seen.calls if f not in (aten.empty.memory_format,)]


def test_gpu_convolution_bias_becomes_an_add_that_fuses():
    out, calls = _convolution_calls("cuda")
    assert tuple(out.shape) == (2, 4, 8, 8)
    convolutions = [a for f, a in calls if f is aten.convolution.default]
    assert len(convolutions) == 1 and convolutions[0][2] is None
    assert calls[-1][0] is aten.add.Tensor


def test_cpu_convolution_keeps_its_bias():
    out, calls = _convolution_calls("cpu")
    assert out is NotImplemented


def test_embedding_backward_is_kept_whole():
    assert aten.embedding_dense_backward.default not in decomposition_table()
