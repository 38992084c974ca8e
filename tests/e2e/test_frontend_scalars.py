"""Python numbers that Dynamo makes symbolic (dynamic=True, or a float argument that changed):
Dynamo passes them as 0-d tensors and reads them with .item() in the graph. kiln compiles
such graphs (one program for every value where it can), computing what eager computes."""

import math
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import TOLERANCE, assert_same
from op_inputs import randn

import kiln
from kiln import errors
from kiln.frontend.backend import REPORTS

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def graph_fallbacks() -> list:
    return [f for f in errors.FALLBACKS if f.scope == "graph"]


@pytest.fixture(autouse=True)
def _no_old_fallbacks():
    errors.FALLBACKS.clear()


@pytest.mark.parametrize("entry", ["kiln.compile", "torch.compile"])
def test_float_argument_with_dynamic_true_one_program_for_every_value(entry):
    def f(x, s):
        return x * s

    compiled = (kiln.compile(f, dynamic=True) if entry == "kiln.compile"
                else torch.compile(f, backend="kiln", dynamic=True))
    x = randn(4, 5)
    before = len(REPORTS)
    for s in (2.5, -0.3, 1e-7, 3.0):
        assert_same(compiled(x, s), f(x, s))
    assert len(REPORTS) == before + 1
    assert not graph_fallbacks()


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.int32, torch.bfloat16, torch.float16])
def test_symbolic_float_promotes_as_a_python_number(dtype):
    """x * s keeps x's dtype (an integer x becomes the default float dtype), and the number
    enters at full precision where eager keeps it (a float64 x, a low-precision multiply)."""

    def f(x, s):
        return x * s, x + s, s - x, torch.full_like(x, s, dtype=torch.float32)

    compiled = kiln.compile(f, dynamic=True)
    x = randn(6, 3, dtype=dtype) * 5 if dtype.is_floating_point else torch.randint(-9, 9, (6, 3), dtype=dtype)
    for s in (0.1, 1.0 / 3):
        assert_same(compiled(x, s), f(x, s), TOLERANCE.get(dtype))
    assert not graph_fallbacks()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_symbolic_float_times_integers_rounds_as_eager(dtype):
    """Eager rounds the number to float32 and multiplies in float32, not in float64."""

    def f(x, s):
        return x * s

    compiled = kiln.compile(f, dynamic=True)
    x = torch.randint(-100000, 100000, (256,), dtype=dtype)
    for s in (1.0 / 3, 0.1):
        assert_same(compiled(x, s), f(x, s), {"rtol": 0, "atol": 0})


def test_python_arithmetic_on_a_symbolic_float(monkeypatch):
    # per shape: a shape family's trace specializes clamp's bounds (test_symbolic_sizes.py)
    monkeypatch.setenv("KILN_SYMBOLIC", "0")

    def f(x, s):
        return torch.clamp(x, min=-s, max=s), x * -s

    compiled = kiln.compile(f, dynamic=True)
    x = randn(5, 7)
    before = len(REPORTS)
    for s in (0.5, 1.25):
        assert_same(compiled(x, s), f(x, s))
    assert len(REPORTS) == before + 1
    assert not graph_fallbacks()


def test_python_math_on_a_module_float():
    """Under dynamic=True Dynamo reads math.pi as a symbolic float: GPT-2's GELU computes
    math.sqrt(2.0 / math.pi), which reaches kiln as aten.true_divide, after the decompositions."""
    def f(x, s):
        return x * math.sqrt(2.0 / math.pi), x * (2.0 / s) + s * s

    compiled = kiln.compile(f, dynamic=True)
    for s in (3.0, 0.7):
        x = randn(6, 9)
        assert_same(compiled(x, s), f(x, s))
    assert not errors.FALLBACKS  # not even one op in ATen


def test_embedding_with_dynamic_true():
    emb = torch.nn.Embedding(10, 4)
    compiled = kiln.compile(emb, dynamic=True)
    for shape in ((3, 5), (2, 7)):
        idx = torch.randint(0, 10, shape)
        assert_same(compiled(idx), emb(idx))


def test_layer_norm_with_another_shape_and_eps():
    def f(x, shape, eps):
        return F.layer_norm(x, shape, eps=eps)

    compiled = kiln.compile(f)
    for x, eps in ((randn(3, 8), 1e-5), (randn(2, 6, seed=1), 0.5), (randn(4, 10, seed=2), 0.25),
                   (randn(2, 6, seed=3), 2.0)):
        assert_same(compiled(x, x.shape[-1:], eps), f(x, x.shape[-1:], eps))


def test_float_argument_that_was_a_tensor_on_the_first_call():
    def f(x, s):
        return x * s + s

    compiled = kiln.compile(f)
    x = randn(3, 4)
    for args in ((x, torch.tensor(2.0)), (2.0, x), (x, 3.0), (-1.5, x)):
        assert_same(compiled(*args), f(*args))


def test_batch_norm_update_with_a_momentum_that_changes():
    """_batch_norm_with_update's decomposition needs the momentum's value while tracing; the
    dispatcher hands that failure over as a RuntimeError, which must still mean "compile
    for each value", not "kiln failed"."""
    def f(x, w, b, mean, var, momentum, eps):
        return torch.ops.aten._batch_norm_with_update(x, w, b, mean, var, momentum, eps)

    compiled = kiln.compile(f)
    records = len(errors.FALLBACKS)
    for k, (shape, momentum) in enumerate((((5, 3, 4), 0.5), ((3, 3, 2), -1.2), ((4, 3, 6), 0.1))):
        x, w, b = randn(*shape, seed=k), randn(3, seed=10 + k), randn(3, seed=20 + k)
        mean, var = randn(3, seed=30 + k), randn(3, seed=40 + k).abs() + 0.5
        eager_stats, kiln_stats = (mean.clone(), var.clone()), (mean.clone(), var.clone())
        expected = f(x, w, b, *eager_stats, momentum, 1e-5)
        assert_same(compiled(x, w, b, *kiln_stats, momentum, 1e-5), expected)
        assert_same(kiln_stats, eager_stats)
    assert not [r for r in list(errors.FALLBACKS)[records:] if r.kind == "internal"]


OPINFO_OPS = ["nn.functional.layer_norm", "nn.functional.rms_norm", "nn.functional.batch_norm",
              "nn.functional.instance_norm", "nn.functional.normalize", "nn.functional.threshold",
              "full", "full_like"]


@pytest.mark.parametrize("name", OPINFO_OPS)
def test_opinfo_samples_through_one_compiled_function(name):
    """The samples, one after another, with their non-tensor arguments passed as arguments:
    Dynamo makes both shapes and floats symbolic after the first ones."""
    pytest.importorskip("expecttest")
    from torch.testing._internal.common_methods_invocations import op_db

    op = next(o for o in op_db if o.name == name and o.variant_test_name == "")
    compiled = kiln.compile(lambda *args, **kwargs: op(*args, **kwargs))
    for sample in op.sample_inputs("cpu", torch.float32):
        args = (sample.input, *sample.args)
        expected = op(*args, **sample.kwargs)
        assert_same(compiled(*args, **sample.kwargs), expected)


def test_transformers_generate_with_a_compiled_dynamic_forward():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        expected_logits = model(ids).logits
        expected = model.generate(ids, max_new_tokens=3, do_sample=False)
        model.forward = kiln.compile(model.forward, dynamic=True)
        actual = model.generate(ids, max_new_tokens=3, do_sample=False)
        assert_same(model(ids).logits, expected_logits)
    assert torch.equal(actual, expected), (actual, expected)
