"""What a compile reports: its passes' times and summaries, its decisions, kernels and program.

Its own module so that a program loaded from the cache is reported without importing the passes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiln.ir.host import HostProgram
    from kiln.ir.kernel import Kernel
    from kiln.passes.fusion import Decision
    from kiln.passes.layout import LayoutChoice
    from kiln.passes.pipeline import LaunchGraphs


@dataclass
class PassRecord:
    name: str
    seconds: float
    summary: str


@dataclass
class CompileReport:
    backend: str = ""
    passes: list[PassRecord] = field(default_factory=list)
    graph_text: str = ""
    decisions: list[Decision] = field(default_factory=list)
    layouts: list[LayoutChoice] = field(default_factory=list)  # strides of the buffers kernels compute
    fallbacks: dict[str, str] = field(default_factory=dict)
    kernels: list[Kernel] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    host_program: HostProgram | None = None
    host_source: str = ""  # the Python generated from host_program
    cache_hits: int = 0
    partition: Any = None  # a training forward's PartitionSummary: what it saves, what is recomputed
    cost: Any = None  # passes/cost.py's GraphCost, against eager's ops (set by the frontend)
    program: Any = None  # a weak reference to the loaded call (explain times its launches)
    from_cache: str = ""  # the graph cache entry the program was loaded from; "" when compiled
    source_map: dict = field(default_factory=dict)  # kernel or ATen call -> passes/source_map.py's entry
    node_origins: dict = field(default_factory=dict)  # node id -> model code (decisions name nodes by id)
    launches: LaunchGraphs | None = None  # kept for the numerics check (compile_graph's check=True)
    numerics: Any = None  # tools/check.py's NumericsReport, once a checked first call ran
    buffer_layouts: dict = field(default_factory=dict)  # buffer -> (dtype, shape), for passes/peak.py
    family: str = ""  # a program of a shape family: each size symbol, where it is read, its traced value
    graphs: Any = None  # runtime/buckets.py's BucketedGraphs: a family's CUDA graphs under reduce-overhead
    # kernel -> its launch configurations' compiled binaries (GPU kernels), or why none
    binaries: dict = field(default_factory=dict)

    @property
    def num_kernels(self) -> int:
        return len(self.kernels)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.passes)
