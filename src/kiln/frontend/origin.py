"""Where a node of the tensor graph came from in the user's model: the module, its class, the
source line and the ATen op, read from the FX node's metadata (Dynamo's stack trace and module
stack, AOTAutograd's original ATen op). The importer tags every node it makes with one;
passes keep it (ir/tensor.py's Builder), and the source map (passes/source_map.py) reads it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

ORIGIN = "origin"  # the key of a node's origin in Node.meta

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n(?P<code>[^\n]*)')
# the compiled module itself (L['self']; L['fn'] inside kiln.explain) is the path's root; another
# local or global (L['model'], G['model']) is its first part
_DYNAMO_ROOT = re.compile(r"^L\[['\"](self|fn)['\"]\]\.?")
_DYNAMO_NAME = re.compile(r"^[LG]\[['\"]([^'\"]+)['\"]\]")
_MODULES_ITEM = re.compile(r"(?:^|\.)_modules\[['\"]([^'\"]+)['\"]\]")
_INDEX = re.compile(r"\[['\"]?([^'\"\]]+)['\"]?\]")


@dataclass(frozen=True)
class Origin:
    """Model code behind a node: module path ("h.0.attn", "" at the top), its class, the file,
    line and text of the source line, the ATen op AOTAutograd traced, and whether the node
    computes a gradient (it then points at the forward code it differentiates)."""

    module: str = ""
    module_class: str = ""
    file: str = ""
    line: int = 0
    code: str = ""
    aten: str = ""
    backward: bool = False

    def where(self) -> str:
        """`path/file.py:12` (the file's last two parts), or "" without a stack trace."""
        if not self.file:
            return ""
        return f"{'/'.join(self.file.split('/')[-2:])}:{self.line}"

    def short(self) -> str:
        """module (Class) file:line, without the code."""
        parts = [f"{self.module or '<top>'} ({self.module_class})"] if self.module_class else []
        parts += [self.where()] if self.file else []
        return ("grad of " if self.backward and parts else "") + " ".join(parts)

    def text(self) -> str:
        """One line: module (Class) file:line `code` [backward of]."""
        parts = []
        if self.module_class:
            parts.append(f"{self.module or '<top>'} ({self.module_class})")
        if self.file:
            parts.append(self.where())
        if self.code:
            parts.append(f"`{self.code}`")
        text = " ".join(parts) or "<no stack trace>"
        return f"grad of {text}" if self.backward else text

    def label(self, containers: frozenset[str] = frozenset()) -> str:
        """A short word for naming a kernel: the innermost module's class where that module
        holds no others (a norm, an activation), else the ATen op (glue code in a block's or
        the compiled module's own forward)."""
        parts = self.aten.split(".")
        leaf = self.module and self.module not in containers
        word = self.module_class if leaf else (parts[1] if len(parts) > 1 else parts[0])
        return re.sub(r"[^a-z0-9]+", "", word.lower())


_ORIGIN_META = ("stack_trace", "nn_module_stack", "fwd_nn_module_stack", "source_fn_stack",
                "autograd_backward", "partitioner_tag", "original_aten")


def keep_origin(new, old) -> None:
    """An FX rewrite's new node new carries the model code of the node old it replaces."""
    for key in _ORIGIN_META:
        if key in old.meta and key not in new.meta:
            new.meta[key] = old.meta[key]


def module_path(dynamo_path: str) -> str:
    """Dynamo's module path ("L['self'].h._modules['0'].attn", "L['self'].h[0]") as the
    dotted path named_modules() gives ("h.0.attn")."""
    path = _DYNAMO_NAME.sub(r"\1", _DYNAMO_ROOT.sub("", dynamo_path))
    path = _MODULES_ITEM.sub(r".\1", path)
    path = _INDEX.sub(r".\1", path)
    return path.strip(".")


def _class_name(cls: Any) -> str:
    if isinstance(cls, type):
        return cls.__name__
    return str(cls).rsplit(".", 1)[-1].strip("'>")


def origin_of(meta: dict) -> Origin | None:
    """The origin in an FX node's meta, or None where it says nothing."""
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack") or {}
    module = module_class = ""
    if stack:
        path, cls = list(stack.values())[-1][:2]
        module, module_class = module_path(str(path)), _class_name(cls)
    file, line, code = "", 0, ""
    frames = list(_FRAME.finditer(meta.get("stack_trace") or ""))
    if frames:
        last = frames[-1]
        file, line, code = last["file"], int(last["line"]), last["code"].strip()
    aten = meta.get("original_aten")
    aten_name = str(aten) if aten is not None else ""
    if not (module_class or file or aten_name):
        return None
    # a forward op recomputed in the backward graph keeps its own module stack; torch 2.11
    # tags the backward's nodes only through the partitioner's tag
    backward = (bool(meta.get("autograd_backward")) or meta.get("partitioner_tag") == "is_backward") \
        and not (meta.get("nn_module_stack") or meta.get("source_fn_stack"))
    return Origin(module, module_class, file, line, code, aten_name, backward)
