"""The Triton matmul template (codegen/templates/matmul.py) rendered from hand-built kernel IR:
its source, its compile for the H200 (sm_90, on wgmma) without a GPU, and the cost model's
choice between it and cuBLAS (passes/matmul_choice.py)."""

import os
import pickle
import subprocess
import sys
import textwrap

import torch

from kiln.codegen.templates import matmul as template
from kiln.ir.index import Sym, as_expr
from kiln.ir.kernel import Compute, Const, Kernel, Load, Param, Stage, Store
from kiln.ir.matmul import MatmulKernel, Operand
from kiln.passes import matmul_choice
from kiln.passes.aten_cost import aten_cost
from kiln.passes.roofline import NOMINAL_GPU


def _epilogue(m: int, n: int, dtype: torch.dtype) -> Kernel:
    """out0 = gelu(product + in0[x1]): a bias and an activation over the product's points."""
    x0, x1 = Sym("x0", m), Sym("x1", n)
    flat = as_expr(x0) * n + as_expr(x1)
    body = (
        Load("t1", "in1", flat, dtype),
        Load("t2", "in0", as_expr(x1), dtype),
        Compute("t3", "add", ("t1", "t2"), dtype),
        Compute("t4", "gelu", ("t3",), dtype),
        Store("out0", flat, "t4", dtype),
    )
    params = (Param("in0", dtype, False), Param("in1", dtype, False), Param("out0", dtype, True))
    return Kernel("kiln_mm_add_gelu_0", (x0, x1), (), params, (Stage(False, body),), args=("b", "prod", "y"))


def bias_gelu(m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16) -> MatmulKernel:
    """gelu(x @ w + b) as kiln's matmul pass makes it: the epilogue's loads of in1 are the product."""
    epi = _epilogue(m, n, dtype)
    params = (epi.params[0], epi.params[2], Param("mat_a", dtype, False), Param("mat_b", dtype, False))
    return MatmulKernel(
        epi.name,
        epi.outer,
        (),
        params,
        epi.stages,
        args=("b", "y", "x", "w"),
        m=m,
        n=n,
        k=k,
        a=Operand("mat_a", 0, (k, 1)),
        b=Operand("mat_b", 0, (n, 1)),
        product="in1",
        product_dtype=dtype,
        operand_dtype=dtype,
    )


def test_source_has_grouped_tiles_and_the_epilogue_after_the_loop():
    source = template.render_source(bias_gelu(8192, 3072, 768))
    assert "group_m = tl.minimum(tiles_m - first_m, GROUP_M)" in source
    assert "for kk in range(0, 768, BLOCK_K):" in source
    loop, epilogue = source.split("xmask = ", 1)
    assert "tl.dot(" in loop and "km.gelu(" in epilogue and "tl.store(out0" in epilogue
    assert "t1 = product" in epilogue and "tl.load(in1" not in source  # the product never loads


def test_a_narrow_output_indexes_by_the_templates_own_coordinates():
    """An epilogue over (m, n) with n too short for row tiling would index by the flat index of
    point-wise kernels, which the template does not define: it indexes by its rows and columns."""
    source = template.render_source(bias_gelu(512, 128, 64))
    epilogue = source.split("xmask = ", 1)[1]
    assert "tl.store(out0" in epilogue
    assert "xindex" not in source
    compile(source, "<template>", "exec")


def test_launch_configs_fit_the_shape():
    assert template.launch_config(bias_gelu(8192, 3072, 768), False) == template.LARGE
    assert template.launch_config(bias_gelu(8192, 4096, 4096), False) == template.LARGE
    assert template.launch_config(bias_gelu(1000, 3000, 768), False) == template.SMALL
    # 64 x 3 tiles of 128 x 256 would leave a second wave of 132 SMs mostly idle
    assert template.launch_config(bias_gelu(8192, 768, 3072), False) == template.SQUARE
    assert template.tile(bias_gelu(8192, 768, 3072))[2] > 0.95
    f32 = bias_gelu(8192, 3072, 768, torch.float32)
    assert template.launch_config(f32, False) == (128, 128, 32, 8, 8, 4)  # half the K depth, no spills
    configs = template.candidate_configs(bias_gelu(8192, 3072, 768))
    assert configs[0] == template.LARGE and 1 < len(configs) <= 6 and len(set(configs)) == len(configs)
    assert template.grid(bias_gelu(8192, 3072, 768), template.LARGE) == (64 * 12, 1, 1)


COMPILE = textwrap.dedent("""
    import pickle, sys
    from kiln.codegen.templates import matmul
    from kiln.runtime.triton_build import compile_for_target

    for kern in pickle.load(open(sys.argv[1], "rb")):
        compiled = compile_for_target(kern, matmul.render_source(kern))
        ptx = compiled.asm["ptx"]
        assert compiled.asm["cubin"], kern.name
        print(kern.m, kern.n, kern.k, "wgmma" if "wgmma" in ptx else "no-wgmma", compiled.metadata.num_warps)
""")


def test_compiles_for_sm90_on_wgmma(tmp_path):
    """Even shapes and odd ones (masked edges and K) compile for the H200 through a GPU build's
    path (no interpreter), on Hopper's warpgroup matmul instructions."""
    kernels = [
        bias_gelu(8192, 3072, 768),
        bias_gelu(1000, 3001, 771),
        bias_gelu(4096, 4096, 4096, torch.float16),
    ]
    path = tmp_path / "kernels.pkl"
    path.write_bytes(pickle.dumps(kernels))
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.split("\n")
    assert "8192 3072 768 wgmma 8" in lines
    assert all("no-wgmma" not in line for line in lines), proc.stdout


def gelu_backward(m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16) -> MatmulKernel:
    """A tanh GELU's backward on the product (the gradient reaching it) and a saved input h
    of the product's shape, as a GPT-2 MLP's backward makes it: a heavy epilogue."""
    x0, x1 = Sym("x0", m), Sym("x1", n)
    flat = as_expr(x0) * n + as_expr(x1)
    f32 = torch.float32
    ops = [  # out, op, args: g * (0.5 * (1 + t) + 0.5 * h * (1 - t^2) * c * (1 + 3 * 0.044715 * h^2))
        ("h2", "mul", ("h", "h")), ("h3", "mul", ("h2", "h")), ("a", "mul", ("h3", "k1")),
        ("u", "add", ("h", "a")), ("v", "mul", ("u", "c")), ("t", "tanh", ("v",)),
        ("t2", "mul", ("t", "t")), ("s", "sub", ("one", "t2")), ("hs", "mul", ("h", "s")),
        ("e", "mul", ("h2", "k3")), ("e1", "add", ("one", "e")), ("d", "mul", ("hs", "e1")),
        ("d1", "mul", ("d", "c")), ("d2", "mul", ("d1", "half")), ("p", "add", ("one", "t")),
        ("p1", "mul", ("p", "half")), ("q", "add", ("p1", "d2")), ("r", "mul", ("g", "q")),
    ]
    body = (
        Load("gl", "in1", flat, dtype), Load("hl", "in0", flat, dtype),
        Compute("g", "cast", ("gl",), f32), Compute("h", "cast", ("hl",), f32),
        Const("k1", 0.044715, f32), Const("k3", 3 * 0.044715, f32), Const("c", 0.7978845608028654, f32),
        Const("one", 1.0, f32), Const("half", 0.5, f32),
        *(Compute(out, op, args, f32) for out, op, args in ops),
        Compute("rl", "cast", ("r",), dtype), Store("out0", flat, "rl", dtype),
    )
    params = (Param("in0", dtype, False), Param("out0", dtype, True), Param("mat_a", dtype, False),
              Param("mat_b", dtype, False))
    return MatmulKernel("kiln_mm_gelu_backward_0", (x0, x1), (), params, (Stage(False, body),),
                        args=("h", "y", "x", "w"), m=m, n=n, k=k, a=Operand("mat_a", 0, (k, 1)),
                        b=Operand("mat_b", 0, (1, k)), product="in1", product_dtype=dtype,
                        operand_dtype=dtype)


SPILLS = textwrap.dedent("""
    import pickle, sys
    from kiln.runtime import triton_build

    for kern in pickle.load(open(sys.argv[1], "rb")):
        print(kern.name, triton_build.template_spill_bytes(kern, ("cuda", 90, 32)))
""")


def test_a_heavy_epilogue_spills_and_the_cost_model_refuses_its_template(tmp_path):
    """The spills are read from the binary compiled for sm_90 (no GPU needed): a bias and GELU
    fit beside the accumulator, a GELU backward reading a second tile does not."""
    path = tmp_path / "kernels.pkl"
    path.write_bytes(pickle.dumps([bias_gelu(8192, 3072, 768), gelu_backward(16384, 3072, 768)]))
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", SPILLS, str(path)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    spilled = {name: int(n) for name, n in (line.split() for line in proc.stdout.split("\n") if line)}
    limit = matmul_choice.TEMPLATE_SPILL_LIMIT
    assert spilled["kiln_mm_add_gelu_0"] <= limit < spilled["kiln_mm_gelu_backward_0"]
    chosen = matmul_choice.MatmulChoice(True, "template with the epilogue fused: ...")
    refused = matmul_choice.refuse_spilling(chosen, spilled["kiln_mm_gelu_backward_0"])
    assert not refused.template and refused.reason.startswith("cuBLAS: the template's epilogue spills")
    assert matmul_choice.refuse_spilling(chosen, spilled["kiln_mm_add_gelu_0"]) is chosen
    assert matmul_choice.refuse_spilling(chosen, None) is chosen  # nothing compiled: the interpreter


CEILINGS = NOMINAL_GPU


def _cublas(m, n, k, dtype=torch.bfloat16):
    meta = lambda *s: torch.empty(*s, dtype=dtype, device="meta")  # noqa: E731
    return aten_cost(torch.ops.aten.mm.default, [meta(m, k), meta(k, n)], meta(m, n), CEILINGS)


def test_the_epilogue_of_a_short_matmul_pays_for_the_template():
    """gelu(x @ w + b) of a GPT-2 MLP: the product's round trip is a third of cuBLAS's time."""
    kern = bias_gelu(8192, 3072, 768)
    choice = matmul_choice.choose_matmul(
        kern, _epilogue(8192, 3072, torch.bfloat16), _cublas(8192, 3072, 768), CEILINGS, False
    )
    assert choice.template and choice.reason.startswith("template with the epilogue fused")
    assert choice.template_s < choice.cublas_s < 1.6 * choice.template_s


def test_idle_sms_in_the_last_wave_count_against_the_template():
    kern = bias_gelu(8192, 768, 3072)
    epilogue, mm = _epilogue(8192, 768, torch.bfloat16), _cublas(8192, 768, 3072)
    busy = matmul_choice.choose_matmul(kern, epilogue, mm, CEILINGS, False, 0.97)
    idle = matmul_choice.choose_matmul(kern, epilogue, mm, CEILINGS, False, 0.73)
    assert idle.template_s > busy.template_s * 1.3 and "73% of the SMs busy" in idle.reason
    assert not idle.template


def test_cublas_where_the_template_would_not_pay_or_tile():
    deep = bias_gelu(8192, 4096, 16384)  # the product's traffic is small beside the matmul
    choice = matmul_choice.choose_matmul(
        deep, _epilogue(8192, 4096, torch.bfloat16), _cublas(8192, 4096, 16384), CEILINGS, False
    )
    assert not choice.template and choice.reason.startswith("cuBLAS: template")
    odd = bias_gelu(8000, 3072, 768)
    choice = matmul_choice.choose_matmul(
        odd, _epilogue(8000, 3072, torch.bfloat16), _cublas(8000, 3072, 768), CEILINGS, False
    )
    assert not choice.template and "does not tile" in choice.reason
    f32 = bias_gelu(8192, 3072, 768, torch.float32)
    choice = matmul_choice.choose_matmul(
        f32, _epilogue(8192, 3072, torch.float32), _cublas(8192, 3072, 768, torch.float32), CEILINGS, False
    )
    assert not choice.template and "float32" in choice.reason
    assert not matmul_choice.choose_matmul(
        kern := bias_gelu(8192, 3072, 768), None, _cublas(8192, 3072, 768), CEILINGS, False
    ).template
    assert matmul_choice.choose_matmul(kern, None, _cublas(8192, 3072, 768), CEILINGS, True).template
