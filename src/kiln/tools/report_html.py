"""One self-contained HTML page from an Explanation (`kiln.explain(...).save_html(path)`):
a roofline plot of the kernels (matplotlib, inline SVG), a sortable kernel table with the model
code of each kernel, the compile time per pass, the break-even and a fusion graph per graph.

Nothing is fetched: styles, the sort script and the pictures are in the page. matplotlib is
imported here only, when a page is written.
"""

from __future__ import annotations

import html
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.ir.host import CallAten, Launch, View, reads

if TYPE_CHECKING:
    from kiln.tools.explain import Explanation, GraphExplanation, KernelCost

ATEN_COLOR, KERNEL_COLOR = "#4c78a8", "#f58518"
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px 32px;color:#222;max-width:1400px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px} .muted{color:#666} code{font-size:12px}
table{border-collapse:collapse;font-size:13px} td,th{padding:3px 8px;border-bottom:1px solid #eee}
th{background:#f4f4f4;cursor:pointer;user-select:none;text-align:left;position:sticky;top:0}
td.n{text-align:right;font-variant-numeric:tabular-nums} th.sorted-asc:after{content:" \\25B2"}
th.sorted-desc:after{content:" \\25BC"} .bar{display:flex;height:22px;width:100%;max-width:900px}
.bar div{height:100%;min-width:1px} .legend span{display:inline-block;margin-right:14px}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
details{margin:4px 0} summary{cursor:pointer}
"""
SORT_SCRIPT = """
document.querySelectorAll("table.sortable th").forEach(function (th, column) {
  th.addEventListener("click", function () {
    var table = th.closest("table"), body = table.tBodies[0];
    var ascending = !th.classList.contains("sorted-asc");
    table.querySelectorAll("th").forEach(function (h) { h.classList.remove("sorted-asc", "sorted-desc"); });
    th.classList.add(ascending ? "sorted-asc" : "sorted-desc");
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[column].dataset.v, y = b.cells[column].dataset.v;
      var nx = parseFloat(x), ny = parseFloat(y);
      var order = (isNaN(nx) || isNaN(ny)) ? String(x).localeCompare(String(y)) : nx - ny;
      return ascending ? order : -order;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
"""
PASS_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6",
               "#9d755d", "#bab0ac", "#1f77b4", "#2ca02c", "#d62728", "#9467bd"]


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _us(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e6:,.1f}"


def _si(n: float, unit: str) -> str:
    for prefix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {prefix}{unit}"
    return f"{n:.0f} {unit}"


def kernel_time(k: KernelCost) -> float | None:
    """Measured where measured, else predicted: seconds per launch."""
    if k.measured_s is not None:
        return k.measured_s
    return k.cost.seconds if k.cost is not None else None


def ceiling_fraction(k: KernelCost) -> float | None:
    """The roofline floor over the kernel's time (measured, else predicted)."""
    t = kernel_time(k)
    return k.cost.floor_s / t if k.cost is not None and t else None


# --- roofline --------------------------------------------------------------------------------


def roofline_points(explanation: Explanation) -> list[tuple[str, str, float, float, bool]]:
    """(kind, name, FLOP per byte, FLOP/s, measured) of each kernel and ATen call with FLOPs and
    bytes: the achieved rate is measured where measured, else predicted."""
    points = []
    for g in explanation.graphs:
        for k in g.kernels:
            t = kernel_time(k)
            if k.cost is not None and k.cost.moves > 0 and k.cost.flops > 0 and t:
                points.append(("kernel", k.name, k.cost.flops / k.cost.moves, k.cost.flops / t,
                               k.measured_s is not None))
        for a in g.cost.aten if g.cost is not None else ():
            if a.moves > 0 and a.flops > 0 and a.seconds > 0:
                points.append(("aten", a.name, a.flops / a.moves, a.flops / a.seconds, False))
    return points


def roofline_svg(explanation: Explanation) -> str:
    """The roofline plot as an inline <svg>: kernels and ATen calls by arithmetic intensity and
    FLOP rate under the device's ceilings (copy rate, element-wise and matmul rates)."""
    import matplotlib
    from matplotlib.figure import Figure

    points = roofline_points(explanation)
    c = explanation.ceilings
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "kiln", "font.size": 9}):
        fig = Figure(figsize=(7.5, 4.4), dpi=96)
        ax = fig.subplots()
        intensities = [p[2] for p in points] or [1.0]
        lo, hi = min(intensities) / 4, max(intensities) * 4
        if c is not None:
            lo, hi = min(lo, 0.01), max(hi, 4 * c.matmul_flop_per_s / c.copy_bytes_per_s)
            xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
            ceilings = ((c.ops_per_s, "element-wise", "--"), (c.matmul_flop_per_s, "matmul", "-"))
            for rate, label, style in ceilings:
                ax.plot(xs, [min(rate, x * c.copy_bytes_per_s) for x in xs], style, color="#888", lw=1.2,
                        label=f"{label} ceiling {rate / 1e9:,.0f} GFLOP/s")
        for kind, color, marker in (("kernel", KERNEL_COLOR, "o"), ("aten", ATEN_COLOR, "^")):
            chosen = [p for p in points if p[0] == kind]
            if not chosen:
                continue
            scatter = ax.scatter([p[2] for p in chosen], [p[3] for p in chosen], s=28, c=color, marker=marker,
                                 edgecolors="white", linewidths=0.5, zorder=3,
                                 label="kiln kernels" if kind == "kernel" else "ATen calls")
            scatter.set_gid(f"roofline-{kind}-markers")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
        ax.set_ylabel("FLOP/s (measured where measured, else predicted)")
        ax.grid(True, which="major", color="#eee")
        ax.legend(loc="lower right", fontsize=8, frameon=False)
        fig.subplots_adjust(left=0.1, right=0.98, top=0.97, bottom=0.12)  # tight_layout draws twice
        out = io.StringIO()
        fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = out.getvalue()
    return svg[svg.index("<svg"):]  # the XML prolog and DOCTYPE do not belong inside HTML


def _roofline_or_why(explanation: Explanation) -> str:
    try:
        return roofline_svg(explanation)
    except ImportError:  # a report without its plot rather than no report
        return "<p class='muted'>the roofline plot needs matplotlib (pip install matplotlib)</p>"


# --- fusion graph ----------------------------------------------------------------------------


def program_steps(g: GraphExplanation) -> tuple[list[tuple[str, str]], list[tuple[int, int]]]:
    """The program's kernel launches and ATen calls in order, as (kind, name), and the edges
    (producer, consumer) between them through the buffers (and views of them) they pass."""
    program = g.host_program
    if program is None:
        return [], []
    steps: list[tuple[str, str]] = []
    edges: set[tuple[int, int]] = set()
    producer: dict[str, int] = {}
    for ins in program.body:
        if isinstance(ins, (Launch, CallAten)):
            index = len(steps)
            for buf in reads(ins):
                if buf in producer and producer[buf] != index:
                    edges.add((producer[buf], index))
            if isinstance(ins, Launch):
                steps.append(("kernel", ins.kernel))
                producer.update(dict.fromkeys(ins.writes, index))
            else:
                steps.append(("aten", ins.out))
                producer[ins.out] = index
        elif isinstance(ins, View) or hasattr(ins, "src"):  # views, items, layouts: the same data
            base = ins.base if isinstance(ins, View) else ins.src
            if base in producer:
                producer[ins.out] = producer[base]
    return steps, sorted(edges)


def _step_site(g: GraphExplanation, name: str, launch: int):
    """The first model-code site of a kernel's launch-th launch (or of an ATen call)."""
    entry = g.source_map.get(name)
    if entry is None:
        return None, ""
    sites = entry.per_launch[launch] if launch < len(entry.per_launch) else entry.sites
    ops = ", ".join(op.split(".")[1] if op.startswith("aten.") else op for op in entry.ops[:6])
    return (sites[0] if sites else None), ops


def fusion_graph_svg(g: GraphExplanation, graph_index: int) -> str:
    """Kernels and ATen calls top to bottom in program order, with arcs for the buffers one
    passes to another (an arc diagram: order is the layout, so it reads at any size)."""
    steps, edges = program_steps(g)
    if not steps:
        return "<p class='muted'>no host program</p>"
    row, box_w, box_h, left = 30, 660, 22, 8
    arc_x = left + box_w
    width = arc_x + 24 + 10 * math.sqrt(max((b - a for a, b in edges), default=1))
    height = row * len(steps) + 10
    parts = [f'<svg class="fusion-graph" id="fusion-graph-{graph_index}" xmlns="http://www.w3.org/2000/svg" '
             f'width="{width:.0f}" height="{height}" viewBox="0 0 {width:.0f} {height}">']
    for a, b in edges:
        y1, y2 = 5 + a * row + box_h / 2, 5 + b * row + box_h / 2
        bend = arc_x + 12 + 10 * math.sqrt(b - a)
        parts.append(f'<path class="edge" d="M{arc_x} {y1:.0f} C{bend:.0f} {y1:.0f} {bend:.0f} {y2:.0f} '
                     f'{arc_x} {y2:.0f}" fill="none" stroke="#999" stroke-width="1.2"/>')
    launched: dict[str, int] = {}
    for i, (kind, name) in enumerate(steps):
        site, ops = _step_site(g, name, launched.get(name, 0))
        launched[name] = launched.get(name, 0) + 1
        code = site.origin.short() if site is not None else ""
        label = name if kind == "kernel" else f"{name} = {ops or 'ATen call'}"
        color = KERNEL_COLOR if kind == "kernel" else ATEN_COLOR
        y = 5 + i * row
        title = f"{label}\n{site.text() if site is not None else 'no model code known'}"
        parts.append(f'<g class="step {kind}"><title>{_e(title)}</title>'
                     f'<rect x="{left}" y="{y}" width="{box_w}" height="{box_h}" rx="4" fill="{color}" '
                     f'fill-opacity="0.18" stroke="{color}"/><text x="{left + 6}" y="{y + 15}" '
                     f'font-size="12" font-family="monospace">{_e(label[:40])}<tspan fill="#555" '
                     f'font-family="sans-serif" font-size="11"> {_e(code[:60])}</tspan></text></g>')
    parts.append("</svg>")
    return "".join(parts)


# --- page ------------------------------------------------------------------------------------


def _kernel_rows(explanation: Explanation) -> list[str]:
    rows = []
    for gi, g in enumerate(explanation.graphs):
        for k in g.kernels:
            t, frac, c = kernel_time(k), ceiling_fraction(k), k.cost
            cells = [
                (gi, str(gi), ""), (k.name, f"<code>{_e(k.name)}</code>", ""),
                (k.launches, str(k.launches), "n"), (t or 0, _us(t), "n"),
                ("measured" if k.measured_s is not None else "predicted",) * 2 + ("muted",),
                (c.moves if c else 0, _si(c.moves, "B") if c else "", "n"),
                (c.flops if c else 0, _si(c.flops, "FLOP") if c else "", "n"),
                (c.bound if c else "", _e(c.bound) if c else "", ""),
                (frac or 0, f"{frac:.0%}" if frac is not None else "", "n"),
                (k.model_code, _e(k.model_code), ""),
            ]
            rows.append("<tr>" + "".join(f'<td class="{cls}" data-v="{_e(v)}">{text}</td>'
                                         for v, text, cls in cells) + "</tr>")
    return rows


def _passes_section(explanation: Explanation) -> list[str]:
    out = []
    names: list[str] = []
    for g in explanation.graphs:
        names.extend(p.name for p in g.passes if p.name not in names)
    colors = {name: PASS_COLORS[i % len(PASS_COLORS)] for i, name in enumerate(names)}
    out.append("<p class='legend'>" + "".join(
        f"<span><i class='swatch' style='background:{colors[n]}'></i>{_e(n)}</span>" for n in names) + "</p>")
    for gi, g in enumerate(explanation.graphs):
        total = sum(p.seconds for p in g.passes) or 1.0
        bar = "".join(f"<div title='{_e(p.name)}: {p.seconds * 1e3:.1f} ms' style='width:"
                      f"{100 * p.seconds / total:.2f}%;background:{colors[p.name]}'></div>" for p in g.passes)
        out.append(f"<h3>graph {gi}: {total * 1e3:,.1f} ms in kiln's passes</h3><div class='bar'>{bar}</div>")
        rows = "".join(f"<tr><td>{_e(p.name)}</td><td class='n' data-v='{p.seconds}'>{p.seconds * 1e3:,.1f}"
                       f"</td><td>{_e(p.summary)}</td></tr>" for p in g.passes)
        out.append(f"<details><summary>passes of graph {gi}</summary><table class='sortable'><thead><tr>"
                   f"<th>pass</th><th>ms</th><th>what it did</th></tr></thead><tbody>{rows}</tbody></table>"
                   "</details>")
    return out


def _break_even_lines(explanation: Explanation) -> list[str]:
    lines = []
    if explanation.eager_s is not None and explanation.compiled_s is not None:
        eager, compiled = explanation.eager_s, explanation.compiled_s
        lines.append(f"measured per call: eager {_us(eager)} us, kiln {_us(compiled)} us "
                     f"({eager / compiled:.2f}x)")
    if explanation.break_even is not None:
        lines.append(explanation.break_even.text(of="first call: Dynamo, AOTAutograd and kiln"))
    for gi, g in enumerate(explanation.graphs):
        if g.break_even is not None:
            lines.append(f"graph {gi}: " + g.break_even.text(of="kiln's passes"))
    return lines or ["no estimate: no graph has a cost model"]


def _source_map_section(explanation: Explanation) -> list[str]:
    out = []
    for gi, g in enumerate(explanation.graphs):
        items = []
        for entry in g.source_map.values():
            sites = ("".join(f"<li>{_e(s.text())}</li>" for s in entry.sites)
                     or "<li class='muted'>no stack trace</li>")
            items.append(f"<li><code>{_e(entry.name)}</code> ({entry.kind})<ul>{sites}</ul></li>")
        out.append(f"<details><summary>graph {gi}: {len(g.source_map)} kernels and ATen calls</summary>"
                   f"<ul>{''.join(items)}</ul></details>")
    return out


def _memory_section(explanation: Explanation) -> list[str]:
    """The peak and what is live at it (passes/peak.py), largest first."""
    peak = explanation.memory
    if peak is None:
        return ["<p class='muted'>no host program to read the peak from</p>"]
    rows = "".join(f"<tr><td>{_e(b.program)}</td><td><code>{_e(b.name)}</code></td><td>{_e(b.role)}</td>"
                   f"<td>{b.nbytes / 2**20:.2f}</td><td>{_e(b.made_by)}</td><td>{_e(b.code)}</td></tr>"
                   for b in peak.live)
    return [f"<p>{_e(peak.text().splitlines()[0])}</p>",
            "<table class='sortable'><thead><tr><th>program</th><th>buffer</th><th>role</th><th>MiB</th>"
            f"<th>made by</th><th>model code</th></tr></thead><tbody>{rows}</tbody></table>"]


def render_html(explanation: Explanation, title: str = "kiln report") -> str:
    graphs = explanation.graphs
    kernels = sum(len(g.kernels) for g in graphs)
    aten = sum(len(g.aten_calls) for g in graphs)
    compile_s = sum(g.compile_s for g in graphs)
    c = explanation.ceilings
    ceilings = (f"{_e(c.device)}: copy {c.copy_bytes_per_s / 1e9:,.1f} GB/s, element-wise "
                f"{c.ops_per_s / 1e9:,.1f} Gop/s, matmul {c.matmul_flop_per_s / 1e12:,.2f} TFLOP/s, "
                f"launch {c.launch_s * 1e6:.1f} us"
                if c is not None else "no ceilings measured")
    body = [
        f"<h1>{_e(title)}</h1>",
        f"<p class='muted'>{len(graphs)} graphs, {kernels} kernels, {aten} ATen calls; {compile_s:.2f} s in "
        f"kiln's passes; ceilings {ceilings}</p>",
        "<h2>Break-even</h2><ul>" + "".join(f"<li>{_e(line)}</li>" for line in _break_even_lines(explanation))
        + "</ul>",
        "<h2>Roofline</h2>",
        f"<div id='roofline'>{_roofline_or_why(explanation)}</div>" if graphs else "<p>no kernels</p>",
        "<h2>Kernels</h2><p class='muted'>click a column to sort</p>",
        "<table class='sortable' id='kernels'><thead><tr><th>graph</th><th>kernel</th><th>launches</th>"
        "<th>us per launch</th><th>time</th><th>bytes moved</th><th>FLOPs</th><th>bound</th>"
        "<th>of ceiling</th><th>model code</th></tr></thead><tbody>" + "".join(_kernel_rows(explanation))
        + "</tbody></table>",
        "<h2>Memory at the peak</h2>", *_memory_section(explanation),
        "<h2>Compile time per pass</h2>", *_passes_section(explanation),
        "<h2>Fusion graphs</h2><p class='legend'><span><i class='swatch' style='background:"
        f"{KERNEL_COLOR}'></i>kiln kernel</span><span><i class='swatch' style='background:{ATEN_COLOR}'></i>"
        "ATen call</span><span>arcs: buffers one step passes to a later one</span></p>",
        *(f"<h3>graph {gi}</h3>{fusion_graph_svg(g, gi)}" for gi, g in enumerate(graphs)),
        "<h2>Source map</h2>", *_source_map_section(explanation),
    ]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>\n" + "\n".join(body)
            + f"\n<script>{SORT_SCRIPT}</script></body></html>\n")


def save_html(explanation: Explanation, path: str | Path, title: str = "kiln report") -> Path:
    path = Path(path)
    path.write_text(render_html(explanation, title), encoding="utf-8")
    return path
