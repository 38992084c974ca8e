"""Memory planning over the host program (ir/host.py): liveness, reuse and frees.

Temporaries (allocated buffers that are neither returned nor handed to an ATen op that may
return a view of them) live in slots: a dead one's slot is taken by the next temporary of the
same dtype and extent. On the CPU the slots are an arena that persists across calls (one per
thread), so temporaries cost no allocation and no page faults; elsewhere a slot is the memory
of its first temporary, viewed again by the later ones. Every other buffer, inputs included,
is freed after its last read (with the boxed calling convention a backward's saved
activations go one layer at a time), except what the program returns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kiln.ir.host import (
    Alloc,
    CallAten,
    Free,
    HostProgram,
    Instr,
    Item,
    Launch,
    Return,
    Slot,
    View,
    extent,
    may_share_memory,
    reads,
    refs,
)
from kiln.ir.sizes import is_symbolic


@dataclass(frozen=True)
class MemoryPlan:
    """What the pass decided, with the reason for each kind of buffer left out of the slots."""

    slots: int  # distinct slots
    pooled: int  # temporaries placed in slots (pooled - slots of them reuse a dead one's)
    freed: int  # buffers freed after their last read
    returned: frozenset[str]  # never pooled or freed: the caller gets their memory
    shared: frozenset[str]  # never pooled: an ATen call's result may be a view of them

    @property
    def reused(self) -> int:
        return self.pooled - self.slots

    def summary(self) -> str:
        return (f"{self.pooled} temporaries in {self.slots} slots, {self.freed} buffers freed after "
                f"their last read, {len(self.returned)} returned, {len(self.shared)} viewed by ATen results")


def _returned(body: tuple[Instr, ...]) -> set[str]:
    """The buffers whose memory the program may return: the returned names and everything
    they may be views of."""
    producers: dict[str, list[Instr]] = {}
    for ins in body:
        out = getattr(ins, "out", None)
        if out is not None:
            producers.setdefault(out, []).append(ins)
    stack = [name for ins in body if isinstance(ins, Return) for name in refs(ins.values)]
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(src for ins in producers.get(name, ()) for src in may_share_memory(ins))
    return seen


def plan_memory(program: HostProgram, arena: bool | None = None) -> tuple[HostProgram, MemoryPlan]:
    """The program with temporaries in slots and frees after last reads. arena: keep the slots
    across calls (default: on the CPU)."""
    if program.arena or any(isinstance(i, Free) or (isinstance(i, Alloc) and i.slot is not None)
                            for i in program.body):
        raise ValueError("kiln: the host program's memory is planned already (it has slots or frees)")
    if arena is None:
        arena = torch.device(program.device).type == "cpu"
    body = program.body
    root: dict[str, str] = {}  # a view -> the buffer whose memory it is
    for ins in body:
        if isinstance(ins, View):
            root[ins.out] = root.get(ins.base, ins.base)
    returned = _returned(body)
    shared = {root.get(r, r) for ins in body if isinstance(ins, CallAten) and ins.may_alias
              for r in reads(ins)}
    # reading a view reads the buffer under it: both stay alive; a kernel writing an input
    # (its update, in place) needs it alive too
    reads_at = [{x for r in (*reads(ins), *getattr(ins, "writes", ())) for x in (r, root.get(r, r))}
                for ins in body]
    last_read: dict[str, int] = {}
    for k, names in enumerate(reads_at):
        for name in names:
            last_read[name] = k
    # past the last launch or call the program only returns: freeing then saves nothing
    work = [k for k, ins in enumerate(body) if isinstance(ins, (Launch, CallAten, Item))]
    last_work = work[-1] if work else -1
    order = {f"arg{k}": k - program.num_args for k in range(program.num_args)}
    for k, ins in enumerate(body):
        order.setdefault(getattr(ins, "out", ""), k)

    slots: list[Slot] = []
    free_slots: dict[Slot, list[int]] = {}
    slot_of: dict[str, int] = {}
    holder: dict[int, str] = {}
    out: list[Instr] = []
    pooled = freed = 0
    for k, ins in enumerate(body):
        # the arena is fixed memory across calls: a shape family's temporaries vary, so they
        # are allocated per call (and freed after their last read)
        varying = arena and is_symbolic(extent(ins.shape, ins.stride)) if isinstance(ins, Alloc) else False
        if isinstance(ins, Alloc) and ins.slot is None and ins.out not in returned and ins.out not in shared \
                and not varying:
            key = Slot(ins.dtype, extent(ins.shape, ins.stride))
            if free_slots.get(key):
                slot = free_slots[key].pop()
            else:
                slot = len(slots)
                slots.append(key)
            slot_of[ins.out] = slot
            pooled += 1
            if arena:
                ins = dataclasses.replace(ins, slot=slot)
            elif slot in holder:
                ins = View(ins.out, holder[slot], ins.shape, ins.stride, 0)
            else:
                holder[slot] = ins.out
        out.append(ins)
        if k > last_work:
            continue
        for name in sorted(reads_at[k], key=lambda n: (order.get(n, len(body)), n)):
            if last_read[name] != k or name in returned:
                continue
            if name in slot_of:
                free_slots.setdefault(slots[slot_of[name]], []).append(slot_of[name])
            else:
                out.append(Free(name))
                freed += 1
    planned = dataclasses.replace(program, body=tuple(out), arena=tuple(slots) if arena else ())
    plan = MemoryPlan(len(slots), pooled, freed, frozenset(returned), frozenset(shared))
    return planned, plan
