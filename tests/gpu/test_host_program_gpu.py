"""The host program on an NVIDIA GPU: no arena (a slot is its first buffer viewed again),
Triton launchers taking tensors, index checks as a device-side assert, and a program rebuilt
from JSON running like eager. Run on a GPU machine:
    PYTHONPATH=src python -m pytest -q tests/gpu -m gpu
"""

import json

import pytest
import torch
from conftest import assert_same, run_compiled

from kiln.codegen import host as host_codegen
from kiln.codegen.backends import get_backend
from kiln.ir.host import HostProgram, View, constants_blob
from kiln.options import Options

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _f(x, i, w):
    h = torch.softmax(torch.tanh(x) * 2, -1)  # temporaries: two kernels, then the matmul
    g = torch.index_select(h, 0, i) @ w
    return g.relu() + 1, x.new_tensor([1.0, 2.0]) * x[0, :2], x.t(), torch.sigmoid(g).sum(0)


def _inputs():
    return (torch.randn(64, 32, device="cuda"), torch.randint(0, 64, (16,), device="cuda"),
            torch.randn(32, 8, device="cuda"))


def test_a_cuda_program_rebuilt_from_json_runs_like_eager():
    args = _inputs()
    out, report = run_compiled(_f, *args)
    assert_same(out, _f(*args))
    program = report.host_program
    assert program.launch_abi == "tensors" and program.arena == ()
    assert "assert_async(" in report.host_source and "errors.any()" not in report.host_source
    data = json.loads(json.dumps(program.to_dict(), allow_nan=False))
    again = HostProgram.from_dict(data, constants_blob(program))
    assert again == program and str(again) == str(program)
    backend = get_backend(report.backend, Options())
    fns, _ = backend.build(report.kernels, [report.sources[k.name] for k in report.kernels])
    call = host_codegen.load(again, {k.name: fn for k, fn in zip(report.kernels, fns)}, check_inputs=True)
    for _ in range(3):
        args = _inputs()
        assert_same(call(list(args)), _f(*args))
    torch.cuda.synchronize()


def test_without_an_arena_temporaries_reuse_their_slots_buffer():
    def chain(x, w):
        for _ in range(4):
            x = torch.tanh(x * 2) @ w  # each kernel's result is dead once the matmul read it
        return x

    x, w = torch.randn(32, 64, device="cuda"), torch.randn(64, 64, device="cuda") / 8
    out, report = run_compiled(chain, x, w)
    assert_same(out, chain(x, w))
    reused = [i for i in report.host_program.body if isinstance(i, View) and i.out.startswith("buf")]
    assert reused, str(report.host_program)
