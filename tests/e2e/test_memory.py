"""The host program's memory: temporaries reuse storage, never leak into outputs, and calls
from several threads do not share them."""

import threading

import pytest
import torch

import kiln
from kiln.frontend.backend import REPORTS
from kiln.ir.host import CallAten, Launch


def _two_kernels_and_a_matmul(x, w):
    h = torch.softmax(x * 2, -1)  # a temporary: read by the matmul only
    return torch.tanh(h @ w) + 1


def test_outputs_of_successive_calls_are_independent():
    f = kiln.compile(_two_kernels_and_a_matmul)
    w = torch.randn(32, 32)
    x1, x2 = torch.randn(16, 32), torch.randn(16, 32)
    out1 = f(x1, w)
    keep = out1.clone()
    out2 = f(x2, w)
    assert torch.equal(out1, keep)  # the second call did not write into the first's output
    torch.testing.assert_close(out2, _two_kernels_and_a_matmul(x2, w))


def test_concurrent_calls_from_threads_match_eager():
    f = kiln.compile(_two_kernels_and_a_matmul)
    w = torch.randn(32, 32)
    f(torch.randn(16, 32), w)  # compile once, before the threads start
    inputs = [torch.randn(16, 32) for _ in range(4)]
    results: dict[int, list] = {}

    def work(k: int) -> None:
        results[k] = [f(inputs[k], w) for _ in range(20)]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, outs in results.items():
        expected = _two_kernels_and_a_matmul(inputs[k], w)
        for out in outs:
            torch.testing.assert_close(out, expected)



def test_a_value_returned_twice_is_not_copied_but_a_clone_is():
    def f(x):
        y = torch.softmax(x, -1)
        return y, y, y.clone(), x.clone()

    torch._dynamo.reset()
    x = torch.randn(8, 16)
    a, b, c, d = kiln.compile(f)(x)
    assert a.data_ptr() == b.data_ptr()  # one tensor in eager as well
    assert len({a.data_ptr(), c.data_ptr(), d.data_ptr(), x.data_ptr()}) == 4
    torch.testing.assert_close(c, torch.softmax(x, -1))


def _kernel_matmul_kernel():
    """kiln's report on relu(tanh(x) @ w) + 1, checked against eager: a kernel, a matmul in
    ATen, a kernel."""
    from kiln.frontend.backend import REPORTS

    def f(x, w):
        return torch.relu(torch.tanh(x) @ w) + 1

    torch._dynamo.reset()
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    torch.testing.assert_close(kiln.compile(f)(x, w), f(x, w))
    return REPORTS[-1]


def test_inputs_are_released_after_their_last_read():
    # with the boxed calling convention the host program holds the only reference to its
    # inputs: a backward frees each saved activation once read for the last time
    host = _kernel_matmul_kernel().host_source
    last_kernel = host.rindex("kiln_")  # kernels are named kiln_<what they fuse>_<n>
    assert "del arg0" in host and host.index("del arg0") < last_kernel, host


def test_only_kernels_reading_outside_memory_check_its_alignment():
    # Triton binaries assume 16-byte aligned tensors: a kernel reading a caller's tensor or
    # an ATen view checks at launch; one reading only buffers kiln allocated, or ATen made
    # new, launches directly
    report = _kernel_matmul_kernel()
    calls = [line.strip() for line in report.host_source.splitlines() if line.strip().startswith("kiln_")]
    assert len(calls) == 2, report.host_source
    if report.backend == "triton":
        assert "(arg0" in calls[0] and ".aligned(" not in calls[0], calls  # reads the caller's x
        assert ".aligned(" in calls[1], calls  # reads the matmul's new result
    else:  # C++ launchers take addresses and assume no alignment
        assert all(".data_ptr()" in c and ".aligned(" not in c for c in calls), calls


def _report(f, *args):
    torch._dynamo.reset()
    before = len(REPORTS)
    out = kiln.compile(f)(*args)
    (report,) = REPORTS[before:]
    return out, report


def _written_over(report) -> list:
    return [d for d in report.decisions if d.verdict == "written over"]


def _conv_norm_act(x, w, scale, shift):
    y = torch.nn.functional.conv2d(x, w, padding=1)  # an ATen result
    h = torch.relu(y * scale + shift)  # read by the next convolution only
    return torch.nn.functional.conv2d(h, w, padding=1).sum((2, 3))


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_a_point_wise_kernel_stores_into_a_dead_aten_results_memory(memory_format):
    """The convolution's result is read by the norm's kernel alone: the kernel stores its
    result there, and the program holds one buffer where it held two."""
    x = torch.randn(2, 4, 8, 8).to(memory_format=memory_format)
    args = (x, torch.randn(4, 4, 3, 3), torch.randn(4, 1, 1), torch.randn(4, 1, 1))
    out, report = _report(_conv_norm_act, *args)
    torch.testing.assert_close(out, _conv_norm_act(*args))
    assert len(_written_over(report)) == 1, report.decisions
    body = report.host_program.body
    first_conv = next(i.out for i in body if isinstance(i, CallAten) and "convolution" in str(i.op))
    assert any(first_conv in i.writes for i in body if isinstance(i, Launch)), report.host_program


def _read_again(x, w):
    y = x @ w
    return torch.relu(y) @ w + y  # y is read after relu's kernel


def _reversed(x, w):
    return torch.flip(x @ w, [0, 1]) * 2 @ w  # the kernel reads the product at other elements


@pytest.mark.parametrize("fn", [_read_again, _reversed])
def test_a_kernel_writes_over_no_buffer_read_later_or_at_other_elements(fn):
    args = (torch.randn(8, 8), torch.randn(8, 8))
    out, report = _report(fn, *args)
    torch.testing.assert_close(out, fn(*args))
    assert not _written_over(report), report.decisions


def test_under_the_numerics_check_kernels_keep_their_inputs_to_be_checked_against():
    """The check evaluates each launch from its inputs after it ran: none is written over."""
    args = (torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3), torch.randn(4, 1, 1), torch.randn(4, 1, 1))
    torch._dynamo.reset()
    before = len(REPORTS)
    out = kiln.compile(_conv_norm_act, check=True)(*args)
    (report,) = REPORTS[before:]
    torch.testing.assert_close(out, _conv_norm_act(*args))
    assert not _written_over(report), report.decisions
    launches = [i for i in report.host_program.body if isinstance(i, Launch)]
    assert report.numerics.checked == len(launches) and not report.numerics.skipped, report.numerics
