"""Matmul templates: an ATen matmul whose product only an element-wise kernel reads becomes
one kernel (ir/matmul.py; Triton on GPUs, C++ on CPUs) that computes the product tile by tile
and applies that kernel's work (bias, activation, residual add, casts, scaling) before storing
anything, where passes/matmul_choice.py predicts it beats the library's matmul (cuBLAS, ATen's
oneDNN) plus the separate kernel. The product then never goes through memory.

A product qualifies when it is mm or addmm (alpha = beta = 1) of 2-D operands of one
floating dtype and of static sizes, and its first reader is a point-wise kernel of the
product's own domain that reads, at each point, its own element. Readers after that kernel
(kernels, ATen calls, outputs) read the product from its buffer, which the template then
stores too. Every matmul gets a Decision: the template, or the library and why.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kiln.ir import index as ix
from kiln.ir.group import is_group
from kiln.ir.kernel import Kernel, Load, Param, Stage, Store
from kiln.ir.matmul import MatmulKernel, Operand, is_matmul
from kiln.ir.sizes import is_symbolic
from kiln.ir.tensor import ArgRef, Node, Op
from kiln.options import env_debug
from kiln.passes.aten_cost import aten_cost
from kiln.passes.fusion import Decision, KernelPlan, Schedule
from kiln.passes.layout import node_label
from kiln.passes.matmul_choice import GPU_MATMUL, MatmulTarget, refuse_spilling
from kiln.passes.overlap import is_wait
from kiln.passes.roofline import Cost

aten = torch.ops.aten
MATMULS = (aten.mm.default, aten.addmm.default)
TEMPLATE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class _Matmul:
    node: Node
    a: Node
    b: Node
    bias: Node | None


def _as_matmul(node: Node, min_side: int) -> tuple[_Matmul | None, str]:
    """The operands of a matmul the template computes, or why not."""
    target, args, kwargs = node.attrs[0], node.attrs[1], node.attrs[2]
    if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
        return None, "addmm with alpha or beta other than 1"
    if not all(isinstance(a, ArgRef) for a in args):
        return None, "an operand that is not a tensor"
    tensors = [node.inputs[a.index] for a in args]
    bias, (a, b) = (tensors[0], tensors[1:]) if target is aten.addmm.default else (None, tensors)
    if node.dtype not in TEMPLATE_DTYPES or any(t.dtype != node.dtype for t in tensors):
        return None, f"dtype {node.dtype} (the template takes bf16, fp16 and fp32 operands of one dtype)"
    if any(is_symbolic(s) for t in tensors for s in t.shape):
        return None, "sizes of a shape family (the template is compiled for static sizes)"
    (m, k), n = a.shape, b.shape[1]
    if min(m, n, k) < min_side:
        return None, f"{m} x {n} x {k} has a side under {min_side}"
    if bias is not None and len(bias.shape) > 2:
        return None, "a bias of more than 2 dimensions"
    return _Matmul(node, a, b, bias), ""


def _operand(node: Node, shape: tuple[int, int], sched: Schedule, names, layouts, param: str):
    """(buffer, Operand) reading node as a matrix of shape (broadcast as eager broadcasts a
    bias), or None where its layout is not known as numbers."""
    alias = sched.aliases.get(node)
    if alias is not None:
        base, strides, offset = alias.base, alias.stride, alias.offset
    else:
        base, strides, offset = node, layouts(node), 0
    if strides is None or any(is_symbolic(s) for s in (*strides, offset)):
        return None
    sizes = tuple(node.shape)
    pad = 2 - len(sizes)
    sizes, strides = (1,) * pad + sizes, (0,) * pad + tuple(strides)
    stride = tuple(0 if size == 1 and full != 1 else st for size, full, st in zip(sizes, shape, strides))
    return names[base], Operand(param, int(offset), (int(stride[0]), int(stride[1])))


def _readers(product: str, node: Node, sched: Schedule, kernels, names) -> list:
    """The steps (kernel plans or ATen calls) and outputs that read the product's buffer."""
    found = []
    if any(o is node for o in sched.graph.outputs) or any(a.base is node for a in sched.aliases.values()):
        found.append("output")
    for step in sched.steps:
        if isinstance(step, KernelPlan):
            kern = kernels.get(id(step))
            if kern is not None and any(
                a == product and not p.is_output for a, p in zip(kern.args, kern.params)
            ):
                found.append(step)
        elif any((sched.aliases[i].base if i in sched.aliases else i) is node for i in step.inputs):
            found.append(step)
    return found


def _row_major(outer) -> ix.Expr:
    flat, stride = ix.as_expr(0), 1
    for s in reversed(outer):
        flat = flat + ix.as_expr(s) * stride
        stride *= s.extent
    return flat


def _epilogue(kern: Kernel, product: str, numel: int) -> tuple[str | None, str]:
    """The parameter by which a kernel reads the product as an epilogue can, or why not."""
    if is_group(kern) or is_matmul(kern) or kern.reduce or kern.scratch or kern.checks or kern.sizes:
        return None, "its reader is not a plain point-wise kernel"
    if any(is_symbolic(s.extent) for s in kern.outer) or kern.outer_numel != numel:
        return None, "its reader iterates another domain than the product's"
    params = [p.name for p, a in zip(kern.params, kern.args) if a == product]
    if len(params) != 1:
        return None, "its reader takes the product twice"
    flat = _row_major(kern.outer)
    for st in kern.stages:
        for s in st.body:
            if isinstance(s, Load) and s.buf == params[0] and (s.index != flat or s.mask is not None):
                return None, "its reader reads the product at other elements than its own"
            if isinstance(s, Store) and s.buf == params[0]:
                return None, "its reader writes the product"
    return params[0], ""


def _with_product_stored(epilogue: Kernel, param: str, product: str, layouts, node: Node) -> Kernel | None:
    """The epilogue also storing the product into its own buffer, in the ATen call's layout
    (later kernels, ATen calls or the outputs read it)."""
    strides, n = layouts(node), node.shape[1]
    if strides is None or any(is_symbolic(s) for s in strides):
        return None
    flat = _row_major(epilogue.outer)
    rows, cols = (
        (ix.as_expr(epilogue.outer[0]), ix.as_expr(epilogue.outer[1]))
        if len(epilogue.outer) == 2 and (epilogue.outer[1].extent == n)
        else (flat // n, flat % n)
    )
    stored = rows * strides[0] + cols * strides[1]
    dtype = node.dtype
    body = (Load("mm_product", param, flat, dtype), Store("mm_out", stored, "mm_product", dtype))
    stages = (Stage(False, body + epilogue.stages[0].body), *epilogue.stages[1:])
    return dataclasses.replace(
        epilogue,
        params=(*epilogue.params, Param("mm_out", dtype, True)),
        args=(*epilogue.args, product),
        stages=stages,
    )


def _first_epilogue(readers: list, sched: Schedule, kernels, product: str, node: Node):
    """(plan, parameter, whether the product is also stored) of the kernel that takes the
    product as its epilogue: its first reader, a point-wise kernel of its domain, when every
    other reader comes after it (or is an output); else (None, why, False)."""
    plans = [r for r in readers if isinstance(r, KernelPlan)]
    if not plans:
        return (
            None,
            f"{len(readers)} readers of the product, none a kernel" if readers else "nothing reads it",
            False,
        )
    order = {id(s): i for i, s in enumerate(sched.steps)}
    first = min(plans, key=lambda p: order[id(p)])
    if any(r != "output" and r is not first and order[id(r)] < order[id(first)] for r in readers):
        return None, "an ATen call reads the product before its first kernel does", False
    param, why = _epilogue(kernels[id(first)], product, node.numel)
    if param is None:
        return None, why, False
    return first, param, len(readers) > 1


def _waits_for_communication(epilogue: Kernel, mm: _Matmul, sched: Schedule, names) -> bool:
    """Whether the epilogue reads a collective's result that the matmul's operands do not:
    fused, the matmul would wait for the data instead of running while it travels."""
    waited = {names[s] for s in sched.steps if not isinstance(s, KernelPlan) and is_wait(s) and s in names}
    operands = {names.get(sched.aliases[n].base if n in sched.aliases else n) for n in (mm.a, mm.b)}
    return bool(waited & set(epilogue.args)) and not waited & operands


def _template(
    mm: _Matmul, epilogue: Kernel | None, param: str | None, product: str, sched, names, layouts
) -> MatmulKernel | None:
    """The MatmulKernel computing mm into epilogue (or, without one, storing the product)."""
    (m, k), n = mm.a.shape, mm.b.shape[1]
    if epilogue is None:  # the product stored as it is, in the ATen call's layout
        strides = layouts(mm.node)
        if strides is None or any(is_symbolic(s) for s in strides):
            return None
        x0, x1 = ix.Sym("x0", m), ix.Sym("x1", n)
        stored = ix.as_expr(x0) * strides[0] + ix.as_expr(x1) * strides[1]
        stages = (
            Stage(
                False,
                (
                    Load("t0", "product_in", _row_major((x0, x1)), mm.node.dtype),
                    Store("out0", stored, "t0", mm.node.dtype),
                ),
            ),
        )
        epilogue = Kernel(
            "kernel",
            (x0, x1),
            (),
            (Param("product_in", mm.node.dtype, False), Param("out0", mm.node.dtype, True)),
            stages,
            args=(product, product),
        )
        param = "product_in"
    operands = [("mat_a", mm.a, (m, k)), ("mat_b", mm.b, (k, n))]
    if mm.bias is not None:
        operands.append(("mat_bias", mm.bias, (m, n)))
    read = []
    for name, node, shape in operands:
        found = _operand(node, shape, sched, names, layouts, name)
        if found is None:
            return None
        read.append((name, node, found))
    written = {a for p, a in zip(epilogue.params, epilogue.args) if p.is_output}
    if written & {buf for _, _, (buf, _) in read}:  # other programs still read what one overwrites
        return None
    keep = [(p, a) for p, a in zip(epilogue.params, epilogue.args) if p.name != param]
    params = tuple(p for p, _ in keep) + tuple(Param(name, node.dtype, False) for name, node, _ in read)
    args = tuple(a for _, a in keep) + tuple(buf for _, _, (buf, _) in read)
    ops = {name: op for name, _, (_, op) in read}
    return MatmulKernel(
        epilogue.name,
        epilogue.outer,
        (),
        params,
        epilogue.stages,
        args=args,
        m=m,
        n=n,
        k=k,
        a=ops["mat_a"],
        b=ops["mat_b"],
        bias=ops.get("mat_bias"),
        product=param,
        product_dtype=mm.node.dtype,
        operand_dtype=mm.a.dtype,
    )


def _cublas_cost(mm: _Matmul, ceilings) -> Cost:
    def meta(n: Node):
        return torch.empty(tuple(n.shape), dtype=n.dtype, device="meta")

    args = [meta(t) for t in ((mm.bias, mm.a, mm.b) if mm.bias is not None else (mm.a, mm.b))]
    return aten_cost(mm.node.attrs[0], args, meta(mm.node), ceilings)


def use_templates(
    sched: Schedule,
    kernels: dict[int, Kernel],
    names: dict[Node, str],
    layouts,
    forced: bool,
    ceilings,
    timed: bool = False,
    tile=None,
    spills=None,
    target: MatmulTarget = GPU_MATMUL,
) -> list[Decision]:
    """Fuse qualifying matmuls into their epilogue kernels (in sched.steps and kernels), as
    forced (every qualifying one) or as the cost model chooses; returns the decisions. timed
    (max-autotune): every qualifying matmul with an epilogue becomes a template whose first
    call times cuBLAS with the epilogue as a kernel of its own against its configurations.
    tile: the backend's (BLOCK_M, BLOCK_N, share of SMs busy) for a MatmulKernel; spills: the
    stack bytes a thread of its compiled binary spills (a template the cost model chose is
    compiled to learn it); target: the backend's sides, choice and library."""
    decisions = []
    for node in [s for s in sched.steps if not isinstance(s, KernelPlan)]:
        if node.op is not Op.EXTERN or node.attrs[0] not in MATMULS:
            continue
        label = node_label(node) + f" {node.attrs[0]}"
        try:
            decisions.append(
                _decide(node, label, sched, kernels, names, layouts, forced, ceilings, timed, tile, spills,
                        target)
            )
        except Exception as e:  # a template is an optimization: its failure must not fail the program
            if env_debug():
                raise
            decisions.append(
                Decision(label, target.library, f"no template: internal error {type(e).__name__}: {e}")
            )
    decided = {d.node for d in decisions}  # these replace the calls' decisions to run in ATen
    sched.decisions[:] = [d for d in sched.decisions if not (d.verdict == "extern" and d.node in decided)]
    return decisions


def _decide(
    node: Node, label: str, sched, kernels, names, layouts, forced, ceilings, timed, tile, spills=None,
    target: MatmulTarget = GPU_MATMUL,
) -> Decision:
    """One matmul: a template in the schedule (and its Decision), or the library and why."""
    library = target.library
    mm, why = _as_matmul(node, target.min_side)
    if mm is None:
        return Decision(label, library, f"no template: {why}")
    product = names[node]
    readers = _readers(product, node, sched, kernels, names)
    plan, param, store_too = _first_epilogue(readers, sched, kernels, product, node)
    why = "" if plan is not None else param
    epilogue = separate = kernels[id(plan)] if plan is not None else None
    if epilogue is not None and _waits_for_communication(epilogue, mm, sched, names):
        return Decision(label, library, "no template: its epilogue reads a collective's result, which the "
                                        "matmul, apart, runs while the data travels (passes/overlap.py)")
    if store_too:
        epilogue = _with_product_stored(epilogue, param, product, layouts, node)
        if epilogue is None:
            return Decision(label, library, "no template: the product's strides are not numbers")
    template = _template(mm, epilogue, param, product, sched, names, layouts)
    if template is None:
        why = "an operand's strides are not numbers, or the epilogue overwrites an operand"
        return Decision(label, library, f"no template: {why}")
    # against the library, which writes the product itself, and the epilogue's kernel as it is
    share = tile(template)[2] if tile is not None else 1.0
    choice = target.choose(template, separate, _cublas_cost(mm, ceilings), ceilings, forced, share)
    if choice.template and not forced and not timed and spills is not None:
        choice = refuse_spilling(choice, spills(template))
    # 16-bit operands only: eager's float32 matmul is IEEE float32, where cuBLAS wins
    if timed and not forced and epilogue is not None and mm.a.dtype.itemsize == 2:
        template = dataclasses.replace(template, cublas_candidate=True)
        timing = f"timed against cuBLAS at the first call (max-autotune); predicted {choice.reason}"
        choice = dataclasses.replace(choice, template=True, reason=timing)
    if not choice.template:
        return Decision(label, library, choice.reason + (f" ({why})" if why else ""))
    _replace(sched, kernels, node, plan, template, store_too)
    fused = "with its epilogue" if plan is not None else "storing the product"
    fused += ", storing the product too" if store_too else ""
    return Decision(label, "template", f"{fused}: {choice.reason}")


def _replace(
    sched: Schedule,
    kernels,
    node: Node,
    plan: KernelPlan | None,
    template: MatmulKernel,
    store_too: bool = False,
) -> None:
    """The matmul's ATen call gives way to the template: in the epilogue's place, or in the
    call's own, storing the product."""
    if plan is None:
        plan = KernelPlan([node], tuple(node.shape), ())
        sched.steps[sched.steps.index(node)] = plan
    elif store_too:  # the epilogue's kernel also stores the product, into the call's buffer
        sched.steps.remove(node)
        plan.roots.append(node)
    else:
        sched.steps.remove(node)
        del sched.stored[node]  # computed inside the kernel: no buffer, the kernel's own node
    kernels[id(plan)] = template
