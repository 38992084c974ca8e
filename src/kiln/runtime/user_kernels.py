"""Launching users' @triton.jit kernels from a host program (ir/host.py LaunchUser).

A program names a kernel by "module:qualname" and its source digest. In the process that
compiled it, the program launches the very object Dynamo saw (remembered here); elsewhere (a
graph-cache hit in a new process, a loaded artifact) the name is imported again and its
source checked. CPU tensors run through Triton's interpreter, as kiln's own kernels do there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kiln.ir.host import find_user_kernel, kernel_identity

_SEEN: dict[tuple[str, str], Any] = {}
_INTERPRETED: dict[int, Any] = {}


def remember(kernel: Any) -> tuple[str, str]:
    """Keep the object a compiled program launches in this process; its name and digest."""
    key = kernel_identity(kernel)
    _SEEN[key] = kernel
    return key


def find(name: str, digest: str) -> Any:
    kernel = _SEEN.get((name, digest))
    if kernel is not None:
        return kernel
    try:
        return find_user_kernel(name, digest)
    except LookupError as error:
        raise ValueError(f"kiln: the host program launches {name}, which cannot be found: {error}") from error


def _interpreted(kernel: Any) -> Any:
    """The kernel as Triton's interpreter runs it (on CPU tensors)."""
    from triton.runtime.interpreter import InterpretedFunction

    found = _INTERPRETED.get(id(kernel))
    if found is None or found[0] is not kernel:
        found = _INTERPRETED[id(kernel)] = (kernel, InterpretedFunction(kernel.fn))
    return found[1]


def launcher(name: str, digest: str, device: str) -> Callable[..., None]:
    """launch(grid, **arguments): the kernel run on a grid, in the interpreter for a program
    on the CPU."""
    kernel = find(name, digest)
    runs = _interpreted(kernel) if torch.device(device).type == "cpu" else kernel

    def launch(grid: tuple, /, **arguments: Any) -> None:
        runs[grid](**arguments)

    launch.__name__ = name.rpartition(":")[2]
    return launch
