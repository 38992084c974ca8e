"""Which size symbols of a shape family's graph may be padded: run at a larger size, then cut.

A graph may be run with a size symbol s raised to a bucket b >= s (each input grown along the
dimensions of size s, the grown part filled with anything) and its outputs cut back to s, where
every element at a real position comes out as it would at s. That holds when no op mixes the
positions along s: element-wise ops, reductions and matmuls over other dimensions, views,
gathers from tables of fixed size, scans along s (a real position reads only earlier ones),
causal attention whose queries and keys both have length s. It holds too for ops that do mix
positions along s once the grown part is masked (frontend/padding_masks.py): a reduction along
s (sum, mean, max, min, prod, any, all, softmax's parts), a matmul summing over s, attention
over s keys, and s itself used as a value, each of which reads s's real value at run time. It
fails for a slice or concatenation along s, a variance along s, an expression of s used as a
value and any op this module does not know, each of which rejects the symbols it touches.

Views complicate the "position": a view of [8, s, 1024] as [8*s, 1024] spreads the real rows of
the padded tensor over its first dimension. So each dimension is tracked as the ordered factors
it was built from, outer first: (8, s) there. Two operands of an element-wise op agree only if
their dimensions have the same factors in the same order; a view that would split a symbol's
factor rejects it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.fx as fx

aten = torch.ops.aten

Dim = tuple  # the factors of one dimension, outer first: ints and size symbols (() for size 1)


class _Mixes(Exception):
    """An op mixes positions along the size symbols it names."""

    def __init__(self, symbols: set, reason: str):
        super().__init__(reason)
        self.symbols, self.reason = symbols, reason


@dataclass
class _Value:
    dims: list[Dim]
    uniform: bool = False  # every element is the same value (zeros, full): agrees with any factors


@dataclass(frozen=True)
class Mask:
    """Where a padded size's grown part must be masked: node's tensor operand (an index into
    its args, or "attn_mask") along dim, or, with dim None, the operand that is the size itself
    (its real value is taken instead)."""

    node: fx.Node
    operand: int | str
    dim: int | None
    symbol: sympy.Symbol


@dataclass
class PaddingPlan:
    """What a family's graph allows: `padded` maps each symbol that may be padded to where its
    value is read (input position, dimension or None for an int input), `bound` does so for
    every symbol; `refused` says why the others may not; `outputs` holds each tensor output's
    factors, to cut it back."""

    padded: dict[sympy.Symbol, tuple[int, int | None]] = field(default_factory=dict)
    bound: dict[sympy.Symbol, tuple[int, int | None]] = field(default_factory=dict)  # every symbol's
    refused: dict[str, str] = field(default_factory=dict)
    inputs: list[Any] = field(default_factory=list)  # per input: tensor sizes or int, as sympy
    outputs: list[list[Dim] | None] = field(default_factory=list)
    masks: list[Mask] = field(default_factory=list)
    device: Any = None  # where the masked graph takes the real sizes (padding_masks.py)

    @property
    def masked(self) -> list[sympy.Symbol]:
        """The symbols whose real values the masked graph takes, in its last input's order."""
        return sorted({m.symbol for m in self.masks}, key=str)

    def unpad(self, reason: str) -> None:
        """Pad nothing, for reason."""
        self.refused.update({str(s): reason for s in self.padded})
        self.padded, self.masks = {}, []

    def text(self) -> str:
        masked = set(self.masked)
        parts = [f"{s} may be padded" + (" (reductions along it masked)" if s in masked else "")
                 for s in self.padded]
        parts += [f"{s} not: {why}" for s, why in self.refused.items()]
        return "; ".join(parts) or "no size symbols"


def _expr(size: Any) -> sympy.Expr:
    return size.node.expr if isinstance(size, (torch.SymInt, torch.SymFloat)) else sympy.Integer(int(size))


def _free(values: Any, padded: set) -> set:
    """The padded symbols among a value's factors or a size expression's free symbols."""
    found: set = set()
    for v in values if isinstance(values, (list, tuple)) else [values]:
        if isinstance(v, (list, tuple)):
            found |= _free(v, padded)
        elif isinstance(v, sympy.Basic):
            found |= v.free_symbols & padded
    return found


def _dim_of(size: Any, padded: set) -> Dim:
    """The factors of a dimension made from its size alone (an input's, a factory's)."""
    e = _expr(size)
    if e == 1:
        return ()
    if e.is_Integer or e.is_Symbol:
        return (e,)
    if isinstance(e, sympy.Mul) and all(a.is_Integer or a.is_Symbol for a in e.args):
        if len(e.free_symbols & padded) > 1:  # the order of two padded factors is unknown
            raise _Mixes(e.free_symbols & padded, f"a dimension of size {e} is not a view's")
        return tuple(a for a in e.args)  # sympy's order: any agrees for one padded factor at most
    if e.free_symbols & padded:
        raise _Mixes(e.free_symbols & padded, f"a dimension of size {e}")
    return (e,)


def _canonical(dim: Dim) -> Dim:
    """Adjacent constant factors multiplied out, size-1 factors dropped."""
    out: list = []
    for f in dim:
        if f == 1:
            continue
        if out and f.is_Integer and out[-1].is_Integer:
            out[-1] = out[-1] * f
        else:
            out.append(f)
    return tuple(out)


def _reshape(dims: list[Dim], sizes: list[Any], padded: set) -> list[Dim]:
    """The factors of a view of `dims` as `sizes`: each new dimension takes whole factors in
    order, splitting only constant ones."""
    factors = [f for d in dims for f in d]
    out: list[Dim] = []
    for size in sizes:
        want, got = _expr(size), []
        product = sympy.Integer(1)
        while sympy.simplify(product - want) != 0:
            if not factors:
                raise _Mixes(_free(dims, padded), f"a view to a size of {want}")
            f = factors.pop(0)
            rest = sympy.simplify(want / product)
            quotient = sympy.simplify(rest / f)
            if sympy.fraction(quotient)[1] == 1:
                got.append(f)
                product = product * f
            elif f.is_Integer and rest.is_Integer and int(f) % int(rest) == 0:
                got.append(rest)
                factors.insert(0, sympy.Integer(int(f) // int(rest)))
                product = product * rest
            else:
                raise _Mixes(_free([f], padded) | _free(dims, padded), f"a view splits a dimension of {f}")
        out.append(_canonical(tuple(got)))
    if any(f != 1 for f in factors):
        raise _Mixes(_free(dims, padded), "a view of unequal size")
    return out


def _broadcast(values: list[_Value], rank: int, padded: set, what: str) -> list[Dim]:
    """The dimensions of an element-wise op's result; its operands must agree where they
    carry padded factors."""
    out: list[Dim] = [()] * rank
    for pos in range(1, rank + 1):
        found: Dim | None = None
        for v in values:
            if v.uniform or pos > len(v.dims) or v.dims[-pos] == ():
                continue
            d = v.dims[-pos]
            if found is None:
                found = d
            elif d != found and _free([d, found], padded):
                raise _Mixes(_free([d, found], padded), f"{what} pairs dimensions {found} and {d}")
        out[-pos] = found if found is not None else ()
    return out


def _dims_arg(arg: Any, rank: int) -> list[int]:
    if arg is None or arg == []:
        return list(range(rank))
    return [d % max(rank, 1) for d in ([arg] if isinstance(arg, int) else arg)]


_SAME_SHAPE = {aten.clone.default, aten.alias.default, aten._to_copy.default, aten.detach.default,
               aten.contiguous.default, aten.lift_fresh_copy.default}
_UNIFORM_LIKE = {aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default,
                 aten.full_like.default, aten.scalar_tensor.default}
_FACTORIES = {aten.zeros.default, aten.ones.default, aten.empty.memory_format, aten.full.default,
              aten.empty_strided.default, aten.new_zeros.default, aten.new_ones.default,
              aten.new_empty.default, aten.new_full.default, aten.new_empty_strided.default}
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
          aten.flatten.using_ints, aten.unflatten.int}
# reductions and scans along `dim` (argument 1), whose result drops it (keepdim: size 1) or
# keeps the input's shape
_REDUCE = {aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default,
           aten.prod.dim_int, aten.var.correction, aten.var_mean.correction, aten.std.correction,
           aten.argmax.default, aten.argmin.default, aten.max.dim, aten.min.dim, aten.any.dim,
           aten.all.dim, aten.logsumexp.default, aten.sum.default, aten.mean.default,
           aten.max.default, aten.min.default, aten.any.default}
_ALONG = {aten._softmax.default, aten._log_softmax.default, aten.cumsum.default,
          aten.cumprod.default, aten.sort.default}
_SCANS = {aten.cumsum.default, aten.cumprod.default}  # a real position reads only earlier ones
_FLAT_INDEX = {aten.argmax.default, aten.argmin.default}  # without a dim: an index into the padded shape
LOWEST, HIGHEST = "lowest", "highest"
# what a reduction's operand holds in its grown part so that the reduction ignores it
MASK_FILL = {
    **{op: 0 for op in (aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default,
                        aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default)},
    **{op: LOWEST for op in (aten.amax.default, aten.max.default, aten.max.dim, aten.argmax.default,
                              aten.logsumexp.default, aten._softmax.default, aten._log_softmax.default)},
    **{op: HIGHEST for op in (aten.amin.default, aten.min.default, aten.min.dim, aten.argmin.default)},
    aten.prod.dim_int: 1, aten.any.dim: False, aten.any.default: False, aten.all.dim: True,
}
# arguments that are sizes, not values: symbols there shape the result instead of entering it
_SIZE_ARGS = _VIEWS | _FACTORIES | {aten.expand.default, aten.arange.default, aten.arange.start,
                                    aten.arange.start_step, aten.slice.Tensor}


class _Analysis:
    def __init__(self, gm: fx.GraphModule, padded: set):
        self.gm, self.padded = gm, padded
        self.values: dict[fx.Node, Any] = {}
        self.masks: list[Mask] = []

    def mask(self, n: fx.Node, operand: int | str, v: "_Value", dims: list[int]) -> None:
        """Mask operand's grown part along each of dims that is a padded size alone."""
        for d in dims:
            touched = _free([v.dims[d]], self.padded)
            if not touched:
                continue
            if len(v.dims[d]) != 1:
                raise _Mixes(touched, f"{_name(n)} mixes positions along a dimension of {v.dims[d]}")
            self.masks.append(Mask(n, operand, d, v.dims[d][0]))

    def value(self, a: Any) -> Any:
        return self.values.get(a) if isinstance(a, fx.Node) else None

    def run(self) -> list[list[Dim] | None]:
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                v = n.meta.get("val")
                if isinstance(v, torch.Tensor):
                    self.values[n] = _Value([_single(s, self.padded) for s in v.shape])
            elif n.op == "call_function":
                self.values[n] = self.call(n)
            elif n.op == "output":
                return self.outputs(n)
        return []

    def outputs(self, n: fx.Node) -> list[list[Dim] | None]:
        out = []
        for a in n.args[0] if isinstance(n.args[0], (list, tuple)) else [n.args[0]]:
            v = self.value(a)
            if isinstance(v, _Value):
                out.append(v.dims)
            else:
                val = a.meta.get("val") if isinstance(a, fx.Node) else a
                if isinstance(val, (torch.SymInt, torch.SymFloat)) and _free(_expr(val), self.padded):
                    raise _Mixes(_free(_expr(val), self.padded), "the graph returns a size")
                out.append(None)
        return out

    def call(self, n: fx.Node) -> Any:
        target = n.target
        out = n.meta.get("val")
        if target is operator.getitem:
            v = self.value(n.args[0])
            return v[n.args[1]] if isinstance(v, tuple) else None
        if not _tensors(out):
            return None  # sizes and their arithmetic: checked where a tensor op takes them
        pointwise = isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags
        if target not in _SIZE_ARGS:
            for i, a in enumerate([*n.args, *n.kwargs.values()]):
                for x in a if isinstance(a, (list, tuple)) else [a]:
                    val = x.meta.get("val") if isinstance(x, fx.Node) else x
                    symbolic = isinstance(val, (torch.SymInt, torch.SymFloat))
                    if not symbolic or not _free(_expr(val), self.padded):
                        continue
                    if pointwise and x is a and i < len(n.args) and _takes_tensor(target, i) \
                            and _expr(val) in self.padded:
                        self.masks.append(Mask(n, i, None, _expr(val)))  # the real size instead
                    else:
                        raise _Mixes(_free(_expr(val), self.padded), f"{_name(n)} takes a size as a value")
        args = [self.value(a) for a in n.args]
        handler = _HANDLERS.get(target)
        if handler is None and pointwise:
            handler = _pointwise
        if handler is None:
            touched = _free([v.dims for v in args if isinstance(v, _Value)], self.padded)
            touched |= _free([[_expr(s) for s in t.shape] for t in _tensors(out)], self.padded)
            if touched:
                raise _Mixes(touched, f"{_name(n)} is not known to keep positions apart")
            return _opaque(out, self.padded)
        return handler(self, n, args, out)


def _name(n: fx.Node) -> str:
    return f"{getattr(n.target, '__name__', n.target)} ({n.name})"


def _takes_tensor(target: Any, i: int) -> bool:
    """Whether an op's argument i is declared a tensor (a size there may become one)."""
    arguments = target._schema.arguments
    return i < len(arguments) and isinstance(arguments[i].type, torch.TensorType)


def argument(n: fx.Node, name: str) -> Any:
    """An op's argument by its schema name, its default where the call leaves it out."""
    for i, a in enumerate(n.target._schema.arguments):
        if a.name == name:
            if i < len(n.args) and not a.kwarg_only:
                return n.args[i]
            return n.kwargs.get(name, a.default_value if a.has_default_value() else None)
    return None


def _tensors(out: Any) -> list[torch.Tensor]:
    return [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]


def _single(size: Any, padded: set) -> Dim:
    e = _expr(size)
    if e.free_symbols & padded and not e.is_Symbol:
        raise _Mixes(e.free_symbols & padded, f"an input dimension of size {e}")
    return () if e == 1 else (e,)


def _opaque(out: Any, padded: set) -> Any:
    if isinstance(out, torch.Tensor):
        return _Value([_dim_of(s, padded) for s in out.shape])
    return tuple(_opaque(o, padded) if isinstance(o, torch.Tensor) else None for o in out)


def _pointwise(an: _Analysis, n: fx.Node, args: list, out: Any) -> _Value:
    operands = [v for v in [*args, *(an.value(a) for a in n.kwargs.values())] if isinstance(v, _Value)]
    for a in n.args:  # where's a list of tensors, in some ops
        if isinstance(a, (list, tuple)):
            operands += [an.value(x) for x in a if isinstance(an.value(x), _Value)]
    rank = out.dim()
    if not operands:
        return _Value([_dim_of(s, an.padded) for s in out.shape], uniform=True)
    dims = _broadcast(operands, rank, an.padded, _name(n))
    for i, s in enumerate(out.shape):  # a size-1 operand dimension broadcast to a real size
        if dims[i] == () and _expr(s) != 1:
            dims[i] = _dim_of(s, an.padded)
    return _Value(dims, uniform=all(v.uniform for v in operands))


def _same(an: _Analysis, n: fx.Node, args: list, out: Any) -> Any:
    return args[0]


def _uniform(an: _Analysis, n: fx.Node, args: list, out: Any) -> _Value:
    fill = {aten.full.default: 1, aten.new_full.default: 2}.get(n.target)
    value = n.args[fill] if fill is not None and len(n.args) > fill else None
    value = value.meta.get("val") if isinstance(value, fx.Node) else value
    if isinstance(value, (torch.SymInt, torch.SymFloat)) and _free(_expr(value), an.padded):
        raise _Mixes(_free(_expr(value), an.padded), f"{_name(n)} fills with a size")
    return _Value([_dim_of(s, an.padded) for s in out.shape], uniform=True)


def _arange(an: _Analysis, n: fx.Node, args: list, out: Any) -> _Value:
    if n.target is not aten.arange.default:
        start = n.args[0]
        if _free(_expr(start.meta["val"] if isinstance(start, fx.Node) else start), an.padded):
            raise _Mixes(_free(_expr(start.meta["val"]), an.padded), "arange starts at a size")
    return _Value([_dim_of(s, an.padded) for s in out.shape])


def _view(an: _Analysis, n: fx.Node, args: list, out: Any) -> _Value:
    v = args[0]
    return _Value(_reshape(v.dims, list(out.shape), an.padded), uniform=v.uniform)


def _expand(an: _Analysis, n: fx.Node, args: list, out: Any) -> _Value:
    v = args[0]
    lead = out.dim() - len(v.dims)
    dims = [_dim_of(s, an.padded) for s in out.shape[:lead]]
    for d, s in zip(v.dims, out.shape[lead:]):
        dims.append(d if d != () or _expr(s) == 1 else _dim_of(s, an.padded))
    return _Value(dims, uniform=v.uniform)


def _permute(an: _Analysis, n: fx.Node, args: list, out: Any) -> _Value:
    v, rank = args[0], len(args[0].dims)
    if n.target is aten.permute.default:
        order = [d % rank for d in n.args[1]]
    else:
        order = list(range(rank))
        if rank >= 2:
            a, b = (0, 1) if n.target is aten.t.default else (n.args[1] % rank, n.args[2] % rank)
            order[a], order[b] = order[b], order[a]
    return _Value([v.dims[d] for d in order], uniform=v.uniform)


def _reduce(an: _Analysis, n: fx.Node, args: list, out: Any) -> Any:
    v = args[0]
    rank = len(v.dims)
    along = _dims_arg(n.args[1] if len(n.args) > 1 else n.kwargs.get("dim"), rank)
    if n.target in _ALONG:
        along = _dims_arg(n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", -1), rank)
    touched = _free([v.dims[d] for d in along], an.padded)
    if touched and n.target not in _SCANS:
        flat_index = n.target in _FLAT_INDEX and argument(n, "dim") is None and rank > 1
        if n.target not in MASK_FILL or flat_index:
            raise _Mixes(touched, f"{_name(n)} reduces along a padded dimension")
        an.mask(n, 0, v, along)
    if n.target in _ALONG:
        result = _Value(list(v.dims))
    else:
        keep = [d for d in range(rank) if d not in along]
        kept_dims = [v.dims[d] for d in keep]

        def shaped(t: torch.Tensor) -> _Value:
            if t.dim() == rank:  # keepdim
                return _Value([v.dims[d] if d in keep else () for d in range(rank)])
            if t.dim() == len(kept_dims):
                return _Value(kept_dims)
            return _Value([_dim_of(s, an.padded) for s in t.shape])
        if isinstance(out, torch.Tensor):
            return shaped(out)
        return tuple(shaped(t) if isinstance(t, torch.Tensor) else None for t in out)
    if isinstance(out, torch.Tensor):
        return result
    return tuple(result if isinstance(t, torch.Tensor) else None for t in out)


def _matmul(an: _Analysis, n: fx.Node, args: list, out: Any) -> _Value:
    operands = args[1:] if n.target in (aten.addmm.default, aten.baddbmm.default) else args
    a, b = operands[0], operands[1]
    inner = _free([a.dims[-1], b.dims[-2]], an.padded)
    if inner:
        if a.dims[-1] != b.dims[-2]:
            raise _Mixes(inner, f"{_name(n)} sums over a padded dimension")
        first = 1 if n.target in (aten.addmm.default, aten.baddbmm.default) else 0
        an.mask(n, first, a, [len(a.dims) - 1])
        an.mask(n, first + 1, b, [len(b.dims) - 2])
    batch = _broadcast([_Value(a.dims[:-2]), _Value(b.dims[:-2])], len(a.dims) - 2, an.padded, _name(n))
    dims = [*batch, a.dims[-2], b.dims[-1]]
    if n.target in (aten.addmm.default, aten.baddbmm.default) and isinstance(args[0], _Value):
        dims = _broadcast([args[0], _Value(dims)], len(dims), an.padded, _name(n))
    return _Value(dims)


def _slice(an: _Analysis, n: fx.Node, args: list, out: Any) -> _Value:
    v = args[0]
    dim = (n.args[1] if len(n.args) > 1 else 0) % len(v.dims)
    inp = n.args[0].meta["val"]
    if _free(v.dims[dim], an.padded):
        start = n.args[2] if len(n.args) > 2 else 0
        if _expr(out.shape[dim]) != _expr(inp.shape[dim]) or start not in (0, None):
            raise _Mixes(_free(v.dims[dim], an.padded), f"{_name(n)} cuts a padded dimension")
        return v
    dims = list(v.dims)
    dims[dim] = _dim_of(out.shape[dim], an.padded)
    return _Value(dims, uniform=v.uniform)


def _select(an: _Analysis, n: fx.Node, args: list, out: Any) -> _Value:
    v = args[0]
    dim = n.args[1] % len(v.dims)
    if _free(v.dims[dim], an.padded):
        index = n.args[2]
        size = n.args[0].meta["val"].shape[dim]
        if len(v.dims[dim]) != 1 or not isinstance(index, int) or not 0 <= index < _least(size):
            raise _Mixes(_free(v.dims[dim], an.padded), f"{_name(n)} picks from a padded dimension")
        # a position below the size's least value is real at every size (a pooler's first token)
    return _Value(v.dims[:dim] + v.dims[dim + 1:], uniform=v.uniform)


def _least(size: Any) -> int:
    """The least value a size may take under the shape environment's ranges (0 if unknown)."""
    if not isinstance(size, torch.SymInt):
        return int(size)
    try:
        return int(size.node.shape_env.bound_sympy(size.node.expr).lower)
    except Exception:  # noqa: BLE001 - no range known: assume nothing
        return 0


def _cat(an: _Analysis, n: fx.Node, args: list, out: Any) -> _Value:
    dim = (n.args[1] if len(n.args) > 1 else 0) % out.dim()
    legacy_empty = [x for x in n.args[0] if tuple(x.meta["val"].shape) == (0,)]  # cat skips them
    parts = [an.value(x) for x in n.args[0] if x not in legacy_empty]
    if len(parts) == 1 and isinstance(parts[0], _Value):  # a key cache's first step
        return parts[0]
    parts = [p for p in parts if isinstance(p, _Value) and len(p.dims) == out.dim()]
    touched = _free([p.dims[dim] for p in parts], an.padded)
    if touched:
        raise _Mixes(touched, f"{_name(n)} joins along a padded dimension")
    others = [_Value(p.dims[:dim] + p.dims[dim + 1:], p.uniform) for p in parts]
    dims = _broadcast(others, out.dim() - 1, an.padded, _name(n))
    return _Value(dims[:dim] + [_dim_of(out.shape[dim], an.padded)] + dims[dim:])


def _embedding(an: _Analysis, n: fx.Node, args: list, out: Any) -> _Value:
    table, index = args[0], args[1]
    if _free(table.dims, an.padded):
        raise _Mixes(_free(table.dims, an.padded), f"{_name(n)} reads a table of padded size")
    return _Value([*index.dims, table.dims[-1]])


def _index_select(an: _Analysis, n: fx.Node, args: list, out: Any) -> _Value:
    v, dim, index = args[0], n.args[1] % len(args[0].dims), args[2]
    if _free(v.dims[dim], an.padded):
        raise _Mixes(_free(v.dims[dim], an.padded), f"{_name(n)} picks from a padded dimension")
    return _Value(v.dims[:dim] + [index.dims[0] if index.dims else ()] + v.dims[dim + 1:])


def _split(an: _Analysis, n: fx.Node, args: list, out: Any) -> tuple:
    v = args[0]
    dim = (n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)) % len(v.dims)
    if _free(v.dims[dim], an.padded):
        raise _Mixes(_free(v.dims[dim], an.padded), f"{_name(n)} cuts a padded dimension")
    return tuple(_Value(v.dims[:dim] + [_dim_of(t.shape[dim], an.padded)] + v.dims[dim + 1:], v.uniform)
                 for t in out)


def _gather(an: _Analysis, n: fx.Node, args: list, out: Any) -> _Value:
    """out[..., i, ...] = x[..., index[..., i, ...], ...] along dim: a table of fixed size along
    dim keeps the index's positions."""
    v, index = args[0], args[2]
    dim = n.args[1] % max(len(v.dims), 1)
    if _free(v.dims[dim], an.padded):
        raise _Mixes(_free(v.dims[dim], an.padded), f"{_name(n)} picks from a padded dimension")
    others = [_Value(x.dims[:dim] + x.dims[dim + 1:]) for x in (v, index)]
    _broadcast(others, len(index.dims) - 1, an.padded, _name(n))
    return _Value(list(index.dims))


def _native_layer_norm(an: _Analysis, n: fx.Node, args: list, out: Any) -> tuple:
    v, normalized = args[0], len(n.args[1])
    lead = len(v.dims) - normalized
    affine = [a.dims for a in args[2:4] if isinstance(a, _Value)]
    touched = _free(v.dims[lead:], an.padded) | _free(affine, an.padded)
    if touched:
        raise _Mixes(touched, f"{_name(n)} normalizes over a padded dimension")
    stats = _Value(v.dims[:lead] + [()] * normalized)
    return (_Value(list(v.dims)), stats, stats)


MASKABLE_ATTENTION = {aten.scaled_dot_product_attention.default,
                       aten._scaled_dot_product_flash_attention_for_cpu.default}  # take attn_mask
_ATTENTION = {aten.scaled_dot_product_attention.default, aten._scaled_dot_product_flash_attention.default,
              aten._scaled_dot_product_efficient_attention.default,
              aten._scaled_dot_product_cudnn_attention.default,
              aten._scaled_dot_product_flash_attention_for_cpu.default}


def attention_mask(n: fx.Node) -> Any:
    """An attention op's mask or bias argument (None where it has none)."""
    return argument(n, "attn_mask") if n.target in MASKABLE_ATTENTION else argument(n, "attn_bias")


def _attention(an: _Analysis, n: fx.Node, args: list, out: Any) -> Any:
    """Attention keeps query positions apart. Its keys mix: padded keys are masked (through
    attn_mask, where the op takes a mask of any shape), or need no mask when attention is causal
    and queries and keys are the same positions (a real query sees only earlier keys)."""
    q, k, v = args[0], args[1], args[2]
    mask = an.value(attention_mask(n))
    touched = _free([q.dims, k.dims, v.dims, mask.dims if mask else []], an.padded)
    if touched and argument(n, "dropout_p"):
        raise _Mixes(touched, f"{_name(n)} draws random numbers by position")
    if _free([q.dims[-1], k.dims[-1]], an.padded):
        raise _Mixes(_free([q.dims[-1], k.dims[-1]], an.padded), f"{_name(n)} sums over a padded dimension")
    batch = _broadcast([_Value(x.dims[:-2]) for x in (q, k, v)], len(q.dims) - 2, an.padded, _name(n))
    queries, keys = q.dims[-2], k.dims[-2]
    if v.dims[-2] != keys and _free([keys, v.dims[-2]], an.padded):
        raise _Mixes(_free([keys, v.dims[-2]], an.padded),
                     f"{_name(n)} pairs keys {keys} with values {v.dims[-2]}")
    if mask is not None:
        _broadcast([mask, _Value([*batch, queries, keys])], len(batch) + 2, an.padded, _name(n))
    if _free([keys], an.padded):
        if argument(n, "is_causal"):
            if queries != keys:
                raise _Mixes(_free([keys], an.padded), f"{_name(n)} is causal over keys of other positions")
        elif n.target in MASKABLE_ATTENTION or all(u.target is operator.getitem and u.args[1] == 0
                                                   for u in n.users):
            an.mask(n, "attn_mask", k, [len(k.dims) - 2])  # a fused op without a mask becomes one with
        else:
            raise _Mixes(_free([keys], an.padded), f"{_name(n)} attends over padded keys without a mask")
    result = _Value([*batch, queries, v.dims[-1]])
    if isinstance(out, torch.Tensor):
        return result
    rows = [_expr(s) for s in out[0].shape[:-1]]

    def shaped(i: int, t: Any) -> Any:  # output 0, then per query row (logsumexp), then the rest
        if not isinstance(t, torch.Tensor):
            return None
        if i == 0:
            return result
        return _Value([*batch, queries]) if [_expr(s) for s in t.shape] == rows else _opaque(t, an.padded)
    return tuple(shaped(i, t) for i, t in enumerate(out))


_HANDLERS = {
    **{op: _same for op in _SAME_SHAPE},
    **{op: _uniform for op in _UNIFORM_LIKE | _FACTORIES},
    **{op: _view for op in _VIEWS},
    **{op: _reduce for op in _REDUCE | _ALONG},
    aten.arange.default: _arange, aten.arange.start: _arange, aten.arange.start_step: _arange,
    aten.expand.default: _expand,
    aten.permute.default: _permute, aten.t.default: _permute, aten.transpose.int: _permute,
    aten.mm.default: _matmul, aten.bmm.default: _matmul, aten.addmm.default: _matmul,
    aten.baddbmm.default: _matmul,
    aten.slice.Tensor: _slice, aten.select.int: _select, aten.cat.default: _cat,
    aten.embedding.default: _embedding, aten.index_select.default: _index_select,
    aten.gather.default: _gather, aten.split_with_sizes.default: _split, aten.split.Tensor: _split,
    aten.native_layer_norm.default: _native_layer_norm,
    aten.copy.default: _pointwise,
    **{op: _attention for op in _ATTENTION},
}


def padding_plan(gm: fx.GraphModule, example_inputs: list[Any]) -> PaddingPlan:
    """Which of the graph's size symbols may be padded (see the module's rule)."""
    plan = PaddingPlan()
    bound: dict[sympy.Symbol, tuple[int, int | None]] = {}
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.SymInt):
            plan.inputs.append(_expr(x))
            if _expr(x).is_Symbol:
                bound.setdefault(_expr(x), (i, None))
        elif isinstance(x, torch.Tensor):
            plan.inputs.append([_expr(s) for s in x.shape])
            for d, s in enumerate(x.shape):
                if _expr(s).is_Symbol:
                    bound.setdefault(_expr(s), (i, d))
        else:
            plan.inputs.append(None)
    padded = set(bound)
    masks: list[Mask] = []
    while padded:  # each round refuses at least one symbol
        try:
            analysis = _Analysis(gm, padded)
            plan.outputs, masks = analysis.run(), analysis.masks
            break
        except _Mixes as e:
            refused = e.symbols & padded or set(padded)  # none of them named: give up on all
            plan.refused.update({str(s): e.reason for s in refused})
            padded -= refused
        except Exception as e:  # noqa: BLE001 - an op this module reads wrongly: pad nothing
            plan.refused.update({str(s): f"{type(e).__name__}: {e}" for s in padded})
            padded = set()
    for e in plan.inputs:  # an int input of a padded symbol's expression must be computed again
        if isinstance(e, sympy.Expr) and not e.is_Symbol and e.free_symbols & padded:
            for s in e.free_symbols & padded:
                plan.refused[str(s)] = f"an input is {e}"
            padded -= e.free_symbols
    plan.bound = bound
    plan.padded = {s: bound[s] for s in sorted(padded, key=str) if s in bound}
    plan.masks = [m for m in masks if m.symbol in plan.padded]
    return plan
