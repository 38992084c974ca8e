"""Choices kiln makes in the C++ source it writes (what runs is checked end to end)."""

from __future__ import annotations

import torch
from planning import plan

from kiln.codegen import cpp


def test_a_bf16_value_rounded_already_is_stored_by_its_upper_half():
    # rounding it again to store it repeats the work (RMSNorm over 4096x4096 bf16 on the CPU
    # was 7-12% slower by its fastest runs); a float32 sum stored as bf16 is still rounded
    bf16 = torch.bfloat16
    _, (kernel,) = plan(lambda x, w: (x.float() * 2).to(bf16) * w, torch.randn(8, 64, dtype=bf16),
                        torch.randn(64, dtype=bf16))
    assert "kiln_bf16_bits(" in cpp.render_kernel(kernel) and "kiln_to_bf16(" not in cpp.render_kernel(kernel)
    _, (total,) = plan(lambda x: x.sum(-1), torch.randn(8, 64, dtype=bf16))
    assert "kiln_to_bf16(" in cpp.render_kernel(total) and "kiln_bf16_bits(" not in cpp.render_kernel(total)


def test_a_gathered_row_is_indexed_once_per_line_outside_the_vector_loop():
    # an embedding's loaded index and its bounds check inside the loop along the row kept
    # that loop scalar (GPT-2's embedding on the CPU: 5x slower)
    import torch.nn.functional as F

    _, (kernel,) = plan(lambda i, w: F.embedding(i, w) * 2, torch.randint(0, 100, (4, 16)),
                        torch.randn(100, 64))
    source = cpp.render_kernel(kernel)
    vector_loop = source.index("#pragma omp simd")
    assert source.index("in0[") < vector_loop and source.index("_hit |=") < vector_loop, source
    assert "_hit)" not in source[vector_loop:].splitlines()[0], source  # no check is reduced there


def test_a_gathered_row_is_indexed_once_per_row_outside_a_reductions_loops():
    # an embedding followed by a LayerNorm loaded and checked the row's index at every
    # element of each of the norm's passes, which kept them scalar (BERT's embeddings: 14x)
    import torch.nn.functional as F

    _, (kernel,) = plan(lambda i, w: F.layer_norm(F.embedding(i, w), (64,)),
                        torch.randint(0, 100, (4, 16)), torch.randn(100, 64))
    assert kernel.reduce
    source = cpp.render_kernel(kernel)
    lines = source.splitlines()
    row_loops = [n for n, line in enumerate(lines) if line.strip().startswith("#pragma omp simd")]
    first_check = next(n for n, line in enumerate(lines) if "_hit |=" in line)
    assert row_loops and first_check < row_loops[0], source
    assert all("_hit)" not in lines[n] for n in row_loops), source  # no check is reduced there
    assert sum("_hit |=" in line for line in lines) == len(kernel.checks), source


def test_a_norms_per_row_scale_is_computed_between_its_loops():
    # 1 / sqrt(var + eps) needs the second pass's sum and nothing along the row: computed once
    # per row, it leaves the last pass its element-wise work whatever the C++ compiler hoists
    import torch.nn.functional as F

    x, r = torch.randn(4, 16, 64), torch.randn(4, 16, 64)
    _, (kernel,) = plan(lambda x, r: F.layer_norm(x + r, (64,)), x, r)
    source = cpp.render_kernel(kernel)
    lines = source.splitlines()
    row_loops = [n for n, line in enumerate(lines) if line.strip().startswith("for (int64_t r0")]
    root = next(n for n, line in enumerate(lines) if "std::sqrt(" in line)
    assert len(row_loops) == 3 and row_loops[1] < root < row_loops[2], source


def test_a_max_reductions_nan_flag_is_as_wide_as_its_values():
    # a bool flag's OR reduction keeps the row loop scalar; an integer of the lanes' width does not
    _, kernels = plan(lambda x: torch.softmax(x, -1) + x.double().amax(-1, keepdim=True), torch.randn(8, 64))
    import re

    sources = "\n".join(cpp.render_kernel(kernel) for kernel in kernels)
    flags = re.findall(r"(\w+) t\d+_nan = 0;", sources)
    assert sorted(flags) == ["int32_t", "int64_t"], sources  # the float32 row's and the float64 row's


def test_truth_value_reductions_accumulate_in_int32():
    # a bool accumulator ORed with || keeps an `any`'s loop scalar
    import re

    x = torch.randn(8, 64)
    _, kernels = plan(lambda x: ((x > 1).any(-1), (x > -1).all(-1), (x > 0).amax(-1), (x < 0).amin(-1)), x)
    sources = "\n".join(cpp.render_kernel(kernel) for kernel in kernels)
    assert "||" not in sources and "&&" not in sources and "bool t" in sources, sources
    accumulators = re.findall(r"int32_t (t\d+) = [01];", sources)
    assert len(accumulators) == 4, sources  # all(x) is not any(not x): one more OR
    assert sorted(re.findall(r"reduction\(([|&]):", sources)) == ["&", "|", "|", "|"], sources


def test_a_transposing_kernel_walks_tiles_and_matches_eager_at_odd_sizes():
    # walking whole lines, each step along the innermost loop read a new cache line of the
    # transposed input
    import kiln

    def f(x, y):
        return x.t().contiguous() + 1, (x.unsqueeze(0) * y.permute(2, 1, 0)).sum(0)

    _, kernels = plan(f, torch.randn(64, 48), torch.randn(48, 64, 3))
    sources = [cpp.render_kernel(kernel) for kernel in kernels]
    assert any(f"+= {cpp.TILE})" in source for source in sources), sources
    assert not any(f"+= {cpp.TILE})" in cpp.render_kernel(kernel)
                   for kernel in plan(lambda x: x * 2, torch.randn(64, 48))[1])
    torch._dynamo.reset()
    for shape in [(37, 50), (64, 48), (17, 1000)]:
        x, y = torch.randn(shape), torch.randn(shape[1], shape[0], 3)
        for actual, expected in zip(kiln.compile(f)(x, y), f(x, y)):
            torch.testing.assert_close(actual, expected)


def test_a_transposed_load_is_copied_tile_by_tile_in_every_dtype():
    # read in place, the vector loop gathered one element from each of a tile's 16 lines: a
    # [2048, 1024] float transpose ran at a fifth of Inductor's speed
    import kiln

    def f(x):
        return x.t().contiguous() + 1

    _, (kernel,) = plan(f, torch.randn(64, 48))
    assert "kiln_transpose_tile(" in cpp.render_kernel(kernel), cpp.render_kernel(kernel)
    _, (whole,) = plan(f, torch.randn(64, 48))
    assert "std::min" not in cpp.render_kernel(whole), cpp.render_kernel(whole)  # no edge tiles
    for dynamic in (False, True):  # a family's tiles: strides and edges at run time
        torch._dynamo.reset()
        compiled = kiln.compile(f, dynamic=dynamic)
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int16, torch.int64,
                      torch.float64):
            for shape in [(16, 16), (37, 50), (64, 48), (17, 1000)]:
                x = (torch.randn(shape) * 100).to(dtype)
                torch.testing.assert_close(compiled(x), f(x))
                torch.testing.assert_close(compiled(x[3:, 1:]), f(x[3:, 1:]))  # a tile's corner off the start


def test_outer_loops_an_index_walks_as_one_are_merged():
    # NCHW -> NHWC over 7x7 images: H and W walked apart, every tile along W was an edge tile
    import kiln

    def to_nhwc(x):
        return x.permute(0, 2, 3, 1).contiguous()

    _, (kernel,) = plan(to_nhwc, torch.randn(2, 32, 7, 7))
    source = cpp.render_kernel(kernel)
    assert "< 49;" in source and "< 7;" not in source, source
    _, (bias,) = plan(lambda x, b: x + b, torch.randn(2, 3, 5, 7), torch.randn(3, 1, 1))
    assert "< 35;" in cpp.render_kernel(bias), cpp.render_kernel(bias)
    _, (rows,) = plan(lambda x, b: x + b, torch.randn(2, 3, 5, 7), torch.randn(5, 1))
    assert "< 35;" not in cpp.render_kernel(rows), cpp.render_kernel(rows)  # b steps along H only
    torch._dynamo.reset()
    for shape in [(2, 32, 7, 7), (3, 17, 5, 9), (1, 64, 56, 56)]:
        x = torch.randn(shape)
        torch.testing.assert_close(kiln.compile(to_nhwc)(x), to_nhwc(x))
        b, c = torch.randn(shape[1], 1, 1), torch.randn(shape[2], 1)
        torch.testing.assert_close(kiln.compile(lambda x, b, c: x + b + c)(x, b, c), x + b + c)


def test_a_padded_windows_middle_runs_without_its_bounds_checks():
    # a padded max pool computed its window's bounds checks and selects at every point (half of
    # Inductor's speed): where every check of a line holds, its middle runs without them
    import torch.nn.functional as F

    import kiln

    def pools(x):
        return F.max_pool2d(x, 3, 2, 1), F.avg_pool2d(x, 3, 1, 1), F.pad(x, (2, 1, 1, 3)) * 2

    _, kernels = plan(pools, torch.randn(2, 3, 9, 9))
    sources = [cpp.render_kernel(kernel) for kernel in kernels]
    assert all("= true;" in source and "} else {" in source for source in sources), sources
    for dynamic in (False, True):
        torch._dynamo.reset()
        compiled = kiln.compile(pools, dynamic=dynamic)
        for shape in [(2, 3, 9, 9), (1, 2, 5, 8), (2, 2, 1, 1), (1, 1, 2, 33), (1, 4, 17, 64)]:
            x = torch.randn(shape)
            for actual, expected in zip(compiled(x), pools(x)):
                torch.testing.assert_close(actual, expected)


def test_an_argmax_finds_the_extreme_vectorized_then_its_first_position():
    # a sequential first-index loop over the row is scalar;
    # values from a math-library call stay sequential: a scalar loop recomputing them may differ
    # by an ulp from the vector loop's, and no position would hold the extreme
    _, (plain,) = plan(lambda x: x.argmax(-1), torch.randn(8, 64))
    _, (erf,) = plan(lambda x: torch.erf(x).argmax(-1), torch.randn(8, 64))
    source = cpp.render_kernel(plain)
    assert "reduction(max:" in source and "break;" in source, source
    assert "break;" not in cpp.render_kernel(erf), cpp.render_kernel(erf)


def test_a_loop_an_index_divides_is_split_into_affine_loops():
    # x1 % 100 along the innermost loop: the compiler gathers element by element; split, the
    # inner loop reads contiguously
    import kiln

    def f(x):
        return x.repeat(3, 2) + 1, torch.nn.functional.max_pool2d(x[None, None], 2)

    x = torch.randn(30, 100)
    _, kernels = plan(lambda x: x.repeat(3, 2) + 1, x)
    source = cpp.render_kernel(kernels[0])
    assert "%" not in source and "x1r" in source, source
    torch._dynamo.reset()
    for actual, expected in zip(kiln.compile(f)(x), f(x)):
        torch.testing.assert_close(actual, expected)


def test_an_upsamplings_indices_are_not_checked_at_every_element():
    # its indices are in range by construction; a bounds check folded into the error slots at
    # every element would cost more than the gather
    import torch.nn.functional as F

    import kiln

    def f(x):
        return F.interpolate(x, scale_factor=2, mode="nearest"), F.interpolate(x, size=(7, 9), mode="nearest")

    x = torch.randn(2, 3, 5, 6)
    torch._dynamo.reset()
    explanation = kiln.explain(f, x, show_kernels=False)
    assert all(not kernel.checks for g in explanation.graphs for kernel in g.report.kernels)
    for actual, expected in zip(kiln.compile(f)(x), f(x)):
        torch.testing.assert_close(actual, expected)
