"""Memory of a training step: the peak analysis (passes/peak.py) names what is live at the
peak, slots no later temporary takes are freed, and training results still equal eager's."""

import copy

import torch

import kiln
from kiln.codegen.host import load
from kiln.frontend.backend import REPORTS
from kiln.ir.host import Alloc, Free, HostProgram, InputSpec, Launch, Ref, Return
from kiln.passes.memory import plan_memory
from kiln.passes.peak import SAVED, graph_peak, step_peak
from kiln.tools.report_html import render_html
from tests.conftest import assert_same


class _Block(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm, self.fc = torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d)
        self.proj = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.norm(x))))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(_Block(32), _Block(32))


def _train_step(model):
    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        return loss
    return step


def test_peak_names_what_the_forward_saves():
    model, x = _model(), torch.randn(4, 16, 32)
    with REPORTS.collect() as reports:
        kiln.compile(_train_step(model))(x)
    forward = next(r for r in reports if r.partition is not None)
    peak = step_peak(reports)
    assert peak is not None and set(peak.peaks) == {"forward", "backward"}
    assert peak.nbytes >= max(peak.peaks.values()) > 0
    saved = peak.by_role()[SAVED]
    saved_bytes = {_layout_bytes(t) for _, t in forward.partition.saved}
    for buf in saved:  # every buffer called saved is as large as one the partition saved (or a view of it)
        assert buf.nbytes in saved_bytes, (buf, forward.partition.saved)
        assert buf.made_by and buf.size_known
    # the saved activations of the Linear layers come from kernels or ATen calls of the model code
    assert any("fc" in buf.code or "Block" in buf.code for buf in saved)
    assert sum(b.nbytes for b in saved) <= forward.partition.saved_bytes


def _layout_bytes(text: str) -> int:
    """'float32[4, 16]' -> its bytes."""
    dtype, shape = text.split("[")
    numel = 1
    for s in shape.rstrip("]").split(","):
        numel *= int(s) if s.strip() else 1
    return numel * getattr(torch, dtype).itemsize


def test_explain_prints_the_peak(monkeypatch):
    # the whole-graph cache's hit, not the joint cache's: a joint hit runs no partitioner, and the
    # analysis tells a forward by its partition summary
    monkeypatch.setenv("KILN_JOINT_CACHE", "0")
    model, x = _model(), torch.randn(4, 16, 32)
    explanation = kiln.explain(_train_step(model), x, show_kernels=False)  # from the graph cache
    assert explanation.memory is not None
    assert all(b.size_known for b in explanation.memory.live)
    text = str(explanation)
    assert "peak memory" in text and "saved for the backward" in text
    assert explanation.memory.live[0].nbytes == max(b.nbytes for b in explanation.memory.live)
    html = render_html(explanation)
    assert "Memory at the peak" in html and explanation.memory.live[0].name in html


def _chain_program() -> HostProgram:
    """arg0 -> buf0 -> buf1 -> buf2 -> out: three temporaries of different sizes."""
    sizes = {"buf0": 1024, "buf1": 2048, "buf2": 4096, "out": 8}
    body, src = [], "arg0"
    for name, n in sizes.items():
        body += [Alloc(name, (n,), (1,), torch.float32), Launch("fill_with_sum", (src, name), (name,))]
        src = name
    body.append(Return((Ref("out"),)))
    inputs = (InputSpec("arg0", 0, torch.float32, (16,), (1,), "cpu"),)
    return HostProgram("cpu", "tensors", 1, inputs, tuple(body))


def test_a_slot_no_later_temporary_takes_is_freed_after_its_last_read():
    """Without an arena a slot's memory used to stay until the program returned: the peak was
    the sum of all temporaries, not the most live at once."""
    planned, plan = plan_memory(_chain_program(), arena=False)
    frees = [i.name for i in planned.body if isinstance(i, Free)]
    assert [f for f in frees if f.startswith("buf")] == ["buf0", "buf1", "buf2"]
    assert graph_peak(planned).nbytes == (2048 + 4096) * 4  # buf1 and buf2, never buf0 with them
    x = torch.randn(16)
    (out,) = load(planned, {"fill_with_sum": lambda src, dst: dst.fill_(src.sum())})([x])
    assert_same(out, torch.full((8,), float(x.sum() * 1024 * 2048 * 4096)), tol={"rtol": 1e-5, "atol": 0})


def test_arena_slots_are_kept():
    planned, _ = plan_memory(_chain_program(), arena=True)
    assert planned.arena and not any(isinstance(i, Free) and i.name.startswith("buf") for i in planned.body)


def test_training_results_equal_eager():
    model = _model()
    reference = copy.deepcopy(model)
    x = torch.randn(4, 16, 32)
    loss = kiln.compile(_train_step(model))(x)
    expected = _train_step(reference)(x)
    assert_same(loss, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_same(p.grad, q.grad)
