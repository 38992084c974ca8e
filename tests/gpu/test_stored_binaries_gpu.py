"""Stored GPU binaries on an NVIDIA GPU: an artifact exported in one process runs in a fresh
one without Triton's compiler, Dynamo or AOTAutograd, like eager; a warm process launches the
whole-graph cache's cubins and compiles no Triton kernel. Run on a GPU machine:
    PYTHONPATH=src python -m pytest -q tests/gpu -m gpu
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.runtime.artifact import ArtifactError

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SRC = os.path.abspath(os.path.join(os.path.dirname(kiln.__file__), ".."))


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(256)
        self.up, self.down = torch.nn.Linear(256, 512), torch.nn.Linear(512, 256)

    def forward(self, x):
        h = self.down(F.gelu(self.up(self.norm(x))))
        return x + h, torch.softmax(h, -1).amax(-1)


def _run(script: str, tmp_path, **env) -> str:
    env = {**os.environ, "PYTHONPATH": SRC, "KILN_CACHE_DIR": str(tmp_path / "cache"), **env}
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-artifact")
    torch.manual_seed(0)
    model = _Block().cuda().eval()
    path = kiln.export(model, (torch.randn(4, 32, 256, device="cuda"),), tmp / "block.kiln")
    base = torch.randn(4 * 32 * 256 + 1, device="cuda")
    x = base[1:].view(4, 32, 256)  # 4 bytes past an allocation: off every 16-byte boundary
    with torch.no_grad():
        torch.save({"x": x.clone(), "x_unaligned": x, "expected": model(x)}, tmp / "io.pt")
    return path, tmp


FORBIDDEN = ("triton", "torch._dynamo", "torch._inductor", "torch._functorch.aot_autograd")


def test_a_fresh_process_runs_the_artifact_without_triton_or_dynamo(exported, tmp_path):
    path, tmp = exported
    manifest = json.loads((path / "manifest.json").read_text())
    major, minor = torch.cuda.get_device_capability()
    assert manifest["device"] == "cuda" and manifest["arch"] == f"sm_{major}{minor}"
    assert list((path / "kernels").glob("*.cubin"))
    out = _run(
        f"""
        import sys, traceback

        class FirstForbiddenImport:  # names the import chains that pulled a compiler in
            stacks = {{}}

            def find_spec(self, name, path=None, target=None):
                root = next((f for f in {FORBIDDEN!r} if name.startswith(f)), None)
                if root is not None and root not in self.stacks:
                    self.stacks[root] = name + " imported from\\n" + "".join(traceback.format_stack(limit=30))

        watch = FirstForbiddenImport()
        sys.meta_path.insert(0, watch)
        import torch, kiln
        io = torch.load({str(tmp / "io.pt")!r})
        program = kiln.load({str(path)!r})
        outs = [program(io["x"]), program(io["x_unaligned"]), program(io["x"])]
        torch.cuda.synchronize()
        loaded = [m for m in sys.modules if m.startswith({FORBIDDEN!r})]
        assert io["x_unaligned"].data_ptr() % 16 != 0
        for got in outs:
            for a, e in zip(got, io["expected"]):
                torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
        assert not loaded, "\\n".join(watch.stacks.values())
        print("ok")
    """,
        tmp_path,
        CXX="/nonexistent",
    )
    assert "ok" in out


def test_an_artifact_for_another_gpu_architecture_is_refused(exported, tmp_path):
    path, _ = exported
    copy = tmp_path / "other.kiln"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["arch"] = "sm_80" if manifest["arch"] != "sm_80" else "sm_90"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=f"built for {manifest['arch']}; this GPU .* is sm_"):
        kiln.load(copy)


def test_a_damaged_cubin_is_refused(exported, tmp_path):
    path, _ = exported
    copy = tmp_path / "damaged.kiln"
    shutil.copytree(path, copy)
    cubin = next((copy / "kernels").glob("*.cubin"))
    cubin.write_bytes(cubin.read_bytes()[:-7])
    with pytest.raises(ArtifactError, match="missing or damaged"):
        kiln.load(copy)


WARM = """
    import os, torch, kiln
    import torch.nn.functional as F
    from kiln.frontend.backend import REPORTS
    from kiln.runtime import compile_pool

    if os.environ.get("WARM_PROCESS"):  # the cache holds every binary: no Triton compile may run
        def refuse(args):
            raise AssertionError(f"Triton compiled {args.kernel_name} in a warm process")
        compile_pool.compile_in_process = refuse

    def f(x, w):
        return torch.softmax(torch.tanh(x) @ w, -1) * 2, F.layer_norm(x, (256,)).sum(-1)

    torch.manual_seed(0)
    x, w = torch.randn(128, 256, device="cuda"), torch.randn(256, 64, device="cuda")
    out = kiln.compile(f)(x, w)
    torch.cuda.synchronize()
    for a, e in zip(out, f(x, w)):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    print(" | ".join(p.summary for r in REPORTS for p in r.passes))
"""


def test_a_warm_process_launches_the_graph_caches_binaries(tmp_path):
    cold = _run(WARM, tmp_path)
    assert "stored as graph/" in cold
    (entry,) = [p for p in (tmp_path / "cache" / "graph").iterdir() if p.is_dir()]
    assert (entry / "binaries.json").is_file() and list((entry / "cubins").glob("*.cubin"))
    warm = _run(WARM, tmp_path, WARM_PROCESS="1")
    assert "from stored binaries" in warm and "0 kernels compiled" in warm


WARM_TRAINING = """
    import os, torch, kiln
    from kiln.frontend.backend import REPORTS
    from kiln.runtime import compile_pool

    if os.environ.get("WARM_PROCESS"):
        def refuse(args):
            raise AssertionError(f"Triton compiled {args.kernel_name} in a warm process")
        compile_pool.compile_in_process = refuse

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(256), torch.nn.Linear(256, 256), torch.nn.GELU()).cuda()
    x = torch.randn(64, 256, device="cuda")
    kiln.compile(model)(x).square().mean().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().mean().backward()
    for a, e in zip(got, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    print(" | ".join(p.summary for r in REPORTS for p in r.passes))
"""


def test_a_warm_training_step_launches_both_programs_from_stored_binaries(tmp_path):
    _run(WARM_TRAINING, tmp_path)
    warm = _run(WARM_TRAINING, tmp_path, WARM_PROCESS="1")
    assert warm.count("from stored binaries") == 2, warm  # the forward and the backward program
