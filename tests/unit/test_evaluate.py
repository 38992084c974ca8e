"""The tensor-IR evaluator (ir/evaluate.py) against eager: whole imported graphs evaluated from
their inputs, in their own dtypes and in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.frontend.decompositions import decomposition_table
from kiln.frontend.importer import import_graph
from kiln.ir.evaluate import evaluate, largest_tensor
from kiln.ir.tensor import Op

CASES = {
    "softmax of a transpose": (lambda x: torch.softmax(x.t() * 2, -1), [(6, 5)]),
    "pad and slice": (lambda x: F.pad(x, (1, 2))[:, 1:-1:2] + 1, [(4, 7)]),
    "cat and flip": (lambda x, y: torch.cat([x, y.flip(0)], 0).exp(), [(3, 4), (2, 4)]),
    "gather with negative indices": (lambda x, i: x[i] * 3, [(5, 3), "idx"]),
    "argmax over two axes": (lambda x: x.flatten(1).argmax(-1), [(3, 4, 5)]),
    "prod and amin": (lambda x: x.prod(0) + x.amin(1).sum(), [(4, 4)]),
    "layer norm": (lambda x: F.layer_norm(x, (8,)), [(3, 8)]),
    "integer floor division": (lambda a: torch.div(a, -1, rounding_mode="floor") + a % 3, ["int32"]),
}


def _input(spec):
    if spec == "idx":
        return torch.tensor([0, -1, 3, -5, 2])
    if spec == "int32":
        return torch.tensor([-(2**31), -7, 5, 0], dtype=torch.int32)
    return torch.randn(*spec)


@pytest.mark.parametrize("name", sorted(CASES))
def test_evaluating_an_imported_graph_gives_eager_values(name):
    fn, specs = CASES[name]
    torch.manual_seed(0)
    args = [_input(s) for s in specs]
    gm = make_fx(fn, decomposition_table=decomposition_table())(*args)
    graph, fallbacks = import_graph(gm, args)
    assert not fallbacks and not any(n.op is Op.EXTERN for n in graph.nodes)
    inputs = {n: args[n.attrs[0]] for n in graph.nodes if n.op is Op.INPUT}
    outputs = graph.output_nodes()
    own = evaluate(outputs, inputs, wide=False)
    wide = evaluate(outputs, inputs, wide=True)
    expected = fn(*args)
    (out,) = outputs
    assert own[out].dtype == expected.dtype and own[out].shape == expected.shape
    torch.testing.assert_close(own[out], expected)
    if expected.is_floating_point():
        assert wide[out].dtype == torch.float64
        torch.testing.assert_close(wide[out].float(), expected, rtol=1e-5, atol=1e-5)
    assert largest_tensor(outputs, inputs) >= expected.numel()
