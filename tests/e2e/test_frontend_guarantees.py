"""Whatever fails inside kiln, the user's program runs (in ATen where it must) with one warning
that says why, and a record in kiln.errors.FALLBACKS; KILN_DEBUG=1 raises instead. Each test
plants one failure and checks all of that against eager."""

import dataclasses
import logging

import pytest
import torch
from conftest import assert_same
from op_inputs import randn

import kiln
from kiln import errors
from kiln.frontend import backend, importer
from kiln.passes import pipeline


class Planted(RuntimeError):
    pass


@pytest.fixture(autouse=True)
def _no_graph_cache(monkeypatch):
    """Failures are planted in the compile that a whole-graph cache hit would skip."""
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")


def boom(*args, **kwargs):
    raise Planted("planted failure")


def f(x, y):
    return torch.sin(x) * y + 1


def plant_lowering(monkeypatch):
    lookup = importer.lookup
    monkeypatch.setattr(importer, "lookup", lambda t: boom if t is torch.ops.aten.sin.default else lookup(t))


def plant_backend_field(field):
    def plant(monkeypatch):
        get_backend = backend.get_backend
        monkeypatch.setattr(backend, "get_backend",
                            lambda *a: dataclasses.replace(get_backend(*a), **{field: boom}))

    return plant


def plant_compile_graph(monkeypatch):
    monkeypatch.setattr(pipeline, "compile_graph", boom)


def plant_first_call(monkeypatch):
    """The program compiles, then raises when it runs (a kernel that does not load, say)."""
    compile_graph = pipeline.compile_graph

    def compile_then_fail(*args):
        _, report = compile_graph(*args)
        return boom, report

    monkeypatch.setattr(pipeline, "compile_graph", compile_then_fail)


def plant_per_shape(monkeypatch):
    monkeypatch.setenv("KILN_SYMBOLIC", "0")  # symbolic graphs compile per shape
    monkeypatch.setattr(backend, "_compile_shape", boom)


def plant_family(monkeypatch):
    monkeypatch.setattr(backend, "compile_family_graph", boom)  # then per shape: also planted
    monkeypatch.setattr(backend, "_compile_shape", boom)


def plant_graph_reading(monkeypatch):
    monkeypatch.setattr(backend, "eager_only_reason", boom)


# name -> (plant, scope of the record, kind of the record, kiln.compile options)
PLANTS = {
    "lowering": (plant_lowering, "op", "internal", {}),
    "code generator": (plant_backend_field("render"), "graph", "internal", {}),
    "build": (plant_backend_field("build"), "graph", "internal", {}),
    "compile_graph": (plant_compile_graph, "graph", "internal", {}),
    "first call": (plant_first_call, "graph", "internal", {}),
    "per-shape path": (plant_per_shape, "graph", "internal", {"dynamic": True}),
    "shape-family path": (plant_family, "graph", "internal", {"dynamic": True}),
    "reading the graph": (plant_graph_reading, "graph", "internal", {}),
    "tracing": (lambda mp: mp.setattr(backend, "decomposition_table", boom), "graph", "trace", {}),
}


def kiln_warnings(caplog) -> list[str]:
    """Warnings of kiln's loggers ("kiln" and its topics, e.g. "kiln.fallbacks")."""
    return [r.getMessage() for r in caplog.records
            if r.name.split(".")[0] == "kiln" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("name", PLANTS)
def test_planted_failure_runs_the_program_with_one_warning(name, monkeypatch, caplog):
    plant, scope, kind, options = PLANTS[name]
    plant(monkeypatch)
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    errors.FALLBACKS.clear()
    compiled = kiln.compile(f, **options)
    x, y = randn(5, 6), randn(5, 6, seed=1)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        assert_same(compiled(x, y), f(x, y))
        assert_same(compiled(x, y), f(x, y))  # and again, without a second warning
    warnings = kiln_warnings(caplog)
    assert len(warnings) == 1 and "planted failure" in warnings[0], warnings
    assert [(r.scope, r.kind) for r in errors.FALLBACKS] == [(scope, kind)]
    assert "Planted: planted failure" in errors.FALLBACKS[0].reason


@pytest.mark.parametrize("name", PLANTS)
def test_planted_failure_raises_under_kiln_debug(name, monkeypatch):
    plant, _, _, options = PLANTS[name]
    plant(monkeypatch)
    monkeypatch.setenv("KILN_DEBUG", "1")
    compiled = kiln.compile(f, **options)
    with pytest.raises(Exception, match="planted failure"):
        compiled(randn(5, 6), randn(5, 6, seed=1))


def test_a_shape_function_that_disagrees_with_its_kernel_is_upstream(monkeypatch, caplog):
    """An ATen result whose rank differs from what PyTorch's shape function said (linalg
    vector norms over size-1 dims on torch 2.11) is PyTorch's bug: the graph runs in ATen."""
    def mismatch(args):
        raise errors.MetaMismatch("an ATen op returned a 0-d result")

    compile_graph = pipeline.compile_graph
    monkeypatch.setattr(pipeline, "compile_graph", lambda *a: (mismatch, compile_graph(*a)[1]))
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    errors.FALLBACKS.clear()
    x, y = randn(5, 6), randn(5, 6, seed=1)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        assert_same(kiln.compile(f)(x, y), f(x, y))
    assert [(r.scope, r.kind) for r in errors.FALLBACKS] == [("graph", "upstream")]
    assert len(kiln_warnings(caplog)) == 1
