"""The compile reports of this process: kept apart from the backend so that loading a cached
program (a warm start) records its report without importing the compiler."""

from __future__ import annotations

import collections
import contextlib
from typing import Any, Iterator


class ReportLog:
    """The compile reports of this process, newest last, numbered from 0 in the order they were
    made: len() counts every report made so far and log[before:] gives those made since len()
    was before. Only the newest `keep` are kept, so that a long-running process does not grow;
    collect() keeps every report made while it is open (what `kiln explain` reads)."""

    def __init__(self, keep: int):
        self._kept: collections.deque = collections.deque(maxlen=keep)
        self._count = 0
        self._collectors: list[list] = []

    def append(self, report: Any) -> None:
        self._kept.append(report)
        self._count += 1
        for reports in self._collectors:
            reports.append(report)

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, k: int | slice) -> Any:
        first = self._count - len(self._kept)  # the number of the oldest report kept
        if isinstance(k, slice):
            return [self._kept[i - first] for i in range(*k.indices(self._count)) if i >= first]
        i = k + self._count if k < 0 else k
        if not first <= i < self._count:
            raise IndexError(f"report {k} is not kept (reports {first}..{self._count - 1} are)")
        return self._kept[i - first]

    @contextlib.contextmanager
    def collect(self) -> Iterator[list]:
        reports: list = []
        self._collectors.append(reports)
        try:
            yield reports
        finally:
            self._collectors.remove(reports)


REPORTS = ReportLog(keep=64)
