"""Independent point-wise kernels run as one launch (a kernel group); a kernel reading what
another writes does not join its group."""

import dataclasses
import os

import pytest
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


def test_a_group_takes_at_most_the_backends_buffers(monkeypatch):
    """A Triton group is one function whose compile grows with its code: its buffers are
    bounded (the backend's group_buffers), so an optimizer step is several groups."""
    from kiln.codegen import backends

    for target, make in list(backends._FACTORIES.items()):
        monkeypatch.setitem(backends._FACTORIES, target,
                            lambda options, make=make: dataclasses.replace(make(options), group_buffers=6))

    def f(*xs):
        return [x.sigmoid() * 2 for x in xs]

    args = [torch.randn(5 + i, 3) for i in range(6)]  # six kernels of two buffers each
    out, report = _compiled(f, *args)
    assert_same(out, f(*args))
    launches = _launches(report)
    assert len(launches) == 2 and all(len(launch.args) <= 6 for launch in launches), report.host_program


def _skip_interpreting(monkeypatch):
    """Grouping is decided at compile time: kernels are built but the interpreter runs none."""
    from kiln.runtime import triton_build

    def not_run(kernel, jit_fn):
        def launch(*tensors):
            pass

        launch.aligned = launch
        return launch

    monkeypatch.setattr(triton_build, "_interpreted_launcher", not_run)


@pytest.mark.skipif(os.environ.get("KILN_TARGET") != "triton", reason="the Triton target's grouping rule")
def test_on_a_gpu_a_large_kernel_joins_a_group_only_when_its_streams_walk_one_index(monkeypatch):
    """A Triton member runs over a flat index: a large kernel that reads a transposed operand
    stays a launch of its own and keeps its tiling; a large one whose loads and stores share
    one index joins (it loses nothing and the group saves its last partial wave); small ones
    group also across the transposing one when independent of it."""
    _skip_interpreting(monkeypatch)

    def f(a, big, b, square):
        return a.relu() + 1, big.sigmoid() * 2, b.tanh() * 3, square + square.t()

    _, report = _compiled(f, torch.randn(33), torch.randn(1024, 4096), torch.randn(7, 5),
                          torch.randn(2048, 2048))
    (group,) = [d for d in report.decisions if d.verdict == "grouped"]
    assert group.reason.startswith("3 "), group
    assert len(_launches(report)) == 2, report.host_program


@pytest.mark.skipif(os.environ.get("KILN_TARGET") != "triton", reason="the Triton target's grouping rule")
def test_a_small_kernel_reading_a_large_ones_output_stays_after_it(monkeypatch):
    _skip_interpreting(monkeypatch)

    def f(a, big):
        c = big.sigmoid()
        return a.relu() + 1, c, c[0, :33] * 2

    _, report = _compiled(f, torch.randn(7, 5), torch.randn(1024, 4096))
    launches = _launches(report)
    assert len(launches) == 2, report.host_program  # the slice cannot join the group before c
    writes = [set(launch.writes) for launch in launches]
    for k, launch in enumerate(launches):
        reads = set(launch.args) - set(launch.writes)
        assert not reads & set().union(*writes[k:]), report.host_program


@pytest.mark.skipif(os.environ.get("KILN_TARGET") != "triton", reason="the Triton target's merging rule")
def test_on_a_gpu_many_unrelated_small_kernels_stay_apart_and_run_as_groups():
    """Merged, a small domain's few programs would walk every member's buffers in turn (an
    optimizer step's biases: 0.16 ms for what a group runs in microseconds)."""
    from kiln.codegen.triton_launch import SMALL_MERGE_BUFFERS

    def f(*xs):
        return [x * 2 + 1 for x in xs]

    args = [torch.randn(48) for _ in range(SMALL_MERGE_BUFFERS)]
    out, report = _compiled(f, *args)
    assert_same(out, f(*args))
    launches = _launches(report)
    assert len(launches) == 1 and any(d.verdict == "grouped" for d in report.decisions), report.host_program
    merged = [d for d in report.decisions if d.verdict == "merged"]
    assert 0 < len(merged) < len(args) - 1, merged


def test_a_kernel_reading_a_family_size_joins_no_group_and_the_family_compiles_once():
    """x[:, :4] has a static domain but reads x's rows at a stride of the family's size: in a
    group (whose launch passes no sizes) it failed the family into a compile per shape."""
    def f(x, y):
        return x[:, :4] * 2, y.sigmoid()

    torch._dynamo.reset()
    kiln.reset_stats()
    g = kiln.compile(f)
    y = torch.randn(5)
    for width in (10, 17, 33):
        x = torch.randn(3, width)
        torch._dynamo.mark_dynamic(x, 1)
        assert_same(g(x, y), f(x, y))
    stats = kiln.stats()
    assert stats.graphs_compiled == 1 and stats.graphs_symbolic == 1, stats
