"""kiln's own Triton math functions against float64 references, run in Triton's
interpreter (the same source compiles for the GPU: test_triton_sm90.py)."""

import os
import subprocess
import sys
import textwrap

import pytest


def _applying(fn: str, body: str) -> str:
    """A script that defines `apply`, a kernel computing km.<fn> element-wise, then runs body."""
    return textwrap.dedent(f'''
        import math, torch, triton, triton.language as tl
        from kiln.codegen import triton_math as km

        @triton.jit
        def apply(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + i, km.{fn}(tl.load(x_ptr + i, mask=i < n)), mask=i < n)
    ''') + textwrap.dedent(body)


ERF = _applying("erf_f32", '''
    torch.manual_seed(0)
    x = torch.cat([torch.linspace(-5, 5, 200001), torch.logspace(-30, 1, 20001), torch.randn(20000) * 2,
                   torch.tensor([0.0, -0.0, 1.0, -1.0, 4.0, 3.9, 100.0, float("inf"), -float("inf")])])
    x = torch.cat([x, -x])
    y = torch.empty_like(x)
    apply[(triton.cdiv(x.numel(), 4096),)](x, y, x.numel(), BLOCK=4096)
    ref = torch.erf(x.double())
    magnitude = ref.float().abs()
    spacing = (torch.nextafter(magnitude, torch.tensor(float("inf"))) - magnitude).double()
    print("max_ulp", ((y.double() - ref).abs() / spacing).max().item())
    assert torch.equal(y[x.abs() >= 4], torch.sign(x[x.abs() >= 4])), "erf rounds to +-1 from 4 on"
    z = torch.tensor([float("nan"), 0.5])
    out = torch.empty_like(z)
    apply[(1,)](z, out, 2, BLOCK=2)
    assert math.isnan(out[0].item())
''')


GELU = _applying(
    "gelu",
    """
    torch.manual_seed(0)
    x = torch.cat([torch.linspace(-8, 8, 400001), torch.logspace(-30, 1, 20001), torch.randn(20000) * 3])
    specials = torch.tensor([0.0, 5.5, -5.5, 30.0, -30.0, 1e30, -1e30, float("inf"), float("nan")])
    x = torch.cat([x, -x, specials])
    y = torch.empty_like(x)
    apply[(triton.cdiv(x.numel(), 4096),)](x, y, x.numel(), BLOCK=4096)
    x64 = x.double()
    phi = 0.5 * torch.special.erfc(-x64 / math.sqrt(2))
    # GELU is x * Phi(x): the error is Phi's, scaled by |x|, plus the product's rounding
    finite = x.isfinite()
    y64, ref = y.double()[finite], (x64 * phi)[finite]
    excess = ((y64 - ref).abs() - ref.abs() * 2**-24).div(x64[finite].abs().clamp(min=1e-30))
    print("max_phi_error", excess.max().item())
    assert y[-2].item() == float("inf") and math.isnan(y[-1].item())
    far = x.abs() >= 30
    assert torch.equal(y[far], torch.where(x[far] > 0, x[far], 0.0)), "GELU is x or 0 far from 0"
""",
)


def _interpreted(script: str) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_float32_erf_is_within_2_5_ulps():
    max_ulp = float(_interpreted(ERF).split("max_ulp")[-1])
    assert max_ulp <= 2.5, max_ulp


def test_float32_gelu_is_within_erfs_accuracy():
    # eager's 0.5 * x * (1 + erf(x / sqrt 2)) carries erf's error, about 6e-8, into Phi
    max_phi_error = float(_interpreted(GELU).split("max_phi_error")[-1])
    assert max_phi_error <= 1.2e-7, max_phi_error


def _run_prmt(asm: str, registers: dict) -> dict:
    """Execute the prmt.b32 lines of PTX (default mode: each selector nibble picks a byte of
    the pair {second operand, first operand})."""
    for line in asm.splitlines():
        if not line.startswith("prmt.b32"):
            continue
        out, a, b, sel = (t.strip(" ;") for t in line[len("prmt.b32") :].split(","))
        pair = registers[a] | registers[b] << 32
        selector = registers[sel]
        registers[out] = sum(((pair >> 8 * (selector >> 4 * i & 7)) & 0xFF) << 8 * i for i in range(4))
    return registers


@pytest.mark.parametrize("elem_bits", [16, 32])
def test_column_window_shifts_by_every_offset(elem_bits):
    # km.load_columns on a GPU: the thread's columns start `shift` elements into the first of
    # two 16-byte vectors; the permutes must leave exactly those columns, in order
    from kiln.codegen import triton_math as km

    asm, vector = km._shift_asm(elem_bits), 128 // elem_bits
    mask = (1 << elem_bits) - 1
    window = [(0x1234 + 977 * i) & mask for i in range(2 * vector)]
    words = [
        sum(window[i * (32 // elem_bits) + j] << elem_bits * j for j in range(32 // elem_bits))
        for i in range(8)
    ]
    for shift in range(vector):
        byte_shift = shift * elem_bits // 8
        registers = {f"${4 + i}": w for i, w in enumerate(words)}
        selectors = [
            0x7654 if byte_shift & 8 else 0x3210,
            0x7654 if byte_shift & 4 else 0x3210,
            0x5432 if byte_shift & 2 else 0x3210,
        ]
        for step, selector in enumerate(selectors[: 3 if elem_bits == 16 else 2]):
            registers[f"${12 + vector * step}"] = selector
        out = _run_prmt(asm, registers)
        got = [
            out[f"${i // (32 // elem_bits)}"] >> elem_bits * (i % (32 // elem_bits)) & mask
            for i in range(vector)
        ]
        assert got == window[shift : shift + vector], (shift, got)
