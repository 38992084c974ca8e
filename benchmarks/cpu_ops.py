"""Single ops and small patterns on the CPU: eager, Inductor and kiln in one process.

    PYTHONPATH=src python -m benchmarks.cpu_ops [--ops softmax_dim0,argmax] [--calls 40]

Each case is one function of a float32 [2048, 1024] tensor (or an [8, 64, 56, 56] image),
compiled whole by Inductor and by kiln; both results are checked against eager's first. Per
case: the median time of a call (Dynamo's guards included), and kiln's speed against
Inductor's. Sweeping many ops finds the kernels kiln writes badly (a loop left scalar, a cache
line per element), which a model benchmark averages away.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks.measure import median_seconds

X = torch.randn(2048, 1024, generator=torch.Generator().manual_seed(0))
Y = torch.randn(2048, 1024, generator=torch.Generator().manual_seed(1))
W = torch.randn(1024)
INDEX = torch.randint(0, 1024, (2048, 64), generator=torch.Generator().manual_seed(2))
IMAGE = torch.randn(8, 64, 56, 56, generator=torch.Generator().manual_seed(3))
C64 = torch.rand(64) + 0.5



def _rms_norm(x: torch.Tensor) -> torch.Tensor:
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    return normed.to(x.dtype) * W.to(x.dtype)


CASES = {
    "argmax": lambda x: x.argmax(-1),
    "amax_dim0": lambda x: x.amax(0),
    "any": lambda x: (x > 3.0).any(-1),
    "var": lambda x: x.var(-1),
    "std_dim0": lambda x: x.std(0),
    "softmax": lambda x: torch.softmax(x, -1),
    "softmax_dim0": lambda x: torch.softmax(x, 0),
    "log_softmax_bf16": lambda x: torch.log_softmax(x.to(torch.bfloat16), -1),
    "logsumexp": lambda x: torch.logsumexp(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, (1024,), W, W),
    "rms_norm_bf16": lambda x: _rms_norm(x.to(torch.bfloat16)),
    "gelu_erf": lambda x: F.gelu(x),
    "silu_mul": lambda x: F.silu(x) * Y,
    "tanh_pow": lambda x: torch.tanh(x ** 3 + Y),
    "cross_entropy": lambda x: F.cross_entropy(x, INDEX[:, 0]),
    "transpose": lambda x: x.t().contiguous() + 1,
    "repeat": lambda x: x[:64].repeat(4, 2) + 1,
    "gather_dim1": lambda x: x.gather(1, INDEX) * 2,
    "pad": lambda x: F.pad(x, (1, 1, 2, 2)) * 2,
    "tril": lambda x: x.tril() + 1,
    "mean_dim0": lambda x: x.mean(0),
    "nchw_to_nhwc": lambda x: IMAGE.permute(0, 2, 3, 1).contiguous(),
    "batch_norm_eval": lambda x: F.batch_norm(IMAGE, C64, C64, C64, C64, training=False),
    "group_norm": lambda x: F.group_norm(IMAGE, 8, C64, C64),
    "max_pool": lambda x: F.max_pool2d(IMAGE, 2),
    "avg_pool": lambda x: F.avg_pool2d(IMAGE, 2),
    "max_pool_pad": lambda x: F.max_pool2d(IMAGE, 3, 2, 1),
    "avg_pool_pad": lambda x: F.avg_pool2d(IMAGE, 3, 2, 1),
    "interpolate_nearest": lambda x: F.interpolate(IMAGE, scale_factor=2, mode="nearest"),
}


def main() -> None:
    import kiln

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=",".join(CASES))
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    print(f"CPU ({torch.get_num_threads()} threads), torch {torch.__version__}")
    print("| op | eager us | Inductor us | kiln us | kiln vs Inductor |")
    print("|---|---|---|---|---|")
    for name in args.ops.split(","):
        fn = CASES[name]
        torch._dynamo.reset()
        compiled = {"inductor": torch.compile(fn), "kiln": kiln.compile(fn)}
        with torch.no_grad():
            expected = fn(X)
            for result in (compiled["inductor"](X), compiled["kiln"](X)):
                torch.testing.assert_close(result, expected, rtol=2e-2, atol=2e-2)
            timed = [median_seconds(f, (X,), args.calls) * 1e6 for f in (fn, *compiled.values())]
        eager, inductor, ours = timed
        print(f"| {name} | {eager:.1f} | {inductor:.1f} | {ours:.1f} | {inductor / ours:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
