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

from kiln import logs
from kiln.runtime import triton_abi
from kiln.runtime.cache import write_atomic

Config = tuple[int, ...]  # XBLOCK, RBLOCK, num_warps; a matmul template's tiles, warps, stages


def _own_launcher(config: Config) -> bool:
    """A configuration named by a string is a launcher of its own (runtime/matmul_candidates.py:
    cuBLAS and an epilogue kernel), not a compiled binary."""
    return isinstance(config[0], str)


def saved_choice(record: Path) -> Config | None:
    """The configuration a record holds; a missing or unreadable record means timing again."""
    try:
        return tuple(json.loads(record.read_text())["config"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class TunedLauncher:
    """Calling it checks that every tensor is 16-byte aligned, where the binaries assume it,
    and falls back to Triton's JIT when one is not; the host program calls `aligned` directly
    where every tensor is a buffer it allocated."""

    def __init__(
        self,
        name: str,
        grid: Callable[[Config], tuple[int, int, int]],
        jit_fn,
        variants: dict[Config, object],
        record: Path,
        n_pointers: int,
        assumes_aligned: bool = True,
        jit_kwargs: Callable[[Config], dict] | None = None,
        constexprs: Callable[[Config], dict] | None = None,
    ):
        self.__name__ = name
        self.assumes_aligned = assumes_aligned
        self.n_pointers = n_pointers
        self.grid = grid
        self.jit_fn = jit_fn
        self.variants = variants
        self.record = record
        # what Triton's JIT takes for a configuration, and the constexprs' values in order
        self.jit_kwargs = jit_kwargs or (
            lambda c: dict(XBLOCK=c[0], RBLOCK=c[1], ALIGNED=False, num_warps=c[2])
        )
        self.constexprs = constexprs
        self.choice: Config | None = None
        self.aligned: Callable = self._tune_and_launch
        if len(variants) == 1:
            self._choose(next(iter(variants)))
        elif (saved := saved_choice(record)) in variants:
            self._choose(saved)

    def _choose(self, config: Config) -> None:
        self.choice = config
        self.aligned = self._launch(config)
        if _own_launcher(config):  # it takes tensors at any address: no check per call
            self.assumes_aligned = False

    def _launch(self, config: Config) -> Callable:
        if _own_launcher(config):
            return self.variants[config]
        constants = tuple(self.constexprs(config).values()) if self.constexprs else ()
        return triton_abi.direct_launch(self.variants[config], self.grid(config), config, self.n_pointers,
                                        constants)

    def _tune(self, tensors) -> None:
        timings, launches = {}, {}
        for config in self.variants:
            run = launches[config] = self._launch(config)
            for _ in range(2):
                run(*tensors)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                run(*tensors)
            end.record()
            end.synchronize()
            timings[config] = start.elapsed_time(end)
        best = min(timings, key=timings.get)
        logs.autotune.info("%s: chose %s of %s", self.record.stem, best,
                           ", ".join(f"{c}: {t / 5 * 1e3:.1f} us" for c, t in timings.items()))
        write_atomic(
            self.record, json.dumps({"config": list(best), "ms": {str(c): t / 5 for c, t in timings.items()}})
        )
        self.choice, self.aligned = best, launches[best]  # the timed launch: its binary is loaded
        if _own_launcher(best):
            self.assumes_aligned = False

    def _tune_and_launch(self, *tensors) -> None:
        self._tune(tensors)
        self.aligned(*tensors)

    def _launch_unaligned(self, tensors) -> None:
        config = self.choice or next(iter(self.variants))
        self.jit_fn[self.grid(config)](*tensors, **self.jit_kwargs(config))

    def __call__(self, *tensors) -> None:
        if not self.assumes_aligned or all(t.data_ptr() % 16 == 0 for t in tensors):
            self.aligned(*tensors)
        else:
            self._launch_unaligned(tensors)

    def binaries(self) -> list | str:
        """Each configuration's binary (triton_abi.KernelBinary), or why one cannot be stored."""
        from kiln.runtime import triton_build

        return triton_build.binaries_of(self.variants, self.grid, self.__name__)
