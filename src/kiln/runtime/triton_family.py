"""Launching a Triton kernel of a shape family: its tensors, then its sizes (ks0, ...).

Per launch, from the sizes: the grid; whether indices need int64 (WIDE); and whether every
size is a multiple of 16, as Triton's JIT specializes int arguments. Those two choices pick
one of the kernel's binaries: (narrow, sizes of 16) and (narrow, any sizes) are compiled with
the graph, a wide one at the first launch that needs it (tensors of 2^31 elements and more).
The launch configuration (block sizes) is the traced example's and the same for every size:
the source is right for every size under it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kiln.codegen.triton_sizes import grid_function, wide_function
from kiln.ir.kernel import Kernel
from kiln.runtime.autotune import Config

VariantKey = tuple[bool, bool]  # (WIDE: int64 indices, every size a multiple of 16)
COMPILED_WITH_THE_GRAPH: tuple[VariantKey, ...] = ((False, True), (False, False))


def variant_key(wide: bool, sizes: tuple[int, ...]) -> VariantKey:
    """The binary a launch at these sizes runs (a wide one assumes nothing of its sizes)."""
    return wide, not wide and all(s % 16 == 0 for s in sizes)


class FamilyLauncher:
    """Launches a family's kernel with every size of the family. `aligned` is the entry the
    host program calls where its tensors are buffers it allocated; calling the launcher checks
    the tensors' alignment first (Triton's JIT launches unaligned ones, as TunedLauncher)."""

    def __init__(
        self,
        kernel: Kernel,
        config: Config,
        jit_fn,
        compile_variant: Callable[[VariantKey], Any],
        binaries: dict[VariantKey, Any],
        assumes_aligned: bool,
    ):
        self.__name__ = kernel.name
        self.config = config
        self.n_tensors = len(kernel.params)
        self.grid = grid_function(kernel, config)
        self.needs_wide = wide_function(kernel)
        self.jit_fn = jit_fn
        self.compile_variant = compile_variant
        self.assumes_aligned = assumes_aligned
        self.launches: dict[VariantKey, Callable] = {
            key: self._launcher(key, binary) for key, binary in binaries.items()
        }

    def _launcher(self, key: VariantKey, compiled) -> Callable:
        xblock, rblock, _ = self.config
        return _launcher(compiled, (xblock, rblock, self.assumes_aligned, key[0]))

    def aligned(self, *args) -> None:
        sizes = args[self.n_tensors :]
        g = self.grid(*sizes)
        if 0 in g:  # no programs: nothing to compute (CUDA refuses an empty grid)
            return
        key = variant_key(self.needs_wide(*sizes), sizes)
        launch = self.launches.get(key)
        if launch is None:
            launch = self.launches[key] = self._launcher(key, self.compile_variant(key))
        launch(g, args)

    def __call__(self, *args) -> None:
        tensors = args[: self.n_tensors]
        if not self.assumes_aligned or all(t.data_ptr() % 16 == 0 for t in tensors):
            self.aligned(*args)
            return
        sizes = args[self.n_tensors :]
        g = self.grid(*sizes)
        if 0 not in g:
            x, r, w = self.config
            wide = self.needs_wide(*sizes)
            self.jit_fn[g](*args, XBLOCK=x, RBLOCK=r, ALIGNED=False, WIDE=wide, num_warps=w)


def _launcher(compiled, constants: tuple) -> Callable:
    """A compiled binary's launch through its own C launcher (which takes int arguments):
    the kernel's arguments, then its constexprs in the signature's order (XBLOCK, RBLOCK,
    ALIGNED, WIDE), as the binary was compiled with them."""
    compiled._init_handles()
    device = torch.cuda.current_device()
    current_stream = torch._C._cuda_getCurrentRawStream
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata

    def launch(grid, args):
        run(
            grid[0],
            grid[1],
            grid[2],
            current_stream(device),
            function,
            metadata,
            None,
            None,
            None,
            *args,
            *constants,
        )

    return launch


def interpreted_launcher(kernel: Kernel, jit_fn, config: Config) -> Callable:
    """The same launch through Triton's interpreter: the grid and WIDE per call."""
    grid, needs_wide = grid_function(kernel, config), wide_function(kernel)
    n_tensors = len(kernel.params)
    xblock, rblock, warps = config

    def launch(*args):
        sizes = args[n_tensors:]
        g = grid(*sizes)
        if 0 not in g:
            jit_fn[g](
                *args, XBLOCK=xblock, RBLOCK=rblock, ALIGNED=False, WIDE=needs_wide(*sizes), num_warps=warps
            )

    launch.__name__ = kernel.name
    launch.aligned = launch  # the interpreter needs no alignment
    return launch
