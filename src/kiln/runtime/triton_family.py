"""Launching a Triton kernel of a shape family: its tensors, then its sizes (ks0, ...).

Per launch, from the sizes: the launch configuration (codegen/triton_sizes.launch_variants:
the traced example's, or for long rows of symbolic length a wider block), the grid, whether
indices need int64 (WIDE), and whether every size is a multiple of the kernel's vector
(size_vector: 16 bytes of its narrowest tensor), as Triton's JIT specializes int arguments that
are multiples of 16 (only where that can change the binary: divisibility_matters).
Those pick one of the kernel's binaries: the traced configuration's narrow ones are compiled
with the graph, any other at the first launch that needs it (a wide one: tensors of 2^31
elements and more). Every binary is right for every size it is launched at; the choice is
one of speed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln.codegen.triton_sizes import (
    divisibility_matters,
    grid_function,
    launch_variants,
    size_vector,
    wide_function,
)
from kiln.ir.kernel import Kernel
from kiln.runtime import triton_abi
from kiln.runtime.triton_build import jit_kwargs

CHOICES_KEPT = 256  # launch choices a family launcher remembers by sizes

# (launch configuration's index, WIDE: int64 indices, every size a multiple of the vector)
VariantKey = tuple[int, bool, bool]


def compiled_with_the_graph(kernel: Kernel) -> tuple[VariantKey, ...]:
    """The binaries compiled with the graph: the traced configuration's narrow ones."""
    return ((0, False, True), (0, False, False)) if divisibility_matters(kernel) else ((0, False, False),)


def variant_key(config: int, wide: bool, sizes: tuple[int, ...], vector: int = 16) -> VariantKey:
    """The binary a launch at these sizes runs, for a kernel whose vector binary assumes sizes
    of `vector` (0: none, where the sizes' divisibility changes nothing); a wide one assumes
    nothing of its sizes."""
    return config, wide, bool(vector) and not wide and all(s % vector == 0 for s in sizes)


class FamilyLauncher:
    """Launches a family's kernel with every size of the family. `aligned` is the entry the
    host program calls where its tensors are buffers it allocated; calling the launcher checks
    the tensors' alignment first (Triton's JIT launches unaligned ones, as TunedLauncher)."""

    def __init__(
        self,
        kernel: Kernel,
        jit_fn,
        compile_variant: Callable[[VariantKey, tuple], Any],
        binaries: dict[VariantKey, Any],
        assumes_aligned: bool,
    ):
        self.__name__ = kernel.name
        self.n_tensors = len(kernel.params)
        self.configs, self.choose = launch_variants(kernel, False)
        self.jit_kwargs = [jit_kwargs(kernel, c) for c in self.configs]
        self.grids = [grid_function(kernel, c) for c in self.configs]
        self.needs_wide = wide_function(kernel)
        self.vector = size_vector(kernel) if divisibility_matters(kernel) else 0
        self.jit_fn = jit_fn
        self.compile_variant = compile_variant
        self.assumes_aligned = assumes_aligned
        self.chosen: dict[tuple, tuple[tuple, Callable | None]] = {}
        self.launches: dict[VariantKey, Callable] = {
            key: self._launcher(key, binary) for key, binary in binaries.items()
        }

    def _launcher(self, key: VariantKey, compiled) -> Callable:
        xblock, rblock, _, *one_tile = self.configs[key[0]]
        return triton_abi.own_launch(compiled, (xblock, rblock, self.assumes_aligned, *one_tile, key[1]))

    def _chosen(self, sizes: tuple) -> tuple[tuple, Callable | None]:
        """The grid and launcher for these sizes (None: no programs, nothing to compute; CUDA
        refuses an empty grid)."""
        config = self.choose(*sizes)
        g = self.grids[config](*sizes)
        if 0 in g:
            return g, None
        key = variant_key(config, self.needs_wide(*sizes), sizes, self.vector)
        launch = self.launches.get(key)
        if launch is None:
            launch = self.launches[key] = self._launcher(key, self.compile_variant(key, self.configs[key[0]]))
        return g, launch

    def aligned(self, *args) -> None:
        # a decode loop launches at the same sizes every step: the choice is remembered per
        # sizes, a few hundred of them at most
        sizes = args[self.n_tensors :]
        chosen = self.chosen.get(sizes)
        if chosen is None:
            if len(self.chosen) >= CHOICES_KEPT:
                self.chosen.clear()
            chosen = self.chosen[sizes] = self._chosen(sizes)
        g, launch = chosen
        if launch is not None:
            launch(g, args)

    def __call__(self, *args) -> None:
        tensors = args[: self.n_tensors]
        if not self.assumes_aligned or all(t.data_ptr() % 16 == 0 for t in tensors):
            self.aligned(*args)
            return
        sizes = args[self.n_tensors :]
        config = self.choose(*sizes)
        g = self.grids[config](*sizes)
        if 0 not in g:
            self.jit_fn[g](*args, **self.jit_kwargs[config], WIDE=self.needs_wide(*sizes))


def interpreted_launcher(kernel: Kernel, jit_fn) -> Callable:
    """The same launch through Triton's interpreter: configuration, grid and WIDE per call."""
    configs, choose = launch_variants(kernel, True)
    kwargs = [jit_kwargs(kernel, c) for c in configs]
    grids = [grid_function(kernel, c) for c in configs]
    needs_wide = wide_function(kernel)
    n_tensors = len(kernel.params)

    def launch(*args):
        sizes = args[n_tensors:]
        config = choose(*sizes)
        g = grids[config](*sizes)
        if 0 not in g:
            jit_fn[g](*args, **kwargs[config], WIDE=needs_wide(*sizes))

    launch.__name__ = kernel.name
    launch.aligned = launch  # the interpreter needs no alignment
    return launch
