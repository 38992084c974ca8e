"""Why kiln ran something in ATen, as values.

Tests, the conformance sweep and `kiln.explain` read these records, never log text. A record
is made where the decision is taken; the one warning a user sees is written from it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from kiln import counters

log = logging.getLogger("kiln.fallbacks")  # kiln/logs.py's topic

# by design:   kiln leaves it to ATen on purpose (e.g. integer interpolation, scans)
# unsupported: kiln has no lowering, or the inputs are of a kind it does not compile
# trace:       AOTAutograd could not trace the graph with kiln's decompositions
# internal:    kiln itself raised (a lowering, code generation or build bug)
# upstream:    PyTorch's shape function for an op disagrees with the op's kernel, so code
#              compiled for the shapes PyTorch promised cannot run
KINDS = ("by design", "unsupported", "trace", "internal", "upstream")
SCOPES = ("graph", "op")
# a user's own Triton kernel that kiln does not launch is told as a warning: it was written for speed
USER_KERNEL = "user Triton kernel"


@dataclass(frozen=True)
class Fallback:
    """scope "graph": a whole graph runs in ATen; scope "op": one ATen call inside a
    compiled program (op names it)."""

    scope: str
    kind: str
    reason: str
    op: str = ""

    def __post_init__(self) -> None:
        if self.scope not in SCOPES or self.kind not in KINDS:
            raise ValueError(f"bad fallback record: scope {self.scope!r}, kind {self.kind!r}")

    def __str__(self) -> str:
        where = f"{self.op} runs" if self.scope == "op" else "graph runs"
        return f"kiln: {where} in ATen ({self.kind}): {self.reason}"


class MetaMismatch(RuntimeError):
    """An ATen result at run time has another rank than PyTorch's shape function gave."""

    fallback_kind = "upstream"


# The newest records of this process; bounded so that a long-running process does not grow.
FALLBACKS: collections.deque[Fallback] = collections.deque(maxlen=1000)
_collectors: list[list[Fallback]] = []


def record(fallback: Fallback) -> Fallback:
    """Keep the record and tell the user once: a whole graph in ATen, a kiln bug, or a user's
    kernel kiln does not launch is a warning; an op kiln has no lowering for is expected and
    logged at info level."""
    for made in _collectors:
        made.append(fallback)
    if _held:  # kept back until the compile that made it is kept (held())
        _held[-1].append(fallback)
        return fallback
    FALLBACKS.append(fallback)
    counters.ran_in_aten(fallback.scope, fallback.kind, fallback.reason, fallback.op)
    if fallback.scope == "graph" or fallback.kind == "internal" or fallback.op.startswith(USER_KERNEL):
        log.warning("%s", fallback)
    else:
        log.info("%s", fallback)
    return fallback


_held: list[list[Fallback]] = []


@contextlib.contextmanager
def held() -> Iterator[list[Fallback]]:
    """Records made while open are kept back, not told: the caller records them again where
    the compile that made them is kept, and drops them where it is not (a shape family's
    compile that gives way to one per shape)."""
    made: list[Fallback] = []
    _held.append(made)
    try:
        yield made
    finally:
        _held.remove(made)


@contextlib.contextmanager
def collect() -> Iterator[list[Fallback]]:
    """The records made while it is open (the graph cache keeps a compile's op records, to
    make them again when it loads the program)."""
    made: list[Fallback] = []
    _collectors.append(made)
    try:
        yield made
    finally:
        _collectors.remove(made)
