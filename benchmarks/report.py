"""Results of benchmarks/run.py: a table for the terminal and docs/benchmarks.md."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.measure import KilnSummary

VARIANTS = ("eager", "inductor", "kiln")


@dataclass
class WarmStart:
    process_s: float = 0.0  # the whole subprocess: interpreter, imports, inputs, compile, one call
    first_call_s: float = 0.0  # the compiled function's first call (Dynamo + kiln + the run)
    kiln_pass_s: float = 0.0  # sum of kiln's pass times in its CompileReports
    cache_hits: int = 0
    kernels: int = 0
    error: str | None = None


@dataclass
class CaseResult:
    name: str
    description: str
    nbytes: int
    compile_s: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str | None] = field(default_factory=dict)
    kiln: KilnSummary = field(default_factory=KilnSummary)
    seconds: dict[str, list[float]] = field(default_factory=dict)  # timed samples per variant
    warm: WarmStart | None = None

    def median(self, variant: str) -> float | None:
        samples = self.seconds.get(variant)
        return statistics.median(samples) if samples else None

    def spread(self) -> float | None:
        """The largest relative inter-quartile range among the variants: how noisy this row is."""
        ranges = []
        for samples in self.seconds.values():
            if len(samples) >= 4:
                q = statistics.quantiles(samples, n=4)
                ranges.append((q[2] - q[0]) / statistics.median(samples))
        return max(ranges) if ranges else None

    def speedup(self, over: str) -> float | None:
        base, mine = self.median(over), self.median("kiln")
        return base / mine if base and mine else None

    def best_speedup(self, over: str) -> float | None:
        """The same ratio between the fastest runs: what a quiet machine would more likely show."""
        base, mine = self.seconds.get(over), self.seconds.get("kiln")
        return min(base) / min(mine) if base and mine else None

    def gbs(self, variant: str = "kiln") -> float | None:
        t = self.median(variant)
        return self.nbytes / t / 1e9 if t else None

    def one_line(self) -> str:
        times = "  ".join(f"{v} {_ms(self, v)} ms" for v in VARIANTS)
        return (f"[{self.name}] {times}  kiln x{_x(self.speedup('eager'))} vs eager, "
                f"x{_x(self.speedup('inductor'))} vs inductor; cold compile kiln "
                f"{_s(self.compile_s.get('kiln'))} s, inductor {_s(self.compile_s.get('inductor'))} s")


def _ms(r: CaseResult, variant: str) -> str:
    if r.errors.get(variant):
        return "FAIL"
    t = r.median(variant)
    return f"{t * 1e3:.2f}" if t else "-"


def _x(v: float | None) -> str:
    return f"{v:.2f}" if v else "-"


def _gbs(v: float | None) -> str:
    return "-" if not v else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _percent(v: float | None) -> str:
    return f"{v * 100:.0f}%" if v is not None else "-"


def _s(v: float | None) -> str:
    return f"{v:.2f}" if v is not None else "-"


MAIN_HEADER = ["case", "eager ms", "Inductor ms", "kiln ms", "kiln vs eager", "kiln vs Inductor",
               "kiln vs Inductor, fastest runs", "kiln GB/s", "noise (IQR)", "cold compile kiln s",
               "kiln passes s", "cold compile Inductor s", "kiln kernels", "ops kiln left to ATen"]
WARM_HEADER = ["case", "kernels built", "kernels from cache", "kiln pass time s",
               "first call s", "process wall s"]


def main_row(r: CaseResult) -> list[str]:
    gbs = r.gbs() if not r.errors.get("kiln") else None
    aten = ", ".join(op.removeprefix("aten.").removesuffix(".default") for op in r.kiln.aten_ops)
    if r.kiln.aten_graphs:
        aten = f"{r.kiln.aten_graphs} whole graph(s); " + aten
    return [r.name, _ms(r, "eager"), _ms(r, "inductor"), _ms(r, "kiln"), _x(r.speedup("eager")),
            _x(r.speedup("inductor")), _x(r.best_speedup("inductor")), _gbs(gbs), _percent(r.spread()),
            _s(r.compile_s.get("kiln")), f"{r.kiln.pass_seconds:.2f}", _s(r.compile_s.get("inductor")),
            str(r.kiln.kernels), aten or "none"]


def warm_row(r: CaseResult) -> list[str]:
    w = r.warm
    if w is None or w.error:
        return [r.name, "-", "-", "-", "-", w.error if w else "skipped"]
    return [r.name, str(w.kernels - w.cache_hits), str(w.cache_hits), f"{w.kiln_pass_s:.3f}",
            f"{w.first_call_s:.2f}", f"{w.process_s:.1f}"]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# The terminal table: a subset of the markdown columns, with short labels.
TERMINAL_COLUMNS = {"case": "case", "eager ms": "eager ms", "Inductor ms": "Ind. ms", "kiln ms": "kiln ms",
                    "kiln vs eager": "vs eager", "kiln vs Inductor": "vs Ind.",
                    "kiln vs Inductor, fastest runs": "vs Ind. (fastest)", "kiln GB/s": "GB/s",
                    "noise (IQR)": "noise", "cold compile kiln s": "kiln cold s",
                    "cold compile Inductor s": "Ind. cold s", "kiln kernels": "kernels"}


def print_table(results: list[CaseResult]) -> None:
    header = list(TERMINAL_COLUMNS.values())
    rows = []
    for r in results:
        cells = dict(zip(MAIN_HEADER, main_row(r)))
        rows.append([cells[c] for c in TERMINAL_COLUMNS])
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    print()
    for row in [header, *rows]:
        print("  ".join(x.rjust(w) for x, w in zip(row, widths)))
    if any(r.warm for r in results):
        print("\nwarm start (new process, same kiln cache): " + "; ".join(
            f"{r.name} {warm_row(r)[2]} cached/{warm_row(r)[1]} built, kiln {warm_row(r)[3]} s"
            for r in results if r.warm))
    for r in results:
        for variant, err in r.errors.items():
            if err:
                print(f"FAIL {r.name} [{variant}]: {err}")


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
        return out.splitlines()[0].strip() if out else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def kiln_version() -> str:
    """kiln's version and, when it runs from a git checkout, the commit (kiln changes often)."""
    import kiln

    src = Path(kiln.__file__).resolve().parent
    commit = _first_line(["git", "-C", str(src), "rev-parse", "--short", "HEAD"])
    if commit == "?":
        return f"kiln {kiln.__version__} from {src}"
    dirty = _first_line(["git", "-C", str(src), "status", "--porcelain", "--", "."]) != "?"
    return f"kiln {kiln.__version__} at commit {commit}" + (" with uncommitted changes" if dirty else "")


def machine_lines() -> list[str]:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    try:
        import transformers

        transformers_version = transformers.__version__
    except ImportError:
        transformers_version = "not installed"
    return [
        f"- CPU: {cpu}, {os.cpu_count()} cores ({torch.get_num_threads()} torch threads)",
        f"- torch {torch.__version__}, triton {triton_version}, transformers {transformers_version}, "
        f"Python {platform.python_version()}",
        f"- C++ compiler: {_first_line(['g++', '--version'])}",
        f"- {kiln_version()}",
    ]


READING_NOTES = """\
## How to read these numbers

- **Warm** (ms columns): median of {repeat} calls of each variant after 3 warm-up calls, taken in
  turns (eager, Inductor, kiln, rotating the order each round) in one process, so that load from
  other processes hits all three alike. Speedups are ratios of these medians. `noise` is the
  largest inter-quartile range among the three variants, relative to its median: on a shared
  machine, trust the ratios of a row only as far as its noise allows. `fastest runs` divides
  the fastest of Inductor's calls by the fastest of kiln's: the runs least disturbed by load.
- **kiln GB/s**: the bytes that must move (every input read once, every output written once)
  divided by kiln's median time; compare it with the copy ceiling above. `swiglu_ffn` and `gpt2`
  spend most of their time in matmuls (ATen), so their GB/s says little.
- **Cold compile** (s columns): the wall time of a compiled function's first call minus one run of
  it (its median above), with Inductor's and kiln's caches in fresh empty folders
  (`TORCHINDUCTOR_CACHE_DIR`, `KILN_CACHE_DIR`) and `torch._dynamo.reset()` before each compile.
  Each compiler's one-time start-up in the process (Dynamo, AOTAutograd, imports, Inductor's
  compile workers) is paid before the first case and reported above, not in these columns.
  `kiln passes` is the part of kiln's cold compile spent in kiln's own passes (import to C++
  build); the rest is Dynamo and AOTAutograd.
- **Warm start**: a new Python process compiles the case with kiln on the cache the cold run
  filled. `kiln pass time` is the sum of kiln's pass times in its compile reports; `first call` is
  the compiled function's first call (Dynamo capture, AOTAutograd, kiln, one run); `process wall`
  is the whole process, imports and input creation included.
- **Peak memory** is not reported: on the CPU, torch's allocator keeps no statistics, tracemalloc
  does not see it, and max-RSS deltas from `resource.getrusage` are too coarse to compare
  variants run in one process.
- A result that does not match eager (`torch.testing.assert_close`, tolerances per dtype) is FAIL
  and is not timed.
"""


def write_markdown(path: str, results: list[CaseResult], *, command: str, started: datetime.datetime,
                   copy_gbs: float, startup: dict[str, float], repeat: int, elapsed_s: float) -> None:
    parts = [
        "# kiln benchmarks (CPU)",
        "",
        f"Run on {started:%Y-%m-%d %H:%M} in {elapsed_s / 60:.1f} min with `{command}`.",
        "",
        *machine_lines(),
        f"- memory ceiling: a 128 MiB eager copy moves {copy_gbs:.1f} GB/s (bytes read + written)",
        f"- one-time start-up (the first compile in the process, a one-line function, cold caches): "
        f"Inductor {startup['inductor']:.1f} s, kiln {startup['kiln']:.2f} s",
        "",
        "## Steady state (warm) and cold compile",
        "",
        markdown_table(MAIN_HEADER, [main_row(r) for r in results]),
        "",
        "## Warm start: a new process, the same kiln cache",
        "",
        markdown_table(WARM_HEADER, [warm_row(r) for r in results]),
        "",
        "## Cases",
        "",
        *[f"- `{r.name}`: {r.description}; {r.nbytes / 1e6:.1f} MB must move" for r in results],
        "",
        _failures(results),
        READING_NOTES.format(repeat=repeat),
    ]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(parts) + _gpu_section(Path(path)))


def _gpu_section(path: Path) -> str:
    """The file's GPU part (written from runs on a GPU machine), kept as it is."""
    text = path.read_text() if path.exists() else ""
    start = text.find("\n# kiln benchmarks (GPU")
    return "\n" + text[start:] if start >= 0 else ""


def _failures(results: list[CaseResult]) -> str:
    lines = [f"- FAIL `{r.name}` ({v}): {err}" for r in results for v, err in r.errors.items() if err]
    return "## Failures\n\n" + "\n".join(lines) + "\n\n" if lines else ""
