"""Compiling models wrapped for data parallelism.

Dynamo cannot trace DistributedDataParallel.forward nor FSDP2's hooks (it breaks the graph at
functions PyTorch marks as skipped, for every backend), so kiln compiles inside the wrappers:
the DDP module's inner model, and each fully_shard unit's own forward. The wrappers' hooks
stay outside the compiled code and run as in eager: DDP reduces gradients bucket by bucket,
and while a DDP module runs Dynamo splits the inner graph at bucket boundaries (its
DDPOptimizer) so that each bucket's all-reduce starts while the backward goes on. FSDP2
gathers a unit's parameters before its compiled forward and reduce-scatters its gradients
after its backward.
"""

from __future__ import annotations

import logging
import sys
from typing import Callable

import torch

log = logging.getLogger("kiln")


def _ddp_class():
    module = sys.modules.get("torch.nn.parallel.distributed")  # never imported just to check
    return getattr(module, "DistributedDataParallel", None)


def _fsdp_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The fully_shard units that contain no other unit: each is compiled on its own."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    unit_class = getattr(fsdp, "FSDPModule", None)
    if unit_class is None:
        return []
    units = [m for m in model.modules() if isinstance(m, unit_class)]
    return [u for u in units if not any(o is not u and isinstance(o, unit_class) for o in u.modules())]


def compile_wrapped(model, compile_module: Callable[[torch.nn.Module], None]) -> torch.nn.Module | None:
    """Compile a DDP- or FSDP2-wrapped model in place with compile_module (which compiles one
    module's forward in place) and return it; None when model is not wrapped so."""
    ddp = _ddp_class()
    if ddp is not None and isinstance(model, ddp):
        compile_module(model.module)
        log.info("kiln: compiling the model inside DistributedDataParallel; gradients are reduced "
                 "by DDP's hooks, bucket by bucket")
        return model
    if not isinstance(model, torch.nn.Module):
        return None
    units = _fsdp_units(model)
    if not units:
        return None
    for unit in units:
        compile_module(unit)
    outside = [u for u in units if u is model]
    log.warning("kiln: compiling each of the %d fully_shard units of %s on its own%s", len(units),
                type(model).__name__,
                "" if outside else "; code outside them (the root's own layers) runs in eager")
    return model
