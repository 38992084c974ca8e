"""Triton kernels of a shape family (sizes as arguments) compile for the H200 (sm_90) in each
binary variant a launch may pick (runtime/triton_family.py), on a machine without a GPU."""

import os
import subprocess
import sys
import textwrap

import pytest

GENERATE = textwrap.dedent("""
    import pickle, sys
    import torch, torch.nn.functional as F
    import kiln
    from kiln.frontend.backend import REPORTS
    from kiln.ir.kernel import size_params

    def graphs():
        x = torch.randn(4, 19, 64)
        yield lambda a: torch.tanh(a) * 2 + torch.sigmoid(a), (x,)
        yield lambda a: torch.softmax(a, -1), (x.transpose(1, 2).contiguous(),)  # a row of length s
        yield lambda a: F.layer_norm(a, (64,)), (x,)
        yield lambda a: a.sum(1), (x,)  # a column reduction over s
        yield lambda a: a[:, 1:] * 2, (x,)

    kernels = []
    for fn, args in graphs():
        torch._dynamo.reset()
        kiln.compile(fn, dynamic=True)(*args)
        assert kiln.stats().graphs_symbolic, kiln.stats()
        kernels += [size_params(k) for k in REPORTS[-1].kernels]
    assert all(k.sizes for k in kernels), [k.name for k in kernels if not k.sizes]
    pickle.dump(kernels, open(sys.argv[1], "wb"))
""")

COMPILE = textwrap.dedent("""
    import pickle, sys
    from kiln.codegen import triton as tr
    from kiln.runtime import compile_pool, triton_build
    from kiln.runtime.triton_family import COMPILED_WITH_THE_GRAPH

    target = ("cuda", 90, 32)
    for kern in pickle.load(open(sys.argv[1], "rb")):
        _, path, _ = triton_build._load(kern, tr.render_source(kern))
        config = tr.launch_config(kern, False)
        ptx = {}
        for key in (*COMPILED_WITH_THE_GRAPH, (True, False)):
            job = triton_build.compile_args(kern, path, config, target, *key)
            ptx[key] = compile_pool.compile_in_process(job).asm["ptx"]
        # int64 indices only where a launch asks for them
        assert ptx[(True, False)].count(".s64") > ptx[(False, False)].count(".s64"), kern.name
        if not kern.reduce:  # an element-wise kernel over sizes of 16 loads whole vectors
            assert "ld.global.v4" in ptx[(False, True)], kern.name
        print("compiled", kern.name)
""")


def _run(script: str, path: str, env: dict) -> str:
    proc = subprocess.run([sys.executable, "-c", script, path], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.skipif(os.environ.get("KILN_TARGET") == "cpp", reason="Triton code generation")
def test_family_kernels_compile_for_sm90_in_every_variant(tmp_path):
    path = str(tmp_path / "kernels.pkl")
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path), KILN_TARGET="triton", TRITON_INTERPRET="1")
    _run(GENERATE, path, env)
    env.pop("TRITON_INTERPRET")
    env.pop("KILN_TARGET")
    assert _run(COMPILE, path, env).count("compiled") >= 5
