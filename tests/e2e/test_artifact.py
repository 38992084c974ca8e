"""Ahead-of-time artifacts: kiln.export writes a compiled program; kiln.load runs it in a
fresh process with no compiler on PATH and without importing Dynamo, and refuses calls and
artifacts it cannot run with errors that say why."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln.runtime.artifact import ArtifactError
from kiln.tools.demo import Block

pytestmark = pytest.mark.skipif(os.environ.get("KILN_TARGET") == "triton",
                                reason="artifacts hold C++ kernels: nothing for the Triton pass to check")


@pytest.fixture(scope="module")
def demo_artifact(tmp_path_factory):
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 16, 256)
    path = kiln.export(model, (x,), tmp_path_factory.mktemp("art") / "block.kiln")
    return model, x, path


def test_a_fresh_process_without_a_compiler_runs_the_artifact(demo_artifact, tmp_path):
    model, x, path = demo_artifact
    x2 = torch.randn_like(x)  # fresh inputs, not the example's
    with torch.no_grad():
        torch.save({"x": x2, "expected": model(x2)}, tmp_path / "io.pt")
    bin_dir = tmp_path / "bin"  # PATH holds Python and nothing else: no C++ compiler
    bin_dir.mkdir()
    os.symlink(sys.executable, bin_dir / "python")
    script = textwrap.dedent(f"""
        import sys, torch, kiln
        io = torch.load({str(tmp_path / 'io.pt')!r})
        out = kiln.load({str(path)!r})(io["x"])
        # nor sympy: a program of fixed sizes has no symbolic size to reason about (read before
        # assert_close, which imports it)
        heavy = ("torch._dynamo", "torch._inductor", "triton", "sympy")
        loaded = [m for m in sys.modules if m.startswith(heavy)]
        torch.testing.assert_close(out, io["expected"], rtol=1e-5, atol=1e-5)
        assert not loaded, loaded
        print("ok")
    """)
    src = os.path.join(os.path.dirname(kiln.__file__), "..")
    # the link runs the base interpreter: a virtual environment's packages come by the path
    path_entries = [os.path.abspath(src), *site.getsitepackages()]
    env = {"PATH": str(bin_dir), "PYTHONPATH": os.pathsep.join(path_entries), "CXX": "/nonexistent",
           "KILN_CACHE_DIR": str(tmp_path / "empty-cache"), "HOME": str(tmp_path)}
    result = subprocess.run([str(bin_dir / "python"), "-c", script], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]
    assert not (tmp_path / "empty-cache").exists()  # nothing compiled, nothing cached


def test_a_function_of_several_inputs_with_several_outputs(tmp_path):
    def f(a, b):
        return torch.softmax(a @ b, -1), (a * 2).sum(0)

    a, b = torch.randn(8, 16), torch.randn(16, 4)
    run = kiln.load(kiln.export(f, (a, b), tmp_path / "f.kiln"))
    a2, b2 = torch.randn(8, 16), torch.randn(16, 4)
    for got, want in zip(run(a2, b2), f(a2, b2)):
        torch.testing.assert_close(got, want)
    assert isinstance(run(a2, b2), tuple)


def test_a_non_contiguous_input_gives_the_same_result(demo_artifact):
    model, x, path = demo_artifact
    run = kiln.load(path)
    y = torch.randn(2, 256, 16).transpose(1, 2)
    with torch.no_grad():
        torch.testing.assert_close(run(y), model(y), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("args,error,message", [
    ((), TypeError, "takes 1 inputs, got 0"),
    ((torch.randn(2, 16, 256).double(),), TypeError, "dtype torch.float64"),
    ((torch.randn(2, 16),), ValueError, "2 dimensions"),
    ((torch.randn(2, 17, 256),), ValueError, "shape [2, 17, 256]"),
    ((torch.randn(2, 16, 256, device="meta"),), ValueError, "is on meta"),
    ((3.0,), TypeError, "must be a tensor"),
], ids=["count", "dtype", "rank", "size", "device", "not-a-tensor"])
def test_a_call_that_does_not_match_names_the_argument(demo_artifact, args, error, message):
    run = kiln.load(demo_artifact[2])
    with pytest.raises(error, match="input|inputs") as info:
        run(*args)
    assert message in str(info.value)


@pytest.mark.parametrize("key", ["torch", "kiln", "machine"])
def test_an_artifact_from_elsewhere_is_refused(demo_artifact, tmp_path, key):
    import shutil

    copy = tmp_path / "other.kiln"
    shutil.copytree(demo_artifact[2], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest[key] = "something else"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=f"built for {key}"):
        kiln.load(copy)


def test_not_an_artifact_is_a_clear_error(tmp_path):
    # an artifact for a shape family: tests/e2e/test_symbolic_sizes.py
    with pytest.raises(ArtifactError, match="not a kiln artifact"):
        kiln.load(tmp_path)
