"""The source map: every kernel and ATen call knows the model code it came from; kernels are
named after what they fuse, in explain and in torch.profiler."""

import pytest
import torch
from conftest import assert_same, run_compiled
from op_inputs import randn

import kiln
from kiln.frontend.origin import Origin, module_path
from kiln.passes.source_map import LABEL_CHARS, kernel_label

THIS_FILE = "e2e/test_source_map.py"  # as explain shows a file: its last two parts


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight  # NORM LINE


class Layer(torch.nn.Module):
    def __init__(self, dim: int = 32):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.norm = RMSNorm(dim)

    def forward(self, x):
        return torch.relu(self.norm(self.lin(x)))  # LAYER LINE


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer(), Layer()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _line(marker: str) -> int:
    lines = open(__file__).read().splitlines()
    return next(i + 1 for i, text in enumerate(lines) if marker in text and "_line(" not in text)


def _sites(report, kind=None):
    return [(e, s) for e in report.source_map.values() if kind in (None, e.kind) for s in e.sites]


def test_kernels_are_named_after_what_they_fuse_and_know_their_model_code():
    torch.manual_seed(0)
    model, x = Model(), randn(4, 8, 32)
    with torch.no_grad():
        out, report = run_compiled(model, x)
        assert_same(out, model(x))
    names = [k.name for k in report.kernels]
    assert names and all(n.startswith("kiln_") and len(n) <= len("kiln__99") + LABEL_CHARS for n in names)
    assert any("rmsnorm" in n and "relu" in n for n in names), names
    assert set(report.source_map) >= set(names)  # every kernel is in the map
    norm_line, layer_line = _line("# NORM LINE"), _line("# LAYER LINE")
    fused = report.source_map[next(n for n in names if "relu" in n)]
    where = {(s.origin.module, s.origin.module_class, s.origin.line) for s in fused.sites}
    # one kernel serves both layers: it lists both layers' code
    assert {("layers.0.norm", "RMSNorm", norm_line), ("layers.1.norm", "RMSNorm", norm_line)} <= where
    assert ("layers.1", "Layer", layer_line) in where
    assert all(s.origin.file.endswith(THIS_FILE) and "# NORM LINE" in s.origin.code
               for s in fused.sites if s.origin.line == norm_line)
    assert "aten.relu.default" in fused.ops and "aten.rsqrt.default" in fused.ops
    # the linear layers run in ATen: each call knows its module
    aten = {(s.origin.module, s.origin.module_class) for _, s in _sites(report, "aten")}
    assert {("layers.0.lin", "Linear"), ("layers.1.lin", "Linear")} <= aten


def test_a_training_step_maps_gradient_kernels_to_the_forward_code():
    torch.manual_seed(0)
    model, x = Layer(16), randn(6, 16)
    eager_model = Layer(16)
    eager_model.load_state_dict(model.state_dict())
    compiled = kiln.compile(model)
    from kiln.frontend.backend import REPORTS

    with REPORTS.collect() as reports:
        compiled(x).square().sum().backward()
    eager_model(x).square().sum().backward()
    for p, q in zip(model.parameters(), eager_model.parameters()):
        assert_same(p.grad, q.grad)
    assert len(reports) == 2
    backward = reports[1]
    grads = [s.origin for _, s in _sites(backward) if s.origin.backward]
    assert any(o.module == "norm" and o.line == _line("# NORM LINE") for o in grads), grads
    assert all(o.text().startswith("grad of ") for o in grads)


def test_explain_prints_the_model_code_under_each_kernel_and_aten_call_and_decision():
    torch.manual_seed(0)
    with torch.no_grad():
        explanation = kiln.explain(Layer(), randn(4, 32), show_kernels=False)
    text = str(explanation)
    graph = explanation.graphs[0]
    for kernel in graph.kernels:
        assert kernel.source is graph.source_map[kernel.name]
        assert kernel.model_code and f"{THIS_FILE}:" in kernel.model_code
        first = text.index(f"  {kernel.name}:")
        assert text[first:].split("\n")[1].startswith("    from ")  # the model code, under the kernel
    assert f"    from norm (RMSNorm) {THIS_FILE}:{_line('# NORM LINE')}" in text
    assert graph.aten_calls and "ATen calls:" in text
    assert f"from lin (Linear) {THIS_FILE}:{_line('# LAYER LINE')}" in text
    fused = [line for line in text.splitlines() if line.startswith("  fused")]
    assert fused and all(f"[norm (RMSNorm) {THIS_FILE}:{_line('# NORM LINE')}]" in line for line in fused)


def _profiled_names(fn, *args) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
    return [e.key for e in prof.events() if e.key.startswith("kiln_")]


def test_launches_are_profiler_ranges_named_after_the_kernels_only_while_profiling():
    from kiln.frontend.backend import REPORTS

    torch.manual_seed(0)
    model, x = Layer(), randn(4, 32)
    with torch.no_grad(), REPORTS.collect() as reports:
        compiled = kiln.compile(model)
        assert_same(compiled(x), model(x))
        (report,) = reports
        program = report.program()
        profiled = program.__globals__["profiled_call"]
        assert profiled.call is None  # no profiler yet: the plain program ran
        ranges = _profiled_names(compiled, x)
        assert profiled.call is not None
        assert sorted(set(ranges)) == sorted(k.name for k in report.kernels), ranges
        # after the profiler stops, calls take the plain program again
        name = report.kernels[0].name
        plain_launcher, calls = program.__globals__[name], []
        program.__globals__[name] = lambda *a: calls.append(1) or plain_launcher(*a)
        try:
            assert_same(compiled(x), model(x))
        finally:
            program.__globals__[name] = plain_launcher
        assert calls


def test_names_are_stable_so_a_second_compile_hits_the_kernel_cache(monkeypatch):
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")
    torch.manual_seed(0)
    model, x = Model(), randn(2, 32)
    with torch.no_grad():
        _, first = run_compiled(model, x)
        out, second = run_compiled(model, x)
        assert_same(out, model(x))
    assert [k.name for k in first.kernels] == [k.name for k in second.kernels]
    assert second.cache_hits == len(second.kernels) > 0


@pytest.mark.parametrize("dynamo, path", [
    ("L['self'].layers[0].norm", "layers.0.norm"),
    ("L['self']._modules['h']._modules['0'].attn", "h.0.attn"),
    ("L['model'].lin", "model.lin"),
    ("G['model']._modules['h'][1]", "model.h.1"),
    ("L['self']", ""),
])
def test_dynamo_module_paths_read_as_named_modules(dynamo, path):
    assert module_path(dynamo) == path


def test_labels_are_short_words_in_program_order():
    from kiln.frontend.origin import ORIGIN
    from kiln.ir.tensor import Builder, Op

    b = Builder()
    x = b.make(Op.INPUT, (), (0, (1,)), (4,), torch.float32)
    b.origin = Origin("a.norm", "LayerNorm", aten="aten.mul.Tensor")
    y = b.make(Op.POINTWISE, (x,), ("neg",), (4,), torch.float32)
    b.origin = Origin("", "Top", aten="aten.relu.default")  # the compiled module's own code
    z = b.make(Op.POINTWISE, (y,), ("relu",), (4,), torch.float32)
    assert y.meta[ORIGIN].module_class == "LayerNorm"
    assert kernel_label([x, y, z]) == "layernorm_relu"
    long = [b.make(Op.POINTWISE, (x,), (f"f{i}",), (4,), torch.float32,
                   {ORIGIN: Origin(f"m{i}", f"Module{i}x")}) for i in range(10)]
    assert len(kernel_label(long)) <= LABEL_CHARS and kernel_label(long).startswith("module0x_module1x")
    assert kernel_label([x]) == "copy"
