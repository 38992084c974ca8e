"""Compare a compiled run with eager: outputs, updated inputs and gradients.

Values: an element passes when it is close to eager's, or when it is at most twice as far
from a float64 reference as eager's is (plus the same tolerance). The second rule admits
what a correct compiler does and eager does not: keeping fused low-precision intermediates in
fp32 (eager rounds after every op, so bf16/fp16 chains drift ulps away, and may overflow to
inf where fp32 does not) and summing in another order (eager's own error is the yardstick).
Relative tolerances: float32 1e-5 (some 80 ulps: approximations of exp, log, tanh...
chained, reductions in another order), float16 4e-3 and bfloat16 3e-2 (about 4 ulps: the
rounding at the store; longer chains pass by the float64 rule). Absolute: the same times the
output's largest finite magnitude (a reduction's error scales with its terms, not its
result), and at least UNIT_ULPS ulps of 1.0 of the dtype (inputs are of unit scale, so a tiny
result is mostly a difference of terms near 1 and carries their rounding: log_softmax over a
size-1 dim, the gradient of x / sqrt(x^2 + eps), the sum of a layer norm's outputs).
Integers and bools compare exactly; NaN only where eager or the reference has NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

# relative tolerance per output dtype; the absolute one is this times the largest magnitude,
# at least UNIT_ULPS ulps of 1.0 (see above)
RTOL = {torch.float64: 1e-9, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
UNIT_ULPS = 4


@dataclass
class Run:
    outputs: list
    inputs: list  # after the run: in-place updates show here
    grads: list | None = None
    # where each differentiated input is NaN: eager's own backward kernels disagree there
    # between their vector and scalar loops (elu: NaN in one, the gradient in the other), so
    # those elements of the gradients are not compared
    grad_nan: list | None = None


def grad_targets(outs, inputs, seed: int):
    """(outputs, inputs, cotangents) of a gradient check, or None when no output needs one."""
    sel = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()]
    wrt = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    if not sel or not wrt:
        return None
    cots = [
        torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + k)).to(o.dtype)
        for k, o in enumerate(sel)
    ]
    return sel, wrt, cots


def compare_runs(actual: Run, expected: Run, ref: Run | None, exact: list[bool] | None = None) -> str:
    """'' when the compiled run matches eager's, else what differs first. exact flags the
    outputs, then the inputs, that must equal eager's bit for bit (zeros' signs included)."""
    exact = exact or []
    n_out = len(expected.outputs)
    groups = [
        ("output", actual.outputs, expected.outputs, ref.outputs if ref else None),
        ("input after the call", actual.inputs, expected.inputs, ref.inputs if ref else None),
    ]
    if expected.grads is not None:
        groups.append(
            (
                "gradient of input",
                actual.grads or [],
                expected.grads,
                ref.grads if ref and ref.grads is not None else None,
            )
        )
    for what, a_list, e_list, r_list in groups:
        if len(a_list) != len(e_list):
            return f"{len(a_list)} {what}s, eager has {len(e_list)}"
        for k, (a, e) in enumerate(zip(a_list, e_list)):
            r = r_list[k] if r_list is not None and k < len(r_list) else None
            flag = {"output": k, "input after the call": n_out + k}.get(what)
            bitwise = flag is not None and flag < len(exact) and exact[flag]
            if what == "gradient of input" and expected.grad_nan and a is not None and e is not None:
                a, e, r = _unmask(expected.grad_nan[k], a, e, r)
            why = compare_tensor(a, e, r, strides=what == "output", bitwise=bitwise)
            if why:
                return f"{what} {k}: {why}"
    return ""


def _unmask(skip: torch.Tensor, a, e, r):
    """a, e and r with eager's values where skip is set, so those elements compare equal."""
    if skip.shape != e.shape or not bool(skip.any()):
        return a, e, r
    if r is not None and r.shape == e.shape:
        r = torch.where(skip, e.to(r.dtype), r)
    return torch.where(skip, e, a), e, r


def compare_tensor(a, e, r=None, strides: bool = True, bitwise: bool = False) -> str:
    if a is None and e is None:
        return ""
    if a is None or e is None:  # an unused input's gradient: None or zeros, both mean zero
        a, e = (torch.zeros_like(e) if a is None else a), (torch.zeros_like(a) if e is None else e)
    if not isinstance(a, torch.Tensor):
        return f"got {type(a).__name__}, eager gives a tensor"
    if a.shape != e.shape or a.dtype != e.dtype:
        return f"{a.dtype}{list(a.shape)}, eager {e.dtype}{list(e.shape)}"
    if strides and e.numel() and is_non_overlapping_and_dense(e):
        bad = [d for d in range(e.dim()) if e.shape[d] > 1 and a.stride(d) != e.stride(d)]
        if bad:
            return f"strides {a.stride()}, eager {e.stride()} (shape {list(e.shape)})"
    if not e.numel():
        return ""
    if not e.is_floating_point():
        if torch.equal(a, e):
            return ""
        at = tuple((a != e).nonzero()[0].tolist())
        return f"{int((a != e).sum())} of {e.numel()} differ, first at {list(at)}: {a[at]} vs eager {e[at]}"
    if bitwise:
        return _compare_bitwise(a, e)
    return _compare_float(a, e, r)


def _compare_bitwise(a: torch.Tensor, e: torch.Tensor) -> str:
    """Equal values, NaN where eager has NaN, and zeros of the same sign."""
    same = ((a == e) & (a.signbit() == e.signbit())) | (a.isnan() & e.isnan())
    if bool(same.all()):
        return ""
    at = tuple((~same).nonzero()[0].tolist())
    return (
        f"{int((~same).sum())} of {e.numel()} values differ (an exact value), first at {list(at)}: "
        f"{a[at].item()!r} vs eager {e[at].item()!r}"
    )


def _compare_float(a: torch.Tensor, e: torch.Tensor, r: torch.Tensor | None) -> str:
    rtol = RTOL.get(e.dtype, 1e-5)
    a64, e64 = a.detach().double(), e.detach().double()
    finite = e64[torch.isfinite(e64)]
    atol = max(rtol * (finite.abs().max().item() if finite.numel() else 1.0),
               UNIT_ULPS * torch.finfo(e.dtype).eps)
    ok = _close(a64, e64, rtol, atol, slack=None)
    if r is not None and not bool(ok.all()):
        r64 = r.detach().to(e.dtype).double() if r.shape == e.shape else None
        if r64 is not None:
            ok = ok | _close(a64, r64, rtol, atol, slack=(e64 - r64).abs())
    if bool(ok.all()):
        return ""
    bad = (~ok).nonzero()[0].tolist()
    at = tuple(bad)
    ref = f", float64 reference {r[at].item():.8g}" if r is not None and r.shape == e.shape else ""
    return (
        f"{int((~ok).sum())} of {e.numel()} {str(e.dtype).removeprefix('torch.')} values differ, "
        f"first at {bad}: {a[at].item():.8g} vs eager {e[at].item():.8g}{ref}"
    )


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float, slack) -> torch.Tensor:
    """Element-wise |a - b| <= slack * 2 + atol + rtol |b|, with equal NaN and equal infinities."""
    both_nan = a.isnan() & b.isnan()
    same_inf = a.isinf() & (a == b)
    diff = (a - b).abs()
    allowed = atol + rtol * b.abs()
    if slack is not None:
        allowed = allowed + 2 * torch.nan_to_num(slack, nan=0.0, posinf=0.0)
    return both_nan | same_inf | (diff <= allowed)
