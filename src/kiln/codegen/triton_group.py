"""Triton for kernel groups (ir/group.py): one launch whose programs are the members' programs
one after another. Program `gpid` runs the member whose range of programs holds it, over its
flat index (a member's lines are not tiled by rows: the group has one grid dimension); every
member uses the group's XBLOCK, so a range's end is a compile-time number."""

from __future__ import annotations

import dataclasses

from kiln.codegen.triton import HEADER, _Renderer
from kiln.codegen.triton import render_source as render_kernel_source
from kiln.ir import kernel as k
from kiln.ir.group import is_group, member_param
from kiln.ir.matmul import is_matmul


def render_source(kernel: k.Kernel) -> str:
    """A kernel's Triton module, a group's and a matmul template's included."""
    if is_matmul(kernel):
        from kiln.codegen.templates import matmul

        return matmul.render_source(kernel)
    if not is_group(kernel):
        return render_kernel_source(kernel)
    return HEADER + "\n\n" + render_group(kernel) + "\n"


def _renamed(member: k.Kernel, position: int) -> k.Kernel:
    """The member with its parameters named as the group's."""
    rename = {p.name: member_param(position, p) for p in member.params}
    stages = tuple(
        k.Stage(st.loop, tuple(_rebuffered(s, rename) for s in st.body)) for st in member.stages)
    params = tuple(dataclasses.replace(p, name=rename[p.name]) for p in member.params)
    return dataclasses.replace(member, params=params, stages=stages)


def _rebuffered(s: k.Stmt, rename: dict[str, str]) -> k.Stmt:
    if isinstance(s, (k.Load, k.Store)) and s.buf in rename:
        return dataclasses.replace(s, buf=rename[s.buf])
    return s


class _MemberRenderer(_Renderer):
    def render_flat(self, pid: str) -> list[str]:
        """The member's body (at the depth of a function's), over its flat index."""
        self.flat = True
        if self.wide:
            pid = f"{pid}.to(tl.int64)"
        self.emit(1, f"pid = {pid}")
        self.emit(1, "xindex = pid * XBLOCK + tl.arange(0, XBLOCK)")
        self._flat_kernel("pid")
        return self.lines


def render_group(kernel: k.Kernel) -> str:
    params = ", ".join(p.name for p in kernel.params)
    constexprs = "XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, ALIGNED: tl.constexpr"
    lines = ["@triton.jit", f"def {kernel.name}({params}, {constexprs}):", "    gpid = tl.program_id(0)"]
    start = "0"
    for i, member in enumerate(kernel.members):
        if member.reduce or member.checks:
            raise ValueError(f"kernel group {kernel.name}: member {i} is not a point-wise kernel")
        lines.append(f"    end{i} = {start} + ({member.outer_numel} + XBLOCK - 1) // XBLOCK")
        lines.append(f"    if gpid < end{i}:" if i == 0 else f"    if (gpid >= {start}) & (gpid < end{i}):")
        body = _MemberRenderer(_renamed(member, i)).render_flat(f"(gpid - {start})")
        lines.extend("    " + line for line in body)
        start = f"end{i}"
    return "\n".join(lines)
