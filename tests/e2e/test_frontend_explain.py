"""kiln.explain leaves what the user compiled alone, takes the model's keyword inputs, and the
process-wide list of compile reports stays bounded."""

import pytest
import torch
from conftest import assert_same
from op_inputs import randn

import kiln
from kiln.frontend.backend import REPORTS


class Scaled(torch.nn.Module):
    def forward(self, input_ids, scale=1.0):
        return torch.tanh(input_ids.float() * scale)


def test_explain_does_not_recompile_what_the_user_compiled():
    def f(x):
        return torch.cos(x) * 2

    compiled = kiln.compile(f)
    x = randn(8)
    assert_same(compiled(x), f(x))
    before = len(REPORTS)
    assert "== graph 0 ==" in str(kiln.explain(lambda y: torch.exp(y) + 1, randn(5)))
    assert len(REPORTS) == before + 1
    assert_same(compiled(x), f(x))
    assert len(REPORTS) == before + 1  # still compiled: the explain did not reset Dynamo


def test_explain_takes_keyword_inputs_and_options_separately():
    text = str(kiln.explain(Scaled(), input_ids=torch.arange(6), scale=0.5, options={"mode": "max-autotune"}))
    assert "== graph 0 ==" in text and "kernels: 1" in text
    with pytest.raises(TypeError, match="unknown kiln option"):
        kiln.explain(Scaled(), input_ids=torch.arange(6), options={"scale": 0.5})


def test_explain_of_one_function_again_and_again():
    """Each explain compiles anew; Dynamo's recompile limit is not reached."""

    def f(y):
        return torch.exp(y) + 1

    for _ in range(10):
        assert "== graph 0 ==" in str(kiln.explain(f, randn(5)))


def test_report_log_keeps_the_newest_and_counts_all():
    from kiln.frontend.backend import ReportLog

    log = ReportLog(keep=3)
    with log.collect() as collected:
        for k in range(5):
            log.append(k)
    assert len(log) == 5 and collected == [0, 1, 2, 3, 4]
    assert log[-1] == 4 and log[2] == 2 and log[1:] == [2, 3, 4] and log[4:] == [4]
    with pytest.raises(IndexError):
        log[1]
    log.append(5)
    assert collected == [0, 1, 2, 3, 4]  # collection ends with the block
    assert isinstance(REPORTS, ReportLog)


def softmax_of_sum(x, y):
    return torch.softmax(x + y, -1) * 2


def test_explain_returns_data_whose_text_shows_the_costs():
    from kiln.tools.explain import Explanation

    x, y = randn(64, 1024), randn(64, 1024, seed=1)
    explanation = kiln.explain(softmax_of_sum, x, y)
    assert isinstance(explanation, Explanation) and len(explanation.graphs) == 1
    graph = explanation.graphs[0]
    assert {"attention", "import", "fuse+kernelize", "build"} <= {p.name for p in graph.passes}
    assert graph.host_program is not None and not graph.fallbacks
    assert {d.verdict for d in graph.decisions} == {"fused"}
    (kernel,) = graph.kernels
    assert kernel.cost.must_move == 3 * 64 * 1024 * 4  # x and y read, the result written
    assert graph.cost.launches == 1 and graph.cost.eager_launches > 1
    assert graph.cost.eager_moves > graph.cost.moves
    assert kernel.measured_s is None and explanation.eager_s is None
    text = str(explanation)
    assert text.startswith("== graph 0 ==\npasses:") and "kernels: 1" in text
    assert f"against eager's ops: launches {graph.cost.eager_launches} -> 1, bytes" in text
    assert "break-even (kiln's passes):" in text and "predicted" in text
    assert "break-even (first call: Dynamo, AOTAutograd and kiln):" in text
    ir_header = f"kernel {kernel.name}("
    assert ir_header in text  # the kernel IR, after the cost lines
    assert text.index("cost (per call") < text.index(ir_header)


def test_explain_folds_views_passed_without_copy_into_one_line():
    text = str(kiln.explain(lambda a: (a.t(), a[1:], a.sum(-1)), randn(32, 16)))
    assert "alias: 2 views passed without copy" in text
    assert not any(line.startswith("  alias   ") for line in text.splitlines())
    assert "decisions: alias 2, stored 1" in text  # the counts still count each


def test_explain_lists_ops_left_to_aten_and_their_matmul_cost():
    x, w = randn(32, 64), randn(64, 16, seed=1)
    graph = kiln.explain(lambda a, b: torch.relu(a @ b), x, w, options={"matmul_templates": False}).graphs[0]
    assert any("mm" in op for op in graph.fallbacks), graph.fallbacks
    (mm,) = [c for c in graph.cost.aten if c.name == "mm"]
    assert mm.flops == 2 * 32 * 64 * 16


def test_explain_measures_kernels_and_the_break_even():
    x, y = randn(256, 1024), randn(256, 1024, seed=1)
    explanation = kiln.explain(softmax_of_sum, x, y, measure=True, show_kernels=False)
    assert explanation.eager_s > 0 and explanation.compiled_s > 0
    (kernel,) = explanation.graphs[0].kernels
    assert kernel.measured_s > 0 and kernel.achieved > 0
    assert explanation.break_even.measured and explanation.break_even.compile_s > 0
    text = str(explanation)
    assert "of the roofline" in text and "measured per call: eager" in text
    assert f"kernel {kernel.name}(" not in text
    assert_same(kiln.compile(softmax_of_sum)(x, y), softmax_of_sum(x, y))  # what was measured is right


def test_explain_of_gpt2_shows_the_roofline_and_the_break_even():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                     use_cache=False)
    model = transformers.GPT2Model(config).eval()
    ids = torch.randint(0, 128, (2, 32))
    with torch.no_grad():
        explanation = kiln.explain(model, ids, measure=True, show_kernels=False)
        assert_same(kiln.compile(model)(ids).last_hidden_state, model(ids).last_hidden_state)
    graph = explanation.graphs[0]
    assert len(graph.kernels) > 3 and all(k.measured_s > 0 and k.achieved > 0 for k in graph.kernels)
    assert graph.cost.aten and graph.cost.eager_launches > graph.cost.launches
    assert any(c.flops > 0 for c in graph.cost.aten)  # the projections' matmuls
    text = str(explanation)
    assert text.count("of the roofline") == len(graph.kernels)
    assert "break-even (kiln's passes):" in text
    assert "break-even (first call: Dynamo, AOTAutograd and kiln):" in text and "measured" in text
