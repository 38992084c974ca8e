"""torch.compile's own mode= and options= reach kiln and mean what kiln.compile's do; a bad
name or value is an error raised to the user, not a fallback."""

import pytest
import torch
from conftest import assert_same
from op_inputs import randn

from kiln import errors
from kiln.frontend import backend
from kiln.frontend.backend import REPORTS
from kiln.options import MODES


def f(x):
    return torch.sin(x) * 2 + 1


@pytest.fixture
def seen_options(monkeypatch):
    """The kiln options each compiled graph was compiled with."""
    seen = []
    compile_graph = backend.compile_aten_graph

    def spy(gm, example_inputs, options, *args):
        seen.append(options)
        return compile_graph(gm, example_inputs, options, *args)

    monkeypatch.setattr(backend, "compile_aten_graph", spy)
    return seen


@pytest.mark.parametrize("mode", MODES)
def test_torch_compile_mode_reaches_kiln(mode, seen_options):
    errors.FALLBACKS.clear()
    x = randn(6, 7)
    before = len(REPORTS)
    assert_same(torch.compile(f, backend="kiln", mode=mode)(x), f(x))
    assert len(REPORTS) == before + 1
    assert [o.mode for o in seen_options] == [mode]
    assert not [r for r in errors.FALLBACKS if r.scope == "graph"]


def test_torch_compile_options_choose_the_code_generator(seen_options):
    x = randn(6, 7)
    before = len(REPORTS)
    assert_same(torch.compile(f, backend="kiln", options={"target": "cpp"})(x), f(x))
    assert len(REPORTS) == before + 1 and REPORTS[-1].backend == "cpp"
    assert [o.target for o in seen_options] == ["cpp"]


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "fastest"}, r"mode must be one of \('default', 'reduce-overhead', 'max-autotune'\)"),
    ({"options": {"target": "cuda"}}, r"kiln option target must be one of \('auto', 'cpp', 'triton'\)"),
    ({"options": {"mode": "fastest"}}, "kiln option mode must be one of"),
    ({"options": {"trget": "cpp"}},
     r"unknown kiln option\(s\) \['trget'\].*\['mode', 'target', 'check', 'eager_random', "
     r"'matmul_templates'\]"),
    ({"options": {"dynamic": True}}, "dynamic are torch.compile's own arguments"),
])
def test_bad_torch_compile_options_raise(kwargs, message):
    compiled = torch.compile(f, backend="kiln", **kwargs)
    with pytest.raises(Exception, match=message):
        compiled(randn(3))
