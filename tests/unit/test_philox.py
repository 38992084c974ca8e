"""kiln's Philox reference (ir/philox.py) against Triton's tl.rand and tl.randn, run by
Triton's interpreter in a process of its own (the interpreter is chosen at import)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

SCRIPT = textwrap.dedent("""
    import torch, triton, triton.language as tl
    from kiln.ir import philox

    @triton.jit
    def numbers(seed_ptr, base, uniform, normal, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        seed = tl.load(seed_ptr + i * 0)
        offset = base + i.to(tl.int64) * 3_000_017
        tl.store(uniform + i, tl.rand(seed, offset))
        tl.store(normal + i, tl.randn(seed, offset))

    for seed, base in ((0, 0), (0x0123456789ABCDEF, 2**33 + 7), (2**62 - 1, 2**31 - 5)):
        key = torch.tensor([seed], dtype=torch.int64)
        u, z = torch.empty(128), torch.empty(128)
        numbers[(1,)](key, base, u, z, BLOCK=128)
        offsets = base + torch.arange(128, dtype=torch.int64) * 3_000_017
        assert torch.equal(u, philox.uniform(key[0], offsets)), seed
        assert torch.allclose(z, philox.normal(key[0], offsets), rtol=1e-5, atol=1e-5), seed
    print("same")
""")


def test_reference_is_tritons_stream():
    path = f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "same" in run.stdout, run.stderr[-2000:]


def test_uniforms_lie_in_the_unit_interval():
    import torch

    from kiln.ir import philox

    words = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1], dtype=torch.int64)
    u = philox.word_to_uniform(words)
    assert (u >= 0).all() and (u < 1).all()
    assert u[0] == 0 and u[-1] == 0  # 0 and -1 (as int32) both fold to 0
