"""Users' Triton kernels inside kiln's graphs on an NVIDIA GPU, where Dynamo captures them
without help and finds which arguments each kernel writes. Run on a GPU machine:
    PYTHONPATH=src python -m pytest -q tests/gpu/test_user_triton_gpu.py -m gpu
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same, run_compiled
from torch._dynamo.utils import counters
from triton_user_kernels import (
    accumulate_into_input,
    accumulate_kernel,
    add_autotuned,
    add_between_kernels,
    add_kernel,
    add_with_grid_lambda,
    autotuned_add_kernel,
    scaled_add,
    through_triton_op,
)

import kiln
from kiln import errors
from kiln.ir.host import Launch, LaunchUser

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _compare(fn, *args):
    """fn compiled by kiln (fullgraph, no graph break) == fn in eager, inputs' updates too."""
    eager_args = [a.clone() for a in args]
    kiln_args = [a.clone() for a in args]
    expected = fn(*eager_args)
    counters.clear()
    actual, report = run_compiled(fn, *kiln_args, fullgraph=True)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert report is not None, "kiln did not compile the graph"
    assert_same(actual, expected)
    for a, e in zip(kiln_args, eager_args):
        assert_same(a, e)
    return report


def _launches(report, kind):
    return [i for i in report.host_program.body if isinstance(i, kind)]


def test_a_kernel_between_kiln_kernels_needs_no_copy():
    x, y = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    report = _compare(add_between_kernels(add_kernel), x, y)
    (launch,) = _launches(report, LaunchUser)
    # Dynamo finds the kernel writes only out_ptr, whose buffer is dead after the launch
    assert launch.clones == () and launch.returns == ("out_ptr",)
    assert len(_launches(report, Launch)) == 2


def test_a_grid_lambda_a_constexpr_block_and_a_transposed_operand():
    x, y = torch.randn(96, 40, device="cuda"), torch.randn(40, 96, device="cuda")
    report = _compare(add_with_grid_lambda(add_kernel), x, y)
    (launch,) = _launches(report, LaunchUser)
    assert launch.grid == (120, 1, 1)


def test_a_kernel_updating_an_input_in_place():
    acc, x = torch.randn(3000, device="cuda"), torch.randn(3000, device="cuda")
    report = _compare(accumulate_into_input(accumulate_kernel), acc, x)
    (launch,) = _launches(report, LaunchUser)
    assert launch.clones == () and "copy_" not in str(report.host_program)


def test_a_triton_op():
    x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    report = _compare(through_triton_op(scaled_add), x, y)
    (launch,) = _launches(report, LaunchUser)
    assert launch.kernel.endswith(":scaled_add_kernel")


def test_an_autotuned_kernel_runs_as_dynamo_would_with_one_reason():
    x, y = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    before = len(errors.FALLBACKS)
    report = _compare(add_autotuned(autotuned_add_kernel), x, y)
    assert not _launches(report, LaunchUser)
    reasons = [f.reason for f in list(errors.FALLBACKS)[before:] if "Autotuner" in f.reason]
    assert len(reasons) == 1


def test_a_kernel_replayed_in_a_cuda_graph():
    """mode="reduce-overhead": the user's launch is captured with kiln's kernels and replays on
    new inputs."""
    fn = add_between_kernels(add_kernel)
    torch._dynamo.reset()
    compiled = kiln.compile(fn, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        x, y = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
        assert_same(compiled(x.clone(), y.clone()), fn(x, y))
