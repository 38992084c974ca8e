"""The benchmark cases stay runnable: each one, at a tiny size, compiled with kiln matches eager.

Nothing is timed here; `python -m benchmarks.run` does that.
"""

import sys
from pathlib import Path

import pytest
import torch

# benchmarks/ is not an installed package: import it from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import run_compiled  # noqa: E402

from benchmarks.cases import CASES  # noqa: E402
from benchmarks.measure import check_close  # noqa: E402


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_case_runs_with_kiln(case):
    work = case.make(small=True)
    with torch.no_grad():
        expected = work.fn(*work.args)
        actual, report = run_compiled(work.fn, *work.args)
    assert report is not None, f"kiln did not compile {case.name} (it ran in ATen)"
    assert check_close(actual, expected) is None, check_close(actual, expected)
    assert work.nbytes > 0
