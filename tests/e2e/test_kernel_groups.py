"""Independent point-wise kernels run as one launch (a kernel group); a kernel reading what
another writes does not join its group."""

import torch
from conftest import assert_same

import kiln
from kiln.frontend.backend import REPORTS
from kiln.ir.host import Launch


def _compiled(f, *args):
    torch._dynamo.reset()
    before = len(REPORTS)
    out = kiln.compile(f)(*args)
    reports = REPORTS[before:]
    assert len(reports) == 1
    return out, reports[0]


def _launches(report) -> list[Launch]:
    return [i for i in report.host_program.body if isinstance(i, Launch)]


def test_independent_kernels_of_several_shapes_run_as_one_launch():
    def f(a, b, c):
        return a.sigmoid() * 2, (b + 1).relu(), c.to(torch.bfloat16) * 3

    args = (torch.randn(6, 7), torch.randn(33), torch.randn(2, 3, 5))
    out, report = _compiled(f, *args)
    assert_same(out, f(*args))
    assert len(_launches(report)) == 1, report.host_program
    assert any(d.verdict == "grouped" for d in report.decisions)


def test_a_kernel_reading_a_grouped_kernels_output_runs_after_it():
    def f(a, b):
        x = a.exp()  # stored: the sum reads it whole
        return x, (x.sum() + b).tanh(), b * 2

    args = (torch.randn(8, 5), torch.randn(7))
    out, report = _compiled(f, *args)
    assert_same(out, f(*args))
    launches = _launches(report)
    writes = [set(launch.writes) for launch in launches]
    for k, launch in enumerate(launches):  # nothing a launch reads is written by itself or later
        reads = set(launch.args) - set(launch.writes)
        assert not reads & set().union(*writes[k:]), report.host_program
