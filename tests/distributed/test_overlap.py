"""Collectives in kiln's graphs are issued as soon as their inputs are ready and waited for
where their results are first needed, so that independent work runs in between."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import kiln
from kiln.frontend.backend import REPORTS

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_independent_work_runs_between_a_collective_and_its_wait(one_rank):
    import torch.distributed._functional_collectives as funcol

    def f(x, w, v):
        reduced = funcol.all_reduce(x @ w, "sum", dist.group.WORLD)
        other = torch.tanh(x @ v)  # needs nothing from the all-reduce
        return reduced * 2 + other

    x, w, v = torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16)
    with REPORTS.collect() as reports:
        out = kiln.compile(f)(x, w, v)
    torch.testing.assert_close(out, f(x, w, v))
    text = str(reports[0].host_program)
    lines = [line for line in text.splitlines() if "call " in line]
    order = [next((k for k in ("all_reduce", "wait_tensor") if k in line), "mm") for line in lines]
    last_mm = len(order) - 1 - order[::-1].index("mm")
    assert order.index("all_reduce") < last_mm < order.index("wait_tensor"), text
    assert [d.verdict for d in reports[0].decisions].count("overlap") >= 1
