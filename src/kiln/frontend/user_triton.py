"""A user's Triton kernel inside a graph: Dynamo hands a `@triton.jit` launch (direct, or in a
`torch.library.triton_op` through `wrap_triton`) over as a higher-order op, which AOTAutograd
functionalizes:

    out = triton_kernel_wrapper_functional(kernel_idx=, constant_args_idx=, grid=[(g0, g1, g2)],
                                           tma_descriptor_metadata={}, kwargs={param: value},
                                           tensors_to_clone=[param, ...])

kernel_idx and constant_args_idx index Dynamo's process-wide side table (the JIT function and
the arguments that are not tensors); `out` maps each parameter of tensors_to_clone to a copy of
its tensor after the launch (the parameters the kernel may write), and every other tensor is
left as it was. kiln imports the call as one UserKernelCall: the host program launches the
kernel itself (ir/host.py LaunchUser), or, where it cannot, runs the op as Dynamo's graph would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from kiln.errors import USER_KERNEL
from kiln.ir.host import find_user_kernel, kernel_identity
from kiln.ir.sizes import as_size, is_symbolic
from kiln.ir.tensor import Node

# by name: torch registers the ops when Dynamo first meets a Triton kernel, not at import
FUNCTIONAL = "triton_kernel_wrapper_functional"
MUTATION = "triton_kernel_wrapper_mutation"
_HOP_ARGUMENTS = ("kernel_idx", "constant_args_idx", "grid", "tma_descriptor_metadata")
LAUNCHED = "a user's Triton kernel: the host program launches it as written"


def is_user_kernel_op(target: Any) -> bool:
    return isinstance(target, torch._ops.HigherOrderOperator) and target.name() in (FUNCTIONAL, MUTATION)


@dataclass(eq=False)
class UserKernelCall:
    """One launch of a user's kernel, as the target of an EXTERN node whose inputs are its
    tensor arguments (parameters tensor_params, in order). reason: why kiln does not launch
    it itself (it then runs the op as Dynamo's graph does); None when it does."""

    hop: Any
    kernel: Any
    name: str
    digest: str
    grid: tuple
    arg_order: tuple[str, ...]  # every parameter the call names, in the call's order
    tensor_params: tuple[str, ...]
    literals: dict[str, Any]  # the arguments that are not tensors
    clones: tuple[str, ...]  # the functional form copies these before the launch
    returns: tuple[str, ...]  # the parameters whose tensors the call returns, in order
    hop_kwargs: dict[str, Any] = field(default_factory=dict)  # the op's own arguments, less kwargs
    hop_params: tuple[str, ...] = ()  # the parameters the op's kwargs name (the rest: the side table's)
    reason: str | None = None

    def arguments(self, tensors: dict[str, Any]) -> list[tuple[str, Any]]:
        """(parameter, value) in the call's order, tensors from `tensors` by parameter."""
        return [(p, tensors[p] if p in tensors else self.literals[p]) for p in self.arg_order]

    def __call__(self, *tensors: torch.Tensor) -> tuple | None:
        """The op as Dynamo's graph runs it: its returned tensors in `returns` order."""
        given = dict(zip(self.tensor_params, tensors))
        kwargs = {p: v for p, v in self.arguments(given) if p in self.hop_params}
        if self.hop.name() == MUTATION:
            self.hop(kwargs=kwargs, **self.hop_kwargs)
            return None
        out = self.hop(kwargs=kwargs, tensors_to_clone=list(self.clones), **self.hop_kwargs)
        return tuple(out[p] for p in self.returns)

    def __str__(self) -> str:
        return f"{USER_KERNEL} {self.name}"


def _launch_size(v: Any) -> Any:
    """A grid extent or number argument as the program writes it (a shape family's size as
    its expression); None when it is neither."""
    if isinstance(v, bool) or v is None or isinstance(v, (int, float, str)):
        return v
    if isinstance(v, torch.SymInt):
        return as_size(v)
    return v if is_symbolic(v) else None


def user_kernel_call(target: Any, kwargs: dict[str, Any], val: Any) -> UserKernelCall:
    """The call a user-kernel op of the ATen graph stands for (its kwargs with kiln nodes for
    tensors); never raises: what kiln cannot launch carries its reason."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    kernel = kernel_side_table.get_kernel(kwargs["kernel_idx"])
    constants = dict(kernel_side_table.get_constant_args(kwargs["constant_args_idx"]))
    call_kwargs = dict(kwargs["kwargs"])
    tensor_params = tuple(p for p, v in call_kwargs.items() if isinstance(v, Node))
    literals = {p: v for p, v in call_kwargs.items() if not isinstance(v, Node)}
    literals.update(constants)
    arg_order = tuple(call_kwargs) + tuple(p for p in constants if p not in call_kwargs)
    functional = target.name() == FUNCTIONAL
    clones = tuple(kwargs.get("tensors_to_clone", ())) if functional else ()
    returns = tuple(p for p in clones if isinstance(val, dict) and p in val) if functional else ()
    hop_kwargs = {k: kwargs[k] for k in _HOP_ARGUMENTS}
    grids = list(kwargs["grid"])
    name, digest = kernel_identity(kernel) if _is_jit(kernel) else (type(kernel).__name__, "")
    call = UserKernelCall(
        target,
        kernel,
        name,
        digest,
        tuple(grids[0]) if grids else (),
        arg_order,
        tensor_params,
        literals,
        clones,
        returns,
        hop_kwargs,
        tuple(call_kwargs),
    )
    call.reason = _why_not_launched(call, grids, kwargs)
    if call.reason is None:
        from kiln.runtime import user_kernels

        user_kernels.remember(kernel)  # what this process's programs launch
        call.grid = tuple(_launch_size(g) for g in call.grid)
        call.literals = {p: as_size(v) if isinstance(v, torch.SymInt) else v for p, v in literals.items()}
    return call


def _why_not_launched(call: UserKernelCall, grids: list, kwargs: dict) -> str | None:
    """Why the host program does not launch this call itself; None when it does."""
    if call.hop.name() == MUTATION:
        return "a user's Triton kernel writing its arguments in place (an unfunctionalized graph)"
    if not _is_jit(call.kernel):
        kind = type(call.kernel).__name__
        return f"a user's Triton kernel wrapped in {kind} (configs chosen at run time) runs as Dynamo's graph"
    if len(grids) != 1:
        return "a user's Triton kernel with several grids (one per config) runs as Dynamo's graph"
    if kwargs.get("tma_descriptor_metadata"):
        return "a user's Triton kernel taking TMA descriptors runs as Dynamo's graph"
    # other objects (a Triton dtype) become the program's constants; tensors must be arguments
    nested = [p for p, v in call.literals.items() if _holds_tensors(v)]
    if nested or any(_launch_size(g) is None for g in call.grid):
        return f"a user's Triton kernel with arguments kiln cannot pass ({', '.join(nested) or 'grid'})"
    return None


def _is_jit(kernel: Any) -> bool:
    from triton.runtime.jit import JITFunction

    return isinstance(kernel, JITFunction)


def _holds_tensors(v: Any) -> bool:
    return any(isinstance(x, (Node, torch.Tensor)) for x in tree_flatten(v)[0])


def cache_text_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The op's kwargs as the graph cache's key names them: the kernel by its name and source
    digest, the side table's constant arguments by value (its indices are per process).
    LookupError when no import re-finds the kernel."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    kernel = kernel_side_table.get_kernel(kwargs["kernel_idx"])
    if not _is_jit(kernel):
        raise LookupError(f"a user's Triton kernel of type {type(kernel).__name__}")
    name, digest = kernel_identity(kernel)
    find_user_kernel(name, digest)
    out = dict(kwargs)
    out["kernel_idx"] = f"{name}@{digest}"
    out["constant_args_idx"] = dict(kernel_side_table.get_constant_args(kwargs["constant_args_idx"]))
    return out
