"""Every Triton kernel kiln generates for a set of canonical graphs compiles for the H200
(sm_90) on a machine without a GPU."""

import os
import subprocess
import sys
import textwrap

import pytest
from generated_kernels import kernels_pickle


@pytest.fixture(scope="session")
def generated_kernels(tmp_path_factory) -> str:
    return kernels_pickle(tmp_path_factory)


COMPILE = textwrap.dedent('''
    import pickle, sys
    from kiln.codegen import triton as tr
    from kiln.codegen import triton_launch
    from kiln.runtime.triton_build import compile_for_target

    kernels = pickle.load(open(sys.argv[1], "rb"))
    for kern in kernels:
        compiled = compile_for_target(kern, tr.render_source(kern))
        assert compiled.asm["cubin"], kern.name
    print("compiled", len(kernels))
''')


def _compile_for_gpu(script: str, kernels: str, tmp_path) -> str:
    """Run a script over the generated kernels as a GPU build would (no interpreter)."""
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path))
    env.pop("TRITON_INTERPRET", None)
    env.pop("KILN_TARGET", None)
    proc = subprocess.run([sys.executable, "-c", script, kernels], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_generated_triton_compiles_for_sm90(generated_kernels, tmp_path):
    """Kernels generated through the interpreter path compile, unchanged, for sm_90."""
    assert int(_compile_for_gpu(COMPILE, generated_kernels, tmp_path).split("compiled")[-1]) >= 5


SPLIT_ROWS = textwrap.dedent('''
    import pickle, sys
    from kiln.codegen import triton as tr
    from kiln.codegen import triton_launch
    from kiln.ir.kernel import Store
    from kiln.runtime.triton_build import compile_for_target

    split = [k for k in pickle.load(open(sys.argv[1], "rb")) if triton_launch.split_rows(k) is not None]
    assert split, "no kernel over rows off 16-byte boundaries"
    weighted = 0
    for kern in split:
        source = tr.render_source(kern)
        ptx = compile_for_target(kern, source).asm["ptx"]
        assert "ld.global.v4.b32" in ptx, kern.name
        stores_rows = any(isinstance(s, Store) and s.index == triton_launch.split_rows(kern).index
                          for st in kern.stages for s in st.body)
        assert "st.global.v4.b32" in ptx or not stores_rows, kern.name
        if "km.load_columns(" in source:  # weights: aligned vectors shifted by byte permutes
            weighted += 1
            assert "prmt.b32" in ptx and "ld.global.v4.b32" in ptx, kern.name
    print("split", len(split), "weighted", weighted)
''')


def test_rows_off_16_byte_boundaries_load_and_store_whole_vectors(generated_kernels, tmp_path):
    out = _compile_for_gpu(SPLIT_ROWS, generated_kernels, tmp_path).split()
    assert int(out[-3]) >= 2 and int(out[-1]) >= 2  # bf16 and float32 rows with weights
