"""The HTML report as a person sees it: a training step's explanation written as one page, which
a real headless browser renders without console errors, with the roofline's markers and the
fusion graphs drawn; and the Explanation it is written from is data."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_same

import kiln
from kiln.tools.report_html import program_steps, roofline_points

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no headless chromium (apt-get install chromium)")
KERNEL_ORANGE = (245, 133, 24)  # report_html.KERNEL_COLOR


class Block(torch.nn.Module):
    def __init__(self, dim: int = 32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 2 * dim)
        self.down = torch.nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


@pytest.fixture(scope="module")
def training():
    """A training step (a forward and a backward graph), explained and measured."""
    torch.manual_seed(0)
    model, x = Block(), torch.randn(4, 8, 32)
    reference = Block()
    reference.load_state_dict(model.state_dict())

    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        return loss

    explanation = kiln.explain(step, x, measure=True, show_kernels=False)
    model.zero_grad()
    compiled_loss = kiln.compile(step)(x)
    loss = reference(x).square().mean()
    loss.backward()
    assert_same(compiled_loss, loss)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_same(p.grad, q.grad)
    return explanation


@pytest.fixture(scope="module")
def page(training, tmp_path_factory) -> tuple[Path, float]:
    path = tmp_path_factory.mktemp("report") / "report.html"
    t0 = time.perf_counter()
    training.save_html(path, title="a training step")
    return path, time.perf_counter() - t0


def test_the_explanation_is_data_whose_text_is_its_str(training):
    assert len(training.graphs) == 2  # forward and backward
    kernels = training.kernels
    assert kernels and all(k.cost is not None and k.measured_s > 0 and k.source is not None for k in kernels)
    assert any("layernorm" in k.name for k in kernels) and any("gelu" in k.name for k in kernels)
    assert any("norm (LayerNorm)" in k.model_code for k in kernels)
    assert training.decisions == [d for g in training.graphs for d in g.decisions]
    assert any("mm" in op for op in training.fallbacks)
    named = [(d, o) for g in training.graphs for d, o in g.decision_code() if o is not None]
    # the modules are named from step's own variable: `model`
    assert named and any(o.module in ("model.norm", "model.up", "model.down") for _, o in named)
    assert set(training.graphs[0].source_map) <= set(training.source_map)
    text = str(training)
    assert all(k.name in text for k in kernels) and "alias   " not in text


def test_the_page_is_one_self_contained_file_written_quickly(training, page):
    path, seconds = page
    assert seconds < 10, seconds  # the target is 2 s for GPT-2 (docs/explain.md); this catches a blow-up
    text = path.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)  # nothing fetched
    assert "<link" not in text and "<script src" not in text and "url(http" not in text
    points = roofline_points(training)
    kernel_points = [p for p in points if p[0] == "kernel"]
    markers = re.search(r'<g id="roofline-kernel-markers">(.*?)</g>', text, re.S)
    assert markers and markers.group(1).count("<use ") == len(kernel_points) > 0
    for i, g in enumerate(training.graphs):
        steps, edges = program_steps(g)
        graph = re.search(rf'<svg class="fusion-graph" id="fusion-graph-{i}".*?</svg>', text, re.S).group(0)
        assert graph.count("<rect ") == len(steps) and graph.count('class="edge"') == len(edges) > 0
    table = re.search(r"<table class='sortable' id='kernels'>.*?</table>", text, re.S).group(0)
    assert table.count("<tr>") == len(training.kernels) + 1
    for k in training.kernels:
        assert f"<code>{k.name}</code>" in table
    assert "break-even" in text and "fuse+kernelize" in text


def _chromium(*args: str) -> subprocess.CompletedProcess:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


PROBE = """<script>
var markers = document.querySelectorAll("#roofline-kernel-markers use");
var drawn = Array.prototype.filter.call(markers, function (m) { var b = m.getBoundingClientRect();
  return b.width > 0 && b.height > 0; }).length;
var boxes = document.querySelectorAll("svg.fusion-graph rect");
var shown = Array.prototype.filter.call(boxes, function (r) { return r.getBBox().width > 100; }).length;
document.body.setAttribute("data-probe", drawn + " of " + markers.length + " markers, " + shown + " of "
  + boxes.length + " boxes");
</script>"""


@needs_browser
def test_a_browser_draws_the_page_without_console_errors(page, tmp_path):
    from PIL import Image

    path, _ = page
    shot = tmp_path / "report.png"
    out = _chromium(f"--screenshot={shot}", "--window-size=1280,3000", path.as_uri())
    assert shot.exists(), out.stderr[-2000:]
    assert _console(out.stderr) == [], _console(out.stderr)
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int32).reshape(-1, 3)
    assert (pixels != 255).any(axis=1).mean() > 0.05  # not blank
    assert len(np.unique(pixels, axis=0)) > 50
    orange = (np.abs(pixels - np.array(KERNEL_ORANGE)) < 40).all(axis=1).sum()
    assert orange > 200  # roofline markers and kernel boxes, in kiln's kernel color

    probed = tmp_path / "probed.html"  # the page, with a script that asks the layout what it drew
    probed.write_text(path.read_text().replace("</body>", PROBE + "</body>"))
    dom = _chromium("--virtual-time-budget=3000", "--dump-dom", probed.as_uri())
    assert _console(dom.stderr) == [], _console(dom.stderr)
    found = re.search(r'data-probe="(\d+) of (\d+) markers, (\d+) of (\d+) boxes"', dom.stdout)
    assert found, dom.stdout[-2000:]
    drawn, markers, shown, boxes = map(int, found.groups())
    assert drawn == markers > 0 and shown == boxes > 0


@needs_browser
def test_the_console_check_catches_a_page_error(tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><p>text</p><script>undefinedFunction();</script></body></html>")
    out = _chromium("--virtual-time-budget=1000", "--dump-dom", broken.as_uri())
    assert any("undefinedFunction" in line for line in _console(out.stderr)), out.stderr[-2000:]


def test_the_command_line_writes_the_page(tmp_path, capsys):
    from kiln.tools.__main__ import main

    path = tmp_path / "demo.html"
    assert main(["explain", "--html", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    text = path.read_text()
    assert "kiln report: the demo block" in text and 'id="roofline-kernel-markers"' in text
    assert "fusion-graph-0" in text and "kiln_rmsnorm_0" in text
