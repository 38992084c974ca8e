"""Communication that overlaps computation: a collective is issued as soon as its inputs are
ready and waited for only where its result is first needed, so that the kernels and ATen
calls in between run while the data travels.

Only the position of collectives and their waits changes. Every other effectful call (an
assert, a print, a mutation) keeps its place relative to them, and collectives keep their
order among themselves, which all ranks must share.
"""

from __future__ import annotations

from kiln.ir.kernel import Kernel
from kiln.ir.tensor import Node, Op
from kiln.passes.fusion import Decision, KernelPlan, Schedule


def _namespace(step) -> str:
    if isinstance(step, KernelPlan) or step.op is not Op.EXTERN:
        return ""
    return getattr(step.attrs[0], "namespace", "")


def is_wait(step) -> bool:
    return _namespace(step) == "_c10d_functional" and "wait_tensor" in str(step.attrs[0])


def is_collective(step) -> bool:
    return _namespace(step) == "_c10d_functional" and not is_wait(step)


def _barrier(step) -> bool:
    """An effectful call other than communication: nothing moves across it."""
    return (not isinstance(step, KernelPlan) and bool(step.meta.get("effectful"))
            and not is_collective(step) and not is_wait(step))


def overlap_communication(sched: Schedule, kernels: dict[int, Kernel],
                          names: dict[Node, str]) -> list[Decision]:
    """Reorder sched.steps in place; one decision per collective or wait that moved."""
    by_name = {v: n for n, v in names.items()}

    def base(n: Node) -> Node:
        return sched.aliases[n].base if n in sched.aliases else n

    def reads(step) -> set[Node]:
        if isinstance(step, KernelPlan):
            kern = kernels.get(id(step))
            if kern is None:
                return set()
            inputs = [a for a, p in zip(kern.args, kern.params) if not p.is_output and a in by_name]
            return {base(by_name[a]) for a in inputs}
        return {base(i) for i in step.inputs}

    def writes(step) -> set[Node]:
        return set(step.roots) if isinstance(step, KernelPlan) else {step}

    decisions: list[Decision] = []
    steps = sched.steps
    for i in range(len(steps)):  # issue early: walk each collective back over what it does not need
        step = steps[i]
        if not is_collective(step):
            continue
        needs, j = reads(step), i
        while j > 0 and not _barrier(steps[j - 1]) and not is_collective(steps[j - 1]) \
                and not (writes(steps[j - 1]) & needs):
            j -= 1
        if j < i:
            steps.insert(j, steps.pop(i))
            decisions.append(Decision(f"%{step.id} {step.attrs[0]}", "overlap",
                                      f"issued {i - j} steps earlier, as soon as its inputs are ready"))
    for i in reversed(range(len(steps))):  # wait late: walk each wait over what does not need it
        step = steps[i]
        if not is_wait(step):
            continue
        j = i
        while j + 1 < len(steps) and step not in reads(steps[j + 1]) and not _barrier(steps[j + 1]):
            j += 1
        if j > i:
            steps.insert(j, steps.pop(i))
            decisions.append(Decision(f"%{step.id} {step.attrs[0]}", "overlap",
                                      f"waited {j - i} steps later, where its result is first needed"))
    return decisions

