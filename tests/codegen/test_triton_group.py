"""A kernel group (ir/group.py) of an optimizer step, rendered for Triton, compiles for the H200
(sm_90) on a machine without a GPU, and its source runs each member over its own programs."""

import os
import pickle
import subprocess
import sys
import textwrap

import torch

from kiln.codegen import triton_group
from kiln.ir.group import make_group
from kiln.ir.index import Sym, as_expr
from kiln.ir.kernel import Kernel, Load, Param, Stage, Store


def _scale_kernel(name: str, numel: int, dtype: torch.dtype) -> Kernel:
    """out0[x0] = in0[x0] (a copy), over numel points."""
    x0 = Sym("x0", numel)
    body = (Load("t1", "in0", as_expr(x0), dtype), Store("out0", as_expr(x0), "t1", dtype))
    return Kernel(name, (x0,), (), (Param("in0", dtype, False), Param("out0", dtype, True)),
                  (Stage(False, body),), (), ("a", "b"))


def _group():
    members = (_scale_kernel("kernel1", 4000, torch.float32), _scale_kernel("kernel2", 3, torch.bfloat16))
    return make_group("kernel0", members)


def test_members_take_consecutive_program_ranges():
    source = triton_group.render_source(_group())
    assert "end0 = 0 + (4000 + XBLOCK - 1) // XBLOCK" in source
    assert "if (gpid >= end0) & (gpid < end1):" in source
    assert "m1_out0" in source and "program_id(1)" not in source


COMPILE = textwrap.dedent('''
    import pickle, sys
    from kiln.codegen import triton_group
    from kiln.runtime.triton_build import compile_for_target

    group = pickle.load(open(sys.argv[1], "rb"))
    compiled = compile_for_target(group, triton_group.render_source(group))
    assert compiled.asm["cubin"]
    print("compiled")
''')


def test_group_compiles_for_sm90(tmp_path):
    path = tmp_path / "group.pkl"
    path.write_bytes(pickle.dumps(_group()))
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path))
    env.pop("TRITON_INTERPRET", None)
    env.pop("KILN_TARGET", None)
    proc = subprocess.run([sys.executable, "-c", COMPILE, str(path)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "compiled" in proc.stdout
