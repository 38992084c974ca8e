"""The @lowering registry: ATen overload -> function building level-1 nodes."""

from __future__ import annotations

from typing import Callable

import torch

LoweringFn = Callable[..., object]
LOWERINGS: dict[torch._ops.OpOverload, LoweringFn] = {}


def lowering(*targets) -> Callable[[LoweringFn], LoweringFn]:
    """Register fn for each target; an OpOverloadPacket registers all its overloads."""

    def register(fn: LoweringFn) -> LoweringFn:
        for t in targets:
            if isinstance(t, torch._ops.OpOverloadPacket):
                for name in t.overloads():
                    LOWERINGS[getattr(t, name)] = fn
            else:
                LOWERINGS[t] = fn
        return fn

    return register


def lookup(target) -> LoweringFn | None:
    _load_all()
    return LOWERINGS.get(target)


_loaded = False


def _load_all() -> None:
    global _loaded
    if not _loaded:
        from kiln.lower import indexing, pointwise, random, reductions, views  # noqa: F401  (register)

        _loaded = True
