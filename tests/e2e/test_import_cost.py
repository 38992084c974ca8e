"""`import kiln` loads neither Dynamo nor Inductor; `torch.compile(backend="kiln")` still finds
kiln, in fresh processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_import_kiln_does_not_import_dynamo():
    code = ("import sys, kiln; bad = [m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules]; "
            "assert not bad, bad")
    env = {**os.environ, "PYTHONPATH": SRC}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


BACKEND_BY_NAME = """
import importlib.metadata, sys, torch
if sys.argv[1] == "source checkout":  # no installed package: no metadata, no entry point
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)
    importlib.metadata.distribution = not_installed
    importlib.metadata.entry_points = lambda **kw: importlib.metadata.EntryPoints(())
if sys.argv[1] != "no import":
    import kiln  # noqa: F401
assert ("kiln" in sys.modules) == (sys.argv[1] != "no import")
if sys.argv[1] == "source checkout":  # the backend registers once Dynamo is imported, not before
    assert "torch._dynamo" not in sys.modules
    import torch._functorch.aot_autograd  # noqa: F401 - it imports Dynamo midway through itself
fn = lambda x: torch.relu(x) * 2 + 1
x = torch.randn(33, 17)
torch.testing.assert_close(torch.compile(fn, backend="kiln")(x), fn(x))
from kiln.frontend.backend import REPORTS
assert REPORTS, "kiln did not compile the graph"
"""


@pytest.mark.parametrize("first", ["import kiln first", "no import", "source checkout"])
def test_backend_by_name_in_a_fresh_process(tmp_path, first):
    env = {**os.environ, "PYTHONPATH": SRC, "KILN_CACHE_DIR": str(tmp_path), "KILN_TARGET": "cpp"}
    subprocess.run([sys.executable, "-c", BACKEND_BY_NAME, first], env=env, check=True, timeout=300)
