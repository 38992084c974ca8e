"""FX graph of ATen ops -> kiln tensor graph (level 1).

Each call is lowered through the registry; a call with no lowering, or whose lowering
declines, becomes an EXTERN node that runs the ATen op itself, with the reason kept.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten, tree_map

from kiln import errors
from kiln.frontend.effects import has_side_effects
from kiln.frontend.origin import origin_of
from kiln.frontend.random import SEED_OP, SEEDS_OP
from kiln.frontend.user_triton import LAUNCHED, UserKernelCall, is_user_kernel_op, user_kernel_call
from kiln.ir.sizes import NeedsNumber, as_size, known_eq, shape_env, size_call, symbols
from kiln.ir.tensor import ArgRef, Builder, Graph, GraphGrowthLimit, Layout, Node, Op
from kiln.lower.context import LowerCtx
from kiln.lower.core import WEAK_SCALAR, Unsupported, cast, constant, is_weak_scalar
from kiln.lower.registry import lookup
from kiln.options import env_debug
from kiln.passes.layout import ARG_STRIDES

aten = torch.ops.aten
# The most nodes one ATen call may lower to: a lowering that loops over a dimension's extent
# (unbind, split into many pieces) would otherwise unroll data-sized work into the source.
NODES_PER_OP_LIMIT = 1024
_HIGHER_ORDER = ("higher-order ops (scans, loops, conditionals) run in ATen until kiln lowers them: "
                 "traced, their bodies would be unrolled once per step")
_EFFECTFUL = "has side effects (an assert, a print, a mutation, a random draw, a wait): runs in ATen"
_INPUT_UPDATE = "an update of a graph input: its kernel writes it in place where that is safe"
_VENDOR = "runs in ATen by design: vendor BLAS/DNN kernels win here"
_SCATTER_ADD = ("runs in ATen by design: a sum into rows named by indices that repeat, which ATen's "
                "kernel sorts and adds row by row; kiln's kernels add without atomics")
_COLLECTIVE = "a collective or its wait: runs in the communication library (c10d), in program order"
EXTERN_BY_DESIGN = {op: _VENDOR for op in (
    aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default,
    aten.convolution.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default, aten.scaled_dot_product_attention.default,
)}
EXTERN_BY_DESIGN[aten.embedding_dense_backward.default] = _SCATTER_ADD
# a random op's seed is drawn by torch's generator, so that torch.manual_seed repeats a run
EXTERN_BY_DESIGN[SEED_OP] = EXTERN_BY_DESIGN[SEEDS_OP] = \
    "the seed of in-kernel random numbers is drawn from torch's generator"


def _layouts(val: Any) -> tuple:
    if isinstance(val, torch.Tensor):
        return (Layout(_sizes(val.shape), _sizes(val.stride()), val.dtype),)
    if isinstance(val, (tuple, list)):
        return tuple(_layouts(v)[0] if isinstance(v, torch.Tensor) else None for v in val)
    return (None,)


def _extern(b: Builder, target, args, kwargs, val, reason: str, effectful: bool = False,
            arg_strides: dict[Node, tuple[int, ...]] | None = None) -> Node:
    """An ATen call; arg_strides: eager's strides of its tensor arguments, which kiln hands it
    the same (a convolution given channels_last reads it without converting)."""
    inputs: list[Node] = []

    def ref(a):
        if isinstance(a, Node):
            inputs.append(a)
            return ArgRef(len(inputs) - 1)
        return a

    args_t = tree_map(ref, args)
    kwargs_t = tree_map(ref, kwargs)
    layouts = _layouts(val)
    single = isinstance(val, torch.Tensor)
    shape = _sizes(val.shape) if single else ()
    dtype = val.dtype if single else torch.float32
    attrs = (target, args_t, kwargs_t, layouts, reason, single)
    meta: dict = {"effectful": True} if effectful else {}
    wanted = {k: arg_strides[i] for k, i in enumerate(inputs) if i in (arg_strides or {})}
    if wanted:
        meta[ARG_STRIDES] = wanted
    return b.make(Op.EXTERN, tuple(inputs), attrs, shape, dtype, meta)


def _sizes(sizes) -> tuple:
    """Sizes of a traced value: ints, or expressions over the shape family's symbols."""
    return tuple(as_size(s) for s in sizes)


def _check(result: Node, val: torch.Tensor, b: Builder) -> Node:
    expected = _sizes(val.shape)
    if len(result.shape) != len(expected) or not all(
            a == b or known_eq(a, b) for a, b in zip(result.shape, expected)):
        raise Unsupported(f"lowering produced shape {result.shape}, ATen gives {expected}")
    return cast(b, result, val.dtype)


def graph_device(example_inputs: list[Any]) -> torch.device:
    """The device of a graph's tensors: the first tensor input's that is not a CPU scalar
    (see cpu_scalars), else the first tensor's; the CPU when none."""
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    for x in tensors:
        if not _is_cpu_scalar(x):
            return x.device
    return tensors[0].device if tensors else torch.device("cpu")


def _is_cpu_scalar(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dim() == 0


def cpu_scalars(example_inputs: list[Any]) -> list[int]:
    """The positions of a GPU graph's 0-d CPU tensor inputs, which eager's GPU ops take as
    scalars (Dynamo passes a module's float attribute so under dynamic=True)."""
    if graph_device(example_inputs).type == "cpu":
        return []
    return [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor) and _is_cpu_scalar(x)]


def import_graph(gm: fx.GraphModule, example_inputs: list[Any],
                 unsupported_fns: frozenset = frozenset()) -> tuple[Graph, dict[str, str]]:
    """Returns the tensor graph and, for each fallback op, why it was not lowered.
    Ops whose lowering needs an element-wise function in unsupported_fns (one the code
    generator cannot express) run in ATen."""
    b = Builder()
    env: dict[fx.Node, Any] = {}
    fallbacks: dict[str, str] = {}
    device = graph_device(example_inputs)
    position = 0
    size_inputs: list = []
    for n in gm.graph.nodes:
        b.origin = origin_of(n.meta) if n.op == "call_function" else None  # stamped on n's nodes
        if n.op == "placeholder":
            ex = example_inputs[position]
            if isinstance(ex, torch.Tensor):
                env[n] = b.make(Op.INPUT, (), (position, _sizes(ex.stride())), _sizes(ex.shape), ex.dtype)
            else:  # a number; a size of the shape family (a torch.SymInt) is its symbol
                env[n] = as_size(ex) if isinstance(ex, torch.SymInt) else ex
                if isinstance(ex, torch.SymInt):
                    size_inputs.append((position, env[n]))
            position += 1
        elif n.op == "get_attr":
            value = _fetch_attr(gm, n.target)
            # a subgraph (a scan's or a loop's body) is an argument of the ATen call running it
            env[n] = value if isinstance(value, fx.GraphModule) else _tensor_constant(b, value)
        elif n.op == "call_function":
            env[n] = _lower_call(b, n, env, fallbacks, unsupported_fns, device)
        elif n.op == "output":
            fx_outs = tree_flatten(n.args[0])[0]
            outs = [env[a] if isinstance(a, fx.Node) else a for a in fx_outs]
            if any(is_weak_scalar(o) for o in outs):
                raise Unsupported("the graph returns a number read from a tensor at run time")
            graph = b.finish(outs, position)
            graph.size_inputs = size_inputs  # where the program reads the family's sizes
            graph.output_strides = [
                _sizes(a.meta["val"].stride())
                if isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)
                else None
                for a in fx_outs
            ]
            # an FX node returned twice is one tensor in eager too: only its first return is fresh
            graph.output_fresh = [
                _returns_new_memory(a) and a not in fx_outs[:k] for k, a in enumerate(fx_outs)
            ]
            graph.output_storage = _output_storage(fx_outs)
            return graph, fallbacks
        else:
            raise Unsupported(f"FX node kind {n.op} is not handled")
    raise Unsupported("FX graph has no output")


def _returns_new_memory(a) -> bool:
    """Whether eager's output is fresh memory: not a graph input, not a view op's result."""
    if not isinstance(a, fx.Node) or a.op != "call_function":
        return False
    if a.target is operator.getitem:
        return _returns_new_memory(a.args[0])
    return not getattr(a.target, "is_view", False)


def _storage_owner(a):
    """The FX node whose result owns the memory eager's value a lives in, through views."""
    while isinstance(a, fx.Node) and a.op == "call_function":
        view = a.args[0] if a.target is operator.getitem else a
        if not isinstance(view, fx.Node) or not getattr(view.target, "is_view", False):
            return a
        a = view.args[0]
    return a


def _output_storage(fx_outs: list) -> list[int | None]:
    """For each output, the first output in the same memory, if an op of the graph owns it."""
    owners = [_storage_owner(a) for a in fx_outs]
    return [owners.index(o) if isinstance(o, fx.Node) and o.op == "call_function" else None for o in owners]


def _touches_complex(args, kwargs, val) -> bool:
    """Kernels have no complex types: an op reading or making complex values runs in ATen."""
    leaves = tree_flatten((args, kwargs, val))[0]
    return any(getattr(v, "dtype", None) in _COMPLEX for v in leaves if isinstance(v, (Node, torch.Tensor)))


_COMPLEX = (torch.complex32, torch.complex64, torch.complex128)


class _TensorConstant:
    """An ATen-side 'call' that yields a tensor constant of the graph (a fresh copy, so
    that a caller who gets it back as an output cannot change the graph's value)."""

    def __init__(self, value: torch.Tensor):
        self.value = value

    def __call__(self) -> torch.Tensor:
        return self.value.clone()

    def as_aten(self) -> tuple[Any, tuple]:
        """The same call as an ATen op and its arguments (how the host program writes it)."""
        return torch.ops.aten.clone.default, (self.value,)

    def __str__(self) -> str:
        return f"tensor_constant{list(self.value.shape)}"


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _tensor_constant(b: Builder, value: Any) -> Any:
    """A graph constant: a scalar tensor becomes a constant node, a larger one a buffer.
    The compiler runs under AOTAutograd's fake mode; the constant is a real tensor."""
    if not isinstance(value, torch.Tensor):
        raise Unsupported(f"graph attribute of type {type(value).__name__} is not handled")
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        value = value.detach()
        if value.dim() == 0 and not value.is_complex():
            return constant(b, value.item(), value.dtype)
        return _extern(b, _TensorConstant(value), (), {}, value, "tensor constant of the graph")


def _lower_call(
    b: Builder,
    n: fx.Node,
    env: dict,
    fallbacks: dict[str, str],
    unsupported_fns: frozenset = frozenset(),
    device: torch.device | None = None,
) -> Any:
    args = tree_map(lambda a: env[a] if isinstance(a, fx.Node) else a, n.args)
    kwargs = tree_map(lambda a: env[a] if isinstance(a, fx.Node) else a, n.kwargs)
    val = n.meta.get("val")
    if n.target is operator.getitem:
        src, k = args
        if isinstance(src, Node) and src.op is Op.EXTERN:
            if isinstance(src.attrs[0], UserKernelCall):  # its results, named by parameter
                k = src.attrs[0].returns.index(k)
            layout = src.attrs[3][k]
            return b.make(Op.ITEM, (src,), (k,), layout.shape, layout.dtype)
        return src[k]
    name = str(n.target)
    sized = size_call(n.target, args, kwargs)  # arithmetic on the shape family's sizes
    if sized is not None:
        return sized
    if n.target is aten._local_scalar_dense.default:
        return _scalar_read(b, args[0])
    if n.target in _NUMBER_OPS and any(is_weak_scalar(a) for a in args):
        return _number_op(b, _NUMBER_OPS[n.target], args)
    if is_user_kernel_op(n.target):
        return _user_kernel(b, n, kwargs, val, env, fallbacks)
    fn = lookup(n.target)
    reads_number = any(is_weak_scalar(v) for v in tree_flatten((args, kwargs))[0])
    reason = EXTERN_BY_DESIGN.get(n.target, "no kiln lowering for this op")
    effectful = has_side_effects(n)
    if effectful:  # kernels have no effects: it runs in ATen, where the program order puts it
        fn, reason = None, EXTERN_BY_DESIGN.get(n.target, _EFFECTFUL)
    by_design = n.target in EXTERN_BY_DESIGN or effectful
    # AOTAutograd's copy_ of an input's update: passes/in_place.py writes it in place or keeps it
    input_update = n.target is aten.copy_.default and isinstance(args[0], Node) and args[0].op is Op.INPUT
    if input_update:
        reason = _INPUT_UPDATE
    if isinstance(n.target, torch._ops.HigherOrderOperator):
        fn, reason, by_design = None, _HIGHER_ORDER, True
    if getattr(n.target, "namespace", None) == "_c10d_functional":
        fn, reason, by_design = None, _COLLECTIVE, True
    if fn is not None and _touches_complex(args, kwargs, val):
        fn, reason = None, "complex tensors are not lowered"
    if fn is not None:
        single = isinstance(val, torch.Tensor)
        ctx = LowerCtx(
            b, n.target, _sizes(val.shape) if single else None, val.dtype if single else None, n, device
        )
        try:
            first_new = len(b.nodes)
            b.limit_growth(NODES_PER_OP_LIMIT)
            result = fn(ctx, *args, **kwargs)
            missing = {m.fn for m in b.nodes[first_new:] if m.op is Op.POINTWISE} & unsupported_fns
            if missing:
                raise Unsupported(f"the code generator has no {', '.join(sorted(missing))}")
            if single:
                return _check(result, val, b)
            if isinstance(val, (tuple, list)) and isinstance(result, (tuple, list)):
                return tuple(_check(r, v, b) for r, v in zip(result, val))
            return result
        except (Unsupported, GraphGrowthLimit) as e:
            if shape_env() is not None:  # a family's lowering declined: per shape, where it may not
                raise NeedsNumber(f"{name}: {e}") from e
            reason = str(e)
        except Exception as e:  # a lowering bug must not break the user's program
            if isinstance(e, NeedsNumber) or shape_env() is not None:  # the graph compiles per shape
                raise NeedsNumber(f"{name}: {type(e).__name__}: {e}") from e
            if env_debug():
                raise
            if reads_number:  # the lowering may not expect a number known only at run time
                raise Unsupported(f"{name} takes a number read from a tensor at run time") from e
            reason = f"lowering failed: {type(e).__name__}: {e}"
            errors.record(errors.Fallback("op", "internal", reason, name))
        finally:
            b.limit_growth(None)
    if reads_number:  # an ATen call takes it as a number, not as the tensor it is here
        raise Unsupported(f"{name} runs in ATen and takes a number read from a tensor at run time")
    if input_update:
        return _extern(b, n.target, args, kwargs, val, reason, effectful, _eager_arg_strides(n, env))
    if name not in fallbacks and not reason.startswith("lowering failed"):
        kind = "by design" if by_design else "unsupported"
        errors.record(errors.Fallback("op", kind, reason, name))
    fallbacks[name] = reason
    return _extern(b, n.target, args, kwargs, val, reason, effectful, _eager_arg_strides(n, env))


def _user_kernel(b: Builder, n: fx.Node, kwargs: dict, val: Any, env: dict,
                 fallbacks: dict[str, str]) -> Node:
    """A user's Triton kernel: one call taking its tensors (in eager's strides, which the
    kernel's own indexing assumes) and returning the ones it may write."""
    call = user_kernel_call(n.target, kwargs, val)
    reason = call.reason or LAUNCHED
    # run as Dynamo's graph, the op takes numbers: a shape family's sizes are not yet numbers
    if call.reason is not None and symbols(call.hop_kwargs["grid"], list(call.literals.values())):
        raise NeedsNumber(f"{call}: {call.reason}")
    if call.reason is not None and str(call) not in fallbacks:
        errors.record(errors.Fallback("op", "unsupported", call.reason, str(call)))
    if call.reason is not None:
        fallbacks[str(call)] = call.reason
    tensors = tuple(kwargs["kwargs"][p] for p in call.tensor_params)
    results = tuple(val[p] for p in call.returns) if isinstance(val, dict) else None
    return _extern(b, call, tensors, {}, results, reason, call.reason is not None, _eager_arg_strides(n, env))


def _eager_arg_strides(n: fx.Node, env: dict) -> dict[Node, tuple[int, ...]]:
    """The strides eager hands the call for each tensor argument kiln computes."""
    out: dict[Node, tuple[int, ...]] = {}
    for a in tree_flatten((n.args, n.kwargs))[0]:
        val = a.meta.get("val") if isinstance(a, fx.Node) else None
        node = env.get(a) if isinstance(a, fx.Node) else None
        if isinstance(node, Node) and isinstance(val, torch.Tensor) and node not in out:
            out[node] = _sizes(val.stride())
    return out


def _scalar_read(b: Builder, tensor: Any) -> Node:
    """tensor.item(): with symbolic floats Dynamo passes a float as a 0-d tensor and reads it
    in the graph. The kernels load it; it promotes as the Python number it stands for."""
    if not isinstance(tensor, Node) or tensor.shape != ():
        raise Unsupported("item() of something other than a 0-d tensor input")
    return b.make(Op.VIEW, (tensor,), ((), (), 0), (), tensor.dtype, meta={WEAK_SCALAR: True})


# Python arithmetic on numbers read at run time (e.g. -s for a float argument s)
_NUMBER_OPS = {
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.truediv: "div",
    operator.neg: "neg",
}


def _number_op(b: Builder, fn: str, args: tuple) -> Node:
    """A number computed as Python does: in double precision, or in integers where all operands
    are integers (except true division); it promotes as a Python number too."""
    if not all(is_weak_scalar(a) or isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
        raise Unsupported(f"{fn} of a number read at run time and {args}")
    floats = fn == "div" or any(
        isinstance(a, float) or is_weak_scalar(a) and a.dtype.is_floating_point for a in args
    )
    dtype = torch.float64 if floats else torch.int64
    operands = tuple(cast(b, a, dtype) if isinstance(a, Node) else constant(b, a, dtype) for a in args)
    return b.make(Op.POINTWISE, operands, (fn,), (), dtype, meta={WEAK_SCALAR: True})
