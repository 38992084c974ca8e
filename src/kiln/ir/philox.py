"""Philox4x32-10, the counter-based generator of Triton's tl.rand/tl.randn (and CUDA's
curand), written with torch integer ops: the reference that kiln's C++ prelude and its
Triton kernels reproduce, and what the IR evaluator and an ATen fallback compute.

A number is a pure function of (seed, offset): the key is the seed's two 32-bit halves, the
counter is (offset's low half, offset's high half, 0, 0). Uniforms are Triton's
uint_to_uniform_float of the first output word; normals are Triton's Box-Muller of the first two.
"""

from __future__ import annotations

import torch

_MASK = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
# the largest float32 scale with (2**31 - 1) * scale < 1.0: uniforms lie in [0, 1)
UNIFORM_SCALE = 4.6566127342e-10


def philox(seed: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The four 32-bit output words (as int64 in [0, 2**32)). int64 products wrap modulo
    2**64, so their high and low words are those of the unsigned product."""
    seed, offset = torch.broadcast_tensors(seed.to(torch.int64), offset.to(torch.int64))
    k0, k1 = seed & _MASK, (seed >> 32) & _MASK
    c0, c1 = offset & _MASK, (offset >> 32) & _MASK
    c2 = c3 = torch.zeros_like(c0)
    for _ in range(ROUNDS):
        p0, p2 = c0 * _ROUND_A, c2 * _ROUND_B
        c0, c2 = ((p2 >> 32) & _MASK) ^ c1 ^ k0, ((p0 >> 32) & _MASK) ^ c3 ^ k1
        c1, c3 = p2 & _MASK, p0 & _MASK
        k0, k1 = (k0 + _KEY_A) & _MASK, (k1 + _KEY_B) & _MASK
    return c0, c1, c2, c3


def word_to_uniform(word: torch.Tensor) -> torch.Tensor:
    """A 32-bit word read as int32 and folded onto [0, 2**31) (x < 0 -> -x - 1), times the
    scale in float32: a float32 in [0, 1)."""
    x = torch.where(word >= 2**31, word - 2**32, word)
    x = torch.where(x < 0, -x - 1, x)
    return x.to(torch.float32) * torch.tensor(UNIFORM_SCALE, dtype=torch.float32)


def uniform(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    return word_to_uniform(philox(seed, offset)[0])


def normal(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    w0, w1, _, _ = philox(seed, offset)
    u1 = torch.clamp(word_to_uniform(w0), min=1.0e-7)
    theta = torch.tensor(6.283185307179586, dtype=torch.float32) * word_to_uniform(w1)
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(theta)
