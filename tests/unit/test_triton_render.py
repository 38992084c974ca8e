"""Choices kiln makes for a Triton kernel, in the source it writes and in how it compiles it
(what runs is checked by the end-to-end tests through Triton's interpreter)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from planning import plan

from kiln.codegen import triton as tr
from kiln.codegen import triton_launch as launch


def test_an_element_wise_kernel_of_odd_size_masks_only_its_last_program():
    # a mask that changes inside a vector makes Triton load element by element: full tiles
    # get a mask that is true throughout
    _, (odd,) = plan(lambda x: torch.tanh(x) * 2, torch.randn(1001))
    source = tr.render_source(odd)
    assert "if tl.program_id(0) < 1001 // XBLOCK:" in source
    assert source.count("xmask = tl.full([XBLOCK], 1, tl.int1)") == 1
    assert source.count("xmask = xindex < 1001") == 1
    _, (even,) = plan(lambda x: torch.tanh(x) * 2, torch.randn(1024))
    source = tr.render_source(even)
    assert "if " not in source and source.count("xmask = xindex < 1024") == 1


def test_rows_off_16_byte_boundaries_get_programs_of_one_row():
    # rows of 1021 bf16 values start 2-14 bytes past a 16-byte boundary, so they load element
    # by element; programs of one row run faster for them than programs of two
    _, (odd,) = plan(lambda x: torch.softmax(x, -1), torch.randn(64, 1021, dtype=torch.bfloat16))
    _, (even,) = plan(lambda x: torch.softmax(x, -1), torch.randn(64, 1000, dtype=torch.bfloat16))
    assert not launch.rows_aligned(odd) and launch.rows_aligned(even)
    assert launch.launch_config(odd, False)[0] == 1 and launch.launch_config(even, False)[0] == 2


def test_rows_off_16_byte_boundaries_split_into_aligned_bodies_and_edges():
    # rows of 1021 values start 4-12 bytes past a 16-byte boundary: the renderer loads and
    # stores each row's aligned body as whole vectors, and the elements around it as a second
    # tile; the two tiles' reductions combine as scalars
    _, (odd_rows,) = plan(lambda x, w: torch.softmax(x, -1) * w, torch.randn(64, 1021), torch.randn(1021))
    split = launch.split_rows(odd_rows)
    assert split is not None and split.vector == 4
    source = tr.render_source(odd_rows)
    assert "xindex = tl.program_id(0)\n" in source  # one row per program
    assert "tl.load(in0 + (rbase + rindex), mask=xmask & rmask" in source
    assert "tl.store(out0 + (rbase + rindex) + zero_tile" in source
    # the weight, by column wherever the body starts: from whole vectors, shifted (the shift's
    # logic is tested in tests/codegen/test_triton_math.py)
    assert "km.load_columns(in1, rhead + 0, 1021, ALIGNED, 4, RBLOCK)" in source
    assert "tl.load(in0 + (r0_e + 1021 * x0), mask=xmask & emask" in source
    assert "tl.store(out0 + (r0_e + 1021 * x0) + zero_edge" in source
    assert "km.maximum_nan(" in source  # the maximum of body and edge
    assert "t3_max = tl.maximum(t3_body_max, t3_edge_max)" in source  # their sums, rescaled to it
    assert "t3_body * tl.exp(t3_body_max - t3_shift)" in source
    assert launch.launch_config(odd_rows, False)[0] == 1 and launch.launch_config(odd_rows, True)[0] == 1
    _, (even_rows,) = plan(lambda x, w: torch.softmax(x, -1) * w, torch.randn(64, 1000), torch.randn(1000))
    assert launch.split_rows(even_rows) is None and "rbase" not in tr.render_source(even_rows)


def test_short_rows_and_arg_reductions_do_not_split():
    _, (short,) = plan(lambda x: torch.softmax(x, -1), torch.randn(64, 37))
    _, (arg,) = plan(lambda x: x.argmax(-1), torch.randn(64, 1021))
    assert not launch.rows_aligned(short) and launch.split_rows(short) is None
    assert not launch.rows_aligned(arg) and launch.split_rows(arg) is None


def test_kernels_over_rows_off_16_byte_boundaries_assume_no_alignment(tmp_path):
    # unless they split (above): an aligned tensor beside misaligned rows would load in wider
    # pieces than the rows, and Triton would convert between the two through shared memory
    from kiln.runtime.triton_build import compile_args

    sm90 = ("cuda", 90, 32)

    def shifted(x):  # two row windows that start at different offsets: no common split
        return torch.softmax(x[:, 1:], -1) * x[:, :-1]

    _, (odd,) = plan(lambda x, w: x * w, torch.randn(64, 1021), torch.randn(1021))
    _, (unsplit,) = plan(shifted, torch.randn(64, 1022))
    _, (split,) = plan(lambda x, w: torch.softmax(x, -1) * w, torch.randn(64, 1021), torch.randn(1021))
    _, (even_rows,) = plan(lambda x, w: torch.softmax(x, -1) * w, torch.randn(64, 1000), torch.randn(1000))
    assert launch.split_rows(unsplit) is None and not launch.rows_aligned(unsplit)
    assert compile_args(unsplit, tmp_path / "k.py", (1, 1024, 2), sm90).attrs == {}
    for kernel in (odd, split, even_rows):  # element-wise kernels, split rows, aligned rows
        assert len(compile_args(kernel, tmp_path / "k.py", (1, 1024, 2), sm90).attrs) == len(kernel.params)


def test_gelu_stays_one_function_and_its_tanh_form_decomposes():
    # the erf form has a cheaper exact formulation than erf itself (km.gelu); the tanh form
    # is tanh already
    _, (exact,) = plan(lambda x: F.gelu(x) * 2, torch.randn(64, 128, dtype=torch.bfloat16))
    _, (tanh,) = plan(lambda x: F.gelu(x, approximate="tanh") * 2, torch.randn(64, 128))
    assert "km.gelu(" in tr.render_source(exact) and "erf" not in tr.render_source(exact)
    assert "km.gelu(" not in tr.render_source(tanh) and "km.tanh(" in tr.render_source(tanh)


def test_bf16_results_are_rounded_once_before_a_store():
    # a result computed with is rounded to bf16; one only stored is left to the store's
    # conversion, which rounds it the same way
    from kiln.ir import kernel as k

    bf16 = torch.bfloat16
    x, y = torch.randn(64, 128, dtype=bf16), torch.randn(64, 128, dtype=bf16)
    _, (kern,) = plan(lambda x, y: (x * y + y) * y, x, y)
    (stored,) = [s.value for st in kern.stages for s in st.body if isinstance(s, k.Store)]
    assert k.only_stored(kern) == {stored}
    source = tr.render_source(kern)
    assert source.count("km.round_bf16(") == 2  # x * y and the sum, not the stored product
    assert f"{stored} = km.round_bf16" not in source and f"km.to_bf16({stored})" in source
    _, (cast,) = plan(lambda x: (x * 2).to(bf16), torch.randn(64, 128))
    assert "km.round_bf16(" not in tr.render_source(cast)


def test_candidate_launch_configurations_start_with_the_heuristic():
    _, (rows,) = plan(lambda x: F.gelu(F.layer_norm(x, (4096,))), torch.randn(8, 4096))
    _, (odd,) = plan(lambda x: torch.softmax(x, -1), torch.randn(8, 1021))
    for kernel in (rows, odd):
        configs = launch.candidate_configs(kernel)
        assert configs[0] == launch.launch_config(kernel, False) and len(set(configs)) == len(configs) <= 6
    assert (1, 4096, 2) in launch.candidate_configs(rows)
    assert all(x == 1 for x, _, _ in launch.candidate_configs(odd))  # split rows: one row per program
