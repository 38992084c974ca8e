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
    assert "== graph 0 ==" in kiln.explain(lambda y: torch.exp(y) + 1, randn(5))
    assert len(REPORTS) == before + 1
    assert_same(compiled(x), f(x))
    assert len(REPORTS) == before + 1  # still compiled: the explain did not reset Dynamo


def test_explain_takes_keyword_inputs_and_options_separately():
    text = kiln.explain(Scaled(), input_ids=torch.arange(6), scale=0.5, options={"mode": "max-autotune"})
    assert "== graph 0 ==" in text and "kernels: 1" in text
    with pytest.raises(TypeError, match="unknown kiln option"):
        kiln.explain(Scaled(), input_ids=torch.arange(6), options={"scale": 0.5})


def test_explain_of_one_function_again_and_again():
    """Each explain compiles anew; Dynamo's recompile limit is not reached."""

    def f(y):
        return torch.exp(y) + 1

    for _ in range(10):
        assert "== graph 0 ==" in kiln.explain(f, randn(5))


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
