"""mode="reduce-overhead" for a shape family's program: CUDA graphs by bucket.

A CUDA graph is recorded at fixed sizes, so a family's program gets one recording per size it
replays at. Where frontend/padding.py allows a size symbol to be padded and the graph is bound
by its launches (the host's cost of launching its kernels one by one exceeds their work on the
device, so doubling the work costs less than the launches a replay saves), each call runs at
the next power of two of each padded size: a few recordings serve every size (reductions along
a padded size read its real value from an input tensor, frontend/padding_masks.py). Otherwise each
distinct size gets its own recording. All recordings share one memory pool; past LIMIT of them,
further sizes run the program without a graph, said once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import sympy
import torch

from kiln.frontend.padding import PaddingPlan
from kiln.runtime.cudagraphs import CudaGraphRunner, padded_buffer

log = logging.getLogger("kiln")

LIMIT = 8  # recordings per program


def bucket(size: int, low: int, high: int | None) -> int:
    """The next power of two at or above size (and low); size itself past high."""
    b = 1 << (max(size, low, 1) - 1).bit_length()
    return size if high is not None and b > high else b


@dataclass
class Recording:
    sizes: dict[str, int]  # each size symbol's value it was recorded at
    pool_bytes: int  # what the shared pool grew by while it was recorded
    calls: int = 0


class _PaddedCall:
    """Without CUDA graphs (a CPU, tests): the program run on padded copies of each call's
    inputs."""

    def __init__(self, call: Callable[[list], list], shapes: list):
        self.call, self.shapes = call, shapes

    def replay(self, args: list) -> list:
        return self.call([a if s is None else padded_buffer(a, s) if isinstance(a, torch.Tensor) else s
                          for a, s in zip(args, self.shapes)])


class BucketedGraphs:
    """A family's boxed program, replayed by bucket (see the module's rule)."""

    _boxed_call = True

    def __init__(self, call: Callable[[list], list], plan: PaddingPlan,
                 ranges: dict[sympy.Symbol, tuple[int, int | None]], pad: bool,
                 static_inputs: frozenset[int] = frozenset(), graphs: bool = True):
        self.call, self.plan, self.ranges = call, plan, ranges
        self.padded = set(plan.padded) if pad else set()
        self.static = frozenset(i for i in static_inputs if not self._grows(i))
        self.graphs = graphs
        self.pool = torch.cuda.graph_pool_handle() if graphs else None
        self.replays: dict[tuple, Any] = {}
        self.recordings: dict[tuple, Recording] = {}
        self.unrecorded_calls = 0

    def _grows(self, i: int) -> bool:
        e = self.plan.inputs[i] if i < len(self.plan.inputs) else None
        exprs = e if isinstance(e, list) else [e] if e is not None else []
        return any(x.free_symbols & self.padded for x in exprs)

    def _values(self, args: list) -> dict[sympy.Symbol, int]:
        return {s: int(args[p]) if d is None else int(args[p].shape[d])
                for s, (p, d) in self.plan.bound.items()}

    def _shapes(self, args: list, at: dict) -> list:
        """Each input's size at the bucket's values (None: its own)."""
        shapes: list = []
        for a, e in zip(args, self.plan.inputs):
            if isinstance(a, torch.Tensor) and isinstance(e, list):
                shapes.append(tuple(at[x] if x in at else n for x, n in zip(e, a.shape)))
            elif isinstance(e, sympy.Expr) and e in at:
                shapes.append(at[e])
            else:
                shapes.append(None)
        return shapes

    def text(self) -> str:
        """The policy and its recordings, for explain."""
        if self.padded:
            padded = ", ".join(sorted(map(str, self.padded)))
            policy = f"sizes padded to the next power of two: {padded}"
            masked = [str(s) for s in self.plan.masked if s in self.padded]
            if masked:
                policy += f"; reductions along {', '.join(masked)} masked to the real size"
        elif self.plan.padded:
            policy = "a recording per size: the graph is not bound by its launches, padding would not pay"
        else:
            policy = "a recording per size"
        lines = [f"CUDA graphs by bucket ({policy}; at most {LIMIT}, one memory pool)"]
        lines += [f"  not padded: {s}: {why}" for s, why in self.plan.refused.items()]
        for r in self.recordings.values():
            sizes = ", ".join(f"{s}={v}" for s, v in r.sizes.items())
            lines.append(f"  recorded at {sizes}: pool +{r.pool_bytes / 2**20:.1f} MiB, {r.calls} calls")
        if self.unrecorded_calls:
            lines.append(f"  {self.unrecorded_calls} calls past the limit ran without a graph")
        return "\n".join(lines)

    def __call__(self, args: list) -> list:
        values = self._values(args)
        at = {s: bucket(v, *self.ranges.get(s, (1, None))) if s in self.padded else v
              for s, v in values.items()}
        shapes = self._shapes(args, at)
        given = args  # a boxed call clears the list it was given
        # a recording bakes in its non-tensor inputs and its sizes: both are part of its key
        key = tuple(s if s is not None else tuple(a.shape) if isinstance(a, torch.Tensor) else a
                    for a, s in zip(args, shapes))
        replay = self.replays.get(key)
        if self.plan.masked:  # the masked graph's last input: the real sizes, read at run time
            args = [*args, self._real_sizes([values[s] for s in self.plan.masked], replay)]
            shapes.append(None)
        if replay is None:
            if len(self.replays) >= LIMIT:
                if not self.unrecorded_calls:
                    log.warning("kiln: a graph met %d bucket sizes under reduce-overhead; further sizes run "
                                "without CUDA graphs", LIMIT)
                self.unrecorded_calls += 1
                outputs = self.call(args)
                given.clear()
                return outputs
            replay = self.replays[key] = self._new_replay(args, shapes, at)
        before = torch.cuda.memory_reserved() if self.graphs and key not in self.recordings else None
        outputs = replay.replay(args)
        if before is not None:
            self.recordings[key] = Recording({str(s): v for s, v in at.items()},
                                             torch.cuda.memory_reserved() - before)
        if key in self.recordings:
            self.recordings[key].calls += 1
        given.clear()
        dims = self.plan.outputs + [None] * len(outputs)
        return [self._cut(o, d, values, at) for o, d in zip(outputs, dims)]

    def _real_sizes(self, values: list[int], replay: Any) -> torch.Tensor:
        """The sizes as a tensor on the graph's device. A recorded graph's own buffer is filled in
        place, one small kernel per size taking it as an argument: no copy from the host, which
        would wait for the work queued before it or need page-locked memory per call."""
        buffer = replay.recorded_input(-1) if isinstance(replay, CudaGraphRunner) else None
        if buffer is None:
            return torch.tensor(values, dtype=torch.int64, device=self.plan.device)
        for i, v in enumerate(values):
            buffer[i].fill_(v)
        return buffer

    def _new_replay(self, args: list, shapes: list, at: dict) -> Any:
        if self.graphs:
            return CudaGraphRunner(self.call, self.static, self.pool, shapes)
        return _PaddedCall(self.call, shapes)

    def _cut(self, o: Any, dims: list | None, values: dict, at: dict) -> Any:
        """An output of the bucket's run cut back to the call's sizes, as a tensor of its own."""
        if not isinstance(o, torch.Tensor):
            return o
        grown = dims is not None and any(f in self.padded and at[f] != values[f] for d in dims for f in d)
        if not grown:
            return o.clone()
        if all(len(d) <= 1 for d in dims):
            return o[tuple(slice(0, values[d[0]]) if d and d[0] in self.padded else slice(None)
                           for d in dims)].clone()
        factors = [f for d in dims for f in d]  # a view's dimension of several factors
        sizes = [int(f) if f.is_Integer else at[f] for f in factors]
        cut = o.reshape(sizes)[tuple(slice(0, values[f]) if f in self.padded else slice(None)
                                     for f in factors)]
        return cut.clone().reshape([int(sympy.prod([values.get(f, f) for f in d])) for d in dims])


def symbol_ranges(shape_env: Any, symbols: Any) -> dict[sympy.Symbol, tuple[int, int | None]]:
    """Each symbol's least and greatest value as Dynamo's guards leave them (None: no bound)."""
    ranges = {}
    for s in symbols:
        r = shape_env.var_to_range.get(s)
        low, high = (getattr(r, "lower", 2), getattr(r, "upper", None))
        try:
            low = int(low)
        except (TypeError, ValueError, OverflowError):
            low = 2
        try:
            high = int(high) if high is not None and high.is_finite else None
        except (TypeError, ValueError, OverflowError, AttributeError):
            high = None
        ranges[s] = (max(low, 1), high)
    return ranges
