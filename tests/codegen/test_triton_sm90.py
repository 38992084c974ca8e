"""Every Triton kernel kiln generates for a set of canonical graphs compiles for the H200
(sm_90) on a machine without a GPU."""

import os
import subprocess
import sys
import textwrap

GENERATE = textwrap.dedent('''
    import pickle, sys
    import torch, torch.nn.functional as F
    import kiln
    from kiln.frontend.backend import REPORTS

    def graphs():
        x, y = torch.randn(64, 128), torch.randn(64, 128)
        yield lambda a, b: (torch.relu(a * b + 1).sum(-1), torch.softmax(a, -1)), (x, y)
        yield lambda a, b: F.layer_norm(F.gelu(a + b), (128,)), (x, y)
        yield lambda a, b: (a.amax(0), a.argmax(-1), torch.tanh(a)[::2] * b[1::2]), (x, y)
        xb = torch.randn(2, 6000, dtype=torch.bfloat16)  # a looped (non-persistent) reduction
        yield lambda a: (a * torch.rsqrt(a.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(a.dtype), (xb,)
        idx = torch.randint(0, 50, (4, 7))
        yield lambda w, i: torch.cat([w[i], F.pad(w[i], (1, 1))[..., 1:-1]], -1), (torch.randn(50, 16), idx)

    kernels = []
    for fn, args in graphs():
        torch._dynamo.reset()
        kiln.compile(fn)(*args)
        kernels += REPORTS[-1].kernels
    pickle.dump(kernels, open(sys.argv[1], "wb"))
''')

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


def test_generated_triton_compiles_for_sm90(tmp_path):
    """Kernels generated through the interpreter path compile, unchanged, for sm_90."""
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path), KILN_TARGET="triton", TRITON_INTERPRET="1")
    kernels = str(tmp_path / "kernels.pkl")
    gen = subprocess.run([sys.executable, "-c", GENERATE, kernels], env=env, capture_output=True, text=True,
                         timeout=600)
    assert gen.returncode == 0, gen.stderr[-4000:]
    env.pop("TRITON_INTERPRET")
    env.pop("KILN_TARGET")
    proc = subprocess.run([sys.executable, "-c", COMPILE, kernels], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert int(proc.stdout.split("compiled")[-1]) >= 5
