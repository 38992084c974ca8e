"""kiln's fuzzer: a fixed budget of random programs compiled by kiln must match eager (on the
C++ path; a small sample of tiny programs when CI runs tests/e2e through Triton's
interpreter), and the fuzzer itself must catch and shrink a wrong compiler."""

from __future__ import annotations

import os

import pytest
import torch

from kiln.tools.fuzz.compare import RTOL, Run, compare_runs, compare_tensor
from kiln.tools.fuzz.grammar import generate
from kiln.tools.fuzz.program import render, reproducer
from kiln.tools.fuzz.runner import run_program
from kiln.tools.fuzz.shrink import shrink

TRITON = os.environ.get("KILN_TARGET") == "triton"
# (seed, programs): about a minute on the C++ path on a 2-core machine
BUDGET = (15, 10) if TRITON else (15, 90)
# the fuzzer's own checks do not depend on the code generator: they run in the C++ pass only
fuzzer_check = pytest.mark.skipif(TRITON, reason="checks the fuzzer itself, not a code generator")


def test_fuzz_budget():
    seed, n = BUDGET
    failures = []
    for index in range(n):
        program = generate(seed, index, "tiny" if TRITON else "cpu")
        outcome = run_program(program)
        if outcome.failed:
            failures.append(f"{outcome.cls}: {outcome.detail}\n{reproducer(program)}")
    assert not failures, f"{len(failures)} of {n} programs fail:\n\n" + "\n\n".join(failures[:3])


@fuzzer_check
def test_programs_are_deterministic():
    assert render(generate(3, 7)) == render(generate(3, 7))
    assert render(generate(3, 7)) != render(generate(3, 8))


def _perturbed(scale: float):
    """A 'compiler' that runs the function and moves every float output by scale (relative)."""

    def compile_fn(fn):
        compiled = torch.compile(fn, backend="eager")

        def run(*args):
            return tuple(o + o.detach() * scale if o.is_floating_point() else o for o in compiled(*args))

        return run

    return compile_fn


def _first_float_program(seed: int):
    for index in range(50):
        program = generate(seed, index)
        if run_program(program, "eager").cls == "pass" and "float" in render(program) and not program.grad:
            outs = run_program(program, _perturbed(1e-2))
            if outs.cls == "mismatch":
                return program
    raise AssertionError("no float program found")


@fuzzer_check
def test_generated_programs_run_their_backward_in_eager():
    # its first draw's backward raised in eager (pow of float16 by bool): drawn again
    program = generate(200, 1549)
    assert run_program(program, "eager").cls == "pass"


@fuzzer_check
def test_catches_a_wrong_result_and_accepts_eager():
    program = _first_float_program(4)
    assert run_program(program, "eager").cls == "pass"
    assert run_program(program, _perturbed(1e-2)).cls == "mismatch"


def _sin_as_cos(gm, example_inputs):
    """A wrong compiler: every torch.sin computes cos."""
    for node in gm.graph.nodes:
        if node.target is torch.sin:
            node.target = torch.cos
    gm.recompile()
    return gm.forward


@fuzzer_check
def test_shrinks_a_failure_to_its_cause():
    def wrong(fn):
        return torch.compile(fn, backend=_sin_as_cos)

    for index in range(300):
        program = generate(21, index)
        candidate = "torch.sin(" in render(program) and len(program.stmts) >= 3 and not program.grad
        if candidate and run_program(program, wrong).cls == "mismatch":
            break
    else:
        raise AssertionError("no failing program with torch.sin")
    small = shrink(program, lambda p: run_program(p, wrong).cls == "mismatch", budget_s=60)
    assert len(small.stmts) < len(program.stmts)
    assert "torch.sin(" in render(small)
    assert run_program(small, wrong).cls == "mismatch"


@fuzzer_check
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tolerance_admits_ulps_and_rejects_errors(dtype):
    e = torch.randn(64).to(dtype)
    eps = torch.finfo(dtype).eps
    assert compare_tensor(e + e * eps, e) == ""
    assert compare_tensor(e + e.abs().max() * 3 * RTOL[dtype], e) != ""  # past rtol |e| + rtol max|e|
    nan = e.clone()
    nan[3] = float("nan")
    assert compare_tensor(e, nan) != "" and compare_tensor(nan, e) != ""


@fuzzer_check
def test_reference_admits_a_more_precise_low_precision_chain():
    x = torch.randn(256, dtype=torch.float64)
    eager = ((x.bfloat16() * 3).bfloat16() - x.bfloat16() * 2.9).bfloat16()  # rounds after each op
    kept_fp32 = (x.bfloat16().float() * 3 - x.bfloat16().float() * 2.9).bfloat16()
    ref = x.bfloat16().double() * 3 - x.bfloat16().double() * 2.9
    assert compare_tensor(kept_fp32, eager, ref) == ""
    assert compare_tensor(kept_fp32 + 0.5, eager, ref) != ""


@fuzzer_check
def test_strides_of_dense_outputs_must_match():
    e = torch.randn(4, 6).t()
    assert compare_tensor(e.contiguous(), e) != ""
    assert compare_tensor(e.clone(), e) == ""


@fuzzer_check
def test_exact_values_compare_bit_for_bit():
    e = torch.tensor([0.0, -0.0, float("nan"), 1.5])
    assert compare_tensor(e.clone(), e, bitwise=True) == ""
    assert compare_tensor(torch.tensor([0.0, 0.0, float("nan"), 1.5]), e, bitwise=True) != ""
    assert compare_tensor(torch.tensor([0.0, -0.0, float("nan"), 1.5000001]), e, bitwise=True) != ""


@fuzzer_check
def test_tiny_results_carry_the_error_of_unit_scale_terms():
    # the gradient of rms_norm over one element: terms near 1 cancel to about 3e-9
    ref = torch.tensor([-3.4974535e-09], dtype=torch.float64)
    eager = torch.tensor([-3.2837668e-09])
    assert compare_tensor(torch.tensor([-4.0398751e-09]), eager, ref) == ""
    # log_softmax over a size-1 dim: eager's x - x is 0, a fused one is within an ulp of 1.0
    zero64 = torch.zeros(1, dtype=torch.float64)
    assert compare_tensor(torch.tensor([5.5e-8]), torch.tensor([0.0]), zero64) == ""
    # the sum of a layer norm's three outputs: eager's happens to be 0, a fused one 1.5 ulps off
    assert compare_tensor(torch.tensor([-1.7881393e-07]), torch.tensor([0.0]), zero64) == ""
    assert compare_tensor(torch.tensor([-1e-6]), eager, ref) != ""


@fuzzer_check
def test_gradients_at_nan_inputs_are_not_compared():
    """eager's elu backward gives NaN at a NaN input in its vector loop and the gradient in its
    scalar tail; elsewhere a gradient still compares."""
    grad = torch.randn(8)
    eager = grad.clone()
    eager[2] = float("nan")
    nan_at = torch.zeros(8, dtype=torch.bool)
    nan_at[2] = True
    expected = Run([], [], [eager], [nan_at])
    assert compare_runs(Run([], [], [grad]), expected, None) == ""
    wrong = grad.clone()
    wrong[5] += 1
    assert compare_runs(Run([], [], [wrong]), expected, None) != ""


@fuzzer_check
def test_worker_processes_return_every_result():
    from kiln.tools.fuzz.pool import run_jobs

    jobs = [
        {
            "seed": 15,
            "index": i,
            "against": "eager",
            "profile": "tiny",
            "excluded": [],
            "timeout": 60,
            "shrink_seconds": 0,
        }
        for i in range(2)
    ] + [
        {
            "seed": 15,
            "index": 2,
            "against": "eager",
            "profile": "no such profile",
            "excluded": [],
            "timeout": 60,
            "shrink_seconds": 0,
        }
    ]
    results: list[dict] = []
    run_jobs(jobs, 1, results.append)
    assert sorted(r["index"] for r in results) == [0, 1, 2]
    assert [r["cls"] for r in sorted(results, key=lambda r: r["index"])][2] == "fuzzer error"
    assert all(r["cls"] == "pass" for r in results if r["index"] < 2), results
