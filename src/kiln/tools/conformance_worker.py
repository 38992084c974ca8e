"""One conformance worker: reads 'op<TAB>dtype' lines, runs the op's samples compiled and
eager, and prints one JSON line per job (preceded by a 'start' line, so that the parent
knows which job a dying worker was running)."""

from __future__ import annotations

import itertools
import json
import logging
import signal
import sys
import time
import warnings

import torch
from torch.utils._pytree import tree_flatten

import kiln  # noqa: F401  (registers the backend)
from kiln.frontend.backend import REPORTS, kiln_backend
from kiln.options import Options

# Ops whose results are random or uninitialized memory: compared on shape and dtype only.
UNDEFINED_VALUES = {
    "bernoulli", "cauchy", "empty", "empty_like", "empty_permuted", "empty_strided", "exponential",
    "geometric", "log_normal", "multinomial", "new_empty", "new_empty_strided", "normal",
    "normal.number_mean", "nn.functional.alpha_dropout", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.feature_alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.feature_alpha_dropout.without_train", "nn.functional.rrelu", "rand_like", "randint", "randint_like",
    "randn", "randn_like", "uniform", "randint.default",
}
RANK = {c: k for k, c in enumerate(("crash", "mismatch", "not captured", "fallback pass", "native pass"))}


class _Timeout(Exception):
    pass


class _KilnLog(logging.Handler):
    """Collects kiln's warnings: a whole graph run in ATen is an internal error."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def prepare() -> tuple[dict, _KilnLog]:
    """op_db by name, and the handler that collects kiln's warnings."""
    from torch.testing._internal import common_methods_invocations as cmi

    from kiln.tools.conformance import op_name

    # OpInfo wraps random ops in a helper that saves and restores the RNG state, which
    # Dynamo does not trace; the runner seeds eager and compiled runs alike instead.
    cmi.wrapper_set_seed = lambda op, *args, **kwargs: op(*args, **kwargs)
    _record_lowerings()
    handler = _KilnLog()
    logging.getLogger("kiln").addHandler(handler)
    return {op_name(op): op for op in cmi.op_db}, handler


def serve(args) -> int:
    ops, handler = prepare()
    warnings.filterwarnings("ignore")
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(_Timeout()))
    for line in sys.stdin:
        name, dtype_key = line.rstrip("\n").split("\t")
        print(json.dumps({"start": True, "op": name, "dtype": dtype_key}), flush=True)
        t0 = time.time()
        signal.alarm(args.timeout)
        try:
            result = run_op(ops[name], name, dtype_key, args.samples, handler)
        except _Timeout:
            result = _result("crash", 0, f"timed out after {args.timeout} s", {})
        except Exception as e:  # noqa: BLE001 - the runner's own failure, not kiln's
            result = _result("skipped", 0, f"runner error: {_short(e)}", {})
        finally:
            signal.alarm(0)
        result.update(op=name, dtype=dtype_key, seconds=round(time.time() - t0, 2))
        print(json.dumps(result), flush=True)
    return 0


def _result(cls: str, samples: int, detail: str, fallbacks: dict) -> dict:
    return {"class": cls, "samples": samples, "detail": detail, "fallbacks": fallbacks}


LOOKED_UP: set[str] = set()  # ATen ops the importer found a lowering for, this job


def _record_lowerings() -> None:
    """Note which lowerings a job reaches, so that a CI subset can cover all of them."""
    from kiln.frontend import importer

    lookup = importer.lookup

    def recording_lookup(target):
        fn = lookup(target)
        if fn is not None:
            LOOKED_UP.add(str(target))
        return fn

    importer.lookup = recording_lookup


def pick_dtype(op, key: str) -> torch.dtype | None:
    supported = op.supported_dtypes("cpu")
    if key == "int":
        return next((d for d in (torch.int64, torch.int32, torch.int16, torch.uint8) if d in supported), None)
    dtype = getattr(torch, key)
    return dtype if dtype in supported else None


def run_op(op, name: str, dtype_key: str, max_samples: int, handler: _KilnLog) -> dict:
    dtype = pick_dtype(op, dtype_key)
    if dtype is None:
        return _result("unsupported dtype", 0, "", {})
    try:
        samples = list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=False), max_samples))
    except Exception as e:  # noqa: BLE001 - the OpInfo itself failed
        return _result("skipped", 0, f"sample_inputs failed: {type(e).__name__}: {e}", {})
    worst, detail, fallbacks, ran = "native pass", "", {}, 0
    LOOKED_UP.clear()
    for k, sample in enumerate(samples):
        outcome = run_sample(op.op, sample, dtype, name in UNDEFINED_VALUES, handler)
        if outcome is None:
            continue  # eager fails on this sample
        ran += 1
        cls, why, fb = outcome
        fallbacks.update(fb)
        if RANK[cls] < RANK[worst]:
            worst, detail = cls, f"sample {k} ({_describe(sample)}): {why}"
    if ran == 0:
        return _result("eager fails", 0, "", {})
    result = _result(worst, ran, detail, fallbacks)
    result["lowered"] = sorted(LOOKED_UP - set(fallbacks))
    return result


def _describe(sample) -> str:
    def one(v):
        if isinstance(v, torch.Tensor):
            return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
        return repr(v) if not isinstance(v, (list, tuple)) else [one(x) for x in v]

    parts = [one(sample.input)] + [one(a) for a in sample.args] + [f"{k}={one(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(str(p) for p in parts)[:160]


def wrap(fn, sample):
    """fn over the sample's tensors as positional inputs; everything else stays constant.
    The rebuild is plain Python, which Dynamo traces (a C++ pytree spec it would not)."""
    found: list[torch.Tensor] = []

    def slots(v):
        if isinstance(v, torch.Tensor):
            found.append(v)
            return _Slot(len(found) - 1)
        if isinstance(v, (list, tuple)):
            return type(v)(slots(x) for x in v)
        if isinstance(v, dict):
            return {k: slots(x) for k, x in v.items()}
        return v

    template = slots((sample.input, list(sample.args), dict(sample.kwargs)))

    def call(*tensors):
        inp, args, kwargs = _fill(template, tensors)
        return fn(inp, *args, **kwargs)

    return call, found


class _Slot:
    def __init__(self, k: int):
        self.k = k


def _fill(v, tensors):
    if isinstance(v, _Slot):
        return tensors[v.k]
    if isinstance(v, (list, tuple)):
        return type(v)(_fill(x, tensors) for x in v)
    if isinstance(v, dict):
        return {k: _fill(x, tensors) for k, x in v.items()}
    return v


def _clone(ts):
    return [t.clone() if isinstance(t, torch.Tensor) else t for t in ts]


def run_sample(fn, sample, dtype, values_undefined: bool, handler: _KilnLog):
    """(class, reason, fallbacks), or None when eager itself fails."""
    call, tensors = wrap(fn, sample)
    eager_in = _clone(tensors)
    torch.manual_seed(0)
    try:
        expected = call(*eager_in)
    except Exception:  # noqa: BLE001
        return None
    kiln_in = _clone(tensors)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    handler.messages.clear()
    graphs, before = [], len(REPORTS)

    def backend(gm, example_inputs):
        graphs.append(gm)
        return kiln_backend(gm, example_inputs, Options(dynamic=False))

    torch.manual_seed(0)
    try:
        actual = torch.compile(call, backend=backend, dynamic=False)(*kiln_in)
    except Exception as e:  # noqa: BLE001
        if _fails_without_kiln(call, tensors, "eager"):
            return "not captured", f"Dynamo fails: {_short(e)}", {}
        return "crash", _short(e), {}
    reports = REPORTS[before:]
    fallbacks = {op: reason for r in reports for op, reason in r.fallbacks.items()}
    fallbacks.update({"(whole graph)": m for m in handler.messages if "by design" in m})
    problem = _kiln_problem(handler.messages, call, tensors)
    if problem:
        return problem[0], problem[1], fallbacks
    mismatch = compare((actual, kiln_in), (expected, eager_in), dtype, values_undefined)
    if mismatch:
        return "mismatch", mismatch, fallbacks
    breaks = torch._dynamo.utils.counters["graph_break"]
    if breaks or not graphs:
        why = "; ".join(list(breaks)[:2]) if breaks else "Dynamo captured no graph"
        return "not captured", why[:300], fallbacks
    return ("fallback pass" if fallbacks else "native pass"), "", fallbacks


def _kiln_problem(messages: list[str], call, tensors):
    for m in messages:
        if "by design" in m:
            continue
        if "AOTAutograd failed" in m:
            if _fails_without_kiln(call, tensors, "aot_eager"):
                return "not captured", m[:400]
            return "crash", m[:400]
        if "graph runs in ATen" in m or "(internal)" in m:
            return "crash", m[:400]
    return None


def _fails_without_kiln(call, tensors, backend: str) -> bool:
    torch._dynamo.reset()
    try:
        torch.compile(call, backend=backend, dynamic=False)(*_clone(tensors))
        return False
    except Exception:  # noqa: BLE001
        return True


def _short(e: Exception) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text[:400]


def compare(actual, expected, dtype, values_undefined: bool) -> str:
    """'' when equal as eager's contract requires, else what differs."""
    a_leaves, a_spec = tree_flatten(actual)
    e_leaves, e_spec = tree_flatten(expected)
    if len(a_leaves) != len(e_leaves):
        return f"{len(a_leaves)} outputs, eager gives {len(e_leaves)}"
    for k, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        why = _compare_one(a, e, values_undefined)
        if why:
            return f"output {k}: {why}"
    return ""


def _compare_one(a, e, values_undefined: bool) -> str:
    if not isinstance(e, torch.Tensor):
        if isinstance(a, torch.Tensor) or a != e and not (a != a and e != e):
            return f"{a!r} != {e!r}"
        return ""
    if not isinstance(a, torch.Tensor):
        return f"got {type(a).__name__}, eager gives a tensor"
    if a.shape != e.shape or a.dtype != e.dtype:
        return f"{a.dtype}{list(a.shape)} vs eager {e.dtype}{list(e.shape)}"
    if values_undefined or e.numel() == 0:
        return ""
    if e.layout != torch.strided:
        a, e = a.to_dense(), e.to_dense()
    if e.is_floating_point() or e.is_complex():
        try:
            torch.testing.assert_close(a, e, equal_nan=True, **tolerance(e))
        except AssertionError as err:
            return str(err).replace("\n", " ")[:300]
        return ""
    if not torch.equal(a, e):
        bad = (a != e).sum().item()
        return f"{bad} of {e.numel()} values differ"
    return ""


def tolerance(e: torch.Tensor) -> dict:
    """Element-wise ops round like eager; reductions may sum in another order, so the
    absolute tolerance grows with the values' magnitude."""
    finite = e[torch.isfinite(e)] if not e.is_complex() else e.abs()
    scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
    if e.dtype in (torch.bfloat16, torch.float16):
        return dict(rtol=2e-2, atol=2e-2 * scale)
    if e.dtype == torch.float64:
        return dict(rtol=1e-7, atol=1e-9 * scale)
    return dict(rtol=1e-4, atol=1e-5 * scale)

