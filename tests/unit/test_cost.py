"""The cost model (passes/roofline.py, aten_cost.py, cost.py) on hand-built kernels whose
bytes and FLOPs are checked by hand, eager's estimate of a small graph, the break-even
arithmetic and its log line, and the ceilings' cache file.
Ceilings are given: nothing here depends on timing."""

import json
import logging
import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.ir.index import Sym, sym
from kiln.ir.kernel import Compute, Const, Kernel, Load, Param, Reduce, Scratch, Stage, Store
from kiln.passes import cost
from kiln.passes.aten_cost import eager_costs
from kiln.passes.cost import break_even, kernel_cost
from kiln.passes.roofline import FN_COST, Ceilings
from kiln.runtime.ceilings import FILE_NAME, ceilings_for, device_key

MiB = 1 << 20
F32 = torch.float32

# round numbers: 1e10 B/s copy, 1e9 ops/s, 1e12 FLOP/s matmul, 10 us an ATen call, 2 us a kernel,
# rows kept up to 64 kB
CEILINGS = Ceilings("cpu: test", 1e10, 1e9, 1e12, 1e-5, 2e-6, 64 << 10)


def add_kernel(rows: int = 1024, cols: int = 1024) -> Kernel:
    x0, x1 = sym("x0", rows), sym("x1", cols)
    index = x0 * cols + x1
    body = (Load("t0", "in0", index, F32), Load("t1", "in1", index, F32),
            Compute("t2", "add", ("t0", "t1"), F32), Store("out0", index, "t2", F32))
    return Kernel("kernel0", (Sym("x0", rows), Sym("x1", cols)), (),
                  (Param("in0", F32, False), Param("in1", F32, False), Param("out0", F32, True)),
                  (Stage(False, body),))


def softmax_kernel(rows: int, cols: int, keep_row: bool = False) -> Kernel:
    """Three loop stages over each row: max, sum of exp, output; the second and third read the
    input row again (or, keep_row, the third reads the exps from a scratch row)."""
    x0, r0 = sym("x0", rows), sym("r0", cols)
    index = x0 * cols + r0
    stages = (
        Stage(True, (Load("a", "in0", index, F32), Reduce("m", "max", "a", F32))),
        Stage(True, (Load("b", "in0", index, F32), Compute("c", "sub", ("b", "m"), F32),
                     Compute("e", "exp", ("c",), F32), Reduce("s", "sum", "e", F32))
              + ((Store("row0", r0, "e", F32),) if keep_row else ())),
        Stage(True, ((Load("e2", "row0", r0, F32),) if keep_row else
                     (Load("b2", "in0", index, F32), Compute("c2", "sub", ("b2", "m"), F32),
                      Compute("e2", "exp", ("c2",), F32)))
              + (Const("one", 1.0, F32), Compute("inv", "div", ("one", "s"), F32),
                 Compute("y", "mul", ("e2", "inv"), F32), Store("out0", index, "y", F32))),
    )
    return Kernel("kernel0", (Sym("x0", rows),), (Sym("r0", cols),),
                  (Param("in0", F32, False), Param("out0", F32, True)), stages,
                  (Scratch("row0", F32),) if keep_row else ())


def test_an_element_wise_add_moves_three_buffers_once():
    c = kernel_cost(add_kernel(), CEILINGS)
    assert c.must_move == c.moves == 12 * MiB  # two 4 MiB inputs read, one written
    assert c.flops == 1024 * 1024 and c.launches == 1
    # memory: 12 MiB / 1e10 B/s = 1.258 ms beats 1M ops / 1e9 ops/s = 1.049 ms
    assert c.bound == "memory"
    assert c.seconds == pytest.approx(2e-6 + 12 * MiB / 1e10)
    assert c.floor_s == pytest.approx(12 * MiB / 1e10)


# a GPU's: the host launches kernels while earlier ones run; 3 us a kernel on the device then
QUEUED = Ceilings(**{**CEILINGS.to_dict(), "device": "cuda: test", "queued_kernel_s": 3e-6,
                     "kernel_launch_s": 1e-5})


def test_a_queued_launch_overlaps_the_work_of_a_large_kernel():
    c = kernel_cost(add_kernel(), QUEUED)
    assert c.bound == "memory"
    assert c.busy_s == pytest.approx(12 * MiB / 1e10)
    assert c.seconds == pytest.approx(3e-6 + 12 * MiB / 1e10)  # the 10 us launch is hidden


def test_a_tiny_queued_kernel_costs_its_launch():
    c = kernel_cost(add_kernel(4, 4), QUEUED)
    assert c.bound == "launch"
    assert c.seconds == pytest.approx(1e-5)


def test_a_row_softmax_reads_its_rows_again_where_they_do_not_fit():
    rows, cols = 64, 1024  # a row: 4 kB
    row_bytes = rows * cols * 4
    fits = kernel_cost(softmax_kernel(rows, cols), CEILINGS)
    assert fits.must_move == 2 * row_bytes  # the input read once, the output written once
    assert fits.moves == fits.must_move  # the re-reads come from the cache
    kept_nowhere = Ceilings(**{**CEILINGS.to_dict(), "row_cache_bytes": 0})
    spills = kernel_cost(softmax_kernel(rows, cols), kept_nowhere)
    assert spills.must_move == 2 * row_bytes
    assert spills.moves == 4 * row_bytes  # read three times, written once
    # per element: max, sub, exp, sum, sub, exp, div, mul (the constant is no op)
    assert spills.flops == 8 * rows * cols


def test_a_row_kept_in_scratch_is_not_read_again():
    kept_nowhere = Ceilings(**{**CEILINGS.to_dict(), "row_cache_bytes": 0})
    c = kernel_cost(softmax_kernel(64, 1024, keep_row=True), kept_nowhere)
    assert c.must_move == 2 * 64 * 1024 * 4
    assert c.moves == 3 * 64 * 1024 * 4  # read again by the sum, not by the output (from scratch)


def test_a_reduction_reads_its_input_and_writes_one_value_a_row():
    x0, r0 = sym("x0", 256), sym("r0", 512)
    kern = Kernel("kernel0", (Sym("x0", 256),), (Sym("r0", 512),),
                  (Param("in0", F32, False), Param("out0", F32, True)),
                  (Stage(True, (Load("a", "in0", x0 * 512 + r0, F32), Reduce("s", "sum", "a", F32))),
                   Stage(False, (Store("out0", x0, "s", F32),))))
    c = kernel_cost(kern, CEILINGS)
    assert c.must_move == c.moves == 256 * 512 * 4 + 256 * 4
    assert c.flops == 256 * 512


def test_math_functions_make_a_kernel_compute_bound():
    x0 = sym("x0", 1 << 20)
    kern = Kernel("kernel0", (Sym("x0", 1 << 20),), (), (Param("in0", F32, False), Param("out0", F32, True)),
                  (Stage(False, (Load("a", "in0", x0, F32), Compute("b", "exp", ("a",), F32),
                                 Store("out0", x0, "b", F32))),))
    c = kernel_cost(kern, CEILINGS)
    weight = FN_COST["cpu"]["exp"]
    assert c.flops == 1 << 20 and c.bound == "compute"
    assert c.seconds == pytest.approx(2e-6 + weight * (1 << 20) / 1e9)


# a CPU's: a working set of up to 16 MiB stays in the last-level cache, moving at 4e10 B/s there
CACHED = Ceilings(**{**CEILINGS.to_dict(), "ops_per_s": 1e11, "cache_copy_bytes_per_s": 4e10,
                     "cache_bytes": 16 * MiB})


def test_a_working_set_the_last_level_cache_holds_moves_at_its_rate():
    fits = kernel_cost(add_kernel(1024, 1024), CACHED)  # 12 MiB
    assert fits.bound == "memory" and fits.seconds == pytest.approx(2e-6 + 12 * MiB / 4e10)
    beyond = kernel_cost(add_kernel(2048, 2048), CACHED)  # 48 MiB
    assert beyond.seconds == pytest.approx(2e-6 + 48 * MiB / 1e10)
    # a host program tells which buffers are held: here only the output
    one = kernel_cost(add_kernel(1024, 1024), CACHED, in_cache=frozenset({"out0"}))
    assert one.seconds == pytest.approx(2e-6 + 4 * MiB / 4e10 + 8 * MiB / 1e10)
    assert kernel_cost(add_kernel(1024, 1024), CEILINGS).seconds == pytest.approx(2e-6 + 12 * MiB / 1e10)


def test_a_buffer_read_after_more_traffic_than_the_cache_holds_comes_from_memory():
    import kiln
    from kiln.frontend.backend import REPORTS

    def f(x, w):
        m = torch.mm(x.sin(), w)  # between x's two reads: w (2 MiB) and m (2 MiB)
        return m[:, :256] + x  # its output: the previous call's block, as far back as x

    x, w = torch.randn(256, 256), torch.randn(256, 2048)
    before = len(REPORTS)
    kiln.compile(f)(x, w)
    report = REPORTS[before]
    small = Ceilings(**{**CACHED.to_dict(), "cache_bytes": 3 * MiB})
    second = [c for c in cost.program_cost(report.host_program, report.kernels, small).kernels][-1]
    from kiln.ir.host import Launch

    kernel = next(k for k in report.kernels if k.name == second.name)
    launch = next(i for i in report.host_program.body if isinstance(i, Launch) and i.kernel == kernel.name)
    x_name = report.host_program.inputs[0].name
    reads_x = next(p.name for p, a in zip(kernel.params, launch.args) if a == x_name)
    params = frozenset(p.name for p in kernel.params)
    held = kernel_cost(kernel, small, in_cache=params)
    outputs = {p.name for p in kernel.params if p.is_output}
    m_held = kernel_cost(kernel, small, in_cache=params - {reads_x} - outputs)
    assert second.seconds == pytest.approx(m_held.seconds) and second.seconds > held.seconds


def test_measured_reduction_steps_and_functions_of_a_kind():
    x0, r0 = sym("x0", 256), sym("r0", 512)
    kern = Kernel("kernel0", (Sym("x0", 256),), (Sym("r0", 512),),
                  (Param("in0", F32, False), Param("out0", F32, True)),
                  (Stage(True, (Load("a", "in0", x0 * 512 + r0, F32), Compute("b", "log1p", ("a",), F32),
                                Reduce("s", "max", "b", F32))),
                   Stage(False, (Store("out0", x0, "s", F32),))))
    measured = Ceilings(**{**CEILINGS.to_dict(), "fn_cost": {"reduce.max": 40.0, "exp": 20.0}})
    c = kernel_cost(kern, measured)  # log1p costs as the measured exp; a max step 40 ops
    assert c.bound == "compute" and c.seconds == pytest.approx(2e-6 + 60 * 256 * 512 / 1e9)


def test_eager_estimate_is_one_launch_per_op_reading_inputs_writing_results():
    def f(x, y):
        z = (x + y).relu()
        return z.view(-1).sum(), torch.mm(x, y)

    x, y = torch.randn(64, 64), torch.randn(64, 64)
    gm = make_fx(f)(x, y)
    costs = eager_costs(gm, CEILINGS)
    assert [c.name for c in costs] == ["add", "relu", "sum", "mm"]  # the view launches nothing
    size = 64 * 64 * 4
    assert [c.moves for c in costs] == [3 * size, 2 * size, size + 4, 3 * size]
    assert costs[3].flops == 2 * 64**3 and costs[3].bound == "launch"
    assert costs[0].seconds == pytest.approx(1e-5 + max(3 * size / 1e10, 64 * 64 / 1e9))


def test_break_even_arithmetic():
    be = break_even(compile_s=2.0, eager_s=3e-3, compiled_s=1e-3, measured=True)
    assert be.saving_s == pytest.approx(2e-3) and be.calls == pytest.approx(1000) and be.pays
    assert "after 1,000 calls" in str(be) and "measured" in str(be)
    slower = break_even(1.0, 1e-3, 2e-3, measured=False)
    assert slower.calls == math.inf and not slower.pays and "never" in str(slower)
    late = break_even(10.0, 2e-4, 1e-4, measured=False)
    assert late.calls == pytest.approx(100_000) and not late.pays


def test_a_graph_that_will_not_pay_gets_one_log_line(caplog):
    import kiln
    from kiln.frontend.backend import REPORTS

    def f(x):
        return torch.exp(x) + 1

    before = len(REPORTS)
    kiln.compile(f)(torch.randn(8))
    report = REPORTS[before]
    gm = make_fx(f)(torch.randn(8))
    free_launches = Ceilings(**{**CEILINGS.to_dict(), "launch_s": 1e-9, "kernel_launch_s": 1e-9})
    with caplog.at_level(logging.INFO, logger="kiln"):
        graph_cost = cost.after_compile(report, (free_launches, eager_costs(gm, free_launches)))
    lines = [r.getMessage() for r in caplog.records if "will not pay" in r.getMessage()]
    assert len(lines) == 1, caplog.text  # 8 elements: saving nanoseconds a call
    assert graph_cost.launches == 1 and graph_cost.eager_launches == 2
    caplog.clear()
    slow_ops = Ceilings(**{**free_launches.to_dict(), "launch_s": 10.0})  # eager's extra op: 10 s
    with caplog.at_level(logging.INFO, logger="kiln"):
        cost.after_compile(report, (slow_ops, eager_costs(gm, slow_ops)))
    assert "will not pay" not in caplog.text


def _fake_measure(counter: list):
    def measure(device):
        counter.append(device)
        return CEILINGS
    return measure


def test_ceilings_are_measured_once_and_cached(tmp_path):
    measured: list = []
    cpu = torch.device("cpu")
    assert ceilings_for(cpu, tmp_path, _fake_measure(measured)) == CEILINGS
    assert ceilings_for(cpu, tmp_path, _fake_measure(measured)) == CEILINGS
    assert len(measured) == 1
    table = json.loads((tmp_path / FILE_NAME).read_text())
    assert table[device_key(cpu)]["copy_bytes_per_s"] == 1e10


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"%s": {"copy_bytes_per_s": 1}}'])
def test_a_corrupt_ceilings_file_is_measured_again(tmp_path, content):
    cpu = torch.device("cpu")
    (tmp_path / FILE_NAME).write_text(content.replace("%s", device_key(cpu)))
    measured: list = []
    assert ceilings_for(cpu, tmp_path, _fake_measure(measured)) == CEILINGS
    assert len(measured) == 1
    assert Ceilings.from_dict(json.loads((tmp_path / FILE_NAME).read_text())[device_key(cpu)]) == CEILINGS


def test_measured_ceilings_are_sane_even_inside_a_compile():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kiln.runtime.ceilings import measure_ceilings

    with FakeTensorMode():  # as a compile's first graph measures them
        c = measure_ceilings(torch.device("cpu"))
    assert 1e8 < c.copy_bytes_per_s < 1e13 and 1e7 < c.ops_per_s < 1e13, c
    assert 1e8 < c.matmul_flop_per_s < 1e15 and 0 < c.launch_s < 1e-2 and c.row_cache_bytes >= 0, c
    assert 0 < c.kernel_launch_s < 1e-2, c
    assert c.cache_bytes == 0 or c.cache_copy_bytes_per_s > 0, c


def _gather_kernel(row_index: bool) -> Kernel:
    """out0[x0, x1] = in0[in1[x0, x1]] (a gather at every element), or, row_index, the
    embedding's in0[in1[x0] * 64 + x1] (one index a row, the row read contiguously)."""
    x0, x1 = sym("x0", 256), sym("x1", 64)
    at = x0 if row_index else x0 * 64 + x1
    i = Sym("i", 64 if row_index else 64 * 256)
    table = sym(i.name, i.extent) * 64 + x1 if row_index else sym(i.name, i.extent)
    body = (Load("i", "in1", at, torch.int64), Load("v", "in0", table, F32),
            Store("out0", x0 * 64 + x1, "v", F32))
    return Kernel("kernel0", (Sym("x0", 256), Sym("x1", 64)), (),
                  (Param("in0", F32, False), Param("in1", torch.int64, False), Param("out0", F32, True)),
                  (Stage(False, body),))


def test_a_gather_at_every_element_costs_its_measured_work_and_a_row_gather_does_not():
    measured = Ceilings(**{**CEILINGS.to_dict(), "fn_cost": {"gather": 50.0}})
    gather, rows = kernel_cost(_gather_kernel(False), measured), kernel_cost(_gather_kernel(True), measured)
    assert gather.bound == "compute" and gather.seconds == pytest.approx(2e-6 + 50 * 256 * 64 / 1e9)
    assert rows.bound == "memory" and rows.seconds < gather.seconds / 10


def test_a_concatenation_reads_each_part_once():
    # each part's load is masked to its own columns: it reads its part, not the output's width
    from planning import plan

    parts = [torch.randn(64, 96) for _ in range(3)]
    _, (kernel,) = plan(lambda a, b, c: torch.cat([a, b, c], -1) * 2, *parts)
    c = kernel_cost(kernel, CEILINGS)
    assert c.must_move == 2 * 3 * 64 * 96 * 4 and c.moves == c.must_move
