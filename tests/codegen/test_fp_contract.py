"""GPU builds of generated Triton keep eager's rounding: no mul+add contracted into an fma
(the CPU interpreter never fuses, so this reads the PTX compiled for sm_90)."""

import os
import subprocess
import sys
import textwrap

PRODUCT_MINUS_ITS_SUM = textwrap.dedent('''
    import torch
    from kiln.codegen import triton as tr
    from kiln.ir import kernel as k
    from kiln.ir.index import Sym, sym
    from kiln.runtime.triton_build import compile_for_target

    x0, r0 = sym("x0", 4096), sym("r0", 1)
    f32 = torch.float32
    kern = k.Kernel(
        "kernel0", (Sym("x0", 4096),), (Sym("r0", 1),),
        (k.Param("in0", f32, False), k.Param("in1", f32, False), k.Param("out0", f32, True)),
        (k.Stage(True, (k.Load("t1", "in0", x0, f32), k.Load("t2", "in1", x0, f32),
                        k.Compute("t3", "mul", ("t1", "t2"), f32), k.Reduce("t4", "sum", "t3", f32))),
         k.Stage(True, (k.Load("t5", "in0", x0, f32), k.Load("t6", "in1", x0, f32),
                        k.Compute("t7", "mul", ("t5", "t6"), f32), k.Compute("t8", "sub", ("t7", "t4"), f32),
                        k.Store("out0", x0, "t8", f32)))))
    ptx = compile_for_target(kern, tr.render_source(kern)).asm["ptx"]
    print("fma" if "fma.rn.f32" in ptx else "", "mul" if "mul.f32" in ptx or "mul.rn.f32" in ptx else "")
''')


def test_gpu_build_does_not_contract_a_product_and_a_subtraction(tmp_path):
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", PRODUCT_MINUS_ITS_SUM], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == ["mul"], proc.stdout
