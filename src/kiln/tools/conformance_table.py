"""Markdown summary of a conformance run (the results file of kiln.tools.conformance)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

from kiln.tools.conformance import CLASSES

SKIPPED = ("eager fails", "unsupported dtype", "skipped")
BEGIN, END = "<!-- conformance:begin -->", "<!-- conformance:end -->"


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summary(rows: list[dict]) -> str:
    by_dtype: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        by_dtype[r["dtype"]][r["class"]] += 1
    dtypes = sorted(by_dtype, key=lambda d: ("float32", "bfloat16", "int").index(d) if d in
                    ("float32", "bfloat16", "int") else 9)
    lines = ["| class | " + " | ".join(dtypes) + " |", "|---|" + "---|" * len(dtypes)]
    for cls in CLASSES + SKIPPED:
        lines.append(f"| {cls} | " + " | ".join(str(by_dtype[d][cls]) for d in dtypes) + " |")
    lines.append("| **pass rate** (see above) | " + " | ".join(_rate(by_dtype[d]) for d in dtypes) + " |")
    return "\n".join(lines)


def _rate(c: Counter) -> str:
    """Runs with no crash and no mismatch, over the runs that ran in eager."""
    ran = sum(c[k] for k in CLASSES)
    ok = c["native pass"] + c["fallback pass"] + c["not captured"]
    return f"{100 * ok / ran:.2f}% ({ok}/{ran})" if ran else "-"


def failures(rows: list[dict]) -> str:
    bad = [r for r in rows if r["class"] in ("crash", "mismatch")]
    if not bad:
        return "None."
    lines = ["| op | dtype | class | detail |", "|---|---|---|---|"]
    for r in sorted(bad, key=lambda r: (r["op"], r["dtype"])):
        lines.append(f"| {r['op']} | {r['dtype']} | {r['class']} | {_cell(r['detail'])} |")
    return "\n".join(lines)


def fallback_ops(rows: list[dict]) -> str:
    """ATen ops run as fallbacks across the sweep, with how many OpInfos hit each."""
    hits: Counter = Counter()
    reasons: dict[str, str] = {}
    for r in rows:
        for op, reason in r.get("fallbacks", {}).items():
            hits[op] += 1
            reasons.setdefault(op, reason)
    lines = ["| ATen op | OpInfo runs | reason |", "|---|---|---|"]
    for op, n in hits.most_common():
        lines.append(f"| {op} | {n} | {_cell(reasons[op])} |")
    return "\n".join(lines)


def strides(rows: list[dict]) -> str:
    bad = [r for r in rows if r.get("strides")]
    if not bad:
        return "None."
    lines = ["| op | dtype | class | strides |", "|---|---|---|---|"]
    for r in sorted(bad, key=lambda r: (r["op"], r["dtype"])):
        lines.append(f"| {r['op']} | {r['dtype']} | {r['class']} | {_cell(r['strides'])} |")
    return "\n".join(lines)


def not_captured(rows: list[dict]) -> str:
    ops = sorted({r["op"] for r in rows if r["class"] == "not captured"})
    return ", ".join(ops) or "None."


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:220]


def render(rows: list[dict]) -> str:
    native = len({r["op"] for r in rows if r["class"] == "native pass" and r["dtype"] == "float32"})
    fallback = len({r["op"] for r in rows if r["class"] == "fallback pass" and r["dtype"] == "float32"})
    return "\n\n".join([
        BEGIN,
        "### Counts per class (one row per OpInfo and dtype)",
        summary(rows),
        (f"In float32, {native} OpInfos compile with every op lowered by kiln and {fallback} pass with "
         "some ATen ops run as fallbacks inside the compiled program."),
        "### Mismatches and crashes",
        failures(rows),
        "### Outputs laid out unlike eager's (values equal; not part of the classes above)",
        strides(rows),
        "### Not captured (Dynamo broke the graph; what it captured ran through kiln, results compared)",
        not_captured(rows),
        "### Fallback ops",
        fallback_ops(rows),
        END,
    ])


def write_table(results: str, doc: str) -> None:
    """Replace the generated section of doc (between the markers), keeping the prose."""
    text = render(load(results))
    try:
        with open(doc) as f:
            old = f.read()
    except FileNotFoundError:
        old = ""
    if BEGIN in old and END in old:
        new = old[:old.index(BEGIN)] + text + old[old.index(END) + len(END):]
    else:
        new = old + ("\n" if old else "") + text + "\n"
    with open(doc, "w") as f:
        f.write(new)


def choose_subset(rows: list[dict]) -> list[tuple[str, str]]:
    """A small set of (op, dtype) runs that together reach every lowering the sweep reached,
    for each dtype: greedy set cover, most new lowerings first, then the cheapest."""
    chosen = []
    for dtype in ("float32", "bfloat16", "int"):
        candidates = [r for r in rows if r["dtype"] == dtype and r.get("lowered")
                      and r["class"] in ("native pass", "fallback pass")]
        left = set().union(*(r["lowered"] for r in candidates)) if candidates else set()
        while left:
            best = max(candidates, key=lambda r: (len(left & set(r["lowered"])), -r.get("seconds", 0)))
            chosen.append((best["op"], dtype))
            left -= set(best["lowered"])
    return chosen
