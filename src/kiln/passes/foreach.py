"""Kernel groups: point-wise kernels that are independent of one another run as one launch
(ir/group.py), as a foreach op does. An optimizer step computes each parameter's update in its
own kernel (its own shape); grouped, the whole step is a few launches.

Kernels join a group while none reads or writes a buffer another member writes (then their
order does not matter), no ATen call stands between them, and the group stays under the
backend's limits of members and buffers. On a GPU a kernel joins when launch-bound or when
its streams walk one index (a group's member runs over a flat index and would lose a tiling of
its own); one that does not join may stand between members: the group runs where its first
member stood, so later members must be independent of it too.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.group import make_group
from kiln.ir.kernel import Kernel, Load, Store, size_params
from kiln.ir.matmul import is_matmul
from kiln.ir.sizes import is_symbolic
from kiln.passes.fusion import Decision, KernelPlan, Schedule
from kiln.passes.layout import node_label


def _groupable(kern: Kernel) -> bool:
    """Point-wise, checking nothing, not empty, of static sizes (a group's launch passes its
    members' buffers only), and not a matmul template (a launch of its own tiling). A static
    domain is not enough: an index may still read a shape family's size (a slice's stride)."""
    if kern.reduce or kern.checks or kern.sizes or is_symbolic(kern.outer_numel) or is_matmul(kern):
        return False
    return kern.outer_numel > 0 and not size_params(kern).sizes


def walks_one_index(kern: Kernel) -> bool:
    """Every load and store at the index of the kernel's stores, or of a single element: run
    over a flat index as a group's member, it loses nothing."""
    stmts = [s for st in kern.stages for s in st.body if isinstance(s, (Load, Store))]
    stored = {s.index for s in stmts if isinstance(s, Store)}
    if len(stored) != 1:
        return False
    return all(s.index in stored or not s.index.terms for s in stmts)


def _buffers(kern: Kernel) -> tuple[set[str], set[str]]:
    reads = {a for a, p in zip(kern.args, kern.params) if not p.is_output}
    writes = {a for a, p in zip(kern.args, kern.params) if p.is_output}
    return reads, writes


def group_kernels(sched: Schedule, kernels: dict[int, Kernel], max_members: int,
                  max_buffers: int = 1024, joins: Callable[[Kernel], bool] | None = None) -> list[Decision]:
    """Replace runs of groupable kernels in sched.steps (and kernels) by groups of at most
    max_members kernels and max_buffers buffers; where joins is given, only kernels it accepts
    join a group."""
    if max_members < 2:
        return []
    runs: list[list[KernelPlan]] = [[]]
    reads: set[str] = set()
    writes: set[str] = set()
    # buffers of the kernels the open run has passed over: a later member moves before them
    passed_reads: set[str] = set()
    passed_writes: set[str] = set()
    args = 0
    for step in sched.steps:
        kern = kernels.get(id(step)) if isinstance(step, KernelPlan) else None
        if kern is None or not _groupable(kern):  # an ATen call's buffers are not known here
            runs.append([])
            reads, writes, passed_reads, passed_writes, args = set(), set(), set(), set(), 0
            continue
        r, w = _buffers(kern)
        if joins is not None and not joins(kern):
            passed_reads |= r
            passed_writes |= w
            continue
        run = runs[-1]
        independent = (not (r & (writes | passed_writes))
                       and not (w & (reads | writes | passed_reads | passed_writes)))
        if not independent or len(run) >= max_members or args + len(kern.args) > max_buffers:
            run = []
            runs.append(run)
            reads, writes, passed_reads, passed_writes, args = set(), set(), set(), set(), 0
        run.append(step)
        reads |= r
        writes |= w
        args += len(kern.args)
    decisions = []
    replaced: dict[int, KernelPlan] = {}
    for run in (r for r in runs if len(r) > 1):
        members = tuple(kernels.pop(id(s)) for s in run)
        plan = KernelPlan([root for s in run for root in s.roots], (), ())
        kernels[id(plan)] = make_group("group", members)
        replaced[id(run[0])] = plan
        replaced.update({id(s): None for s in run[1:]})
        decisions.append(Decision(node_label(run[0].roots[0]), "grouped",
                                  f"{len(run)} independent point-wise kernels run as one launch"))
    sched.steps[:] = [replaced.get(id(s), s) for s in sched.steps if replaced.get(id(s), s) is not None]
    return decisions
