"""Run-time checks on the GPU behave as eager's CUDA kernels: an index out of range stops the
program with a device-side assert (asynchronously, never a host read per call), an integer
division by zero does not raise. Run on a GPU machine:
    PYTHONPATH=src python -m pytest -q tests/gpu -m gpu
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import assert_same

import kiln

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _gather(x, i):
    return torch.index_select(x, 0, i) * 2


def test_gather_in_range_matches_eager_without_a_host_sync():
    x, i = torch.randn(1000, 64, device="cuda"), torch.randint(0, 1000, (300,), device="cuda")
    compiled = kiln.compile(_gather)
    assert_same(compiled(x, i), _gather(x, i))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a host read of the error buffer would raise here
    try:
        out = compiled(x, i)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_same(out, _gather(x, i))


def test_index_out_of_range_asserts_on_the_device():
    """A device-side assert ruins the CUDA context: it runs in a process of its own."""
    script = textwrap.dedent("""
        import torch, kiln
        f = kiln.compile(lambda x, i: torch.index_select(x, 0, i) * 2)
        x = torch.randn(10, 4, device="cuda")
        f(x, torch.tensor([1, 3], device="cuda"))
        f(x, torch.tensor([1, 12], device="cuda"))
        torch.cuda.synchronize()
        print("no error")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode != 0 and "no error" not in done.stdout, done.stdout + done.stderr
    assert "assert" in done.stderr, done.stderr[-2000:]


def test_integer_division_by_zero_does_not_raise():
    a = torch.randint(-50, 50, (256,), device="cuda")
    b = torch.randint(-3, 4, (256,), device="cuda")
    b[0] = 0
    out = kiln.compile(lambda a, b: torch.div(a, b, rounding_mode="floor") + 1)(a, b)
    torch.cuda.synchronize()
    nonzero = b != 0
    expected = torch.div(a, b, rounding_mode="floor") + 1
    assert torch.equal(out[nonzero], expected[nonzero])


def test_a_training_step_with_index_checks_runs_compiled():
    """A training graph is compiled inside AOTAutograd's fake mode: what the program keeps of
    its checks must be real tensors, or its first call fails and the graph runs in ATen."""
    from kiln import errors

    def step(logits, targets):
        loss = torch.nn.functional.cross_entropy(logits.float(), targets)
        loss.backward()
        return loss

    logits = torch.randn(64, 300, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 300, (64,), device="cuda")
    targets[::7] = -100  # ignored rows
    reference = logits.detach().clone().requires_grad_()
    with errors.collect() as fallbacks:
        loss = kiln.compile(step)(logits, targets)
    assert not [f for f in fallbacks if f.scope == "graph"], fallbacks
    assert_same(loss, step(reference, targets))
    assert_same(logits.grad, reference.grad)
