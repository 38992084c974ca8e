"""Values every correct compiler computes exactly like eager: rows of equal values centre to
exactly 0 (normalizations would amplify a one-ulp mean into a visible error), and the sign of
a zero survives rounding, remainders, -0.0 literals and training graphs."""

import pytest
import torch
import torch.nn.functional as F
from conftest import run_compiled


def _constant_rows(rows: int, width: int) -> torch.Tensor:
    """Each row holds one random value (not a power of two: its sum is rounded)."""
    return (torch.rand(rows, 1) + 0.5).expand(rows, width).contiguous()


CENTERED = {
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "layer_norm_2d": lambda x: F.layer_norm(x.view(16, 4, -1), x.view(16, 4, -1).shape[-2:]),
    "group_norm": lambda x: F.group_norm(x.view(16, 4, -1), 2),
    "var": lambda x: x.var(-1),
    "std": lambda x: x.std(-1, keepdim=True),
    "var_mean": lambda x: torch.var_mean(x, -1, correction=0)[0],
}


@pytest.mark.parametrize("width", [256, 100])
@pytest.mark.parametrize("name", sorted(CENTERED))
def test_rows_of_equal_values_centre_to_exactly_zero(name, width):
    fn = CENTERED[name]
    x = _constant_rows(16, width)
    out, report = run_compiled(fn, x)
    assert report is not None
    expected = fn(x)
    assert torch.equal(expected, torch.zeros_like(expected))
    assert torch.equal(out, expected), (out - expected).abs().max()

