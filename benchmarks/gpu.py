"""kiln vs eager vs Inductor on an NVIDIA GPU, in one process.

    PYTHONPATH=src python -m benchmarks.gpu [--cases chain,rmsnorm] [--out FILE.md] [--per-call]

KILN_MATMUL_TEMPLATES=1 forces kiln's Triton matmul templates (fused epilogues) wherever they
apply, =0 keeps every matmul in cuBLAS; unset, kiln's cost model chooses per matmul.

Each case is checked against eager first (a wrong result is FAIL, never timed). Times are
per call: medians over CUDA-graph replays of back-to-back calls on rotating inputs (`bench`),
except the launch-bound tiny MLP's, a loop of calls timed on the host (`bench_host`). With
--per-call every case is timed one call at a time between CUDA events, L2 flushed before
each (triton.testing.do_bench), host overhead included. Memory-bound cases report achieved
bandwidth against the copy bandwidth measured in the same run; matmul-bound ones, TFLOP/s
against the bf16 matmul rate measured in the same run. Cold compile = first call minus one
timed run, with empty kiln, Inductor and Triton caches.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import tempfile
import time

for var, prefix in (("KILN_CACHE_DIR", "kiln"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
    os.environ[var] = tempfile.mkdtemp(prefix=f"gpu-bench-{prefix}-")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16
PER_CALL = False  # --per-call


def chain(x, y):
    z = x * y + 1
    z = torch.where(z > 0, z * torch.exp(-z), torch.tanh(z))  # continuous at 0: rounding can't flip it
    return torch.sigmoid(z) * x - y * 0.5


def rmsnorm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def layernorm_gelu(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))


def softmax(x):
    return torch.softmax(x, -1)


def bias_gelu(x, w, b):
    return F.gelu(x @ w + b)


def ffn(x, w_norm, w_gate, w_up, w_down):
    h = rmsnorm(x, w_norm)
    return x + (F.silu(h @ w_gate) * (h @ w_up)) @ w_down


def attention(q, k, v):
    t = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v


class TinyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.norm = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64), torch.nn.LayerNorm(64)

    def forward(self, x):
        return self.norm(x + self.fc2(F.gelu(self.fc1(x))))


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEV, dtype=dtype)


def nbytes(*ts):
    return sum(t.numel() * t.element_size() for t in ts)


def cases():
    """(name, fn, args, bytes that must move or None, flops or None, tolerance)."""
    x, y = r(64 << 20), r(64 << 20)
    yield "chain 64M f32", chain, (x, y), nbytes(x, y, x), None, 1e-4
    x, w = r(16384, 4096, dtype=BF16), r(4096, dtype=BF16)
    yield "rmsnorm 16384x4096 bf16", rmsnorm, (x, w), nbytes(x, x, w), None, 2e-2
    b = r(4096, dtype=BF16)
    yield "layernorm+gelu 16384x4096 bf16", layernorm_gelu, (x, w, b), nbytes(x, x, w, b), None, 2e-2
    x = r(65536, 1024, dtype=BF16)
    yield "softmax 65536x1024 bf16", softmax, (x,), nbytes(x, x), None, 2e-2
    x = r(4096, 50304, dtype=BF16)  # rows too long for one tile: a loop over chunks per row
    yield "softmax 4096x50304 bf16 (long rows)", softmax, (x,), nbytes(x, x), None, 2e-2
    x, w, b = r(8192, 768, dtype=BF16), r(768, 3072, dtype=BF16) * 0.036, r(3072, dtype=BF16) * 0.02
    yield "gelu(x @ w + b) 8192x768 @ 768x3072 bf16", bias_gelu, (x, w, b), None, 2 * 8192 * 768 * 3072, 2e-2
    x = r(8192, 4096, dtype=BF16)
    wn, wg, wu, wd = (r(4096, dtype=BF16), r(4096, 11008, dtype=BF16) * 0.02, r(4096, 11008, dtype=BF16) * 0.02,
                      r(11008, 4096, dtype=BF16) * 0.02)
    yield "rmsnorm+swiglu ffn 8192x4096 h11008 bf16", ffn, (x, wn, wg, wu, wd), None, 2 * 8192 * 4096 * 11008 * 3, 5e-2
    q, k, v = (r(8, 16, 1024, 64, dtype=BF16) for _ in range(3))
    yield "causal attention 8x16x1024x64 bf16", attention, (q, k, v), None, 4 * 8 * 16 * 1024 * 1024 * 64, 3e-2
    mlp = TinyMLP().to(DEV)
    yield "tiny mlp 32x64 f32 (launch-bound)", mlp, (r(32, 64),), None, None, 1e-4
    yield "tiny mlp 32x64 f32, reduce-overhead (CUDA graphs)", mlp, (r(32, 64),), None, None, 1e-4
    # odd shapes at the sizes above (where a copy reaches the full rate), then smaller ones
    x, w = r(16381, 4093, dtype=BF16), r(4093, dtype=BF16)
    yield "rmsnorm 16381x4093 bf16 (odd)", rmsnorm, (x, w), nbytes(x, x, w), None, 2e-2
    x = r(65521, 1021, dtype=BF16)
    yield "softmax 65521x1021 bf16 (odd)", softmax, (x,), nbytes(x, x), None, 2e-2
    x, y = r((64 << 20) - 5), r((64 << 20) - 5)
    yield "chain 67108859 f32 (odd)", chain, (x, y), nbytes(x, y, x), None, 1e-4
    x, w = r(5000, 3000, dtype=BF16), r(3000, dtype=BF16)
    yield "rmsnorm 5000x3000 bf16 (odd, 60 MB)", rmsnorm, (x, w), nbytes(x, x, w), None, 2e-2
    x = r(50000, 1000, dtype=BF16)
    yield "softmax 50000x1000 bf16 (odd, 200 MB)", softmax, (x,), nbytes(x, x), None, 2e-2
    x, y = r(10_000_019), r(10_000_019)
    yield "chain 10000019 f32 (odd, 120 MB)", chain, (x, y), nbytes(x, y, x), None, 1e-4


def bench_per_call(fn, args) -> float:
    """Median seconds of one call between CUDA events, L2 flushed before each
    (triton.testing.do_bench): `--per-call` times every case this way."""
    from triton.testing import do_bench

    with torch.no_grad():
        return do_bench(lambda: fn(*args), warmup=25, rep=200, return_mode="median") * 1e-3


def bench(fn, args, graph: bool = True) -> float:
    """Median seconds per call of back-to-back calls, replayed from a CUDA graph: the device's
    time, free of host overhead and launch gaps. The calls rotate through copies of the inputs
    that together span four L2 caches, so each call reads its inputs from device memory,
    without a cache flush in between (a flush leaves the L2 full of lines to write back
    during the next call). graph=False queues the calls on the stream instead, for device
    copies: captured in a graph they become copy-engine transfers (2.75 TB/s on the H200,
    against 4.2-4.3 queued on the stream)."""
    if PER_CALL:
        return bench_per_call(fn, args)
    l2 = torch.cuda.get_device_properties(DEV).L2_cache_size
    size = max(1, sum(nbytes(a) for a in args if isinstance(a, torch.Tensor)))
    arg_sets = [args] + [tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
                         for _ in range(math.ceil(4 * l2 / size) - 1)]
    calls = max(len(arg_sets), math.ceil(2e-3 / bench_per_call(fn, args)))  # about 2 ms a round

    def run():
        for i in range(calls):
            fn(*arg_sets[i % len(arg_sets)])

    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # lazy initialisation must not be captured
            run()
        torch.cuda.current_stream().wait_stream(side)
        if graph:
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured):
                run()
            run = captured.replay
        times = []
        for _ in range(12):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3 / calls)
    return sorted(times[2:])[len(times[2:]) // 2]


def bench_host(fns, args) -> list[float]:
    """Median seconds per call of each function in loops of calls, host included: what a
    launch-bound caller sees (inputs this small stay in the L2 cache). The functions take
    turns, so that load on the host hits them alike."""
    times = [[] for _ in fns]
    with torch.no_grad():
        for fn in fns:
            for _ in range(20):
                fn(*args)
        for _ in range(9):
            for fn, fn_times in zip(fns, times):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(100):
                    fn(*args)
                torch.cuda.synchronize()
                fn_times.append((time.perf_counter() - t0) / 100)
    return [statistics.median(t) for t in times]


def copy_bandwidth() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    return 2 * a.numel() / bench(lambda a: b.copy_(a), (a,), graph=False)


def copy_time(nbytes_moved: int) -> float:
    """A device copy moving as many bytes (read + written): the best this traffic can do at
    this size, launch and tail included."""
    a = torch.empty(nbytes_moved // 2, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    return bench(lambda a: b.copy_(a), (a,), graph=False)


def matmul_rate() -> float:
    a, b = r(8192, 8192, dtype=BF16), r(8192, 8192, dtype=BF16)
    return 2 * 8192**3 / bench(torch.mm, (a, b))


def first_call(fn, args) -> tuple[float, object]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = fn(*args)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def check(out, ref, tol) -> str | None:
    """Max error relative to the output's scale (matmul outputs in bf16 differ in ulps of
    large values between any two implementations, eager's included)."""
    out, ref = out.float(), ref.float()
    if out.shape != ref.shape:
        return f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if not torch.equal(out.isnan(), ref.isnan()):
        return "NaN in different places"
    err = (out - ref).nan_to_num().abs().max().item()
    scale = max(ref.nan_to_num().abs().max().item(), 1.0)
    return None if err <= tol * scale else f"max error {err:.3g} at scale {scale:.3g}"


def main() -> int:
    import kiln
    from kiln.frontend.backend import REPORTS

    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--per-call", action="store_true", help="time each call alone, host included")
    parser.add_argument("--dynamic", action="store_true",
                        help="also time kiln compiled with dynamic=True (one program per shape family)")
    args = parser.parse_args()
    global PER_CALL
    PER_CALL = args.per_call
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    bw, mm = copy_bandwidth(), matmul_rate()
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s, bf16 matmul {mm / 1e12:.0f} TFLOP/s", flush=True)
    # one-time start-up of the process, kept out of every case's cold compile: Dynamo's, and
    # the first attention call's (loading its kernels), which only the attention case makes
    torch.compile(lambda t: t + 1, backend="aot_eager")(torch.ones(2, device=DEV))
    t0 = time.perf_counter()
    F.scaled_dot_product_attention(*(r(1, 1, 64, 64, dtype=BF16) for _ in range(3)), is_causal=True)
    torch.cuda.synchronize()
    print(f"one-time start-up: first scaled_dot_product_attention call {time.perf_counter() - t0:.2f} s", flush=True)
    rows = []
    for name, fn, fargs, moved, flops, tol in cases():
        if wanted and not any(w in name for w in wanted):
            continue
        with torch.no_grad():
            ref = fn(*fargs)
        # the tiny MLP's time is its host overhead, which a graph replay would hide: timed in
        # turns with eager's
        on_host = "tiny mlp" in name and not PER_CALL
        eager_times = [] if on_host else [bench(fn, fargs)]
        row = {"case": name, "eager": math.nan}
        for compiler in ("inductor", "kiln") + (("kiln_dynamic",) if args.dynamic else ()):
            torch._dynamo.reset()
            kiln.reset_stats()
            before = len(REPORTS)
            mode = "reduce-overhead" if "reduce-overhead" in name else "default"
            if compiler == "inductor":
                compiled = torch.compile(fn, mode=mode)
            else:
                compiled = kiln.compile(fn, mode=mode, dynamic=compiler == "kiln_dynamic")
            seconds, out = first_call(compiled, fargs)
            problem = check(out, ref, tol)
            if problem:
                row[compiler] = float("nan")
                row[f"{compiler}_fail"] = problem
                continue
            if on_host:
                t_eager, row[compiler] = bench_host([fn, compiled], fargs)
                eager_times.append(t_eager)
            else:
                row[compiler] = bench(compiled, fargs)
            row[f"{compiler}_compile"] = seconds - row[compiler]
            if compiler == "kiln_dynamic":
                stats = kiln.stats()
                row["family"] = "yes" if stats.graphs_symbolic and not stats.per_shape else f"no: {dict(stats.per_shape)}"
            if compiler == "kiln":
                row["kernels"] = sum(rep.num_kernels for rep in REPORTS[before:])
                row["kiln_passes"] = sum(rep.seconds for rep in REPORTS[before:])
                row["kiln_build"] = sum(p.seconds for rep in REPORTS[before:] for p in rep.passes if p.name == "build")
        row["eager"] = statistics.median(eager_times) if eager_times else bench_host([fn], fargs)[0]
        if moved:
            row["metric"] = f"{moved / row['kiln'] / 1e12:.2f} TB/s ({100 * moved / row['kiln'] / bw:.0f}%)"
            row["ind_metric"] = f"{100 * moved / row['inductor'] / bw:.0f}%"
            row["vs_copy"] = f"{100 * copy_time(moved) / row['kiln']:.0f}%"
        elif flops:
            row["metric"] = f"{flops / row['kiln'] / 1e12:.0f} TFLOP/s ({100 * flops / row['kiln'] / mm:.0f}%)"
            row["ind_metric"] = f"{100 * flops / row['inductor'] / mm:.0f}%"
        rows.append(row)
        print(_line(row), flush=True)
    table = _table(rows, bw, mm)
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 0


def _line(row) -> str:
    fails = {k: v for k, v in row.items() if k.endswith("_fail")}
    compile_s = (f"; cold compile kiln {row['kiln_compile']:.2f} s ({row['kiln_passes']:.2f} s in kiln's passes, "
                 f"{row['kiln_build']:.2f} s of them building kernels), Inductor {row['inductor_compile']:.2f} s"
                 if "kiln_compile" in row and "inductor_compile" in row else "")
    return f"{row['case']}: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in row.items()
                                           if k in ("eager", "inductor", "kiln", "kiln_dynamic")) + compile_s + (f" FAIL {fails}" if fails else "")


def _table(rows, bw, mm) -> str:
    import triton

    lines = [
        f"{datetime.date.today()} · {torch.cuda.get_device_name()} · torch {torch.__version__} · "
        f"triton {triton.__version__} · python {sys.version.split()[0]} · measured copy {bw / 1e12:.2f} TB/s, "
        f"bf16 matmul {mm / 1e12:.0f} TFLOP/s · timed "
        + ("one call at a time, host included" if PER_CALL else "by graph replays of back-to-back calls"),
        "",
        "| case | eager ms | Inductor ms | kiln ms | kiln vs eager | kiln vs Inductor | kiln achieved | Inductor achieved | kiln vs a copy of as many bytes | cold compile kiln / Inductor s | kiln kernels |"
        + (" kiln dynamic=True ms | its time / kiln's | one family |" if any("kiln_dynamic" in r or "kiln_dynamic_fail" in r for r in rows) else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if any("kiln_dynamic" in r or "kiln_dynamic_fail" in r for r in rows) else ""),
    ]
    for row in rows:
        k, i, e = row.get("kiln", math.nan), row.get("inductor", math.nan), row["eager"]
        fails = " ".join(f"{c} FAIL: {row[c + '_fail']}" for c in ("kiln", "inductor", "kiln_dynamic")
                         if c + "_fail" in row)
        dynamic = ""
        if "kiln_dynamic" in row or "kiln_dynamic_fail" in row:
            d = row.get("kiln_dynamic", math.nan)
            dynamic = f" {d * 1e3:.3f} | {d / k:.2f} | {row.get('family', '-')} |"
        lines.append(
            f"| {row['case']} | {e * 1e3:.3f} | {i * 1e3:.3f} | {k * 1e3:.3f} | {e / k:.2f}x | {i / k:.2f}x | "
            f"{row.get('metric', '-')} | {row.get('ind_metric', '-')} | {row.get('vs_copy', '-')} | "
            f"{row.get('kiln_compile', math.nan):.2f} / {row.get('inductor_compile', math.nan):.2f} | "
            f"{row.get('kernels', '-')} {fails}|" + dynamic)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
