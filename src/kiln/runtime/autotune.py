"""Launch configurations timed on the GPU, once per kernel and shape, ever.

Every candidate is compiled up front (in parallel, with the kernel's other builds); the
first launch with real tensors times each one with CUDA events and keeps the fastest.
The choice is written next to the kernel's source, so later processes skip the timing.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch

from kiln import logs
from kiln.runtime.cache import write_atomic

Config = tuple[int, ...]  # XBLOCK, RBLOCK, num_warps; a matmul template's tiles, warps, stages


# Triton builds a C launcher per kernel signature: a C compiler run when its cache is cold.
# kiln's kernels take nothing but pointers, and the GPU reads only as many parameters
# as a kernel declares, so one launcher built for up to 8, 16, 32... pointers serves every
# kernel with as many or fewer, given None (a null pointer) for the rest: the null scratch
# pointers a kernel without scratch memory would get anyway.
_SHARED_LAUNCHERS: dict[tuple, object] = {}


def _shared_launcher(n_pointers: int, metadata) -> tuple[object, int] | None:
    """The launcher for kernels of up to n_pointers pointers (rounded up) and its width, or
    None when the kernel needs what only its own launcher passes (scratch memory)."""
    if (
        metadata.global_scratch_size
        or metadata.profile_scratch_size
        or getattr(metadata, "tensordesc_meta", None)
    ):
        return None
    width = max(8, 1 << (n_pointers - 1).bit_length())
    key = (width, metadata.num_ctas, metadata.launch_cooperative_grid, metadata.launch_pdl)
    if key not in _SHARED_LAUNCHERS:
        from triton.runtime.driver import driver

        signature = SimpleNamespace(constants={}, signature={i: "*i8" for i in range(width)})
        _SHARED_LAUNCHERS[key] = driver.active.launcher_cls(signature, metadata)
    return _SHARED_LAUNCHERS[key], width


def _load_function(compiled):
    """The compiled kernel loaded on the current GPU (Triton's own loading would also build
    the kernel's launcher)."""
    from triton.runtime.driver import driver

    device = driver.active.get_current_device()
    meta = compiled.metadata
    if meta.shared > driver.active.utils.get_device_properties(device)["max_shared_mem"]:
        raise RuntimeError(
            f"kiln: {compiled.name} needs {meta.shared} bytes of shared memory, more than the GPU has"
        )
    _, function, _, _, max_threads = driver.active.utils.load_binary(
        compiled.name, compiled.kernel, meta.shared, device
    )
    if meta.num_warps * 32 > max_threads:
        raise RuntimeError(
            f"kiln: {compiled.name} needs {meta.num_warps * 32} threads, more than it can have"
        )
    return function


def _direct_launch(compiled, grid: tuple[int, int, int], config: Config, n_pointers: int,
                   constants: tuple = ()) -> Callable:
    """Call the C launch function with everything fixed ahead: per launch, only the current
    stream is looked up (a fraction of Triton's generic launch path)."""
    device = torch.cuda.current_device()
    current_stream = torch._C._cuda_getCurrentRawStream
    g0, g1, g2 = grid
    shared = _shared_launcher(n_pointers, compiled.metadata)
    if shared is None:
        compiled._init_handles()
        run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
        constants = constants or config[:2]  # XBLOCK, RBLOCK

        def launch(*args):
            run(
                g0,
                g1,
                g2,
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
    launcher, width = shared
    c_launch, function, metadata = launcher.launch, _load_function(compiled), compiled.packed_metadata
    cooperative, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
    padding = (None,) * (width - n_pointers)

    def launch(*args):
        c_launch(
            g0,
            g1,
            g2,
            current_stream(device),
            function,
            cooperative,
            pdl,
            None,
            None,
            metadata,
            None,
            None,
            None,
            *args,
            *padding,
        )

    return launch


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

    def _launch(self, config: Config) -> Callable:
        if isinstance(config[0], str):  # a launcher of its own (runtime/matmul_candidates.py)
            return self.variants[config]
        constants = tuple(self.constexprs(config).values()) if self.constexprs else ()
        return _direct_launch(self.variants[config], self.grid(config), config, self.n_pointers, constants)

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

    def _tune_and_launch(self, *tensors) -> None:
        self._tune(tensors)
        self.aligned(*tensors)

    def __call__(self, *tensors) -> None:
        chosen_launcher = self.choice is not None and isinstance(self.choice[0], str)
        if chosen_launcher or not self.assumes_aligned or all(t.data_ptr() % 16 == 0 for t in tensors):
            self.aligned(*tensors)
        else:
            config = self.choice or next(iter(self.variants))
            self.jit_fn[self.grid(config)](*tensors, **self.jit_kwargs(config))
