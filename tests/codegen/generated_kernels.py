"""Kernels kiln generates for a set of canonical graphs, shared by the code generation tests
(a plain module: a second conftest module would shadow tests/conftest.py)."""

import os
import subprocess
import sys
import textwrap

GENERATE = textwrap.dedent("""
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
        # the online sum of exp over looped rows: softmax, and cross-entropy's forward
        yield lambda a: torch.softmax(a, -1), (xb,)
        yield lambda a, t: F.cross_entropy(a.float(), t, ignore_index=1), (xb, torch.tensor([3, 1]))
        xo, wo = torch.randn(64, 1021, dtype=torch.bfloat16), torch.randn(1021, dtype=torch.bfloat16)
        # rows off 16-byte boundaries: aligned bodies and edges
        def softmax_and_rmsnorm(a, w):
            rms = a * torch.rsqrt(a.float().pow(2).mean(-1, keepdim=True))
            return torch.softmax(a, -1), rms.to(a.dtype) * w

        yield softmax_and_rmsnorm, (xo, wo)
        yield lambda a, w, b: F.layer_norm(a, (1021,), w, b), (xo.float(), wo.float(), wo.float() * 0.5)
        idx = torch.randint(0, 50, (4, 7))
        yield lambda w, i: torch.cat([w[i], F.pad(w[i], (1, 1))[..., 1:-1]], -1), (torch.randn(50, 16), idx)
        for dt in (torch.int64, torch.int32, torch.uint8):  # integer divisions and their checks
            a, b = torch.randint(0, 100, (64,), dtype=dt), torch.randint(1, 9, (64,), dtype=dt)
            yield (lambda a, b: (a // b, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc")),
                   (a, b))

    kernels = []
    for fn, args in graphs():
        torch._dynamo.reset()
        kiln.compile(fn)(*args)
        kernels += REPORTS[-1].kernels
    pickle.dump(kernels, open(sys.argv[1], "wb"))
""")


_generated: dict[str, str] = {}


def kernels_pickle(tmp_path_factory) -> str:
    """A pickle of the kernels generated through the interpreter path (no GPU needed),
    made once per test session."""
    if "path" in _generated:
        return _generated["path"]
    tmp = tmp_path_factory.mktemp("generated")
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp), KILN_TARGET="triton", TRITON_INTERPRET="1")
    path = str(tmp / "kernels.pkl")
    gen = subprocess.run(
        [sys.executable, "-c", GENERATE, path],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert gen.returncode == 0, gen.stderr[-4000:]
    _generated["path"] = path
    return path
