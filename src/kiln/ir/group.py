"""A kernel group: independent kernels run by one launch, as a foreach op runs one element-wise
op over a list of tensors (an optimizer step updates every parameter in one group).

A group is a Kernel (what the host program launches, with every member's buffers as its
parameters, in member order) whose members keep their own kernel IR; a code generator that
groups renders each member and one entry that runs them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.ir.kernel import Kernel, Param


@dataclass(frozen=True)
class KernelGroup(Kernel):
    members: tuple[Kernel, ...] = ()


def member_param(position: int, param: Param) -> str:
    """The group's name for a member's parameter."""
    return f"m{position}_{param.name}"


def make_group(name: str, members: tuple[Kernel, ...]) -> KernelGroup:
    params = tuple(Param(member_param(i, p), p.dtype, p.is_output)
                   for i, m in enumerate(members) for p in m.params)
    args = tuple(a for m in members for a in m.args)
    return KernelGroup(name, (), (), params, (), args=args, members=members)


def is_group(kernel: Kernel) -> bool:
    return bool(getattr(kernel, "members", ()))
