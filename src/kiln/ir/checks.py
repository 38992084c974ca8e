"""Run-time checks of generated code: what a kernel reports, and what the host raises then.

A kernel cannot raise. Where eager would (an index out of range, an integer division by
zero), it writes into its error buffer and goes on without touching memory outside its
buffers; the host program reads the errors once after all launches and raises as eager does.
The error buffer holds two int64 per check: a flag, and one offending value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_OUT_OF_BOUNDS = "index {value} is out of bounds for dimension {dim} with size {size}"


@dataclass(frozen=True)
class ErrorRule:
    """What eager raises for one kind of check: the exception and its message (formatted with
    the offending value, the dimension and its size)."""

    exception: type[Exception]
    message: str
    wrap: bool = False  # index rules: negative indices count from the end (else they are errors)
    # False where the op's indices are in range by construction (an upsampling's): an index out
    # of range is still read as 0, never outside the buffer, but not reported
    reported: bool = True


# The ATen ops that read or write through data-dependent indices, and integer division (the
# CPU kernels' messages).
RULES: dict[str, ErrorRule] = {
    "index_select": ErrorRule(IndexError, "index out of range in self"),
    # eager's index_select along dim 1 runs another kernel, with its own error
    "index_select_dim1": ErrorRule(
        RuntimeError, "INDICES element is out of DATA bounds, id={value} axis_dim={size}"
    ),
    "embedding": ErrorRule(IndexError, "index out of range in self"),
    # x[i, :, j]: the dimension eager names is the index tensor's position (j: 1), not x's
    "index": ErrorRule(
        IndexError, "index {value} is out of bounds for dimension {input} with size {size}", wrap=True
    ),
    "gather": ErrorRule(RuntimeError, _OUT_OF_BOUNDS),
    "scatter": ErrorRule(RuntimeError, _OUT_OF_BOUNDS),
    "nll_loss": ErrorRule(IndexError, "Target {value} is out of bounds."),  # its target, gathered
    "take": ErrorRule(
        IndexError, "out of range: tried to access index {value} on a tensor of {size} elements.", wrap=True
    ),
    "divide_by_zero": ErrorRule(RuntimeError, "ZeroDivisionError"),
    "unchecked_index": ErrorRule(IndexError, _OUT_OF_BOUNDS, wrap=True, reported=False),
}


@dataclass(frozen=True)
class Check:
    """One check site of a kernel: its rule (a key of RULES), and for an index the dimension
    and size it indexes and which of the op's index tensors it comes from."""

    rule: str
    dim: int = 0
    size: Any = 0  # an int, or a size of the shape family
    input: int = 0

    def error(self, value: int, size: int | None = None) -> Exception:
        """The exception eager raises; size is this call's value of a symbolic size."""
        rule = RULES[self.rule]
        size = self.size if size is None else size
        message = rule.message.format(value=value, dim=self.dim, size=size, input=self.input)
        error = rule.exception(message)
        setattr(error, RAISED_AS_EAGER, True)
        return error

    def __str__(self) -> str:
        if self.rule not in INDEX_RULES:
            return self.rule
        return f"{self.rule} dim {self.dim} size {self.size} input {self.input}"


# An exception the host program raises on eager's behalf (the user's error, not kiln's) carries
# this attribute, so that kiln's own fallbacks let it through.
RAISED_AS_EAGER = "kiln_raised_as_eager"
INDEX_RULES = frozenset(RULES) - {"divide_by_zero"}
ERROR_PARAM = "err"  # the kernel parameter of its error buffer
SLOTS_PER_CHECK = 2  # flag, value: 16 bytes, so that every kernel's part stays 16-byte aligned
