"""The CPU benchmark cases: a function, an input factory, and the bytes that must move.

Each case's `make(small)` returns a Workload. `small=True` gives tiny shapes for the smoke
test; the default sizes make one eager run take a few milliseconds or more on a 2-core CPU.

`nbytes` is the traffic a perfect kernel cannot avoid: every input (weights included) read
once and every output written once. Dividing it by a run's time gives the achieved GB/s.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F


@dataclass
class Workload:
    fn: Callable  # a function or an nn.Module (in eval mode)
    args: tuple
    nbytes: int  # inputs read once + outputs written once


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    make: Callable[[bool], Workload]


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _seeded() -> None:
    torch.manual_seed(0)


# --- (1) a long element-wise chain -------------------------------------------------------


def elementwise_chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a = x * 1.5 + y
    b = torch.exp(-a.abs())
    c = torch.tanh(a) * b
    d = torch.sigmoid(c + y)
    e = torch.where(x > 0, d, c * 0.5)
    f = e * e + 0.1 * x
    return torch.sqrt(f.abs() + 1.0) - y * d


def make_elementwise(small: bool = False) -> Workload:
    _seeded()
    shape = (64, 64) if small else (2048, 2048)  # 4M float32
    x, y = torch.randn(shape), torch.randn(shape)
    return Workload(elementwise_chain, (x, y), tensor_bytes(x, y, x))


# --- (2) RMSNorm ------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Llama's RMSNorm: statistics in float32, result back in the input's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def _make_rms_norm(dtype: torch.dtype, small: bool) -> Workload:
    _seeded()
    rows, cols = (32, 64) if small else (4096, 4096)
    x = torch.randn(rows, cols, dtype=dtype)
    w = torch.rand(cols, dtype=dtype) + 0.5
    return Workload(rms_norm, (x, w), tensor_bytes(x, w, x))


def make_rms_norm_f32(small: bool = False) -> Workload:
    return _make_rms_norm(torch.float32, small)


def make_rms_norm_bf16(small: bool = False) -> Workload:
    return _make_rms_norm(torch.bfloat16, small)


# --- (3) bias + GELU + residual + LayerNorm ---------------------------------------------


def bias_gelu_residual_layernorm(x, bias, residual, weight, beta) -> torch.Tensor:
    h = F.gelu(x + bias) + residual
    return F.layer_norm(h, (h.shape[-1],), weight, beta)


def make_bias_gelu_ln(small: bool = False) -> Workload:
    _seeded()
    rows, cols = (32, 64) if small else (4096, 1024)
    x, residual = torch.randn(rows, cols), torch.randn(rows, cols)
    bias, weight, beta = torch.randn(cols), torch.rand(cols) + 0.5, torch.randn(cols)
    args = (x, bias, residual, weight, beta)
    return Workload(bias_gelu_residual_layernorm, args, tensor_bytes(*args, x))


# --- (4) scaled masked softmax -----------------------------------------------------------


def scaled_masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    scale = 1.0 / math.sqrt(64)
    return torch.softmax((scores * scale).masked_fill(~mask, float("-inf")), dim=-1)


def make_masked_softmax(small: bool = False) -> Workload:
    _seeded()
    b, h, s = (2, 2, 16) if small else (16, 8, 256)
    scores = torch.randn(b, h, s, s)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    return Workload(scaled_masked_softmax, (scores, causal), tensor_bytes(scores, causal, scores))


# --- (5) RMSNorm + SwiGLU FFN block (matmuls stay in ATen) -------------------------------


def rmsnorm_swiglu_ffn(x, norm_w, w_gate, w_up, w_down) -> torch.Tensor:
    h = rms_norm(x, norm_w)
    return x + (F.silu(h @ w_gate) * (h @ w_up)) @ w_down


def make_swiglu_ffn(small: bool = False) -> Workload:
    _seeded()
    tokens, dim, hidden = (16, 32, 88) if small else (512, 1024, 2816)
    x = torch.randn(tokens, dim)
    norm_w = torch.rand(dim) + 0.5
    w_gate = torch.randn(dim, hidden) / math.sqrt(dim)
    w_up = torch.randn(dim, hidden) / math.sqrt(dim)
    w_down = torch.randn(hidden, dim) / math.sqrt(hidden)
    args = (x, norm_w, w_gate, w_up, w_down)
    return Workload(rmsnorm_swiglu_ffn, args, tensor_bytes(*args, x))


# --- (6) a small GPT-2 forward -------------------------------------------------------------


class GPT2Body(torch.nn.Module):
    """transformers' GPT2Model returning the last hidden state (no LM head, no KV cache)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids).last_hidden_state


def make_gpt2(small: bool = False) -> Workload:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Config, GPT2Model

    _seeded()
    batch, seq = (1, 16) if small else (4, 128)
    embd, heads = (64, 2) if small else (256, 4)
    config = GPT2Config(n_layer=2, n_embd=embd, n_head=heads, n_positions=max(seq, 128),
                        vocab_size=1024 if small else 50257, use_cache=False)
    model = GPT2Body(GPT2Model(config)).eval()
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    hidden = torch.empty(batch, seq, embd)
    # Only the embedding rows the ids select must be read; the other weights are read whole.
    weights = [p for n, p in model.named_parameters() if not n.endswith("wte.weight")]
    used_rows = ids.unique().numel() * embd * 4
    return Workload(model, (ids,), tensor_bytes(ids, hidden, *weights) + used_rows)


# --- (7) a small GPT-2 training step (forward, loss, backward) -------------------------------


def make_gpt2_train(small: bool = False) -> Workload:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPT2Config, GPT2LMHeadModel

    _seeded()
    batch, seq = (1, 16) if small else (4, 128)
    embd, heads = (64, 2) if small else (256, 4)
    config = GPT2Config(n_layer=2, n_embd=embd, n_head=heads, n_positions=max(seq, 128), vocab_size=1024 if small
                        else 8192, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    model = GPT2LMHeadModel(config).train()

    def train_step(ids: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            model.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        return loss.detach()

    ids = torch.randint(0, config.vocab_size, (batch, seq))
    # each weight read by the forward and by the backward, and its gradient written
    return Workload(train_step, (ids,), 3 * tensor_bytes(*model.parameters()) + tensor_bytes(ids))


CASES: list[Case] = [
    Case("elementwise", "20-op element-wise chain (mul/add/exp/tanh/sigmoid/where/sqrt), 2048x2048 f32",
         make_elementwise),
    Case("rmsnorm_f32", "RMSNorm 4096x4096 f32", make_rms_norm_f32),
    Case("rmsnorm_bf16", "RMSNorm 4096x4096 bf16 (f32 statistics)", make_rms_norm_bf16),
    Case("bias_gelu_ln", "bias+GELU+residual+LayerNorm 4096x1024 f32", make_bias_gelu_ln),
    Case("masked_softmax", "scaled causal-masked softmax 16x8x256x256 f32", make_masked_softmax),
    Case("swiglu_ffn", "RMSNorm+SwiGLU FFN 512x1024, hidden 2816 f32 (matmuls in ATen)", make_swiglu_ffn),
    Case("gpt2", "GPT-2 body, 2 layers, n_embd 256, 4 heads, batch 4 x seq 128 f32", make_gpt2),
    Case("gpt2_train", "GPT-2 training step (forward, loss, backward), 2 layers, n_embd 256, vocab 8192, "
         "batch 4 x seq 128 f32", make_gpt2_train),
]

CASES_BY_NAME: dict[str, Case] = {c.name: c for c in CASES}


def outputs_of(result: Any) -> list[torch.Tensor]:
    """The tensors of a case's result, flattened (for comparing against eager)."""
    return [t for t in torch.utils._pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
