"""The numerics check (docs/numerics_check.md): a planted wrong kernel is named with its IR,
its source and the model code it came from; bisection names the fusion decision, the merge or
the op; a correct model passes; `python -m kiln check` exits 1 on a planted error."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import assert_same

import kiln
from kiln.codegen import backends
from kiln.frontend.backend import REPORTS
from kiln.ir import kernel as K
from kiln.tools import check
from kiln.tools.__main__ import main as kiln_command
from kiln.tools.demo import Block

SRC = str(Path(kiln.__file__).parents[1])


def _sqrt_for_rsqrt(kern: K.Kernel) -> K.Kernel:
    """The kernel computing sqrt where its IR says rsqrt."""
    def swap(s):
        return dataclasses.replace(s, fn="sqrt") if isinstance(s, K.Compute) and s.fn == "rsqrt" else s

    stages = tuple(K.Stage(st.loop, tuple(swap(s) for s in st.body)) for st in kern.stages)
    return dataclasses.replace(kern, stages=stages)


PLANTS = {
    "every kernel": lambda kern: True,
    "reduction kernels": lambda kern: kern.is_reduction,
    "merged kernels": lambda kern: sum(p.is_output for p in kern.params) > 1,
}


@pytest.fixture
def planted(monkeypatch):
    """plant(where): kernels the predicate picks render sqrt for rsqrt (the IR stays right)."""
    def plant(where: str) -> None:
        picks = PLANTS[where]
        real = backends.get_backend

        def get_backend(name, options):
            backend = real(name, options)

            def render(kern):
                return backend.render(_sqrt_for_rsqrt(kern) if picks(kern) else kern)

            return dataclasses.replace(backend, render=render)

        monkeypatch.setattr("kiln.frontend.backend.get_backend", get_backend)

    return plant


class Norm(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(dim))

    def forward(self, x):
        scaled = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return torch.relu(scaled * self.weight) + x.sum(-1, keepdim=True)


def _checked_run(module, *args, **options):
    torch._dynamo.reset()
    before = len(REPORTS)
    out = kiln.compile(module, check=True, **options)(*args)
    reports = REPORTS[before:]
    assert reports, "kiln compiled nothing"
    return out, reports


def test_a_planted_wrong_kernel_is_named_with_its_ir_source_and_model_code(planted, caplog):
    planted("every kernel")
    torch.manual_seed(0)
    x = torch.randn(8, 64)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        _, reports = _checked_run(Norm(64), x)
    result = reports[-1].numerics
    assert result is not None and not result.ok
    assert result.max_error > result.tolerance > 0
    text = result.text
    assert result.kernel in text
    assert "pointwise.rsqrt" in text  # the tensor IR, which says rsqrt
    assert f"kernel {result.kernel}(" in text  # the kernel IR
    source = reports[-1].sources[result.kernel]
    assert source.strip().splitlines()[1].strip() in text  # the generated source
    assert "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)" in text  # the model code
    assert "test_numerics_check.py" in text
    # one warning, carrying the same text; the bisection finds the op wrong on its own
    warnings = [r for r in caplog.records if "numerics check" in r.getMessage()]
    assert len(warnings) == 1 and result.kernel in warnings[0].getMessage()
    assert "not a fusion decision" in result.bisection and "pointwise.rsqrt" in result.bisection


def test_bisection_names_the_fusion_decision_that_changes_the_result(planted):
    planted("reduction kernels")  # rsqrt goes wrong only where a reduction is fused with it
    torch.manual_seed(0)
    _, reports = _checked_run(Norm(64), torch.randn(8, 64))
    result = reports[-1].numerics
    assert not result.ok
    assert "fusion decision that inlined" in result.bisection, result.bisection
    assert "reduce.sum" in result.bisection


def test_bisection_names_a_merge(planted):
    planted("merged kernels")  # wrong only where two stored values share a kernel
    torch.manual_seed(0)
    _, reports = _checked_run(Norm(64), torch.randn(8, 64))
    result = reports[-1].numerics
    merged = [k for k in reports[-1].kernels if sum(p.is_output for p in k.params) > 1]
    if not merged:
        pytest.skip("this backend computes the norm without a merged kernel")
    assert not result.ok
    assert "the merge of" in result.bisection, result.bisection


def test_a_transformer_block_passes_forward_and_training_step(caplog):
    torch.manual_seed(0)
    block = Block(64, 4, 176)
    x = torch.randn(2, 16, 64)
    expected = block(x)
    expected.square().mean().backward()
    grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    with caplog.at_level(logging.WARNING, logger="kiln"):
        out, reports = _checked_run(block, x)
        out.square().mean().backward()
    reports = REPORTS[len(REPORTS) - len(reports) - 1:]  # with the backward's
    results = [r.numerics for r in reports if r.numerics is not None]
    assert len(results) == 2, "the forward and the backward are both checked"
    for result in results:
        assert result.ok, result.text
        assert result.checked > 0 and not result.skipped, result.text
    assert not [r for r in caplog.records if "numerics check" in r.getMessage()]
    assert_same(out, expected)
    for p, g in zip(block.parameters(), grads):
        assert_same(p.grad, g)


def test_check_through_torch_compile_options_and_the_environment(monkeypatch):
    def fn(x):
        return torch.rsqrt(x.abs() + 1) * x.sum(-1, keepdim=True)

    x = torch.randn(4, 32)
    torch._dynamo.reset()
    before = len(REPORTS)
    torch.compile(fn, backend="kiln", options={"check": True})(x)
    assert REPORTS[-1].numerics is not None and REPORTS[-1].numerics.ok
    assert not REPORTS[-1].from_cache and len(REPORTS) > before

    monkeypatch.setenv("KILN_CHECK", "1")
    torch._dynamo.reset()
    kiln.compile(fn)(x)
    assert REPORTS[-1].numerics is not None and REPORTS[-1].numerics.ok
    monkeypatch.setenv("KILN_CHECK", "0")
    torch._dynamo.reset()
    kiln.compile(fn)(x)
    assert REPORTS[-1].numerics is None


_SCRIPT = """
import dataclasses, sys
import torch
import kiln
from kiln.codegen import backends
from kiln.tools.__main__ import main as kiln_command
from kiln.ir import kernel as K

if sys.argv[1] == "planted":
    real = backends.get_backend

    def swap(s):
        return dataclasses.replace(s, fn="sqrt") if isinstance(s, K.Compute) and s.fn == "rsqrt" else s

    def get_backend(name, options):
        b = real(name, options)
        def render(kern):
            stages = tuple(K.Stage(st.loop, tuple(swap(s) for s in st.body)) for st in kern.stages)
            return b.render(dataclasses.replace(kern, stages=stages))
        return dataclasses.replace(b, render=render)

    import kiln.frontend.backend
    kiln.frontend.backend.get_backend = get_backend

f = torch.compile(lambda x: torch.rsqrt(x.abs() + 1) * x.sum(-1, keepdim=True), backend="kiln")
print(f(torch.randn(4, 32)).sum())
"""


def test_the_command_line_exits_1_on_a_kernel_over_tolerance(tmp_path, monkeypatch):
    script = tmp_path / "model.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("KILN_CHECK", None)
    planted_run = subprocess.run([sys.executable, "-m", "kiln", "check", str(script), "planted"],
                                 env=env, capture_output=True, text=True, timeout=300)
    assert planted_run.returncode == 1, planted_run.stderr[-3000:]
    assert "over tolerance" in planted_run.stderr and "model.py" in planted_run.stderr
    # the clean script, in this process (the command restores nothing it sets: the test does)
    monkeypatch.setenv("KILN_CHECK", "0")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    torch._dynamo.reset()
    before = len(check.RESULTS)
    assert kiln_command(["check", str(script), "clean"]) == 0
    assert len(check.RESULTS) == before + 1 and check.RESULTS[-1].ok


def test_comparison_rules():
    wide = torch.tensor([1.0, 2.0, float("nan"), float("inf")], dtype=torch.float64)
    own = wide.float()
    assert not check.compare(own.clone(), wide, own).over
    off = own.clone()
    off[1] += 1e-3
    err = check.compare(off, wide, own)
    assert err.over and err.bad_elements == 1 and err.max_error == pytest.approx(1e-3, rel=1e-3)
    nan = own.clone()
    nan[0] = float("nan")  # a NaN where both references are finite
    assert check.compare(nan, wide, own).over
    ints = torch.tensor([1, 2, 3])
    assert not check.compare(ints.clone(), ints, ints).over
    assert check.compare(ints + torch.tensor([0, 1, 0]), ints, ints).bad_elements == 1
