"""Several training steps, compiled against eager: an MLP, a conv net, a small GPT-2 and a
small Llama (transformers configs, random weights), in float32 and under bf16 autocast.
Losses agree at every step; every parameter's gradient agrees on the first step. The MLP
also has a frozen layer and a submodule in eval mode inside the training graph."""

import copy
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln

os.environ.setdefault("HF_HUB_OFFLINE", "1")
STEPS = 3


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(24, 32)
        self.frozen.requires_grad_(False)
        self.body = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Dropout(0.5))
        self.head = nn.Linear(64, 10)

    def train(self, mode: bool = True):
        super().train(mode)
        self.body[3].eval()  # an eval-mode module inside a training graph: dropout is off
        return self

    def forward(self, x, y):
        return F.cross_entropy(self.head(self.body(torch.tanh(self.frozen(x)))), y)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.fc = nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.Linear(16, 10)

    def forward(self, x, y):
        h = F.relu(self.bn(self.conv1(x)))
        h = F.silu(self.conv2(h)).mean((2, 3))
        return F.cross_entropy(self.fc(h), y)


class LM(nn.Module):
    """A transformers causal LM whose forward returns its loss."""

    def __init__(self, kind: str):
        super().__init__()
        import transformers

        common = {"vocab_size": 128}
        if kind == "gpt2":
            config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, resid_pdrop=0.0,
                                             embd_pdrop=0.0, attn_pdrop=0.0, **common)
            self.model = transformers.GPT2LMHeadModel(config)
        else:
            config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                              num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=32, **common)
            self.model = transformers.LlamaForCausalLM(config)

    def forward(self, ids, labels):
        return self.model(input_ids=ids, labels=labels).loss


def _model_and_batches(name: str):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name == "mlp":
        return MLP(), [(torch.randn(16, 24, generator=g), torch.randint(0, 10, (16,), generator=g))
                       for _ in range(STEPS)]
    if name == "convnet":
        return ConvNet(), [(torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 10, (4,), generator=g))
                           for _ in range(STEPS)]
    batches = []
    for _ in range(STEPS):
        ids = torch.randint(0, 128, (2, 16), generator=g)
        batches.append((ids, ids))
    return LM(name), batches


def _rel_error(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-12) -> float:
    """|a - b| / |b|; a gradient that is zero in exact arithmetic (a conv bias before batch
    norm) is rounding noise, measured against floor instead."""
    return ((a.double() - b.double()).norm() / max(b.double().norm().item(), floor)).item()


@pytest.mark.parametrize("precision", ["float32", "autocast-bf16"])
@pytest.mark.parametrize("name", ["mlp", "convnet", "gpt2", "llama"])
def test_training_steps_match_eager(name, precision):
    eager, batches = _model_and_batches(name)
    eager.train()
    model = copy.deepcopy(eager)
    compiled = kiln.compile(model)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    opt_k = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    autocast = precision == "autocast-bf16"
    # float32 sums in another order than eager; bf16 autocast rounds every matmul input
    # (a zero gradient's noise is measured against a fraction of the largest gradient)
    loss_tol, grad_tol, noise = (1e-4, 1e-3, 1e-3) if not autocast else (2e-2, 5e-2, 1e-2)
    for step, batch in enumerate(batches):
        losses = []
        for m, opt in ((eager, opt_e), (compiled, opt_k)):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = m(*batch)
            loss.backward()
            losses.append(loss.detach().float())
        assert torch.isfinite(losses[1]), f"step {step}: loss {losses[1]}"
        assert _rel_error(losses[1], losses[0]) <= loss_tol, f"step {step}: loss {losses[1]} vs {losses[0]}"
        if step == 0:
            scale = max(p.grad.norm().item() for p in eager.parameters() if p.grad is not None)
            for (pname, pe), pk in zip(eager.named_parameters(), model.parameters()):
                if not pe.requires_grad:
                    assert pk.grad is None, pname  # frozen stays frozen
                    continue
                assert pk.grad is not None, pname
                error = _rel_error(pk.grad, pe.grad, noise * scale)
                assert error <= grad_tol, f"grad of {pname}: relative error {error:.3g}"
        for opt in (opt_e, opt_k):
            opt.step()
            opt.zero_grad()
