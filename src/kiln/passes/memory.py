"""Memory planning over the host program (ir/host.py): liveness, reuse and frees.

Temporaries (allocated buffers that are neither returned nor handed to an ATen op that may
return a view of them) live in slots. On the CPU the slots are an arena that persists across
calls (one per thread), so temporaries cost no allocation and no page faults: each temporary
is placed at the lowest offset where it overlaps no temporary alive at the same time, the
largest first (the arena is then about the largest set of temporaries alive at once, not the
sum of every shape's). Elsewhere a slot is the memory of its first temporary, viewed again by
the next temporary of the same dtype and extent once the first is dead, where keeping it until
then raises no peak of the program's bytes alive (ATen results counted); otherwise it is freed
(the caching allocator reuses memory across shapes itself). Every other buffer, inputs included,
is freed after its last read (with the boxed calling convention a backward's saved
activations go one layer at a time), except what the program returns.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
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
    LaunchUser,
    Ref,
    Return,
    Slot,
    View,
    extent,
    may_share_memory,
    reads,
    refs,
    slot_bytes,
)
from kiln.ir.sizes import hint, is_symbolic
from kiln.passes.layout import is_non_overlapping


@dataclass(frozen=True)
class MemoryPlan:
    """What the pass decided, with the reason for each kind of buffer left out of the slots."""

    slots: int  # distinct slots
    pooled: int  # temporaries placed in slots (pooled - slots of them reuse a dead one's)
    freed: int  # buffers freed after their last read
    returned: frozenset[str]  # never pooled or freed: the caller gets their memory
    shared: frozenset[str]  # never pooled: an ATen call's result may be a view of them
    copies_dropped: int = 0  # users' kernels writing a dead buffer in place of a copy of it

    @property
    def reused(self) -> int:
        return self.pooled - self.slots

    def summary(self) -> str:
        return (f"{self.pooled} temporaries in {self.slots} slots, {self.freed} buffers freed after "
                f"their last read, {len(self.returned)} returned, {len(self.shared)} viewed by ATen results"
                + (f", {self.copies_dropped} copies before users' kernels dropped (dead after them)"
                   if self.copies_dropped else ""))


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


def drop_dead_copies(body: tuple[Instr, ...]) -> tuple[tuple[Instr, ...], int]:
    """A user's kernel writes a buffer's copy so that the buffer keeps its values; where
    nothing reads the buffer after the launch, the kernel may write the buffer itself. Only
    memory the program made whole (an allocation, a fresh ATen result) qualifies: an input's
    memory is the caller's, and a view or a viewed buffer is read through other names."""
    made = {i.out for i in body if isinstance(i, Alloc) or isinstance(i, CallAten) and not i.may_alias}
    viewed = {src for i in body if not isinstance(i, LaunchUser) for src in may_share_memory(i)}
    returned = _returned(body)
    read_at: dict[str, list[int]] = {}
    for k, ins in enumerate(body):
        for name in (*reads(ins), *getattr(ins, "writes", ())):
            read_at.setdefault(name, []).append(k)
    out: list[Instr] = []
    dropped = 0
    for k, ins in enumerate(body):
        if isinstance(ins, LaunchUser) and ins.clones:
            names = [ins.buffer(p) for p, _ in ins.args]
            keep = tuple(p for p in ins.clones if not (
                (name := ins.buffer(p)) in made and name not in viewed and name not in returned
                and names.count(name) == 1 and max(read_at[name]) == k))
            dropped += len(ins.clones) - len(keep)
            ins = dataclasses.replace(ins, clones=keep)
        out.append(ins)
    return tuple(out), dropped


_COPY_ = "aten::copy_.default"


def update_inputs_in_place(program: HostProgram) -> tuple[tuple[Instr, ...], int]:
    """A user's kernel writing an input (an optimizer step in Triton) writes a copy of it,
    which AOTAutograd's copy_ at the end puts back into the input: as in eager, the kernel may
    write the input itself, and the copy_ goes, where nothing else reads the input after the
    launch, nothing may view it, its elements do not overlap, and the program returns neither
    it nor its new value."""
    body = program.body
    specs = {s.name: s for s in program.inputs}
    readers: dict[str, list[int]] = {}
    for k, ins in enumerate(body):
        for name in (*reads(ins), *getattr(ins, "writes", ())):
            readers.setdefault(name, []).append(k)
    items = {(i.src, i.index): (k, i.out) for k, i in enumerate(body) if isinstance(i, Item)}
    updates = {(i.args[0].name, i.args[1].name): k for k, i in enumerate(body)
               if isinstance(i, CallAten) and i.op == _COPY_ and len(i.args) == 2
               and all(isinstance(a, Ref) for a in i.args)}
    # the copy_ returns its target: it views the input, but it is what goes
    viewed = {src for k, i in enumerate(body) if k not in updates.values() for src in may_share_memory(i)}
    returned = _returned(body)
    out, gone, written = list(body), set(), 0
    for k, ins in enumerate(body):
        if not isinstance(ins, LaunchUser):
            continue
        keep = []
        names = [ins.buffer(p) for p, _ in ins.args]
        for p in ins.clones:
            name = ins.buffer(p)
            item = items.get((ins.out, ins.returns.index(p))) if p in ins.returns else None
            update = updates.get((name, item[1])) if item is not None else None
            spec = specs.get(name)
            safe = (
                update is not None and spec is not None and names.count(name) == 1
                and name not in viewed and name not in returned
                and item[1] not in returned and is_non_overlapping(spec.shape, spec.stride)
                and all(r <= k or r == update for r in readers[name]) and body[update].out not in readers
            )
            if safe:
                gone.add(update)
                written += 1
            else:
                keep.append(p)
        out[k] = dataclasses.replace(ins, clones=tuple(keep))
    return tuple(i for k, i in enumerate(out) if k not in gone), written


def _pooled_starts(body: tuple[Instr, ...], returned: set[str], shared: set[str]) -> dict[tuple, list[int]]:
    """Where the program allocates its temporaries of each (dtype, extent)."""
    starts: dict[tuple, list[int]] = {}
    for k, ins in enumerate(body):
        if isinstance(ins, Alloc) and ins.slot is None and ins.out not in returned and ins.out not in shared:
            starts.setdefault((ins.dtype, extent(ins.shape, ins.stride)), []).append(k)
    return starts


def pack_arena(temporaries: list[tuple[torch.dtype, int, int, int]]) -> list[int]:
    """Byte offsets for temporaries given as (dtype, extent, first, last): each alive from
    instruction first through last. Largest first, each takes the lowest aligned offset where
    it overlaps no placed temporary whose instructions meet its own."""
    offsets = [0] * len(temporaries)
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    order = sorted(range(len(temporaries)),
                   key=lambda t: (-slot_bytes(*temporaries[t][:2]), temporaries[t][2]))
    for t in order:
        dtype, n, first, last = temporaries[t]
        size, offset = slot_bytes(dtype, n), 0
        for start, end, _, _ in sorted(p for p in placed if p[2] <= last and first <= p[3]):
            if offset + size <= start:
                break
            offset = max(offset, end)
        offsets[t] = offset
        placed.append((offset, offset + size, first, last))
    return offsets


def _place_in_arena(in_arena: list[tuple[int, Alloc, int]], out: list[Instr],
                    last_read: dict[str, int]) -> tuple[Slot, ...]:
    """Each arena temporary's slot, written into its Alloc in out: temporaries packed by
    their lifetimes (pack_arena), those of one dtype, extent and offset sharing a slot."""
    temporaries = [(a.dtype, int(extent(a.shape, a.stride)), k, last_read.get(a.out, k))
                   for _, a, k in in_arena]
    slots: dict[Slot, int] = {}
    for (place, alloc, _), (dtype, n, _, _), offset in zip(in_arena, temporaries, pack_arena(temporaries)):
        out[place] = dataclasses.replace(alloc, slot=slots.setdefault(Slot(dtype, n, offset), len(slots)))
    return tuple(slots)


def _bytes_alive_without_reuse(body: tuple[Instr, ...], last_read: dict[str, int], returned: set[str],
                               layouts: dict[str, tuple]) -> list[int]:
    """Bytes alive at each instruction if every buffer were freed after its last read: the
    allocations' own, and ATen results' as layouts give them (none where they do not)."""
    change = [0] * (len(body) + 2)
    for k, ins in enumerate(body):
        if isinstance(ins, Alloc):
            nbytes = hint(extent(ins.shape, ins.stride)) * ins.dtype.itemsize
        elif isinstance(ins, (CallAten, Item)) and ins.out in layouts:
            dtype, shape = layouts[ins.out]
            nbytes = math.prod(hint(d) for d in shape) * dtype.itemsize
        else:
            continue
        end = len(body) if ins.out in returned else last_read.get(ins.out, k)
        change[k] += nbytes
        change[end + 1] -= nbytes
    return list(itertools.accumulate(change[:-1]))


def plan_memory(program: HostProgram, arena: bool | None = None,
                layouts: dict[str, tuple] | None = None) -> tuple[HostProgram, MemoryPlan]:
    """The program with temporaries in slots and frees after last reads. arena: keep the slots
    across calls (default: on the CPU). layouts: buffer name -> (dtype, shape), for the sizes
    of ATen calls' results (without an arena a dead slot is kept for a later temporary only
    where the memory it holds raises no peak)."""
    if program.arena or any(isinstance(i, Free) or (isinstance(i, Alloc) and i.slot is not None)
                            for i in program.body):
        raise ValueError("kiln: the host program's memory is planned already (it has slots or frees)")
    if arena is None:
        arena = torch.device(program.device).type == "cpu"
    body, in_place = update_inputs_in_place(program)
    body, copies_dropped = drop_dead_copies(body)
    copies_dropped += in_place
    root: dict[str, str] = {}  # a view -> the buffer whose memory it is
    for ins in body:
        if isinstance(ins, View):
            root[ins.out] = root.get(ins.base, ins.base)
    returned = _returned(body)
    shared = {root.get(r, r) for ins in body if isinstance(ins, CallAten) and ins.may_alias
              for r in reads(ins)}
    shared |= {root.get(r, r) for ins in body if isinstance(ins, LaunchUser) for r in may_share_memory(ins)}
    # reading a view reads the buffer under it: both stay alive; a kernel writing an input
    # (its update, in place) needs it alive too
    reads_at = [{x for r in (*reads(ins), *getattr(ins, "writes", ())) for x in (r, root.get(r, r))}
                for ins in body]
    last_read: dict[str, int] = {}
    for k, names in enumerate(reads_at):
        for name in names:
            last_read[name] = k
    # past the last launch or call the program only returns: freeing then saves nothing
    work = [k for k, ins in enumerate(body) if isinstance(ins, (Launch, LaunchUser, CallAten, Item))]
    last_work = work[-1] if work else -1
    order = {f"arg{k}": k - program.num_args for k in range(program.num_args)}
    for k, ins in enumerate(body):
        order.setdefault(getattr(ins, "out", ""), k)

    keys: list[tuple] = []  # without an arena: each slot's (dtype, extent)
    free_slots: dict[tuple, list[int]] = {}  # taken in the order they fell free
    # without an arena: the bytes alive at each instruction, and their peak, which a dead slot
    # kept for a later temporary of its key must not raise
    alive = None if arena else _bytes_alive_without_reuse(body, last_read, returned, layouts or {})
    peak = 0 if alive is None else max(alive)
    slot_of: dict[str, int] = {}
    holder: dict[int, str] = {}
    occupants: dict[int, list[str]] = {}  # without an arena: the names a slot's memory has had
    in_arena: list[tuple[int, Alloc, int]] = []  # (place in out, the Alloc, its instruction)
    arena_names: set[str] = set()  # in the arena: never freed
    starts = _pooled_starts(body, returned, shared)
    allocs_left = {key: len(ks) for key, ks in starts.items()}
    out: list[Instr] = []
    pooled = freed = 0
    for k, ins in enumerate(body):
        # the arena is fixed memory across calls: a shape family's temporaries vary, so they
        # are allocated per call (and freed after their last read)
        varying = arena and is_symbolic(extent(ins.shape, ins.stride)) if isinstance(ins, Alloc) else False
        if isinstance(ins, Alloc) and ins.slot is None and ins.out not in returned and ins.out not in shared \
                and not varying:
            pooled += 1
            if arena:
                in_arena.append((len(out), ins, k))
                arena_names.add(ins.out)
            else:
                key = (ins.dtype, extent(ins.shape, ins.stride))
                allocs_left[key] -= 1
                if free_slots.get(key):
                    slot = free_slots[key].pop(0)
                else:
                    slot = len(keys)
                    keys.append(key)
                slot_of[ins.out] = slot
                if slot in holder:
                    ins = View(ins.out, holder[slot], ins.shape, ins.stride, 0)
                else:
                    holder[slot] = ins.out
                occupants.setdefault(slot, []).append(ins.out)
        out.append(ins)
        if k > last_work:
            continue
        for name in sorted(reads_at[k], key=lambda n: (order.get(n, len(body)), n)):
            if last_read[name] != k or name in returned or name in arena_names:
                continue
            if name in slot_of:
                slot = slot_of[name]
                key = keys[slot]
                # slots are taken in the order they fell free: this one by the j-th next temporary
                later, j = starts[key][len(starts[key]) - allocs_left[key]:], len(free_slots.get(key, ()))
                taker = later[j] if j < len(later) else None
                held = hint(key[1]) * key[0].itemsize
                if taker is not None and max(alive[k + 1:taker], default=0) + held <= peak:
                    for t in range(k + 1, taker):
                        alive[t] += held
                    free_slots.setdefault(key, []).append(slot)
                else:  # no later temporary takes this slot, or holding it would raise the peak
                    for occupant in occupants.pop(slot, ()):
                        out.append(Free(occupant))
                        freed += 1
            else:
                out.append(Free(name))
                freed += 1
    slots = _place_in_arena(in_arena, out, last_read)
    planned = dataclasses.replace(program, body=tuple(out), arena=slots)
    plan = MemoryPlan(len(slots) if arena else len(keys), pooled, freed, frozenset(returned),
                      frozenset(shared), copies_dropped)
    return planned, plan
