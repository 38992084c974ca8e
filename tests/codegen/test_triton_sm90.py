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
    from kiln.runtime.triton_build import compile_for_target

    kernels = pickle.load(open(sys.argv[1], "rb"))
    for kern in kernels:
        compiled = compile_for_target(kern, tr.render_source(kern))
        assert compiled.asm["cubin"], kern.name
    print("compiled", len(kernels))
''')


def test_generated_triton_compiles_for_sm90(generated_kernels, tmp_path):
    """Kernels generated through the interpreter path compile, unchanged, for sm_90."""
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path))
    env.pop("TRITON_INTERPRET", None)
    env.pop("KILN_TARGET", None)
    proc = subprocess.run([sys.executable, "-c", COMPILE, generated_kernels], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert int(proc.stdout.split("compiled")[-1]) >= 5
