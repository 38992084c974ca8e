"""The Triton matmul template (ir/matmul.py): a tiled tl.dot with a float32 accumulator,
programs in groups of GROUP_M tile rows (neighbouring programs share the operands' tiles in
L2), and the epilogue rendered by codegen/triton.py's renderer over the output tile.

Sizes, strides and offsets are literals of the source: a static `if` on them (M % BLOCK_M)
drops the masks of shapes that tile evenly. Rows and columns past the end of the last tile
read rows of the operands that exist (wrapped), so the loop needs no masks but along K; their
results are masked at the store.
"""

from __future__ import annotations

import torch

from kiln.codegen.triton import HEADER, _Renderer, _round_to
from kiln.codegen.triton_launch import next_pow2
from kiln.ir import kernel as k
from kiln.ir.matmul import MatmulKernel, Operand

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages)
MatmulConfig = tuple[int, int, int, int, int, int]
CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")
# Hopper's usual best tiles for 16-bit operands: a 128 x 256 tile over 8 warps (two warpgroups
# of wgmma), 3 stages of 48 KiB of operands in shared memory.
LARGE = (128, 256, 64, 8, 8, 3)
SQUARE = (128, 128, 64, 8, 8, 4)
SMALL = (64, 64, 32, 8, 4, 3)
INTERPRETED = (32, 32, 16, 2, 4, 1)  # few programs: the interpreter runs each one in turn
SMS = 132  # an H100's or H200's multiprocessors
# (128, 128, 64) over 3 stages leaves room for two programs an SM (shared memory and
# registers), so that one's epilogue overlaps the other's loop
CANDIDATES = (
    LARGE,
    (128, 128, 64, 8, 8, 3),
    (256, 128, 64, 8, 8, 3),
    (128, 128, 64, 8, 4, 4),
    (128, 256, 64, 8, 8, 4),
    (128, 128, 128, 8, 8, 3),
    (64, 256, 64, 8, 4, 4),
    SQUARE,
    SMALL,
)


def _fits(config: MatmulConfig, kernel: MatmulKernel) -> bool:
    bm, bn, bk = config[:3]
    return (
        bm <= max(16, next_pow2(kernel.m))
        and bn <= max(16, next_pow2(kernel.n))
        and bk <= max(16, next_pow2(kernel.k))
    )


def _for_operands(config: MatmulConfig, kernel: MatmulKernel) -> MatmulConfig:
    """Four-byte operands take half the K depth: the same bytes of shared memory a stage."""
    if kernel.operand_dtype.itemsize == 4:
        return (*config[:2], max(16, config[2] // 2), *config[3:])
    return config


def wave_share(config: MatmulConfig, m: int, n: int) -> float:
    """The share of the last wave's SMs busy, averaged over the waves: programs of these tiles
    run one an SM at a time (their shared memory), on SMS multiprocessors."""
    tiles = -(-m // config[0]) * -(-n // config[1])
    return tiles / (-(-tiles // SMS) * SMS)


def launch_config(kernel: MatmulKernel, interpreted: bool) -> MatmulConfig:
    """Of the tiles that divide the shape, the one that leaves the fewest SMs idle in the last
    wave (the larger on a tie); small tiles otherwise."""
    if interpreted:
        return INTERPRETED
    if kernel.operand_dtype.itemsize == 4:  # FMAs, not wgmma: a 128 x 256 tile would spill
        return _for_operands(SQUARE, kernel)
    even = [c for c in (LARGE, SQUARE) if kernel.m % c[0] == 0 and kernel.n % c[1] == 0]
    if not even:
        return SMALL
    return max(even, key=lambda c: wave_share(c, kernel.m, kernel.n))


def tile(kernel: MatmulKernel) -> tuple[int, int, float]:
    """(BLOCK_M, BLOCK_N, share of the SMs busy) of the heuristic's configuration: what the
    cost model (passes/cost.py) predicts the template's time from."""
    config = launch_config(kernel, False)
    return config[0], config[1], wave_share(config, kernel.m, kernel.n)


def candidate_configs(kernel: MatmulKernel) -> list[MatmulConfig]:
    """The heuristic's configuration first, then those of CANDIDATES that fit the shape."""
    out = [launch_config(kernel, False)]
    for config in CANDIDATES:
        config = _for_operands(config, kernel)
        if _fits(config, kernel) and config not in out:
            out.append(config)
    return out[:6]


def grid(kernel: MatmulKernel, config: MatmulConfig) -> tuple[int, int, int]:
    bm, bn = config[:2]
    return (-(-kernel.m // bm) * -(-kernel.n // bn), 1, 1)


def constexprs(config: MatmulConfig) -> dict[str, int]:
    return dict(zip(CONSTEXPRS, config[:4]))


def options(config: MatmulConfig) -> dict[str, int]:
    return {"num_warps": config[4], "num_stages": config[5]}


def _pointer(op: Operand, rows: str, cols: str) -> str:
    return f"{op.param} + ({op.offset} + {rows} * {op.stride[0]} + {cols} * {op.stride[1]})"


def _loaded(expr: str, dtype: torch.dtype) -> str:
    """A loaded bias as float32 (bf16 through its bits: see triton_math's from_bf16)."""
    if dtype is torch.bfloat16:
        return f"km.from_bf16({expr})"
    return f"{expr}.to(tl.float32)"


class _TemplateRenderer(_Renderer):
    def __init__(self, kernel: MatmulKernel):
        super().__init__(kernel)
        self.mm = kernel
        self.flat = False  # the template defines its own coordinates (x0, x1), not a flat index

    def stmt(self, s: k.Stmt, depth: int, in_loop: bool) -> None:
        if isinstance(s, k.Load) and s.buf == self.mm.product:
            self.types[s.out] = s.dtype
            self.emit(depth, f"{s.out} = product")
            return
        super().stmt(s, depth, in_loop)

    def render(self) -> str:
        mm = self.mm
        m, n, kk = mm.m, mm.n, mm.k
        params = ", ".join(p.name for p in mm.params)
        self.emit(0, "@triton.jit")
        self.emit(0, f"def {mm.name}({params}, {', '.join(c + ': tl.constexpr' for c in CONSTEXPRS)}):")
        self.emit(1, "pid = tl.program_id(0)")
        self.emit(1, f"tiles_m = ({m} + BLOCK_M - 1) // BLOCK_M")
        self.emit(1, f"tiles_n = ({n} + BLOCK_N - 1) // BLOCK_N")
        self.emit(1, "group = GROUP_M * tiles_n")
        self.emit(1, "first_m = pid // group * GROUP_M")
        self.emit(1, "group_m = tl.minimum(tiles_m - first_m, GROUP_M)")
        self.emit(1, "pid_m = first_m + (pid % group) % group_m")
        self.emit(1, "pid_n = (pid % group) // group_m")
        wide = self.wide or max(m * kk, kk * n, m * n) >= 2**31 - 1
        cast = ".to(tl.int64)" if wide else ""
        self.emit(1, f"rm = pid_m{cast} * BLOCK_M + tl.arange(0, BLOCK_M)")
        self.emit(1, f"rn = pid_n{cast} * BLOCK_N + tl.arange(0, BLOCK_N)")
        self.emit(1, "rk = tl.arange(0, BLOCK_K)")
        for name, index, size, block in (("am", "rm", m, "BLOCK_M"), ("bn", "rn", n, "BLOCK_N")):
            self.emit(1, f"if {size} % {block} == 0:")
            self.emit(2, f"{name} = {index}")
            self.emit(1, "else:")
            self.emit(2, f"{name} = {index} % {size}")
        a, b = mm.a, mm.b
        self.emit(1, f"a_ptrs = {_pointer(a, 'am[:, None]', 'rk[None, :]')}")
        self.emit(1, f"b_ptrs = {_pointer(b, 'rk[:, None]', 'bn[None, :]')}")
        self.emit(1, "acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)")
        # eager's float32 matmul is IEEE float32 (PyTorch leaves TF32 off by default)
        precision = ', input_precision="ieee"' if mm.operand_dtype is torch.float32 else ""
        self.emit(1, f"for kk in range(0, {kk}, BLOCK_K):")
        self.emit(2, f"if {kk} % BLOCK_K == 0:")
        self.emit(3, "a = tl.load(a_ptrs)")
        self.emit(3, "b = tl.load(b_ptrs)")
        self.emit(2, "else:")
        self.emit(3, f"a = tl.load(a_ptrs, mask=rk[None, :] < {kk} - kk, other=0.0)")
        self.emit(3, f"b = tl.load(b_ptrs, mask=rk[:, None] < {kk} - kk, other=0.0)")
        self.emit(2, f"acc = tl.dot(km.dot_operand(a), km.dot_operand(b), acc{precision})")
        self.emit(2, f"a_ptrs += BLOCK_K * {a.stride[1]}")
        self.emit(2, f"b_ptrs += BLOCK_K * {b.stride[0]}")
        self.emit(1, f"if ({m} % BLOCK_M == 0) and ({n} % BLOCK_N == 0):")
        self.emit(2, "xmask = tl.full([BLOCK_M, BLOCK_N], 1, tl.int1)")
        self.emit(1, "else:")
        self.emit(2, f"xmask = (rm[:, None] < {m}) & (rn[None, :] < {n})")
        self.emit(1, "zero_x = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)")
        if mm.bias is not None:
            bias = f"tl.load({_pointer(mm.bias, 'rm[:, None]', 'rn[None, :]')} + zero_x, mask=xmask, other=0)"
            self.emit(1, f"acc = acc + {_loaded(bias, self._bias_dtype())}")
        self.emit(1, f"product = {_round_to('acc', mm.product_dtype)}")
        extents = tuple(s.extent for s in mm.outer)
        if extents == (m, n):
            x0, x1 = mm.outer
            self.emit(1, f"{x0.name} = rm[:, None] + zero_x")
            self.emit(1, f"{x1.name} = rn[None, :] + zero_x")
        else:  # the epilogue's points in row-major order are the product's elements
            self.emit(1, f"xindex = rm[:, None] * {n} + rn[None, :] + zero_x")
            self._decompose(1, "xindex", mm.outer)
        for stage in mm.stages:
            for s in stage.body:
                self.stmt(s, 1, False)
        return "\n".join(self.lines)

    def _bias_dtype(self) -> torch.dtype:
        return next(p.dtype for p in self.mm.params if p.name == self.mm.bias.param)


def render_source(kernel: MatmulKernel) -> str:
    return HEADER + "\n\n" + _TemplateRenderer(kernel).render() + "\n"
