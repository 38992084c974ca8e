"""GPU kernels stored as binaries, checked on a machine without a GPU: a whole-graph entry
and an artifact built for a (faked) sm_90 device hold each kernel's cubin and launch
metadata, which round-trip through to_dict/from_dict; launches pass the arguments Triton's
compiled kernel expects; loading a GPU artifact here says why it cannot run."""

from __future__ import annotations

import json

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.codegen.backends import get_backend
from kiln.frontend.decompositions import decomposition_table
from kiln.options import Options
from kiln.runtime import artifact, cache, graph_cache, triton_abi, triton_build
from kiln.runtime.artifact import ArtifactError
from kiln.runtime.triton_abi import KernelBinary

pytestmark = pytest.mark.skipif(
    triton_build.interpreted(), reason="compiles for a GPU, not for Triton's interpreter"
)

SM90 = ("cuda", 90, 32)
ELF_MAGIC = b"\x7fELF"


@pytest.fixture
def fake_sm90(monkeypatch, tmp_path):
    """Triton builds compile for sm_90 and launchers are never started (no GPU here)."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(triton_abi, "current_target", lambda: SM90)
    monkeypatch.setattr(triton_abi, "direct_launch", lambda *args: lambda *tensors: None)


def _f(x, w):
    # x[:, 1:] starts off a 16-byte boundary: its kernel also gets a binary for any address
    return torch.softmax(torch.tanh(x[:, 1:]) * 2, -1) @ w, (x * 3).sum(0)


def _inputs():
    return torch.randn(64, 33), torch.randn(32, 8)


def _check_binary(b: KernelBinary, params: int) -> None:
    assert b.cubin.startswith(ELF_MAGIC) and b.arch == 90 and b.warp_size == 32
    assert b.num_warps == b.config[2] and b.num_ctas == 1 and b.shared >= 0
    assert b.pointers == params and b.grid[0] >= 1
    assert b.constants["XBLOCK"] == b.config[0] and b.constants["RBLOCK"] == b.config[1]
    assert b.constants["ALIGNED"] == b.aligned
    data = json.loads(json.dumps(b.to_dict()))
    assert "cubin" not in data and KernelBinary.from_dict(data, b.cubin) == b


def test_a_graph_entry_holds_each_kernels_cubin_and_launch_metadata(fake_sm90):
    x, w = _inputs()
    gm = make_fx(_f, decomposition_table())(x, w)
    backend = get_backend("triton", Options())
    _, report = graph_cache.compile_cached(gm, [x, w], Options(), "triton", backend)
    (folder,) = [p for p in cache.cache_dir(graph_cache.FOLDER).iterdir() if p.is_dir()]
    stored = graph_cache.read_binaries(folder)
    assert set(stored) == {k.name for k in report.kernels} and len(report.kernels) >= 2
    for kern in report.kernels:
        (binary,) = stored[kern.name]
        _check_binary(binary, len(kern.params))
        assert binary == report.binaries[kern.name][0]
    assert (
        cache.check(
            cache.entry("graph", graph_cache.FOLDER, "graph", "", cache.read_record(folder)["components"])
        )
        is None
    )

    # no GPU here: a hit builds the kernels through Triton's cache instead of the binaries
    _, again = graph_cache.compile_cached(gm, [x, w], Options(), "triton", backend)
    assert again.from_cache == folder.name
    assert "from cache" in again.passes[-1].summary


def test_a_damaged_cubin_is_refused():
    b = KernelBinary(
        "k",
        ELF_MAGIC + b"rest",
        90,
        32,
        4,
        1,
        0,
        0,
        1,
        0,
        1,
        {"in0": "*fp32", "XBLOCK": "constexpr"},
        {"XBLOCK": 128},
        (128, 1, 4),
        (3, 1, 1),
        True,
    )
    with pytest.raises(ValueError, match="does not match its digest"):
        KernelBinary.from_dict(b.to_dict(), ELF_MAGIC + b"other")


def test_launch_arguments_append_triton_scratch_pointers():
    b = KernelBinary(
        "k",
        b"",
        90,
        32,
        4,
        1,
        0,
        256,
        16,
        0,
        1,
        {"in0": "*fp32", "in1": "*bf16", "out0": "*fp32", "XBLOCK": "constexpr", "RBLOCK": "constexpr"},
        {"XBLOCK": 128, "RBLOCK": 1},
        (128, 1, 4),
        (6, 2, 1),
        True,
    )
    assert b.pointers == 3 and b.threads == 128
    assert triton_abi.launch_arguments(b, [16, 32, 48]) == [16, 32, 48, 0, 0]
    assert triton_abi.launch_arguments(b, [16, 32, 48], 4096) == [16, 32, 48, 4096, 0]
    assert triton_abi.scratch_sizes(b) == (12 * 256, 0)  # a program's scratch, for each program
    with pytest.raises(ValueError, match="takes 3 pointers"):
        triton_abi.launch_arguments(b, [16, 32])


def test_an_artifact_for_the_gpu_holds_cubins_and_is_refused_without_one(fake_sm90, tmp_path, monkeypatch):
    monkeypatch.setattr(artifact, "_code_generator", lambda devices: "triton")
    x, w = _inputs()
    path = kiln.export(_f, (x, w), tmp_path / "f.kiln")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["device"] == "cuda" and manifest["arch"] == "sm_90" and "machine" not in manifest
    kernels = manifest["kernels"]
    assert len(kernels) >= 2
    for entry in kernels.values():
        for data in (entry["binary"], entry["any alignment"]):
            if data is not None:
                cubin = (path / "kernels" / f"{data['cubin_sha256']}.cubin").read_bytes()
                _check_binary(KernelBinary.from_dict(data, cubin), len(data["signature"]) - 3)
    # the kernel reading x[:, 1:] may be given an address off 16 bytes: it has a binary for any
    any_address = [e["any alignment"] for e in kernels.values() if e["binary"]["aligned"]]
    assert any(a is not None and not a["aligned"] for a in any_address)
    with pytest.raises(
        ArtifactError, match="runs on an NVIDIA GPU \\(sm_90\\); this machine has no CUDA GPU"
    ):
        kiln.load(path)


LOAD_WITH_STAND_IN = """
import ctypes, sys
{fake_gpu}
import kiln
program = kiln.load({path!r})
x, w = torch.randn(64, 33), torch.randn(32, 8)
outs = program(x, w)
assert [tuple(o.shape) for o in outs] == [(64, 8), (33,)]
heavy = [m for m in sys.modules if m.startswith(("triton", "torch._dynamo", "torch._inductor", "sympy"))]
print("launches", ctypes.c_int.in_dll(ctypes.CDLL({library!r}), "launches").value, "heavy", heavy)
"""


def test_a_gpu_artifact_loads_and_launches_every_kernel_through_the_driver(fake_sm90, tmp_path, monkeypatch):
    """Against the stand-in driver (its launches compute nothing): the loaded program binds
    each kernel to its cubin and launches it with as many pointers as it was compiled for,
    importing neither Triton, Dynamo nor sympy."""
    import os
    import subprocess
    import sys

    import stand_in_cuda

    library = stand_in_cuda.build(tmp_path)
    if library is None:
        pytest.skip("needs a C compiler to build the stand-in driver")
    monkeypatch.setattr(artifact, "_code_generator", lambda devices: "triton")
    x, w = _inputs()
    path = kiln.export(_f, (x, w), tmp_path / "f.kiln")
    launches = sum(1 for i in json.loads((path / "host.json").read_text())["body"] if i["instr"] == "Launch")
    script = LOAD_WITH_STAND_IN.format(
        fake_gpu=stand_in_cuda.FAKE_GPU.format(library=str(library)), path=str(path), library=str(library)
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["launches", str(launches), "heavy", "[]"]
