"""Ahead-of-time artifacts: `kiln.export` compiles a program once and writes it to a folder;
`kiln.load` runs it in any process, without Dynamo, AOTAutograd or a compiler.

An artifact holds the host program as data (host.json, and its tensor constants), the
model's parameters and buffers (state.pt), the compiled kernels (C++ shared libraries for
CPU inputs; for CUDA inputs each Triton kernel's cubin and launch metadata, launched through
the CUDA driver without Triton) and a manifest naming the versions and machine (CPU model or
GPU architecture) they were built for and the inputs the program takes. Exported with
dynamic_shapes (torch.export's), it holds one program for the shape family: the manifest
names each dynamic dimension's symbol and range, and the loaded program refuses sizes
outside them.
"""

from __future__ import annotations

import ctypes
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

FORMAT = 1
_DTYPES = {str(d): d for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                               torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool)}


class ArtifactError(RuntimeError):
    """An artifact that cannot run here, or a call that does not match it."""


def _module_of(fn_or_module: Callable) -> torch.nn.Module:
    if isinstance(fn_or_module, torch.nn.Module):
        return fn_or_module

    class Function(torch.nn.Module):
        def forward(self, *args):
            return fn_or_module(*args)

    return Function()


def export(fn_or_module: Callable, example_args: tuple, path: str | Path, dynamic_shapes=None) -> Path:
    """Compile fn_or_module for example_args (torch.export, then kiln) and write the artifact
    folder path; returns it."""
    from kiln.codegen.backends import get_backend
    from kiln.frontend.decompositions import decomposition_table
    from kiln.ir import sizes
    from kiln.ir.host import constants_blob
    from kiln.options import Options
    from kiln.passes.pipeline import compile_graph
    from kiln.runtime import cache

    example_args = tuple(example_args)
    tensors = [a for a in example_args if isinstance(a, torch.Tensor)]
    if len(tensors) != len(example_args):
        raise TypeError("kiln.export takes tensor arguments only")
    target = _code_generator({t.device for t in tensors})
    if target == "triton" and dynamic_shapes is not None:
        raise NotImplementedError("kiln.export: a shape family (dynamic_shapes) of CUDA inputs: a family's "
                                  "Triton binaries are chosen and compiled per launch and are not "
                                  "stored (docs/dynamic_shapes.md); export each shape")
    with torch.no_grad():
        program = torch.export.export(_module_of(fn_or_module), example_args, dynamic_shapes=dynamic_shapes)
        program = program.run_decompositions(decomposition_table())
    placeholders = [n for n in program.graph_module.graph.nodes if n.op == "placeholder"]
    traced = [n.meta.get("val") for n in placeholders]  # fake tensors: symbolic where dynamic
    gm, signature = program.graph_module, program.graph_signature
    state_names, inputs = [], []
    user = iter(example_args)
    for spec in signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            inputs.append(next(user))
            continue
        value = program.state_dict.get(spec.target)
        if value is None:
            value = program.constants[spec.target]
        state_names.append(spec.target)
        inputs.append(value)
    if any(spec.kind.name != "USER_OUTPUT" for spec in signature.output_specs):
        raise NotImplementedError("kiln.export: the program updates buffers in place (e.g. batch norm "
                                  "in training mode); export the model in eval mode")
    backend = get_backend(target, Options())
    env = _shape_env(traced) if dynamic_shapes is not None else None
    if env is not None:  # one program for the family: the fake tensors carry its sizes
        with sizes.family(env):
            _, report = compile_graph(gm, list(traced), backend)
    else:
        _, report = compile_graph(gm, [x.detach() for x in inputs], backend)
    host = report.host_program

    path = Path(path)
    if path.exists():
        shutil.rmtree(path)
    (path / "kernels").mkdir(parents=True)
    if target == "triton":
        kernels, machine = _write_binaries(report, path / "kernels")
    else:
        kernels, machine = _write_libraries(report, path / "kernels"), {"machine": cache.cpu_model()}
    (path / "host.json").write_text(json.dumps(host.to_dict(), indent=1))
    (path / "constants.pt").write_bytes(constants_blob(host))
    torch.save({name: t.detach().clone() for name, t in zip(state_names, inputs)}, path / "state.pt")
    manifest = {
        "format": FORMAT,
        "kiln": _kiln_version(),
        "torch": torch.__version__,
        "device": "cuda" if target == "triton" else "cpu",
        **machine,
        "state": state_names,
        "inputs": [{"dtype": str(a.dtype), "shape": _shape_entry(v, env), "device": str(a.device)}
                   for a, v in zip(example_args, traced[len(state_names):])],
        "outputs": _output_structure(program.call_spec.out_spec),
        "kernels": kernels,
        "shapes": "one program for its shape family" if env is not None else "as exported",
    }
    (path / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return path


def _code_generator(devices: set[torch.device]) -> str:
    """The code generator of an artifact for inputs on these devices."""
    kinds = {d.type for d in devices}
    if len(devices) > 1:
        raise NotImplementedError(f"kiln.export: the inputs are on several devices "
                                  f"({sorted(map(str, devices))})")
    if kinds - {"cpu", "cuda"}:
        raise NotImplementedError(f"kiln.export writes CPU and CUDA programs; these inputs are on "
                                  f"{sorted(kinds)}")
    return "triton" if kinds == {"cuda"} else "cpp"


def _write_libraries(report, folder: Path) -> dict:
    """The C++ kernels' shared libraries, copied into folder; each kernel's manifest entry."""
    from kiln.ir.kernel import size_params
    from kiln.runtime import cpp_build

    size_counts = {k.name: len(size_params(k).sizes) for k in report.kernels}
    built = cpp_build.build_all([(report.sources[k.name], k.name, (len(k.params), size_counts[k.name]))
                                 for k in report.kernels])
    kernels = {}
    for kern, result in zip(report.kernels, built):
        library = result.path.name
        if not (folder / library).exists():
            shutil.copyfile(result.path, folder / library)
        kernels[kern.name] = {"library": library, "arguments": len(kern.params),
                              "sizes": size_counts[kern.name]}
    return kernels


def _write_binaries(report, folder: Path) -> tuple[dict, dict]:
    """The GPU kernels' cubins, written into folder by digest; each kernel's manifest entry
    (its binary's launch metadata, and a binary taking tensors at any address where the host
    program may pass one off a 16-byte boundary) and the GPU they were compiled for."""
    from kiln.ir.host import Launch
    from kiln.runtime import triton_abi, triton_build

    target = triton_abi.current_target()
    maybe_unaligned = {i.kernel for i in report.host_program.body if isinstance(i, Launch) and not i.aligned}
    chosen = {}
    for kern in report.kernels:
        stored = report.binaries.get(kern.name)
        if not isinstance(stored, list) or len(stored) != 1:
            raise NotImplementedError(f"kiln.export: kernel {kern.name} cannot be stored as one binary "
                                      f"({stored if isinstance(stored, str) else 'no single configuration'})")
        chosen[kern.name] = stored[0]
    unaligned = [k for k in report.kernels if k.name in maybe_unaligned]
    any_address = dict(zip((k.name for k in unaligned), triton_build.any_alignment_binaries(
        [(k, report.sources[k.name], chosen[k.name].config) for k in unaligned], target)))
    kernels = {}
    for kern in report.kernels:
        binary, anywhere = chosen[kern.name], any_address.get(kern.name)
        for b in (binary, anywhere):
            if b is not None:
                (folder / f"{b.cubin_sha256}.cubin").write_bytes(b.cubin)
        kernels[kern.name] = {"binary": binary.to_dict(),
                              "any alignment": anywhere.to_dict() if anywhere is not None else None}
    return kernels, {"arch": f"sm_{target[1]}"}


def _shape_env(traced: list) -> Any:
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([v for v in traced if isinstance(v, torch.Tensor)])
    return getattr(mode, "shape_env", None)


def _shape_entry(value: Any, env: Any) -> list:
    """An input's sizes for the manifest: an int, or for a dynamic dimension its symbol and
    range ({"symbol": "s0", "min": 2, "max": 4096}; max None where unbounded)."""
    from kiln.ir.sizes import as_size, is_symbolic

    out: list = []
    for s in value.shape:
        size = as_size(s)
        if not is_symbolic(size):
            out.append(size)
            continue
        if not size.is_Symbol:
            raise NotImplementedError(f"kiln.export: a dynamic dimension of size {size} (not one symbol)")
        bounds = env.var_to_range.get(size) if env is not None else None
        lo = int(bounds.lower) if bounds is not None and bounds.lower.is_finite else 0
        hi = int(bounds.upper) if bounds is not None and bounds.upper.is_finite else None
        out.append({"symbol": str(size), "min": lo, "max": hi})
    return out


def _output_structure(out_spec) -> str:
    """How the user's function returns its tensors: one, or a tuple or list of them."""
    if out_spec.is_leaf():
        return "tensor"
    if out_spec.type not in (tuple, list) or any(not c.is_leaf() for c in out_spec.children()):
        raise NotImplementedError("kiln.export: the function must return a tensor or a flat tuple or "
                                  "list of tensors")
    return out_spec.type.__name__


def _kiln_version() -> str:
    from kiln import __version__

    return __version__


@dataclass
class LoadedProgram:
    """A loaded artifact: call it with the inputs it was exported for."""

    path: Path
    manifest: dict
    _call: Callable[[list], list]
    _state: list[torch.Tensor]
    _libraries: list[ctypes.CDLL]  # kept loaded while the program lives

    def __call__(self, *args: Any) -> Any:
        expected = self.manifest["inputs"]
        if len(args) != len(expected):
            raise TypeError(f"kiln artifact {self.path.name} takes {len(expected)} inputs, got {len(args)}")
        inputs = []
        bound: dict[str, tuple[int, int, int]] = {}  # symbol -> (size, input, dim) first seen
        for k, (a, spec) in enumerate(zip(args, expected)):
            inputs.append(_checked(a, spec, k, bound))
        out = self._call([*self._state, *inputs])
        if self.manifest["outputs"] == "tensor":
            return out[0]
        return tuple(out) if self.manifest["outputs"] == "tuple" else list(out)

    def __repr__(self) -> str:
        inputs = self.manifest["inputs"]
        shapes = ", ".join(f"{i['dtype'].removeprefix('torch.')}{_shape_text(i['shape'])}" for i in inputs)
        return f"kiln artifact {self.path} ({shapes})"


def _checked(a: Any, spec: dict, k: int, bound: dict | None = None) -> torch.Tensor:
    where = f"kiln artifact input {k}"
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"{where} must be a tensor, got {type(a).__name__}")
    if str(a.dtype) != spec["dtype"]:
        raise TypeError(f"{where} has dtype {a.dtype}, the artifact was exported for {spec['dtype']}")
    if a.dim() != len(spec["shape"]):
        raise ValueError(f"{where} has {a.dim()} dimensions, the artifact was exported for "
                         f"{len(spec['shape'])} (shape {spec['shape']})")
    for d, (n, want) in enumerate(zip(a.shape, spec["shape"])):
        if isinstance(want, dict):  # a dynamic dimension: within its range, equal where its symbol is
            lo, hi = want["min"], want["max"]
            if n < lo or (hi is not None and n > hi):
                raise ValueError(f"{where} has size {n} in dimension {d}, outside the range "
                                 f"[{lo}, {'inf' if hi is None else hi}] of {want['symbol']} the artifact "
                                 "was exported for")
            first = (bound if bound is not None else {}).setdefault(want["symbol"], (n, k, d))
            if first[0] != n:
                raise ValueError(f"{where} has size {n} in dimension {d}; input {first[1]} has size "
                                 f"{first[0]} in dimension {first[2]}, the same size {want['symbol']}")
        elif n != want:
            raise ValueError(f"{where} has shape {list(a.shape)}, the artifact was exported for shape "
                             f"{_shape_text(spec['shape'])} only")
    if str(a.device) != spec["device"]:
        raise ValueError(f"{where} is on {a.device}, the artifact runs on {spec['device']}")
    return a.contiguous()  # the kernels were compiled for the example's layout: contiguous


def _shape_text(shape: list) -> str:
    return "[" + ", ".join(s["symbol"] if isinstance(s, dict) else str(s) for s in shape) + "]"


def load(path: str | Path) -> LoadedProgram:
    """The artifact at path as a callable; refuses one from another kiln, torch or machine."""
    from kiln.codegen import host as host_codegen
    from kiln.ir.host import HostProgram
    from kiln.runtime.cache import cpu_model

    path = Path(path)
    manifest_file = path / "manifest.json"
    if not manifest_file.is_file():
        raise ArtifactError(f"{path} is not a kiln artifact (no manifest.json)")
    manifest = json.loads(manifest_file.read_text())
    if manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path}: artifact format {manifest.get('format')!r}, this kiln reads {FORMAT}")
    on_gpu = manifest.get("device") == "cuda"
    for key, here in (("kiln", _kiln_version()), ("torch", torch.__version__)):
        if manifest[key] != here:
            raise ArtifactError(f"{path} was built for {key} {manifest[key]!r}; this is {here!r}: "
                                "export it again here")
    if on_gpu:
        device = _gpu_for(path, manifest)
    elif manifest["machine"] != cpu_model():
        raise ArtifactError(f"{path} was built for machine {manifest['machine']!r}; this is {cpu_model()!r}: "
                            "export it again here")
    host = HostProgram.from_dict(json.loads((path / "host.json").read_text()),
                                 (path / "constants.pt").read_bytes())
    # GPU weights are read from the file mapped into memory and copied once, to the GPU; CPU
    # weights are read into memory (a mapped file cut short under a running program kills it)
    state_dict = torch.load(path / "state.pt", weights_only=True, mmap=on_gpu)
    libraries: dict[str, ctypes.CDLL] = {}
    if on_gpu:
        launchers = _gpu_launchers(path, manifest, device)
    else:
        launchers = _cpu_launchers(path, manifest, libraries)
    call = host_codegen.load(host, launchers)
    state = [state_dict[name] for name in manifest["state"]]
    return LoadedProgram(path, manifest, call, state, list(libraries.values()))


def _cpu_launchers(path: Path, manifest: dict, libraries: dict[str, ctypes.CDLL]) -> dict[str, Callable]:
    launchers = {}
    for name, k in manifest["kernels"].items():
        if k["library"] not in libraries:
            libraries[k["library"]] = ctypes.CDLL(str(path / "kernels" / k["library"]))
        fn = getattr(libraries[k["library"]], name)
        fn.argtypes = [ctypes.c_void_p] * k["arguments"] + [ctypes.c_int64] * k.get("sizes", 0)
        fn.restype = None
        launchers[name] = fn
    return launchers


def _gpu_for(path: Path, manifest: dict) -> int:
    """The GPU an artifact's inputs live on, refused unless it is of the architecture the
    artifact's cubins were compiled for."""
    arch = manifest["arch"]
    if not torch.cuda.is_available():
        raise ArtifactError(f"{path} runs on an NVIDIA GPU ({arch}); this machine has no CUDA GPU: "
                            "export it again here for the CPU")
    devices = {torch.device(i["device"]) for i in manifest["inputs"]}
    index = next(iter(devices)).index if devices else None
    index = torch.cuda.current_device() if index is None else index
    if index >= torch.cuda.device_count():
        raise ArtifactError(f"{path} runs on cuda:{index}; this machine has {torch.cuda.device_count()} GPUs")
    major, minor = torch.cuda.get_device_capability(index)
    if f"sm_{major}{minor}" != arch:
        raise ArtifactError(f"{path} was built for {arch}; this GPU ({torch.cuda.get_device_name(index)}) is "
                            f"sm_{major}{minor}: export it again here")
    return index


def _gpu_launchers(path: Path, manifest: dict, device: int) -> dict[str, Callable]:
    """Each kernel's launcher over its cubin, loaded through the CUDA driver: no Triton."""
    from kiln.runtime.cuda_driver import BinaryLauncher
    from kiln.runtime.triton_abi import KernelBinary

    def binary(data: dict | None) -> KernelBinary | None:
        if data is None:
            return None
        try:
            cubin = (path / "kernels" / f"{data['cubin_sha256']}.cubin").read_bytes()
            return KernelBinary.from_dict(data, cubin)
        except (OSError, ValueError) as e:
            raise ArtifactError(f"{path}: the binary of {data['name']} is missing or damaged ({e})") from e

    launchers = {}
    for name, k in manifest["kernels"].items():
        b = binary(k["binary"])
        launchers[name] = BinaryLauncher(name, {b.config: b}, path / "kernels" / f"{name}.tune.json",
                                         unaligned=binary(k["any alignment"]), device=device)
    return launchers
