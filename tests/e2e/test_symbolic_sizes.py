"""One program per shape family: a graph Dynamo traced with symbolic sizes is compiled once
and serves every size of its family, equal to eager. Each test asserts the compile count,
no per-shape fallback and no size kiln specialized."""

import os

import pytest
import torch

import kiln
from tests.conftest import assert_same

TRITON = os.environ.get("KILN_TARGET") == "triton"
# sizes off every vector width, primes among them (1 is Dynamo's own program: see below)
LENGTHS = (2, 3, 17, 64, 1000, 4097)
# Triton's interpreter runs a program in about a millisecond: other dimensions stay small there
HIDDEN, BATCH = (8, 4) if TRITON else (32, 5)


def randn(*shape, seed=0, **kw):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g, **kw)


def assert_one_family(graphs: int = 1):
    """kiln compiled `graphs` ATen graphs, each once for its family, and nothing per shape."""
    s = kiln.stats()
    assert s.graphs_symbolic == graphs, s
    assert s.graphs_compiled == graphs, s
    assert not s.per_shape, s.per_shape
    assert s.specialized == 0, s
    assert not s.graphs_in_aten, s.graphs_in_aten


@pytest.fixture(autouse=True)
def fresh_stats():
    torch._dynamo.reset()
    kiln.reset_stats()


def test_matmul_and_element_wise_serve_every_length():
    w = randn(HIDDEN, HIDDEN, seed=1)

    def f(x):
        return torch.nn.functional.gelu(x @ w) * torch.sigmoid(x)

    compiled = kiln.compile(f, dynamic=True)
    for n in LENGTHS:
        x = randn(BATCH, n, HIDDEN)
        assert_same(compiled(x), f(x))
    assert_one_family()


def test_reductions_over_a_symbolic_dim():
    def f(x):
        return torch.softmax(x, -1), x.sum(1), x.amax(-1), x.mean(-1, keepdim=True), torch.var(x, -1)

    compiled = kiln.compile(f, dynamic=True)
    for n in LENGTHS:
        x = randn(BATCH, HIDDEN, n)
        assert_same(compiled(x), f(x))
    assert_one_family()


def test_layer_norm_forward_and_backward():
    ln = torch.nn.LayerNorm(HIDDEN)
    with torch.no_grad():
        ln.weight.copy_(randn(HIDDEN, seed=2))
        ln.bias.copy_(randn(HIDDEN, seed=3))

    def f(x):
        return ln(x)

    compiled = kiln.compile(f, dynamic=True)
    for n in LENGTHS:
        x = randn(BATCH, n, HIDDEN, requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        grad = randn(BATCH, n, HIDDEN, seed=4)
        ln.zero_grad()
        got = compiled(x)
        got.backward(grad)
        got_grads = [x.grad, ln.weight.grad.clone(), ln.bias.grad.clone()]
        ln.zero_grad()
        want = f(x_eager)
        want.backward(grad)
        assert_same(got, want)
        tol = {"rtol": 1e-4, "atol": 1e-4}
        for a, e in zip(got_grads, [x_eager.grad, ln.weight.grad, ln.bias.grad]):
            assert_same(a, e, tol)
    assert_one_family(graphs=2)  # the forward and the backward, once each


def test_views_and_slices():
    def f(x):
        heads = x.view(x.shape[0], x.shape[1], 4, HIDDEN // 4).transpose(1, 2)
        return heads * 2, x[:, 1:] + 1, x[:, :-1].sum(-1), x.reshape(-1, HIDDEN).relu()

    compiled = kiln.compile(f, dynamic=True)
    for n in LENGTHS[1:]:  # at 2, the slices have size 1, on which Dynamo's trace specializes
        x = randn(BATCH, n, HIDDEN)
        assert_same(compiled(x), f(x))
    assert_one_family()


def test_slices_bounded_by_numbers_clamp_to_the_length():
    """x[:, -20:] (a sliding window's last positions, as Mistral's mask takes them) and
    x[:, 5:30] clamp to the length where it is shorter, as Python's slices do. Dynamo's trace
    guards on which side of the bounds the length lies: one program for the lengths between
    5 and 20, one for those above 30."""
    def f(x):
        return x[:, -20:] * 2, x[:, 5:30] + 1

    compiled = kiln.compile(f, dynamic=True)
    for n in (7, 11, 17, 19, 40, 64, 1000):
        x = randn(BATCH, n, HIDDEN)
        assert_same(compiled(x), f(x))
    assert_one_family(graphs=2)


def test_a_slices_gradient_serves_every_length():
    """The backward of x[:, 1:] writes the incoming gradient over a slice of zeros
    (aten.slice_scatter), its bounds in the family's sizes."""
    compiled = kiln.compile(lambda x: (x[:, 1:] * x[:, :-1]).sum(), dynamic=True)
    for n in LENGTHS[1:]:
        x = randn(BATCH, n, HIDDEN).requires_grad_()
        compiled(x).backward()
        grad, x.grad = x.grad, None
        (x[:, 1:] * x[:, :-1]).sum().backward()
        assert_same(grad, x.grad)
    assert_one_family(graphs=2)
    assert not kiln.stats().ops_in_aten, kiln.stats().ops_in_aten


def test_a_patchify_stem_and_a_channels_last_norm_serve_every_image_size():
    """A ConvNeXt stem (a 4x4 convolution of stride 4: sizes n // 4), its norm and a Linear
    over channels in channels-last order: ATen's metadata writes the Linear's unflattened
    size as (n // 4) ** 2 // (n // 4), and the kernels divide indices by n // 4."""
    conv, norm, linear = torch.nn.Conv2d(3, 8, 4, stride=4), torch.nn.LayerNorm(8), torch.nn.Linear(8, 16)

    def f(x):
        h = linear(norm(conv(x).permute(0, 2, 3, 1)))
        return h.reshape(h.shape[0], -1, 16).mean(1), h.permute(0, 3, 1, 2) * 2

    compiled = kiln.compile(f, dynamic=True)
    with torch.no_grad():
        for batch, side in ((2, 16), (3, 24), (5, 36)):
            x = randn(batch, 3, side, side)
            assert_same(compiled(x), f(x))
    assert_one_family()


def test_an_index_into_a_symbolic_dim_is_checked_at_that_calls_size():
    def f(x, idx):
        return x[idx] * 2

    compiled = kiln.compile(f, dynamic=True)
    for n in LENGTHS:
        x = randn(n, HIDDEN)
        idx = torch.randint(0, n, (5,), generator=torch.Generator().manual_seed(n))
        assert_same(compiled(x, idx), f(x, idx))
    assert_one_family()
    with pytest.raises(IndexError, match="index 20 is out of bounds for dimension 0 with size 17"):
        compiled(randn(17, HIDDEN), torch.tensor([3, 20]))


def test_mark_dynamic_makes_one_dimension_symbolic():
    def f(x, y):
        return torch.tanh(x) * y + x.sum(0)

    compiled = kiln.compile(f)
    for n in LENGTHS:
        x, y = randn(BATCH, n), randn(BATCH, n, seed=1)
        torch._dynamo.mark_dynamic(x, 1)
        torch._dynamo.mark_dynamic(y, 1)
        assert_same(compiled(x, y), f(x, y))
    assert_one_family()


def test_automatic_dynamic_compiles_the_family_after_one_shape_change():
    def f(x):
        return torch.exp(x) / x.abs().sum(-1, keepdim=True)

    compiled = kiln.compile(f)
    for n in LENGTHS:
        x = randn(3, n)
        assert_same(compiled(x), f(x))
    s = kiln.stats()
    # Dynamo traces the first shape statically, then the family once the shape changes
    assert (s.graphs_compiled, s.graphs_symbolic, s.specialized) == (2, 1, 0), s
    assert not s.per_shape, s.per_shape


def test_a_symbolic_float_argument():
    def f(x, scale, eps):
        return x * scale / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()

    compiled = kiln.compile(f, dynamic=True)
    for k, n in enumerate(LENGTHS):
        x = randn(BATCH, n)
        scale, eps = 0.5 + k, 1e-5 * (k + 1)
        assert_same(compiled(x, scale, eps), f(x, scale, eps))
    assert_one_family()


def test_size_one_is_its_own_program():
    def f(x):
        return torch.relu(x) + x.sum(-1, keepdim=True)

    compiled = kiln.compile(f, dynamic=True)
    for n in (1, 2, 17, 1):
        x = randn(BATCH, n)
        assert_same(compiled(x), f(x))
    s = kiln.stats()
    # Dynamo specializes size 1 (broadcasting depends on it): the family serves the rest
    assert (s.graphs_compiled, s.graphs_symbolic, s.specialized) == (2, 2, 0), s
    assert not s.per_shape, s.per_shape


def test_per_shape_with_kiln_symbolic_0(monkeypatch):
    monkeypatch.setenv("KILN_SYMBOLIC", "0")

    def f(x):
        return torch.relu(x) * 2

    compiled = kiln.compile(f, dynamic=True)
    for n in (2, 3, 17):
        x = randn(BATCH, n)
        assert_same(compiled(x), f(x))
    s = kiln.stats()
    assert s.graphs_symbolic == 0 and s.graphs_compiled == 3, s
    assert list(s.per_shape) == ["KILN_SYMBOLIC=0"], s.per_shape


def test_the_family_is_listed_in_the_report():
    from kiln.frontend.backend import REPORTS

    def f(x):
        return torch.sigmoid(x) + 1

    compiled = kiln.compile(f, dynamic=True)
    before = len(REPORTS)
    x = randn(BATCH, 17)
    assert_same(compiled(x), f(x))
    report = REPORTS[before]
    assert "= args[" in report.family and "(traced 17)" in report.family, report.family
    program = report.host_program
    assert program.sizes and all(k.sizes for k in report.kernels) is not None
    # the host program round-trips through its serialized form, sizes as text
    from kiln.ir.host import HostProgram

    assert HostProgram.from_dict(program.to_dict()) == program


def test_explain_lists_the_shape_family():
    def f(x):
        return torch.tanh(x).sum(-1)

    text = str(kiln.explain(f, randn(BATCH, 17), options={"dynamic": True}))
    assert "shape family: " in text and "(traced 17)" in text, text
    if TRITON:  # what the kernel decided about its sizes, and why
        assert "sizes   kiln_" in text, text
        assert "up to 32 in one tile" in text and "longer ones looped" in text, text


@pytest.mark.skipif(not TRITON, reason="Triton's launch decisions")
def test_triton_launches_decide_grid_and_index_width_from_the_sizes():
    from kiln.codegen.triton_sizes import grid_function, wide_function
    from kiln.frontend.backend import REPORTS
    from kiln.ir.kernel import size_params
    from kiln.runtime.triton_family import variant_key

    def f(x):
        return torch.tanh(x) * 2

    compiled = kiln.compile(f, dynamic=True)
    before = len(REPORTS)
    assert_same(compiled(randn(BATCH, 17)), f(randn(BATCH, 17)))
    (kernel,) = [size_params(k) for k in REPORTS[before].kernels]
    assert len(kernel.sizes) == 2  # both dims of x
    wide = wide_function(kernel)
    assert not wide(4, 17) and not wide(2**15, 2**15) and wide(2**16, 2**15)  # 2^31 elements
    grid = grid_function(kernel, (128, 1, 4))
    assert grid(4, 17) == (1, 1, 1) and grid(4, 1000) == (32, 1, 1)
    assert variant_key(0, False, (16, 32)) == (0, False, True) and variant_key(0, False, (16, 17))[2] is False
    assert variant_key(0, True, (16, 32)) == (0, True, False)  # the wide binary assumes nothing of its sizes
    # a bf16 kernel's vector is 8 elements: rows of 3000 start on 16-byte boundaries
    assert variant_key(0, False, (5000, 3000), 8)[2] and not variant_key(0, False, (5000, 3000), 16)[2]
    assert not variant_key(0, False, (16, 32), 0)[2]  # no vector binary where divisibility changes nothing


@pytest.mark.skipif(not TRITON, reason="Triton's launch decisions")
def test_vector_sizes_get_a_binary_only_where_that_can_change_it():
    from kiln.frontend.backend import REPORTS
    from kiln.ir.kernel import size_params
    from kiln.runtime.triton_family import compiled_with_the_graph

    def f(x):
        return torch.tanh(x) * 2

    compiled = kiln.compile(f)
    before = len(REPORTS)
    for n in (3, 17):
        x = randn(BATCH, n, 16)
        torch._dynamo.mark_dynamic(x, 1)
        assert_same(compiled(x), f(x))
    assert_one_family()
    (kernel,) = [size_params(k) for k in REPORTS[before].kernels]
    # indexed by xindex, masked by xindex < 64 * ks0: a multiple of 16 for every ks0
    assert compiled_with_the_graph(kernel) == ((0, False, False),)


@pytest.mark.skipif(not TRITON, reason="Triton's launch decisions")
def test_a_family_row_in_one_tile_takes_the_per_shape_block_where_rows_align(monkeypatch):
    """bf16 rows of 1024 start on 16-byte boundaries at the traced example: the one-tile body
    covers as many rows a program as the kernel compiled for that shape."""
    import sympy

    from kiln.codegen.triton_launch import launch_config
    from kiln.codegen.triton_sizes import launch_variants
    from kiln.frontend.backend import REPORTS
    from kiln.ir import sizes
    from kiln.ir.kernel import size_params

    def f(x):
        return torch.softmax(x.float(), -1).to(x.dtype)

    x = randn(64, 1024).bfloat16()
    kernels = []
    for dynamic in (False, True):
        torch._dynamo.reset()
        assert_same(kiln.compile(f, dynamic=dynamic)(x), f(x))
        (kernel,) = [size_params(k) for k in REPORTS[-1].kernels]
        kernels.append(kernel)
    # past its compile a family's sizes have no traced values: 1024 stands in for both
    monkeypatch.setattr(sizes, "hint", lambda e: int(sympy.sympify(e).subs(
        {sym: 1024 for sym in sympy.sympify(e).free_symbols})))
    static, one_tile = launch_config(kernels[0], False), launch_variants(kernels[1], False)[0][0][:3]
    assert one_tile == static and static[0] > 1, (static, one_tile)


@pytest.mark.skipif(not TRITON, reason="Triton's launch decisions")
def test_a_family_launch_picks_its_binary_from_the_sizes(monkeypatch):
    """FamilyLauncher's dispatch, with the GPU launch replaced by a record of what would run."""
    from kiln.frontend.backend import REPORTS
    from kiln.ir.kernel import size_params
    from kiln.runtime import triton_abi, triton_family

    compiled = kiln.compile(lambda x: torch.relu(x) + 1, dynamic=True)
    before = len(REPORTS)
    compiled(randn(BATCH, 17))
    (kernel,) = [size_params(k) for k in REPORTS[before].kernels]
    ran, compiles = [], []
    monkeypatch.setattr(triton_abi, "own_launch",
                        lambda binary, constants: lambda grid, args: ran.append((binary, constants[3], grid)))

    def compile_variant(key, config):
        compiles.append(key)
        return key

    binaries = {key: key for key in triton_family.compiled_with_the_graph(kernel)}
    assert len(binaries) == 2  # x's sizes in its mask: for sizes of 16, and for any sizes
    launcher = triton_family.FamilyLauncher(kernel, None, compile_variant, binaries, True)
    assert launcher.configs == ((1024, 1, 4),)  # the heuristic's at the traced example on a GPU
    x = object()  # tensors pass through untouched to the launch
    launcher.aligned(x, x, 16, 32)
    launcher.aligned(x, x, 4, 17)
    launcher.aligned(x, x, 2**16, 2**15)  # 2^31 elements: int64 indices, compiled once
    launcher.aligned(x, x, 2**16, 2**15 + 1)
    assert [r[0] for r in ran] == [(0, False, True), (0, False, False), (0, True, False), (0, True, False)]
    assert compiles == [(0, True, False)] and [r[1] for r in ran] == [False, False, True, True]
    assert ran[0][2] == (1, 1, 1) and ran[2][2] == (2**31 // 1024, 1, 1)


@pytest.mark.skipif(not TRITON, reason="Triton's launch decisions")
def test_long_rows_of_a_family_take_a_wider_block(monkeypatch):
    import sympy

    from kiln.codegen.triton_sizes import LONG_ROW_BLOCK, LONG_ROWS, launch_variants
    from kiln.frontend.backend import REPORTS
    from kiln.ir import sizes
    from kiln.ir.kernel import size_params

    def f(x):
        return torch.softmax(x, -1)

    compiled = kiln.compile(f, dynamic=True)
    before = len(REPORTS)
    for n in (17, 3000):  # a row longer than LONG_ROWS blocks of the traced one's
        assert_same(compiled(randn(BATCH, n)), f(randn(BATCH, n)))
    assert_one_family()
    (kernel,) = [size_params(k) for k in REPORTS[before].kernels]
    (decision,) = [d for d in REPORTS[before].decisions if d.verdict == "sizes"]
    assert f"rows of {LONG_ROWS * 32} or more: XBLOCK 1, RBLOCK {LONG_ROW_BLOCK}" in decision.reason, decision
    # outside its compile a size has no traced value: the traced row's (17) stands in
    def at_17(s):
        return int(sympy.sympify(s).subs({x: 17 for x in sympy.sympify(s).free_symbols}))

    monkeypatch.setattr(sizes, "hint", at_17)
    # on a GPU: rows up to the traced row's block (32) in one tile, longer ones looped in
    # blocks of 32, the longest in blocks of LONG_ROW_BLOCK
    configs, choose = launch_variants(kernel, False)
    assert [(c[1], c[3]) for c in configs] == [(32, True), (32, False), (LONG_ROW_BLOCK, False)]
    rows = (17, 32, 33, LONG_ROWS * 32 - 1, LONG_ROWS * 32)
    assert [choose(BATCH, n) for n in rows] == [0, 0, 1, 1, 2]

    # a launcher built at compile time compiles a long-row binary at its first long row, later,
    # with the configuration it chose then, not one chosen again without the traced sizes
    from kiln.runtime import triton_abi, triton_family

    compiles = []
    launcher = triton_family.FamilyLauncher(
        kernel, None, lambda key, config: compiles.append((key, config)) or key, {}, True
    )
    monkeypatch.undo()
    monkeypatch.setattr(triton_abi, "own_launch", lambda binary, constants: lambda grid, args: None)
    x = object()
    launcher.aligned(x, x, BATCH, LONG_ROWS * 32)
    assert [(key[0], config) for key, config in compiles] == [(2, configs[2])]


def test_training_with_varying_lengths_compiles_forward_and_backward_once():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(HIDDEN, 4, 2 * HIDDEN, dropout=0.0, batch_first=True)
    reference = torch.nn.TransformerEncoderLayer(HIDDEN, 4, 2 * HIDDEN, dropout=0.0, batch_first=True)
    reference.load_state_dict(layer.state_dict())
    compiled = kiln.compile(layer, dynamic=True)
    for n in LENGTHS[1:3]:
        x = randn(BATCH, n, HIDDEN)
        got, want = compiled(x), reference(x)
        got.sum().backward()
        want.sum().backward()
        assert_same(got, want, {"rtol": 1e-4, "atol": 1e-4})
        for p, q in zip(layer.parameters(), reference.parameters()):
            assert_same(p.grad, q.grad, {"rtol": 1e-3, "atol": 1e-4})
    assert_one_family(graphs=2)


def test_an_artifact_with_dynamic_shapes_serves_every_size_in_its_range(tmp_path):
    from torch.export import Dim

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(HIDDEN, HIDDEN)

        def forward(self, x):
            return torch.nn.functional.gelu(self.lin(x)) * torch.softmax(x, -1)

    model = Block().eval()
    batch, length = Dim("batch", min=2, max=64), Dim("length", min=2, max=4096)
    path = kiln.export(model, (randn(3, 5, HIDDEN),), tmp_path / "family",
                       dynamic_shapes={"x": {0: batch, 1: length}})
    loaded = kiln.load(path)
    shape = loaded.manifest["inputs"][0]["shape"]
    assert [d["min"] for d in shape[:2]] == [2, 2] and [d["max"] for d in shape[:2]] == [64, 4096], shape
    for b, n in ((2, 2), (3, 17), (64, 4097 - 1), (7, 1000)):
        x = randn(b, n, HIDDEN)
        with torch.no_grad():
            assert_same(loaded(x), model(x))
    with pytest.raises(ValueError, match=r"input 0 has size 65 in dimension 0, outside the range \[2, 64\]"):
        loaded(randn(65, 3, HIDDEN))


def test_a_family_program_is_loaded_from_the_graph_cache():
    def f(x):
        return torch.softmax(x, -1) * 2

    for attempt in range(2):  # Dynamo forgets the first program; kiln's graph cache keeps it
        torch._dynamo.reset()
        compiled = kiln.compile(f, dynamic=True)
        for n in (3, 17):
            x = randn(BATCH, n)
            assert_same(compiled(x), f(x))
    s = kiln.stats()
    assert (s.graphs_compiled, s.graphs_from_cache, s.graphs_symbolic) == (2, 1, 2), s
