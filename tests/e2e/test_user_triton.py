"""Users' Triton kernels inside compiled graphs: launched by the host program with no graph
break, between kiln's own kernels, with the functional form's copies only where a buffer is
read again, matching eager (the kernels run in Triton's interpreter on the CPU: see
triton_user_kernels.py for why Dynamo needs `dynamo_sees_triton` here)."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
import triton.language as tl
from conftest import assert_same, run_compiled
from torch._dynamo.utils import counters
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_functional as functional_op
from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_mutation as mutation_op
from triton_user_kernels import (
    accumulate_into_input,
    accumulate_kernel,
    add_between_kernels,
    add_kernel,
    add_with_grid_lambda,
    cast_kernel,
    cast_to_half,
    dynamo_sees_triton,  # noqa: F401 - a fixture
    interpreted,
    jit,
    scaled_add,
    scaled_add_body,
    scaled_add_kernel,
    through_triton_op,
)

from kiln import errors
from kiln.frontend.user_triton import cache_text_kwargs, user_kernel_call
from kiln.ir.host import HostProgram, Launch, LaunchUser, constants_blob

pytestmark = pytest.mark.usefixtures("dynamo_sees_triton")


def _compile_and_compare(make, kernel, *args):
    """make(kernel) compiled with kiln (fullgraph) against make(interpreted kernel) in eager,
    on copies of args (updates of the inputs compared too); the report."""
    eager_args = [a.clone() for a in args]
    kiln_args = [a.clone() for a in args]
    expected = make(interpreted(kernel))(*eager_args)
    counters.clear()
    actual, report = run_compiled(make(kernel), *kiln_args, fullgraph=True)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert report is not None, "kiln did not compile the graph"
    assert_same(actual, expected)
    for a, e in zip(kiln_args, eager_args):
        assert_same(a, e)
    return report


def _user_launches(report) -> list[LaunchUser]:
    return [i for i in report.host_program.body if isinstance(i, LaunchUser)]


def test_a_kernel_writing_its_output_runs_between_kiln_kernels():
    report = _compile_and_compare(add_between_kernels, add_kernel, torch.randn(300), torch.randn(300))
    (launch,) = _user_launches(report)
    assert launch.kernel == "triton_user_kernels:add_kernel" and launch.grid == (5, 1, 1)
    assert dict(launch.args)["n"] == 300 and dict(launch.args)["BLOCK"] == 64
    kernels = [i for i in report.host_program.body if isinstance(i, Launch)]
    assert len(kernels) == 2  # sin before it, cos * 2 after it: the launch splits fusion
    # the buffers of sin and of empty_like are dead after the launch: no copy of them
    assert "x_ptr" not in launch.clones and "out_ptr" not in launch.clones
    assert "user_kernel" in report.host_source


def test_a_constexpr_block_a_grid_lambda_and_a_transposed_operand():
    x, y = torch.randn(24, 10), torch.randn(10, 24)
    report = _compile_and_compare(add_with_grid_lambda, add_kernel, x, y)
    (launch,) = _user_launches(report)
    assert launch.grid == (8, 1, 1) and dict(launch.args)["BLOCK"] == 32


def test_a_kernel_updating_an_input_in_place():
    report = _compile_and_compare(
        accumulate_into_input, accumulate_kernel, torch.randn(130), torch.randn(130)
    )
    (launch,) = _user_launches(report)
    # the kernel writes the caller's tensor itself, as in eager: no copy of it, no copy_ back
    assert launch.clones == () and "copy_" not in str(report.host_program)


def test_a_triton_op_registered_kernel():
    def eager_op(x, y, alpha):
        return scaled_add_body(interpreted(scaled_add_kernel), x, y, alpha)

    x, y = torch.randn(200), torch.randn(200)
    expected = through_triton_op(eager_op)(x.clone(), y.clone())
    counters.clear()
    actual, report = run_compiled(through_triton_op(scaled_add), x.clone(), y.clone(), fullgraph=True)
    assert not counters["graph_break"] and report is not None
    assert_same(actual, expected)
    (launch,) = _user_launches(report)
    assert launch.kernel.endswith(":scaled_add_kernel") and dict(launch.args)["alpha"] == 0.5


def test_the_program_round_trips_through_json_and_names_the_kernel_by_source():
    report = _compile_and_compare(add_between_kernels, add_kernel, torch.randn(100), torch.randn(100))
    program = report.host_program
    again = HostProgram.from_dict(json.loads(json.dumps(program.to_dict())), constants_blob(program))
    assert str(again) == str(program)
    assert "launch_user triton_user_kernels:add_kernel" in str(program)


def test_a_kernel_no_import_finds_is_launched_but_not_stored():
    from kiln.runtime import graph_cache

    @jit
    def local_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(
            out_ptr + offsets,
            tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask),
            mask=mask,
        )

    report = _compile_and_compare(add_between_kernels, local_add, torch.randn(60), torch.randn(60))
    assert _user_launches(report)[0].kernel.endswith("<locals>.local_add")
    assert any("inside a function" in k for k in graph_cache.STATS if k.startswith("not cached")), (
        graph_cache.STATS
    )
    with pytest.raises(ValueError, match="cannot be stored.*inside a function"):
        report.host_program.to_dict()


def _side_table_kwargs(kernel, constants: dict) -> dict:
    return {
        "kernel_idx": kernel_side_table.add_kernel(kernel),
        "constant_args_idx": kernel_side_table.add_constant_args(constants),
        "grid": [(1, 1, 1)],
        "tma_descriptor_metadata": {},
        "kwargs": {},
        "tensors_to_clone": [],
    }


def test_the_cache_key_names_a_module_kernel_by_name_and_source():
    text = cache_text_kwargs(_side_table_kwargs(add_kernel, {"n": 8, "BLOCK": 8}))
    assert text["kernel_idx"].startswith("triton_user_kernels:add_kernel@")
    assert text["constant_args_idx"] == {"n": 8, "BLOCK": 8}


def test_an_autotuned_kernel_runs_as_dynamo_would_with_its_reason():
    import triton

    tuned = triton.autotune([triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["n"])(
        add_kernel
    )
    call = user_kernel_call(functional_op, _side_table_kwargs(tuned, {"n": 8}), {})
    assert call.reason is not None and "Autotuner" in call.reason
    assert (
        user_kernel_call(functional_op, _side_table_kwargs(add_kernel, {"n": 8, "BLOCK": 8}), {}).reason
        is None
    )
    in_place = user_kernel_call(mutation_op, _side_table_kwargs(add_kernel, {"n": 8, "BLOCK": 8}), None)
    assert in_place.reason is not None and "in place" in in_place.reason


def test_an_unlaunchable_kernel_keeps_the_graph_compiled(monkeypatch, caplog):
    """A call kiln does not launch runs as Dynamo's graph does, calling the op (whose kernel the
    side table hands out interpreted here), with one warning; the rest of the graph stays
    compiled."""
    from kiln.frontend import user_triton

    get_kernel = kernel_side_table.get_kernel
    monkeypatch.setattr(kernel_side_table, "get_kernel", lambda index: interpreted(get_kernel(index)))
    monkeypatch.setattr(user_triton, "_why_not_launched", lambda call, grids, kwargs: "declined for the test")
    before = len(errors.FALLBACKS)
    # a size no other test compiles: the graph cache keys the graph, not the decision
    report = _compile_and_compare(add_between_kernels, add_kernel, torch.randn(77), torch.randn(77))
    assert not _user_launches(report)
    reasons = [f.reason for f in list(errors.FALLBACKS)[before:]]
    assert reasons.count("declined for the test") == 1
    warned = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("kiln")
    ]
    assert len(warned) == 1 and "declined for the test" in warned[0], warned
    assert len([i for i in report.host_program.body if isinstance(i, Launch)]) == 2


@pytest.mark.skipif(
    os.environ.get("KILN_TARGET") == "triton", reason="the Triton target compiles one program per shape"
)
def test_one_program_for_a_shape_family_computes_the_grid_per_call():
    import kiln
    from kiln.frontend.backend import REPORTS

    torch._dynamo.reset()
    compiled = kiln.compile(add_between_kernels(add_kernel), dynamic=True)
    eager = add_between_kernels(interpreted(add_kernel))
    before = len(REPORTS)
    for n in (90, 131, 200):
        x, y = torch.randn(n), torch.randn(n)
        assert_same(compiled(x.clone(), y.clone()), eager(x, y))
    assert len(REPORTS) - before == 1
    program = REPORTS[-1].host_program
    (launch,) = [i for i in program.body if isinstance(i, LaunchUser)]
    assert launch.grid[0] not in (2, 3, 4)  # an expression of the size, not a number
    again = HostProgram.from_dict(json.loads(json.dumps(program.to_dict())), constants_blob(program))
    assert str(again) == str(program)


_CHILD = """
import logging, json, sys
import torch
import torch.utils._triton as torch_triton
torch_triton.has_triton = lambda: True  # as the dynamo_sees_triton fixture does
logging.getLogger("torch._higher_order_ops.triton_kernel_wrap").setLevel(logging.ERROR)
import kiln
from kiln.frontend.backend import REPORTS
from triton_user_kernels import add_between_kernels, add_kernel, interpreted
torch.manual_seed(int(sys.argv[1]))
x, y = torch.randn(150), torch.randn(150)
got = kiln.compile(add_between_kernels(add_kernel))(x, y)
torch.testing.assert_close(got, add_between_kernels(interpreted(add_kernel))(x, y))
print(json.dumps({"from_cache": [r.from_cache for r in REPORTS]}))
"""


def test_a_new_process_finds_the_kernel_by_name_on_a_cache_hit(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": f"{tests.parent / 'src'}{os.pathsep}{tests}",
        "KILN_CACHE_DIR": str(tmp_path),
    }
    runs = []
    for seed in (1, 2):
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(seed)], env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert runs[0]["from_cache"] == [""] and runs[1]["from_cache"][0]


def test_a_triton_dtype_constexpr_is_a_constant_of_the_program():
    report = _compile_and_compare(cast_to_half, cast_kernel, torch.randn(100))
    (launch,) = _user_launches(report)
    assert launch.kernel.endswith(":cast_kernel") and "OUT_DTYPE=const" in str(report.host_program)
    with pytest.raises(ValueError, match="cannot be serialized"):
        report.host_program.to_dict()
