"""Helpers the generated host program calls (codegen/host.py): layout fix-ups, copies, the
per-thread arena, error reports and input checks."""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Sequence

import torch

from kiln import errors
from kiln.ir.checks import SLOTS_PER_CHECK, Check
from kiln.ir.host import InputSpec, Slot, arena_bytes, extent


def _as_strided_from(t: torch.Tensor, shape, stride, offset: int = 0) -> torch.Tensor:
    return torch.as_strided(t, shape, stride, t.storage_offset() + offset)


try:
    # view(t, shape, stride, offset): an alias of t's memory at t's offset + offset, made
    # without the dispatcher (a launch-bound program makes a view per operand of each call)
    from torch._C._dynamo.guards import _reinterpret_tensor as view
except ImportError:  # an older PyTorch without it
    view = _as_strided_from


# ATen overloads whose Python binding (torch._C._VariableFunctions) takes the same arguments
# and dispatches to the same kernel at less host cost than the OpOverload: the calls a
# launch-bound program makes most.
FAST_BINDINGS = ("mm", "bmm", "addmm", "baddbmm", "convolution", "_scaled_dot_product_cudnn_attention",
                 "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention")


def fast_binding(op: Callable) -> Callable:
    """The cheapest callable with op's semantics."""
    packet = getattr(op, "overloadpacket", None)
    name = getattr(packet, "__name__", "")
    if getattr(op, "_overloadname", None) == "default" and name in FAST_BINDINGS:
        return getattr(torch._C._VariableFunctions, name, op)
    return op


def restride(t: torch.Tensor, stride: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
    """t in new memory with these strides (and dtype: some ATen kernels return another dtype
    than their meta function says). A layout that repeats elements along stride-0 dims (a
    broadcast) is filled from one slice along them and expanded: no copy can write one
    element twice."""
    if len(stride) != t.dim():
        raise errors.MetaMismatch(f"an ATen op returned a {t.dim()}-d result of shape {tuple(t.shape)} "
                                  f"where PyTorch's shape function gives {len(stride)} dims")
    dtype = dtype or t.dtype
    broadcast = [d for d, (n, st) in enumerate(zip(t.shape, stride)) if st == 0 and n > 1]
    if broadcast:
        one = t[tuple(slice(0, 1) if d in broadcast else slice(None) for d in range(t.dim()))]
        return restride(one, stride, dtype).expand(t.shape)
    out = torch.empty_strided(t.shape, stride, dtype=dtype, device=t.device)
    out.copy_(t)
    return out


def copy_memory(t: torch.Tensor) -> torch.Tensor:
    """A copy of the memory t spans, in t's layout (overlapping strides included), so that
    views of t rebuilt on it from t's strides and offsets address the same values."""
    flat = torch.as_strided(t, (extent(t.shape, t.stride()),), (1,), t.storage_offset()).clone()
    return torch.as_strided(flat, t.shape, t.stride(), 0)


def raise_reported(errors: torch.Tensor, checks: tuple[Check, ...], sizes: tuple[int, ...]) -> None:
    """Raise what the first check that reported an error says, as eager would have; sizes
    are the checks' sizes in this call."""
    for check, size, (flag, value) in zip(checks, sizes, errors.view(-1, SLOTS_PER_CHECK).tolist()):
        if flag:
            raise check.error(value, size)


# torch._assert_async takes messages shorter than this
ASSERT_MESSAGE_LIMIT = 255


def checks_message(checks: tuple[Check, ...]) -> str:
    """What a failed device-side check says: the distinct checks, as many as the message fits."""
    head, listed = "kiln: a run-time check failed in a compiled program (", []
    distinct = list(dict.fromkeys(map(str, checks)))
    for n, text in enumerate(distinct):
        rest = len(distinct) - n - 1
        more = f", and {rest} more" if rest else ""
        if len(head + ", ".join([*listed, text]) + more + ")") >= ASSERT_MESSAGE_LIMIT:
            more = f"{', ' if listed else ''}and {len(distinct) - n} more"
            return head + ", ".join(listed) + more + ")"
        listed.append(text)
    return head + ", ".join(listed) + ")"


class _SharedArena(threading.local):
    """One thread's memory for the temporaries of every program it runs, per device: programs
    run one after another, so they share it, and a step's forward and backward together hold
    the largest program's temporaries, not their sum. The programs hold the buffer; once none
    is left it is freed. busy: a program is running on it."""

    def __init__(self):
        self.buffers: dict[torch.device, weakref.ref] = {}
        self.generation = 0  # grows with each new buffer: views of an older one are stale
        self.busy = False


_SHARED = _SharedArena()


def shared_arena_bytes() -> int:
    """The bytes this thread's shared arenas hold."""
    return sum(b.numel() for ref in _SHARED.buffers.values() if (b := ref()) is not None)


def _release() -> None:
    _SHARED.busy = False


def _slot_tensor(buffer: torch.Tensor, slot: Slot) -> torch.Tensor:
    """A slot of the buffer as a tensor of its own storage, at offset 0: an ATen op given a
    tensor at an offset in its storage may return one at the same offset (slice_scatter
    does), where the compiled graph's metadata says 0. The storage does not own the memory:
    the program that carved it holds the buffer as long as it holds the slot."""
    n = max(int(slot.extent), 1)
    memory = torch._C._construct_storage_from_data_pointer(buffer.data_ptr() + slot.offset, buffer.device,
                                                          n * slot.dtype.itemsize)
    return torch.empty(0, dtype=slot.dtype, device=buffer.device).set_(memory, 0, (n,), (1,))


def thread_arena(slots: tuple[Slot, ...], device: torch.device,
                 views: Sequence[tuple] = ()) -> Callable[[], tuple[list, list, list, Callable[[], None]]]:
    """A program's arena: get() returns the slots' storage, their addresses, views of them
    ((slot, shape, stride) each) and the function that hands the memory back when the program
    returns. The slots lie in the thread's shared arena, grown to the largest program's need;
    a program that starts while another runs on the thread (a Python op of one calling
    another compiled function) gets memory of its own for that call."""
    nbytes = arena_bytes(slots)
    mine = threading.local()  # this program's views of its thread's buffer

    def carve(buffer: torch.Tensor) -> tuple[list, list, list]:
        storage = [_slot_tensor(buffer, s) for s in slots]
        made = [torch.as_strided(storage[slot], shape, stride) for slot, shape, stride in views]
        return storage, [t.data_ptr() for t in storage], made

    def get() -> tuple[list, list, list, Callable[[], None]]:
        shared = _SHARED
        if shared.busy:
            own = torch.empty(nbytes, dtype=torch.uint8, device=device)
            return (*carve(own), lambda: own)  # the release function holds the memory until then
        shared.busy = True
        if getattr(mine, "generation", None) == shared.generation:
            return (*mine.arena, _release)
        ref = shared.buffers.get(device)
        buffer = ref() if ref is not None else None
        if buffer is None or buffer.numel() < nbytes:
            mine.arena = mine.buffer = buffer = None  # this program's hold on the old one goes first
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
            shared.buffers[device] = weakref.ref(buffer)
            shared.generation += 1
        mine.buffer, mine.arena, mine.generation = buffer, carve(buffer), shared.generation
        return (*mine.arena, _release)

    return get


def check_arg_count(args: list, expected: int) -> None:
    if len(args) != expected:
        raise TypeError(f"kiln: the compiled program takes {expected} arguments, got {len(args)}")


def check_input(t, spec: InputSpec) -> None:
    """Raise a clear error where an input is not what the compiled code relies on: a tensor
    of spec's dtype, sizes and device, with its strides wherever a dimension has more than one
    element (a size-1 dimension's stride never addresses memory)."""
    where = f"kiln: input {spec.position} ({spec.name})"
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where} must be a tensor, got {type(t).__name__}")
    if t.dtype != spec.dtype:
        raise TypeError(f"{where} has dtype {t.dtype}, the compiled program expects {spec.dtype}")
    if t.dim() != len(spec.shape):
        raise ValueError(f"{where} has {t.dim()} dimensions, the compiled program expects {len(spec.shape)}")
    # a shape family's sizes (expressions) are read from the inputs: only numbers are checked
    if any(isinstance(want, int) and n != want for n, want in zip(t.shape, spec.shape)):
        raise ValueError(f"{where} has sizes {tuple(t.shape)}, the compiled program expects {spec.shape}")
    if any(isinstance(n, int) and isinstance(b, int) and n > 1 and a != b
           for n, a, b in zip(spec.shape, t.stride(), spec.stride)):
        raise ValueError(f"{where} has strides {t.stride()}, the compiled program expects {spec.stride}")
    if t.device != torch.device(spec.device):
        raise ValueError(f"{where} is on {t.device}, the compiled program expects {spec.device}")
