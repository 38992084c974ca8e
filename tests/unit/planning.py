"""Plans graphs through the same passes as compile_graph, stopping before C++ is built."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen.backends import get_backend
from kiln.frontend.decompositions import decomposition_table
from kiln.frontend.importer import import_graph
from kiln.ir.kernel import Kernel
from kiln.ir.tensor import Graph
from kiln.options import Options
from kiln.passes.fusion import Schedule, plan_stores
from kiln.passes.layout import Layouts
from kiln.passes.pipeline import _fuse_and_kernelize
from kiln.passes.simplify import all_rules, simplify


def tensor_graph(fn, *args: torch.Tensor) -> Graph:
    """fn's simplified tensor graph."""
    gm = make_fx(fn, decomposition_table=decomposition_table())(*args)
    graph, _ = import_graph(gm, list(args), get_backend("cpp", Options()).unsupported_fns)
    return simplify(graph, all_rules())[0]


def plan(fn, *args: torch.Tensor) -> tuple[Schedule, list[Kernel]]:
    """Schedule and kernel IR of fn."""
    graph = tensor_graph(fn, *args)
    layouts = Layouts(graph)
    stored, aliases, decisions = plan_stores(graph, layouts)
    sched, kernels = _fuse_and_kernelize(
        graph, stored, aliases, decisions, layouts, get_backend("cpp", Options())
    )
    return sched, list(kernels.values())
