"""A matmul template (ir/matmul.py) against the library's matmul (cuBLAS on GPUs, ATen's oneDNN
on CPUs) and a separate epilogue kernel: which one a matmul with a fused epilogue takes, from
the predicted times of both."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from kiln.ir.kernel import Kernel
from kiln.ir.matmul import loop_form
from kiln.passes.cost import kernel_cost, matmul_template_cost
from kiln.passes.roofline import Ceilings, Cost, dtype_text

TEMPLATE_TILE = (128, 128, 64)  # M, N, K: the tiles of the template's configurations divide these


@dataclass(frozen=True)
class MatmulChoice:
    """Template or cuBLAS for one matmul, with the predicted times behind it (seconds)."""

    template: bool
    reason: str
    template_s: float = 0.0
    cublas_s: float = 0.0  # the ATen matmul and the separate epilogue kernel


def choose_matmul(template, epilogue: Kernel | None, cublas: Cost, ceilings: Ceilings,
                  forced: bool, wave_share: float = 1.0) -> MatmulChoice:
    """template: the MatmulKernel that fusing would make; epilogue: the kernel it replaces
    (None: nothing reads the product but as a buffer); cublas: the ATen call's cost;
    wave_share: the share of SMs the template's waves of tiles keep busy (the backend's).
    The template pays where the epilogue's traffic (the product written, read back, and the
    second launch) outweighs what the template gives up to cuBLAS, on shapes it tiles evenly."""
    if forced:
        return MatmulChoice(True, "matmul templates forced on (option matmul_templates=True)")
    m, n, k = template.m, template.n, template.k
    tm, tn, tk = TEMPLATE_TILE
    if m % tm or n % tn or k % tk:
        return MatmulChoice(False, f"cuBLAS: {m} x {n} x {k} does not tile by {tm} x {tn} x {tk}, "
                                   "where the template would mask its edge tiles")
    if template.operand_dtype.itemsize > 2:
        return MatmulChoice(False, f"cuBLAS: {dtype_text(template.operand_dtype)} operands (eager's "
                                   "float32 matmul is IEEE float32, which tensor cores do not run)")
    if epilogue is None:
        return MatmulChoice(False, "cuBLAS: no element-wise epilogue reads the product")
    fused = matmul_template_cost(template, ceilings, wave_share).seconds
    separate = cublas.seconds + kernel_cost(epilogue, ceilings).seconds
    times = f"template {fused * 1e6:.1f} us, cuBLAS + epilogue kernel {separate * 1e6:.1f} us predicted"
    if wave_share < 0.9:
        times += f" (the template's tiles keep {wave_share:.0%} of the SMs busy)"
    if fused < separate:
        return MatmulChoice(True, f"template with the epilogue fused: {times}", fused, separate)
    return MatmulChoice(False, f"cuBLAS: {times}", fused, separate)


def choose_cpu_matmul(template, epilogue: Kernel | None, aten: Cost, ceilings: Ceilings,
                      forced: bool, wave_share: float = 1.0) -> MatmulChoice:
    """The C++ template (codegen/cpp_matmul.py) pays where ATen's call and the epilogue's own
    kernel cost more than what the template gives up to oneDNN's rate: a product of a few
    rows, where the library's fixed cost is most of its time."""
    if forced:
        return MatmulChoice(True, "matmul templates forced on (option matmul_templates=True)")
    if epilogue is None:
        return MatmulChoice(False, "ATen: no element-wise epilogue reads the product")
    if loop_form(template) is None:
        return MatmulChoice(False, "ATen: neither operand layout the template reads contiguously "
                                   "(A and B along k, or B along n)")
    fused = matmul_template_cost(template, ceilings).seconds
    separate = aten.seconds + kernel_cost(epilogue, ceilings).seconds
    times = f"template {fused * 1e6:.1f} us, ATen + epilogue kernel {separate * 1e6:.1f} us predicted"
    if fused < separate:
        return MatmulChoice(True, f"template with the epilogue fused: {times}", fused, separate)
    return MatmulChoice(False, f"ATen: {times}", fused, separate)


@dataclass(frozen=True)
class MatmulTarget:
    """What a backend's matmul templates take: the smallest side, the choice against the
    library, and the library's name (a Decision's verdict)."""

    min_side: int
    choose: Callable[..., MatmulChoice]
    library: str


GPU_MATMUL = MatmulTarget(16, choose_matmul, "cuBLAS")  # tl.dot's smallest tile side
CPU_MATMUL = MatmulTarget(1, choose_cpu_matmul, "ATen")


# Stack bytes a thread of a template may spill at its tile: a little spilling costs little, a
# heavy epilogue's spilling costs several times the template's predicted time
# (docs/matmul_templates.md).
TEMPLATE_SPILL_LIMIT = 256


def refuse_spilling(choice: MatmulChoice, spilled: int | None) -> MatmulChoice:
    """The template loses where its compiled epilogue spills registers past the limit: the
    cost model's rates assume a template that keeps its tile in registers."""
    if not choice.template or spilled is None or spilled <= TEMPLATE_SPILL_LIMIT:
        return choice
    return dataclasses.replace(
        choice, template=False,
        reason=f"cuBLAS: the template's epilogue spills {spilled} bytes a thread at its tile "
               f"(over {TEMPLATE_SPILL_LIMIT}); predicted {choice.reason}")


