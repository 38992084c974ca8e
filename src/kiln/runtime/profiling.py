"""Kernel launches as named ranges in torch.profiler: while a profiler runs, a host program
runs its profiled variant, whose launchers open a record_function range named after the
kernel (`kiln_layernorm_gelu_3`). Otherwise the cost per call is one flag read: the module
attribute torch's profilers set on start and clear on stop."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
from torch.autograd import profiler as autograd_profiler

# The generated code reads `autograd_profiler._is_profiler_enabled`; a torch without that
# flag gets it as a constant False (no ranges, no cost).
if not hasattr(autograd_profiler, "_is_profiler_enabled"):
    autograd_profiler._is_profiler_enabled = False


class RangedLauncher:
    """A launcher whose calls are record_function ranges of the kernel's name."""

    def __init__(self, name: str, launcher: Callable):
        self.name, self.launcher = name, launcher
        aligned = getattr(launcher, "aligned", None)
        if aligned is not None:
            self.aligned = lambda *args: self._ranged(aligned, args)

    def __call__(self, *args: Any) -> Any:
        return self._ranged(self.launcher, args)

    def _ranged(self, fn: Callable, args: tuple) -> Any:
        with torch.autograd.profiler.record_function(self.name):
            return fn(*args)


def ranged(launchers: Mapping[str, Callable]) -> dict[str, Callable]:
    return {name: RangedLauncher(name, fn) for name, fn in launchers.items()}


class LazyProfiled:
    """The profiled variant of a program, built at its first call under a profiler."""

    def __init__(self, build: Callable[[], Callable]):
        self.build, self.call = build, None

    def __call__(self, args: list) -> Any:
        if self.call is None:
            self.call = self.build()
        return self.call(args)
