"""mode="reduce-overhead": replay a compiled graph as one CUDA graph.

The host program is recorded once, after a warm-up run, and then replayed with a single
launch. Inputs are copied into the recorded buffers before each replay, except static ones
(parameters and buffers, whose memory does not move between calls); outputs are copied out
after it, so a later replay never overwrites what a caller holds.
"""

from __future__ import annotations

from typing import Callable

import torch


class CudaGraphRunner:
    def __init__(self, call: Callable[[list], list], static_inputs: frozenset[int] = frozenset()):
        self.call = call
        self.static = static_inputs
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: list = []
        self.outputs: list = []
        self._boxed_call = True

    def _record(self, args: list) -> None:
        self.inputs = [a if (i in self.static or not isinstance(a, torch.Tensor)) else a.clone()
                       for i, a in enumerate(args)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: lazy initialisation must not be recorded
            self.call(list(self.inputs))
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = self.call(list(self.inputs))
        self.graph.replay()  # recording does not run the kernels

    def __call__(self, args: list) -> list:
        if self.graph is None:
            self._record(args)
        else:
            for i, (dst, src) in enumerate(zip(self.inputs, args)):
                if isinstance(dst, torch.Tensor) and i not in self.static:
                    dst.copy_(src)
            self.graph.replay()
        args.clear()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in self.outputs]


def static_input_indices() -> frozenset[int]:
    """Inputs AOTAutograd knows to be parameters or buffers of the compiled module."""
    try:
        ctx = torch._guards.TracingContext.try_get()
        meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
        return frozenset(getattr(meta, "static_input_indices", None) or ())
    except Exception:  # noqa: BLE001 - an optimisation only: copy every input instead
        return frozenset()
