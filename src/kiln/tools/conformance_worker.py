"""One conformance worker: reads 'op<TAB>dtype' lines, runs the op's samples compiled and
eager, and prints one JSON line per job (preceded by a 'start' line, so that the parent
knows which job a dying worker was running).

Two modes (see docs/conformance.md):
    per-op      one compiled function per op; every sample is called through it in turn with
                its tensors and its other arguments (numbers, shapes, dtypes, ...) as arguments,
                so Dynamo decides what to specialize and makes shapes dynamic when they change
    per-sample  a fresh compile per sample (Dynamo reset, dynamic=False), the sample's
                non-tensor arguments baked in as constants
"""

from __future__ import annotations

import itertools
import json
import signal
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch.utils._pytree import tree_map

import kiln  # noqa: F401  (registers the backend)
from kiln import errors
from kiln.frontend.backend import kiln_backend
from kiln.options import Options
from kiln.tools.conformance_compare import compare, stride_difference

MODES = ("per-op", "per-sample")

# Ops whose results are random or uninitialized memory: compared on shape and dtype only.
UNDEFINED_VALUES = {
    "bernoulli",
    "cauchy",
    "empty",
    "empty_like",
    "empty_permuted",
    "empty_strided",
    "exponential",
    "geometric",
    "log_normal",
    "multinomial",
    "new_empty",
    "new_empty_strided",
    "normal",
    "normal.number_mean",
    "nn.functional.alpha_dropout",
    "nn.functional.dropout",
    "nn.functional.dropout2d",
    "nn.functional.dropout3d",
    "nn.functional.feature_alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.feature_alpha_dropout.without_train",
    "nn.functional.rrelu",
    "rand_like",
    "randint",
    "randint_like",
    "randn",
    "randn_like",
    "uniform",
    "randint.default",
}
# Ops that draw random numbers only in some samples: (op, whether a sample draws). kiln draws
# them from its own counter-based stream (docs/random.md), so their values differ from eager's.
RANDOM_IN_SAMPLES = {
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
    # (query, key, value, embed_dim, num_heads, in_proj_weight, in_proj_bias, bias_k, bias_v,
    # add_zero_attn, dropout_p, ...): dropout_p is args[9] after the query
    "nn.functional.multi_head_attention_forward":
        lambda s: len(s.args) > 9 and s.args[9] > 0 and s.kwargs.get("training", True),
    "nn.functional.fractional_max_pool2d": lambda s: "_random_samples" not in s.kwargs,
    "nn.functional.fractional_max_pool3d": lambda s: "_random_samples" not in s.kwargs,
}


def random_values(name: str, sample) -> bool:
    """Whether a sample's results are random or uninitialized: compared on shape and dtype."""
    return name in UNDEFINED_VALUES or RANDOM_IN_SAMPLES.get(name, lambda s: False)(sample)


# Worst first: an op's class is the worst over its samples.
RANK = {c: k for k, c in enumerate(("crash", "mismatch", "not captured", "fallback pass", "native pass"))}


class _Timeout(BaseException):
    """Not an Exception: the runner's handlers of kiln's and Dynamo's errors must not catch it."""


def prepare() -> dict:
    """op_db by name."""
    from torch.testing._internal import common_methods_invocations as cmi

    from kiln.tools.conformance import op_name

    # OpInfo wraps random ops in a helper that saves and restores the RNG state, which
    # Dynamo does not trace; the runner seeds eager and compiled runs alike instead.
    cmi.wrapper_set_seed = lambda op, *args, **kwargs: op(*args, **kwargs)
    _record_lowerings()
    return {op_name(op): op for op in cmi.op_db}


def serve(args) -> int:
    ops = prepare()
    warnings.filterwarnings("ignore")
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(_Timeout()))
    for line in sys.stdin:
        name, dtype_key = line.rstrip("\n").split("\t")
        print(json.dumps({"start": True, "op": name, "dtype": dtype_key}), flush=True)
        t0 = time.time()
        signal.alarm(args.timeout)
        try:
            result = run_op(ops[name], name, dtype_key, args.samples, args.mode)
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


def run_op(op, name: str, dtype_key: str, max_samples: int, mode: str = "per-op") -> dict:
    """The op's class over its first max_samples samples (the worst of them)."""
    dtype = pick_dtype(op, dtype_key)
    if dtype is None:
        return _result("unsupported dtype", 0, "", {})
    try:
        samples = list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=False), max_samples))
    except Exception as e:  # noqa: BLE001 - the OpInfo itself failed
        return _result("skipped", 0, f"sample_inputs failed: {type(e).__name__}: {e}", {})
    samples_runner = runner(op.op, mode)
    worst, detail, fallbacks, ran, strides = "native pass", "", {}, 0, ""
    LOOKED_UP.clear()
    for k, sample in enumerate(samples):
        outcome = samples_runner.run(sample, random_values(name, sample), dtype)
        if outcome is None:
            continue  # eager fails on this sample
        ran += 1
        fallbacks.update(outcome.fallbacks)
        if outcome.strides and not strides:
            strides = f"sample {k} ({_describe(sample)}): {outcome.strides}"
        if RANK[outcome.cls] < RANK[worst]:
            worst, detail = outcome.cls, f"sample {k} ({_describe(sample)}): {outcome.why}"
    if ran == 0:
        return _result("eager fails", 0, "", {})
    result = _result(worst, ran, detail, fallbacks)
    result["lowered"] = sorted(LOOKED_UP - set(fallbacks))
    result["strides"] = strides
    return result


def _describe(sample) -> str:
    def one(v):
        if isinstance(v, torch.Tensor):
            return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
        return repr(v) if not isinstance(v, (list, tuple)) else [one(x) for x in v]

    parts = (
        [one(sample.input)]
        + [one(a) for a in sample.args]
        + [f"{k}={one(v)}" for k, v in sample.kwargs.items()]
    )
    return ", ".join(str(p) for p in parts)[:160]


@dataclass
class Outcome:
    cls: str
    why: str = ""
    fallbacks: dict[str, str] = field(default_factory=dict)
    strides: str = ""  # an output laid out unlike eager's (reported, not part of the class)


@dataclass
class _Call:
    """One sample as a call: positional and keyword arguments of the function compiled."""

    fn: Callable
    args: tuple
    kwargs: dict

    def clone(self) -> _Call:
        fresh = tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, (self.args, self.kwargs))
        return _Call(self.fn, *fresh)

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


class _Counted:
    """A compiled graph that counts its calls: a sample whose call ran no graph was not captured."""

    def __init__(self, fn: Callable, runs: list[int]):
        self.fn, self.runs = fn, runs

    def __call__(self, *args: Any) -> Any:
        self.runs[0] += 1
        return self.fn(*args)


class _Runner:
    """Runs samples eager and compiled and classifies each; subclasses say how samples
    become calls and when to compile."""

    options: ClassVar[dict] = {}  # kiln's options; KILN_TARGET picks the code generator, as for kiln.compile

    def __init__(self, fn: Callable):
        self.fn = fn
        self.runs = [0]  # calls of compiled graphs
        self.history: list[_Call] = []  # the calls made so far, to replay without kiln

    def call_of(self, sample) -> _Call:
        raise NotImplementedError

    def compiled(self, backend: Callable | str) -> Callable:
        """The function to call the samples through, compiled with backend."""
        raise NotImplementedError

    def replay(self) -> list[_Call]:
        """The calls another backend must make to reach the last one as kiln did."""
        raise NotImplementedError

    def kiln(self, gm, example_inputs):
        return _Counted(kiln_backend(gm, example_inputs, Options.from_kwargs(**self.options)), self.runs)

    def run(self, sample, values_undefined: bool, dtype: torch.dtype) -> Outcome | None:
        """The sample's outcome, or None when eager itself fails."""
        call = self.call_of(sample)
        eager = call.clone()
        torch.manual_seed(0)
        try:
            expected = eager()
        except Exception:  # noqa: BLE001
            return None
        self.history.append(call)
        actual_call = call.clone()
        torch._dynamo.utils.counters.clear()
        errors.FALLBACKS.clear()
        runs_before = self.runs[0]
        torch.manual_seed(0)
        try:
            actual = self.compiled(self.kiln)(*actual_call.args, **actual_call.kwargs)
        except Exception as e:  # noqa: BLE001
            if self._fails_without_kiln("eager"):
                return Outcome("not captured", f"Dynamo fails: {_short(e)}")
            return Outcome("crash", _short(e))
        records = list(errors.FALLBACKS)
        ran_in_aten = ("by design", "unsupported", "upstream")
        fallbacks = {r.op or "(whole graph)": r.reason for r in records if r.kind in ran_in_aten}
        problem = self._kiln_problem(records)
        if problem:
            return Outcome(problem[0], problem[1], fallbacks)
        mismatch = compare(
            (actual, actual_call.args, actual_call.kwargs),
            (expected, eager.args, eager.kwargs),
            dtype,
            values_undefined,
        )
        if mismatch:
            return Outcome("mismatch", mismatch, fallbacks)
        fallbacks_and_strides = {"fallbacks": fallbacks, "strides": stride_difference(actual, expected)}
        breaks = [*_counted("graph_break"), *_counted("unimplemented")]
        refused = [b for b in breaks if b.startswith(_BACKEND_FAILED)]
        if refused:  # the backend raised an error Dynamo turns into a graph break
            cls = "not captured" if self._fails_without_kiln("aot_eager") else "crash"
            return Outcome(cls, _first_line(refused[0]), **fallbacks_and_strides)
        if breaks or self.runs[0] == runs_before:
            why = "; ".join(map(_first_line, breaks[:2])) if breaks else "no compiled graph ran"
            return Outcome("not captured", why, **fallbacks_and_strides)
        return Outcome("fallback pass" if fallbacks else "native pass", "", **fallbacks_and_strides)

    def _kiln_problem(self, records: list[errors.Fallback]) -> tuple[str, str] | None:
        """A kiln bug among the fallback records: an internal error, or a graph that
        AOTAutograd traces without kiln's decompositions but not with them."""
        for r in records:
            if r.kind == "internal":
                return "crash", str(r)[:400]
            if r.kind == "trace":
                if self._fails_without_kiln("aot_eager"):
                    return "not captured", str(r)[:400]
                return "crash", str(r)[:400]
        return None

    def _fails_without_kiln(self, backend: str) -> bool:
        """Whether the same calls, compiled by another backend, fail too (raise, or have the
        backend's error turned into a graph break on the last call)."""
        torch._dynamo.reset()
        try:
            compiled = self.compiled(backend)
            for call in self.replay():
                call = call.clone()
                torch._dynamo.utils.counters.clear()
                compiled(*call.args, **call.kwargs)
            return any(b.startswith(_BACKEND_FAILED) for b in _counted("unimplemented"))
        except Exception:  # noqa: BLE001
            return True
        finally:
            torch._dynamo.reset()
            self.restart()

    def restart(self) -> None:
        """Forget compiled state after a replay."""


class _PerOp(_Runner):
    """One compiled function per op, every sample's arguments passed through it."""

    def __init__(self, fn: Callable):
        super().__init__(fn)
        torch._dynamo.reset()
        self._compiled: dict[Any, Callable] = {}

    def call_of(self, sample) -> _Call:
        return _Call(self.fn, (sample.input, *sample.args), dict(sample.kwargs))

    def compiled(self, backend):
        if backend not in self._compiled:
            fn = self.fn

            def op_call(*args, **kwargs):
                return fn(*args, **kwargs)

            self._compiled[backend] = torch.compile(op_call, backend=backend)
        return self._compiled[backend]

    def replay(self):
        return self.history

    def restart(self) -> None:
        # Dynamo's reset dropped kiln's graphs too: the next sample compiles afresh
        self._compiled.clear()


class _PerSample(_Runner):
    """A fresh compile per sample, with the sample's non-tensor arguments as constants."""

    options: ClassVar[dict] = {"dynamic": False}

    def call_of(self, sample) -> _Call:
        call, tensors = wrap(self.fn, sample)
        return _Call(call, tuple(tensors), {})

    def compiled(self, backend):
        torch._dynamo.reset()
        return torch.compile(self.history[-1].fn, backend=backend, dynamic=False)

    def replay(self):
        return self.history[-1:]


_MODES: dict[str, type[_Runner]] = {"per-op": _PerOp, "per-sample": _PerSample}


def runner(fn: Callable, mode: str = "per-op") -> _Runner:
    """What runs an op's samples, one after another, compiled and eager (`.run(sample, ...)`)."""
    return _MODES[mode](fn)


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


_BACKEND_FAILED = "Backend compiler exception"


def _counted(kind: str) -> list[str]:
    """The messages Dynamo counted under kind (graph breaks and their causes) since the last clear."""
    return list(torch._dynamo.utils.counters[kind])


def _first_line(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " ".join(lines[:3])[:300]


def _short(e: Exception) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text[:400]
