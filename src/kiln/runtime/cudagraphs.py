"""mode="reduce-overhead": replay a compiled graph as one CUDA graph.

The host program is recorded once, after a warm-up run, and then replayed with a single
launch. Inputs are copied into the recorded buffers before each replay, except static ones
(parameters and buffers, whose memory does not move between calls) and a recorded buffer a
caller filled itself; outputs are copied out
after it, so a later replay never overwrites what a caller holds.

A recording may be made at sizes larger than the call's (runtime/buckets.py): its inputs are
then buffers of the recorded sizes, each call's inputs are copied into their leading part,
and the caller cuts the outputs back.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def padded_buffer(a: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A zero-filled buffer of `shape` whose dimensions lie in memory in a's order, with a in
    its leading part."""
    order = sorted(range(a.dim()), key=lambda d: -a.stride(d))
    buffer = torch.zeros([shape[d] for d in order], dtype=a.dtype, device=a.device).permute(
        [order.index(d) for d in range(a.dim())])
    buffer[tuple(slice(0, n) for n in a.shape)].copy_(a)
    return buffer


class CudaGraphRunner:
    """One recording of a boxed program. `shapes` (per input, or None) are the sizes to record
    at where they differ from the first call's: tensor shapes, or an int input's value."""

    def __init__(self, call: Callable[[list], list], static_inputs: frozenset[int] = frozenset(),
                 pool: Any = None, shapes: list | None = None):
        self.call = call
        self.static = static_inputs
        self.pool, self.shapes = pool, shapes
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: list = []
        self.outputs: list = []
        self._boxed_call = True

    def _recorded_input(self, i: int, a: Any) -> Any:
        shape = self.shapes[i] if self.shapes is not None else None
        if not isinstance(a, torch.Tensor):
            return a if shape is None else shape
        if i in self.static:
            return a
        if shape is None or tuple(shape) == tuple(a.shape):
            return a.clone()
        return padded_buffer(a, shape)

    def _record(self, args: list) -> None:
        self.inputs = [self._recorded_input(i, a) for i, a in enumerate(args)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: lazy initialisation must not be recorded
            self.call(list(self.inputs))
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.pool):
            self.outputs = self.call(list(self.inputs))
        self.graph.replay()  # recording does not run the kernels

    def recorded_input(self, i: int) -> torch.Tensor | None:
        """The buffer input i is read from at replay; None before the recording. A caller may
        fill it itself and pass it as the input: it is then not copied."""
        return self.inputs[i] if self.graph is not None else None

    def replay(self, args: list) -> list:
        """The recorded outputs (overwritten by the next replay) for these inputs."""
        if self.graph is None:
            self._record(args)
            return self.outputs
        for i, (dst, src) in enumerate(zip(self.inputs, args)):
            if isinstance(dst, torch.Tensor) and i not in self.static and dst is not src:
                if dst.shape != src.shape:
                    dst = dst[tuple(slice(0, n) for n in src.shape)]
                dst.copy_(src)
        self.graph.replay()
        return self.outputs

    def __call__(self, args: list) -> list:
        outputs = self.replay(args)
        args.clear()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in outputs]


def static_input_indices() -> frozenset[int]:
    """Inputs AOTAutograd knows to be parameters or buffers of the compiled module."""
    try:
        ctx = torch._guards.TracingContext.try_get()
        meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
        return frozenset(getattr(meta, "static_input_indices", None) or ())
    except Exception:  # noqa: BLE001 - an optimisation only: copy every input instead
        return frozenset()
