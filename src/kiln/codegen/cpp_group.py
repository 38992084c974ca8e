"""C++ for kernel groups (ir/group.py): each distinct member as a static function, and one
exported entry that runs the members in order (each with its own parallel loops)."""

from __future__ import annotations

import dataclasses

from kiln.codegen.cpp import render_kernel as _render_loops
from kiln.codegen.cpp_matmul import render_template
from kiln.codegen.cpp_values import STORAGE_TYPE
from kiln.ir.group import is_group, member_param
from kiln.ir.kernel import Kernel
from kiln.ir.matmul import is_matmul


def render_kernel(kernel: Kernel) -> str:
    """One kernel's C++: a matmul template's (cpp_matmul.py) or loop nests (cpp.py)."""
    return render_template(kernel) if is_matmul(kernel) else _render_loops(kernel)


def render(kernel: Kernel) -> str:
    """A kernel's C++, a group's included."""
    if not is_group(kernel):
        return render_kernel(kernel)
    bodies: dict[str, str] = {}
    calls = []
    for i, member in enumerate(kernel.members):
        fn = f"{kernel.name}_{member.name}"
        if fn not in bodies:
            source = render_kernel(dataclasses.replace(member, name=fn))
            bodies[fn] = source.replace(f'extern "C" void {fn}(', f"static void {fn}(", 1)
        calls.append(f"  {fn}({', '.join(member_param(i, p) for p in member.params)});")
    # members may read one buffer through several parameters: the entry's are not restrict
    params = ", ".join(f"{'' if p.is_output else 'const '}{STORAGE_TYPE[p.dtype]}* {p.name}"
                       for p in kernel.params)
    entry = [f'extern "C" void {kernel.name}({params}) {{', *calls, "}"]
    return "\n\n".join([*bodies.values(), "\n".join(entry)])
