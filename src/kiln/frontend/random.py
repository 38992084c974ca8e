"""Random numbers inside kernels: ATen's random ops rewritten, while AOTAutograd traces, into
a seed drawn from torch's generator and Philox numbers that are a pure function of that seed
and each element's index (docs/random.md).

Two ops carry them through the FX graphs:
- kiln::seed(device, stream): one int64 drawn from torch's generator for `device` (the ATen
  call torch.randint, so torch.manual_seed makes runs repeatable). `stream` numbers the random
  ops of one trace: no two calls are alike, so no CSE merges two ops' seeds.
- kiln::philox(seed, offset, size, kind): the float32 tensor of Philox numbers (uniform or
  normal) at offsets offset + linear index. Pure: the partitioner recomputes it (and a dropout
  mask compared from it) in the backward from the saved seed instead of saving the mask.
"""

from __future__ import annotations

import itertools
from typing import Callable

import torch
import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from kiln.ir import philox as reference

aten = torch.ops.aten
UNIFORM, NORMAL = 0, 1
# seeds are drawn below 2**62: non-negative in int64 on every backend
SEED_BOUND = 2**62

_lib = torch.library.Library("kiln", "FRAGMENT")
_lib.define("seed(Device device, int stream) -> Tensor", tags=(torch.Tag.nondeterministic_seeded,))
_lib.define("seeds(Device device, int count) -> Tensor", tags=(torch.Tag.nondeterministic_seeded,))
_lib.define("philox(Tensor seed, SymInt offset, SymInt[] size, int kind) -> Tensor")


def _seed(device: torch.device, stream: int) -> torch.Tensor:
    return torch.randint(0, SEED_BOUND, (), dtype=torch.int64, device=device)


def _seeds(device: torch.device, count: int) -> torch.Tensor:
    return torch.randint(0, SEED_BOUND, (count,), dtype=torch.int64, device=device)


def _philox(seed: torch.Tensor, offset: int, size: list[int], kind: int) -> torch.Tensor:
    """The reference numbers, for a graph that runs in ATen instead of kiln's kernels."""
    n = 1
    for s in size:
        n *= s
    offsets = offset + torch.arange(n, dtype=torch.int64, device=seed.device)
    fn = reference.normal if kind == NORMAL else reference.uniform
    return fn(seed, offsets).reshape(size)


_lib.impl("seed", _seed, "CompositeExplicitAutograd")
_lib.impl("seeds", _seeds, "CompositeExplicitAutograd")
_lib.impl("philox", _philox, "CompositeExplicitAutograd")


@torch.library.register_fake("kiln::seed")
def _seed_fake(device, stream):
    return torch.empty((), dtype=torch.int64, device=device)


@torch.library.register_fake("kiln::seeds")
def _seeds_fake(device, count):
    return torch.empty((count,), dtype=torch.int64, device=device)


@torch.library.register_fake("kiln::philox")
def _philox_fake(seed, offset, size, kind):
    return seed.new_empty(size, dtype=torch.float32)


SEED_OP = torch.ops.kiln.seed.default
SEEDS_OP = torch.ops.kiln.seeds.default
PHILOX_OP = torch.ops.kiln.philox.default


# ----------------------------------------------------------------------------- decompositions
def random_decompositions() -> dict:
    """Decompositions of ATen's random ops into kiln::seed and kiln::philox, fresh for each
    trace (their stream numbers count from 0, so a graph's text does not depend on history)."""
    streams = itertools.count()

    def numbers(shape, device, kind: int, dtype) -> torch.Tensor:
        seed = SEED_OP(torch.device(device or "cpu"), next(streams))
        out = PHILOX_OP(seed, 0, list(shape), kind)
        return out if dtype is None or dtype == torch.float32 else out.to(dtype)

    def like(kind: int) -> Callable:
        def fn(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
            if memory_format not in (None, torch.preserve_format, torch.contiguous_format) or \
                    layout not in (None, torch.strided):
                return NotImplemented
            if memory_format is torch.preserve_format and not x.is_contiguous():
                return NotImplemented  # eager returns x's strides: left to ATen
            if not _float32_enough(dtype or x.dtype):
                return NotImplemented
            return numbers(x.shape, device or x.device, kind, dtype or x.dtype)
        return fn

    def fresh(kind: int) -> Callable:
        def fn(size, *, dtype=None, layout=None, device=None, pin_memory=None):
            dtype = dtype or torch.get_default_dtype()
            if layout not in (None, torch.strided) or not _float32_enough(dtype):
                return NotImplemented
            return numbers(size, device, kind, dtype)
        return fn

    def native_dropout(x, p, train):
        """As eager: train with 0 < p < 1 keeps an element where a uniform number exceeds p
        and scales it by 1/(1-p); p == 1 zeros all; otherwise the input and a mask of ones."""
        if train is False or p == 0 or x.numel() == 0:
            return x.clone(), torch.ones_like(x, dtype=torch.bool)
        if p == 1:
            return torch.zeros_like(x), torch.zeros_like(x, dtype=torch.bool)
        if not x.dtype.is_floating_point:
            return NotImplemented
        keep = numbers(x.shape, x.device, UNIFORM, None) > p
        return keep * x * float(1.0 / (1.0 - p)), keep

    def bernoulli(x, *, generator=None):
        if generator is not None or not x.dtype.is_floating_point:
            return NotImplemented
        return (numbers(x.shape, x.device, UNIFORM, None) < x).to(x.dtype)

    def bernoulli_p(x, p=0.5, *, generator=None):
        if generator is not None:
            return NotImplemented
        return (numbers(x.shape, x.device, UNIFORM, None) < p).to(x.dtype)

    def bernoulli_tensor(x, p, *, generator=None):
        if generator is not None:
            return NotImplemented
        return (numbers(x.shape, x.device, UNIFORM, None) < p).to(x.dtype)

    return {
        aten.native_dropout.default: native_dropout,
        aten.rand_like.default: like(UNIFORM),
        aten.randn_like.default: like(NORMAL),
        aten.rand.default: fresh(UNIFORM),
        aten.randn.default: fresh(NORMAL),
        aten.bernoulli.default: bernoulli,
        aten.bernoulli.p: bernoulli_p,
        aten.bernoulli.Tensor: bernoulli_tensor,
    }


def _float32_enough(dtype: torch.dtype) -> bool:
    """Philox numbers are float32: float64 ones (53 random bits in eager) stay in ATen."""
    return dtype in (torch.float32, torch.bfloat16, torch.float16)


# ----------------------------------------------------------------------------- partitioning
def recompute_random_numbers(joint: fx.GraphModule) -> None:
    """Mark Philox numbers for recomputation: the backward regenerates them (and the masks
    compared from them) from the saved seed, a 0-d tensor, instead of loading saved masks."""
    for n in joint.graph.nodes:
        if n.op == "call_function" and n.target is PHILOX_OP:
            n.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE


# ----------------------------------------------------------------------------- one draw per call
def draw_seeds_once(gm: fx.GraphModule) -> None:
    """A forward graph's seeds drawn by one ATen call per device (kiln::seeds, one int64 per
    random op) instead of one call per op: the k-th op's seed is element k of the draw."""
    groups: dict[str, list[fx.Node]] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is SEED_OP:
            groups.setdefault(str(n.args[0]), []).append(n)
    for nodes in groups.values():
        if len(nodes) < 2:
            continue
        first = nodes[0]
        with gm.graph.inserting_before(first):
            draws = gm.graph.call_function(SEEDS_OP, (first.args[0], len(nodes)))
        val = first.meta.get("val")
        mode = getattr(val, "fake_mode", None)
        if mode is not None:
            with mode:
                draws.meta["val"] = torch.empty((len(nodes),), dtype=torch.int64, device=val.device)
        for k, n in enumerate(nodes):
            with gm.graph.inserting_before(n):
                pick = gm.graph.call_function(aten.select.int, (draws, 0, k))
            pick.meta = dict(n.meta)
            n.replace_all_uses_with(pick)
            gm.graph.erase_node(n)
    if any(len(nodes) > 1 for nodes in groups.values()):
        gm.recompile()
