"""Cross-entropy forward+backward and long-row softmax: kiln, eager and Inductor in one process.

    PYTHONPATH=src python -m benchmarks.xent [--device cuda] [--cases xent,softmax] [--rows N]
                                             [--mode max-autotune]

Cases (on CUDA the issue's sizes; on the CPU smaller ones, or --rows):
  xent     loss = cross_entropy(logits.float(), targets), then d loss / d logits, bf16 logits
           [N, 50304] (some targets ignored); must move: the logits read by the forward and by
           the backward, the gradient written (3 x the logits' bytes)
  softmax  softmax(x, -1) over bf16 rows of 50304 (float32 math); must move: x read, y written

Each variant is checked against eager, then timed one call at a time: on CUDA with the L2
flushed before each call (triton.testing.do_bench, host overhead included), on the CPU as a
median of calls taken in turns. Bandwidth is the must-move bytes over the time, against a
device copy measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import tempfile

for var, prefix in (("KILN_CACHE_DIR", "kiln"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                    ("TRITON_CACHE_DIR", "triton")):
    os.environ.setdefault(var, tempfile.mkdtemp(prefix=f"xent-bench-{prefix}-"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

VOCAB = 50304


def loss_fn(logits, targets):
    return F.cross_entropy(logits.float(), targets)


def softmax(x):
    return torch.softmax(x, -1)


def xent_step(loss):
    """Forward and backward of a (compiled) loss: the logits' gradient, never accumulated."""

    def step(logits, targets):
        return torch.autograd.grad(loss(logits, targets), logits)[0]

    return step


def per_call_seconds(fn, args, device: str) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(lambda: fn(*args), warmup=25, rep=200, return_mode="median") * 1e-3
    from benchmarks.measure import median_seconds

    return median_seconds(fn, args, 10)


def copy_seconds(nbytes: int, device: str) -> float:
    """A device copy moving nbytes (read + written), timed like the cases."""
    a = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    return per_call_seconds(lambda a: b.copy_(a), (a,), device)


def cases(device: str, rows: int):
    logits = torch.randn(rows, VOCAB, device=device, dtype=torch.bfloat16).requires_grad_()
    targets = torch.randint(0, VOCAB, (rows,), device=device)
    targets[::97] = -100  # ignored rows
    moved = 3 * logits.numel() * logits.element_size()
    yield "xent", f"cross-entropy fwd+bwd {rows}x{VOCAB} bf16", (logits, targets), moved
    x = torch.randn(rows // 2, VOCAB, device=device, dtype=torch.bfloat16)
    yield "softmax", f"softmax {rows // 2}x{VOCAB} bf16", (x,), 2 * x.numel() * x.element_size()


def variants(key: str, mode: str):
    import kiln

    if key == "xent":
        return {"eager": xent_step(loss_fn), "inductor": xent_step(torch.compile(loss_fn, mode=mode)),
                "kiln": xent_step(kiln.compile(loss_fn, mode=mode))}
    return {"eager": softmax, "inductor": torch.compile(softmax, mode=mode),
            "kiln": kiln.compile(softmax, mode=mode)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cases", default="xent,softmax")
    parser.add_argument("--rows", type=int, default=0, help="cross-entropy rows (softmax: half)")
    parser.add_argument("--mode", default="default", help="both compilers' mode (max-autotune: tuned tiles)")
    parsed = parser.parse_args(argv)
    device = parsed.device
    rows = parsed.rows or (8192 if device == "cuda" else 256)
    wanted = {c.strip() for c in parsed.cases.split(",") if c.strip()}
    print("| case | variant | ms per call | TB/s | of a copy |")
    print("|---|---|---|---|---|")
    for key, name, args, moved in cases(device, rows):
        if key not in wanted:
            continue
        copy = copy_seconds(moved, device)
        expected = None
        for variant, fn in variants(key, parsed.mode).items():
            torch._dynamo.reset()
            out = fn(*args)
            if expected is None:
                expected = out
            else:
                torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
            seconds = per_call_seconds(fn, args, device)
            rate = moved / seconds
            print(f"| {name} | {variant} | {seconds * 1e3:.3f} | {rate / 1e12:.2f} | "
                  f"{100 * copy / seconds:.0f}% |", flush=True)
        print(f"| {name} | copy of the must-move bytes | {copy * 1e3:.3f} | "
              f"{moved / copy / 1e12:.2f} | 100% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
