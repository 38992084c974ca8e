"""Launch configurations timed on the GPU, once per kernel and shape, ever.

Every candidate is compiled up front (in parallel, with the kernel's other builds); the
first launch with real tensors times each one with CUDA events and keeps the fastest.
The choice is written next to the kernel's source, so later processes skip the timing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from kiln.runtime.cache import atomic_write

Config = tuple[int, int, int]  # XBLOCK, RBLOCK, num_warps


def _direct_launch(compiled, grid: tuple[int, int, int]) -> Callable:
    """Call the compiled binary's launcher with everything fixed ahead: per launch, only the
    current stream is looked up (a fraction of Triton's generic launch path)."""
    compiled._init_handles()
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    device = torch.cuda.current_device()
    current_stream = torch._C._cuda_getCurrentRawStream
    g0, g1, g2 = grid

    def launch(*args):
        run(g0, g1, g2, current_stream(device), function, metadata, None, None, None, *args)

    return launch


class TunedLauncher:
    def __init__(self, name: str, grid: Callable[[Config], tuple[int, int, int]], jit_fn,
                 variants: dict[Config, object], record: Path):
        self.__name__ = name
        self.grid = grid
        self.jit_fn = jit_fn
        self.variants = variants
        self.record = record
        self.choice: Config | None = None
        self.fast: Callable | None = None
        if len(variants) == 1:
            self._choose(next(iter(variants)))
        elif record.exists():
            saved = tuple(json.loads(record.read_text())["config"])
            if saved in variants:
                self._choose(saved)

    def _choose(self, config: Config) -> None:
        self.choice = config
        self.fast = _direct_launch(self.variants[config], self.grid(config))

    def _tune(self, tensors) -> None:
        timings = {}
        for config, compiled in self.variants.items():
            run = compiled[self.grid(config)]
            for _ in range(2):
                run(*tensors, config[0], config[1])
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                run(*tensors, config[0], config[1])
            end.record()
            end.synchronize()
            timings[config] = start.elapsed_time(end)
        best = min(timings, key=timings.get)
        atomic_write(self.record, json.dumps({"config": list(best), "ms": {str(c): t / 5 for c, t in timings.items()}}))
        self._choose(best)

    def __call__(self, *tensors) -> None:
        if all(t.data_ptr() % 16 == 0 for t in tensors):  # what the binaries were specialized for
            if self.fast is None:
                self._tune(tensors)
            self.fast(*tensors, self.choice[0], self.choice[1])
        else:
            x, r, w = self.choice or next(iter(self.variants))
            self.jit_fn[self.grid((x, r, w))](*tensors, XBLOCK=x, RBLOCK=r, num_warps=w)
