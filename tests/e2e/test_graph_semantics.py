"""Graph-level semantics: outputs that alias inputs or each other, their strides and
storage offsets, saved tensors of the backward, and gradients, all as eager has them."""

from __future__ import annotations

import pytest
import torch
from conftest import TOLERANCE

import kiln
from kiln import errors
from kiln.frontend.backend import compile_aten_graph
from kiln.frontend.decompositions import decomposition_table
from kiln.options import Options


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _layout(outs, inputs) -> list:
    """Per output: shape, strides, storage offset, and which input or earlier output it
    shares memory with (None for new memory). Strides of dimensions of size 1 address
    nothing and are left out (AOTAutograd's own views of an output may differ there)."""
    described = []
    for k, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            described.append(o)
            continue
        shares = [("in", i) for i, x in enumerate(inputs) if _storage(x) == _storage(o)]
        shares += [("out", j) for j, p in enumerate(outs[:k]) if _storage(p) == _storage(o)]
        offset = o.storage_offset() if shares else 0
        stride = tuple(st if n != 1 else None for st, n in zip(o.stride(), o.shape))
        described.append((tuple(o.shape), stride, offset, shares))
    return described


def _run(fn, inputs, grad: bool):
    # only the first input requires grad: the others may be mutated in place
    inputs = [x.detach().clone().requires_grad_(grad and k == 0) for k, x in enumerate(inputs)]
    outs = fn(*inputs)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    grads = None
    if grad:
        torch.manual_seed(1)
        loss = sum((o * torch.randn_like(o)).sum() for o in outs if o.requires_grad)
        loss.backward()
        grads = [x.grad for x in inputs]
    values = [o.detach().clone() for o in outs]
    return values, _layout(outs, inputs), grads, [x.detach() for x in inputs]


def check_semantics(fn, *inputs, grad: bool = True) -> None:
    torch._dynamo.reset()
    before = len(errors.FALLBACKS)
    compiled = kiln.compile(fn)
    for _ in range(2):  # the second call runs the compiled program without compiling
        expected = _run(fn, inputs, grad)
        actual = _run(compiled, inputs, grad)
        tol = TOLERANCE[torch.float32]
        for name, a, e in zip(("outputs", "layout", "gradients", "inputs after the call"), actual, expected):
            if name == "layout":
                assert a == e, f"{name}: kiln {a}, eager {e}"
            elif e is not None:
                for ak, ek in zip(a, e):
                    if ek is None:
                        assert ak is None
                    else:
                        torch.testing.assert_close(ak, ek, **tol, msg=lambda m, name=name: f"{name}: {m}")
    graph_fallbacks = [f for f in list(errors.FALLBACKS)[before:] if f.scope == "graph"]
    assert not graph_fallbacks, graph_fallbacks


def check_graph_outputs(fn, *inputs) -> int:
    """Each compiled ATen graph (forward and backward) returns tensors with exactly the
    strides and storage offsets its FX metadata records (AOTAutograd relies on them).
    Returns how many graphs were checked."""
    checked = []

    def compiler(gm, example_inputs):
        compiled = compile_aten_graph(gm, example_inputs, Options())
        metas = [
            n.meta.get("val") if isinstance(n, torch.fx.Node) else None
            for n in gm.graph.find_nodes(op="output")[0].args[0]
        ]

        def run(args):
            outs = compiled(args)
            for k, (o, m) in enumerate(zip(outs, metas)):
                if isinstance(m, torch.Tensor):
                    assert (o.shape, o.stride()) == (m.shape, m.stride()), (k, o.stride(), m.stride())
                    if m._is_view() or o.storage_offset():
                        assert o.storage_offset() == m.storage_offset(), k
            checked.append(gm)
            return outs

        run._boxed_call = True
        return run

    from torch._functorch.aot_autograd import aot_function

    inputs = [x.detach().clone().requires_grad_(k == 0) for k, x in enumerate(inputs)]
    outs = aot_function(fn, fw_compiler=compiler, bw_compiler=compiler, decompositions=decomposition_table())(
        *inputs
    )
    outs = outs if isinstance(outs, (tuple, list)) else [outs]
    sum((o * torch.randn_like(o)).sum() for o in outs if o.requires_grad).backward()
    return len(checked)


def strided_view_and_its_sine(x):
    v = x[::3]
    return v, torch.sin(v)


def column_and_its_sine(x):
    v = x[:, 1]
    return v, torch.sin(v)


def output_and_its_transpose(x):
    y = torch.sin(x)
    return y, y.t()


def output_and_its_slices(x):
    y = x * 2
    return y, y[1:], y[:, ::2]


def view_of_an_intermediate(x):
    return torch.sin(x)[::2].t()


def diagonal_of_an_intermediate(x):
    return torch.diagonal(torch.cos(x)), x.diagonal()


def expanded_outputs(x):
    return x.expand(4, 3), torch.sin(x).expand(4, 3), torch.cos(x).unsqueeze(0)


def transposed_outputs(x):
    return x.t(), torch.sin(x).t(), x.t() * 2


def input_returned_unchanged(x):
    return x, x * 2


def same_output_twice(x):
    y = torch.sin(x)
    return y, y


def matmul_views(x):
    y = x @ x.t()
    return y.t(), y[::2], torch.sin(y)[:, 1:]


def strided_saved_for_backward(x):
    return torch.sin(x[::2, ::3]).sum(1) * torch.cos(x[1::2, ::3]).sum(1)


CASES = [
    (strided_view_and_its_sine, (5, 1)),
    (strided_view_and_its_sine, (7, 3)),
    (strided_view_and_its_sine, (7, 1, 3)),
    (column_and_its_sine, (6, 4)),
    (output_and_its_transpose, (5, 3)),
    (output_and_its_transpose, (1, 5)),
    (output_and_its_slices, (4, 6)),
    (view_of_an_intermediate, (6, 5)),
    (view_of_an_intermediate, (6, 1)),
    (diagonal_of_an_intermediate, (5, 5)),
    (expanded_outputs, (1, 3)),
    (transposed_outputs, (3, 5)),
    (input_returned_unchanged, (4, 3)),
    (same_output_twice, (4, 3)),
    (strided_saved_for_backward, (8, 9)),
    (matmul_views, (4, 3)),
]


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("fn,shape", CASES, ids=[f"{fn.__name__}-{'x'.join(map(str, s))}" for fn, s in CASES])
def test_outputs_match_eager(fn, shape, grad):
    torch.manual_seed(0)
    check_semantics(fn, torch.randn(shape), grad=grad)


@pytest.mark.parametrize("fn,shape", CASES, ids=[f"{fn.__name__}-{'x'.join(map(str, s))}" for fn, s in CASES])
def test_compiled_graphs_return_their_metadata_strides(fn, shape):
    torch.manual_seed(0)
    assert check_graph_outputs(fn, torch.randn(shape)) == 2


def test_mutated_input_and_output():
    def f(x, buf):
        buf.add_(x)
        return x * buf, buf

    torch.manual_seed(0)
    check_semantics(f, torch.randn(4, 3), torch.randn(4, 3))


def test_mutated_transposed_input():
    def f(x, buf):
        buf.mul_(2)
        return torch.sin(x) + buf

    torch.manual_seed(0)
    check_semantics(f, torch.randn(3, 4), torch.randn(4, 3).t())
