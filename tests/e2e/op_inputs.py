"""Random inputs for the op tests: fixed seeds, never all zeros, in several layouts."""

from __future__ import annotations

import torch

FLOATS = [torch.float32, torch.float64, torch.bfloat16]
LAYOUTS = ["contiguous", "transposed", "sliced", "offset"]


def randn(*shape, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)


def randint(low: int, high: int, *shape, dtype=torch.int64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g, dtype=torch.int64).to(dtype)


def nonzero_ints(*shape, dtype=torch.int64, seed: int = 0, bound: int = 9) -> torch.Tensor:
    """Integers in [-bound, bound] without 0, so they can divide."""
    x = randint(1, bound + 1, *shape, seed=seed)
    sign = randint(0, 2, *shape, seed=seed + 1) * 2 - 1
    return (x * sign).to(dtype)


def positive(*shape, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    return (randn(*shape, seed=seed).abs() + 0.1).to(dtype)


def with_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A tensor equal in shape to x (2-d) whose strides follow the layout."""
    if layout == "contiguous":
        return x
    if layout == "transposed":
        return x.t().contiguous().t()
    if layout == "sliced":  # every other column of a wider tensor
        wide = torch.stack([x, x + 1], dim=-1).reshape(x.shape[0], 2 * x.shape[1])
        return wide[:, ::2]
    if layout == "offset":  # a view starting past the storage's first row
        return torch.cat([x[:1] + 1, x]).narrow(0, 1, x.shape[0])
    raise ValueError(layout)


def with_specials(x: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """x with some NaN, +inf and -inf entries in fixed random places."""
    x = x.clone()
    flat = x.view(-1)
    g = torch.Generator().manual_seed(seed)
    pos = torch.randperm(flat.numel(), generator=g)
    k = max(1, flat.numel() // 16)
    flat[pos[:k]] = float("nan")
    flat[pos[k:2 * k]] = float("inf")
    flat[pos[2 * k:3 * k]] = float("-inf")
    return x
