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
        # bf16 rows: the vector binary assumes sizes of 8 (16 bytes), enough for whole vectors
        yield lambda a: torch.softmax(a.float(), -1).to(a.dtype), (x.transpose(1, 2).contiguous().bfloat16(),)

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
    from kiln.codegen.triton_sizes import launch_variants

    import sympy

    from kiln.ir import sizes

    # outside its compile a size has no traced value: the example's (19) stands in
    sizes.hint = lambda s: int(sympy.sympify(s).subs({x: 19 for x in sympy.sympify(s).free_symbols}))
    target = ("cuda", 90, 32)
    long_rows = one_tile = 0
    for kern in pickle.load(open(sys.argv[1], "rb")):
        _, path, _ = triton_build._load(kern, tr.render_source(kern))
        configs, _ = launch_variants(kern, False)
        longer = [(i, False, False) for i in range(1, len(configs))]  # long rows' blocks
        keys = [(0, False, True), (0, False, False), (0, True, False), *longer]
        long_rows += len(configs) - 1
        one_tile += sum(len(c) > 3 and c[3] for c in configs)  # a row of s fits the traced tile
        ptx = {}
        for key in keys:
            job = triton_build.family_compile_args(kern, path, target, key)
            ptx[key] = compile_pool.compile_in_process(job).asm["ptx"]
            if key[2]:  # a multiple of 16 bytes of the narrowest tensor, not 16 elements
                vector = 16 // min(p.dtype.itemsize for p in kern.params)
                assert job.attrs[(len(kern.params),)] == [["tt.divisibility", vector]], job.attrs
        # int64 indices only where a launch asks for them
        assert ptx[(0, True, False)].count(".s64") > ptx[(0, False, False)].count(".s64"), kern.name
        if not kern.reduce:  # an element-wise kernel over sizes of 16 loads whole vectors
            assert "ld.global.v4" in ptx[(0, False, True)], kern.name
        elif configs[0][3:] == (True,):  # so does a row of symbolic length, in one tile
            assert "ld.global.v4" in ptx[(0, False, True)], kern.name
            assert "ld.global.v4" not in ptx[(0, False, False)], kern.name
        print("compiled", kern.name)
    assert long_rows, "no looped row of symbolic length"
    assert one_tile, "no row of symbolic length in one tile"
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
    assert _run(COMPILE, path, env).count("compiled") >= 6
