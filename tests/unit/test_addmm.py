"""The rewrite of launch-bound addmm into mm + a bias add (frontend/addmm.py)."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.frontend.addmm import LAUNCH_BOUND_MACS, split_launch_bound_addmm

aten = torch.ops.aten


def test_only_launch_bound_addmm_with_unit_scales_splits():
    def f(b, x, w, big_x, big_w):
        return (torch.addmm(b, x, w), torch.addmm(b, x, w, beta=0.5), torch.addmm(b, big_x, big_w))

    side = round(LAUNCH_BOUND_MACS ** (1 / 3)) + 1  # just over the bound
    args = (torch.randn(side), torch.randn(32, 64), torch.randn(64, side), torch.randn(side, side),
            torch.randn(side, side))
    gm = make_fx(f, tracing_mode="fake")(*args)
    assert split_launch_bound_addmm(gm) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(aten.mm.default) == 1 and targets.count(aten.addmm.default) == 2
    for got, want in zip(gm(*args), f(*args)):
        torch.testing.assert_close(got, want)
