"""Logs by topic: KILN_LOGS (and torch's TORCH_LOGS names) choose what kiln says, per-pass IR
at debug level, and a long compile says which pass it is in."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import assert_same, run_compiled

from kiln import errors, logs

SRC = str(Path(__file__).resolve().parents[2] / "src")


class Collected(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def messages(self, topic: str, level: int = logging.DEBUG) -> list[str]:
        return [r.getMessage() for r in self.records if r.name == f"kiln.{topic}" and r.levelno >= level]


@pytest.fixture
def collected():
    """A handler on the `kiln` logger (configure then adds none of its own); levels reset after."""
    handler = Collected()
    root = logging.getLogger("kiln")
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        logs.configure("")


def softmax_sum(x):
    return torch.softmax(x * 2, -1).sum(0)


def test_kiln_logs_names_topics_levels_and_all():
    levels, unknown = logs.parse("passes, +fusion,-fallbacks,bogus")
    assert levels == {"passes": logging.INFO, "fusion": logging.DEBUG, "fallbacks": logging.ERROR}
    assert unknown == ["bogus"]
    everything, _ = logs.parse("+all,-cache")
    assert set(everything) == set(logs.TOPICS) and everything["cache"] == logging.ERROR
    assert everything["passes"] == logging.DEBUG
    with pytest.raises(ValueError, match="no log topic"):
        logs.logger("nonsense")


def test_each_pass_logs_its_time_and_at_debug_its_ir(collected, monkeypatch):
    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")  # the compile runs its passes
    logs.configure("+passes,fusion,+kernels")
    x = torch.randn(8, 16)
    out, report = run_compiled(softmax_sum, x)
    assert_same(out, softmax_sum(x))
    lines = collected.messages("passes")
    for name in ("import", "simplify", "fuse+kernelize", "host", "codegen"):
        assert any(line.startswith(name) and " ms " in line for line in lines), (name, lines)
    debug = "\n".join(collected.messages("passes"))
    for what in ("tensor graph after import", "tensor graph after simplify", "kernel IR after kernelize",
                 "host program after memory"):
        assert what in debug, what
    assert f"kernel {report.kernels[0].name}(" in debug
    fusion = collected.messages("fusion")
    assert any(f"{report.num_kernels} kernels" in line for line in fusion)
    assert not any(line.startswith("decisions:") for line in fusion)  # fusion's debug level is off
    assert any(m.startswith(f"source of {report.kernels[0].name}") for m in collected.messages("kernels"))
    assert not collected.messages("cache")  # not asked for


def test_a_quiet_topic_hides_even_its_warnings(collected):
    fallback = errors.Fallback("graph", "unsupported", "a test's reason for running in ATen")
    logs.configure("")
    errors.record(fallback)
    assert collected.messages("fallbacks", logging.WARNING) == [str(fallback)]
    collected.records.clear()
    logs.configure("-fallbacks")
    errors.record(fallback)
    assert collected.messages("fallbacks") == []


def test_a_long_compile_says_which_pass_it_is_in(collected, monkeypatch):
    import kiln.passes.pipeline as pipeline

    monkeypatch.setenv("KILN_GRAPH_CACHE", "0")
    monkeypatch.setattr(logs, "LONG_STEP_S", 0.2)
    monkeypatch.setattr(logs, "WARN_AFTER_S", 0.5)
    plan_memory = pipeline.plan_memory

    def slow_plan_memory(host, **options):
        time.sleep(0.9)
        return plan_memory(host, **options)

    monkeypatch.setattr(pipeline, "plan_memory", slow_plan_memory)
    logs.configure("passes")
    x = torch.randn(4, 8)
    out, _ = run_compiled(softmax_sum, x)
    assert_same(out, softmax_sum(x))
    progress = [r for r in collected.records
                if r.name == "kiln.passes" and "compiling a graph" in r.getMessage()]
    running = [r.getMessage() for r in progress if "still running" in r.getMessage()]
    assert sum("in memory for" in m for m in running) >= 2, running  # 0.9 s in it, told every 0.2 s
    assert progress[-1].getMessage().endswith(" s") and "took" in progress[-1].getMessage()
    # info level at first, warnings once past WARN_AFTER_S: those show without KILN_LOGS
    assert progress[0].levelno == logging.INFO and progress[-1].levelno == logging.WARNING


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("KILN_LOGS", "TORCH_LOGS")}
    environ.update(PYTHONPATH=SRC, KILN_GRAPH_CACHE="0", **env)
    return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True,
                          timeout=300)


COMPILE = """
import sys, torch, kiln
assert "torch._dynamo" not in sys.modules  # import kiln still leaves Dynamo out
f = kiln.compile(lambda x: torch.softmax(x * 2, -1).sum(0))
x = torch.randn(8, 16)
torch.testing.assert_close(f(x), torch.softmax(x * 2, -1).sum(0))
"""


def test_kiln_logs_and_torch_logs_names_print_to_stderr_in_a_fresh_process():
    out = _run(COMPILE, KILN_LOGS="passes,-fallbacks,nonsense", TORCH_LOGS="fusion")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[kiln.passes] import" in out.stderr and "[kiln.passes] build" in out.stderr, out.stderr[-3000:]
    assert "KILN_LOGS names nonsense, which are no topics" in out.stderr
    assert "[kiln.fusion] " in out.stderr and "decisions:" in out.stderr  # torch's fusion: kiln's at debug
    assert "[kiln.kernels]" not in out.stderr and "tensor graph after import" not in out.stderr


def test_torch_logs_plus_kiln_shows_every_topic_at_debug():
    out = _run(COMPILE, TORCH_LOGS="+kiln")
    assert out.returncode == 0, out.stderr[-3000:]
    for text in ("tensor graph after import", "kiln/passes/pipeline.py", "source of kiln_"):
        assert text in out.stderr, (text, out.stderr[-3000:])
