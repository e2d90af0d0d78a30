"""The examples every passing submission meets, recorded once and replayed.

Hypothesis is derandomized and seeded per check, so until a submission first fails a check, the
examples it meets depend on nothing the submission does: every submission that passes meets the
same sequence, and every other one meets the start of it. The first grading whose submission
passes a check records that sequence, each example with the reference's result on it; later
gradings replay it without Hypothesis (drawing the examples is most of the grader's own work)
and without the reference. When the submission fails example i, Hypothesis runs as it always
did; its first i + 1 examples are the recorded ones, already answered, so it does not ask the
worker again and shrinks from there: the worker meets the same calls, in the same order, and the
grading ends with the same score and feedback as without a recording.

A recording is valid for one check (exercise, id, seed, number of examples) under one grader:
its key hashes the source of every module Hypothesis draws constants from (the grader, the
reference solution, the student package: the strategies, the reference and the pool of
literals that Hypothesis mixes into its draws), the versions of the libraries that build the
examples and the reference's results, and the CPU's vector extension (torch's kernels round
differently on another one). Any change makes a new key, so a stale recording is never read.
Only checks on the public seed are recorded: the hidden seed's examples never reach the disk.

Recordings are safetensors files (tensors) with a JSON description, never pickle, in a folder
only its owner can read (PPO_GRADER_CACHE, else ~/.cache/ppo-grade); outside the project tree
and the Python environment, so no sandbox shows it to a worker.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import sys
import tempfile
from dataclasses import fields
from importlib import metadata
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .calls import Called
from .cases import Case
from .exercises.update import UpdateCase, Updated

FORMAT = "ppo-grade replay 1"
CACHE_ENV = "PPO_GRADER_CACHE"
LIBRARIES = ("torch", "numpy", "hypothesis", "transformers", "safetensors")
# What a recording holds, by type name; UpdateCase.initial is the grading model's own parameters,
# set again on loading.
TYPES = {t.__name__: t for t in (Case, Called, UpdateCase, Updated)}
NOT_RECORDED = {"initial"}
ALIGN = 8  # bytes: the largest itemsize a recorded tensor has (float64, int64)


def directory() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "ppo-grade")


# The entry script (ppo-grade, python -m autograder, a batch's worker process) adds only its
# literals to Hypothesis's pool: they, not its text, go into the key.
ENTRY_MODULES = ("__main__", "__mp_main__")


def _local_modules() -> tuple[str, ...]:
    """The names of the modules whose literals Hypothesis may draw (its own test of a local
    module: not in site-packages, not the standard library)."""
    return _local_among(tuple(sys.modules))  # what is imported changes rarely: look again only then


@functools.lru_cache(maxsize=None)
def _local_among(names: tuple[str, ...]) -> tuple[str, ...]:
    from hypothesis.internal.constants_ast import is_local_module_file

    return tuple(sorted(name for name in names
                        if isinstance(getattr(sys.modules.get(name), "__file__", None), str)
                        and is_local_module_file(sys.modules[name].__file__)))


@functools.lru_cache(maxsize=None)
def _grader_digest(modules: tuple[str, ...]) -> str:
    from hypothesis.internal.constants_ast import constants_from_module

    h = hashlib.sha256(FORMAT.encode())
    for name in modules:
        module = sys.modules[name]
        if name in ENTRY_MODULES:
            content = repr(sorted(map(repr, constants_from_module(module)))).encode()
        else:
            try:
                content = Path(module.__file__).read_bytes()
            except OSError:
                content = b"(unreadable)"
        h.update(f"\0{name}\0{len(content)}\0".encode() + content)
    versions = {lib: _version(lib) for lib in LIBRARIES}
    h.update(json.dumps([versions, sys.version, platform.machine(), torch.backends.cpu.get_cpu_capability(),
                         torch.get_num_threads()]).encode())
    return h.hexdigest()


def _version(lib: str) -> str:
    try:
        return metadata.version(lib)
    except metadata.PackageNotFoundError:
        return "absent"


def key(number: int, check: str, seed: int, examples: int) -> str:
    """The name of one check's recording under this grader (see the module docstring)."""
    grader = _grader_digest(_local_modules())
    return hashlib.sha256(json.dumps([grader, number, check, seed, examples]).encode()).hexdigest()


# ---- (de)serialisation: JSON for the structure, the tensors' bytes packed in one buffer ---------

def _encode(x, tensors: list[torch.Tensor]):
    if isinstance(x, torch.Tensor):
        if not x.is_contiguous():  # a copy could reduce in another order: do not record it
            raise TypeError("non-contiguous tensor")
        tensors.append(x.detach())
        return {"tensor": len(tensors) - 1}
    if type(x).__name__ in TYPES and type(x) is TYPES[type(x).__name__]:
        return {"type": type(x).__name__,
                "fields": {f.name: _encode(getattr(x, f.name), tensors) for f in fields(x) if f.name not in NOT_RECORDED}}
    if isinstance(x, dict):
        if not all(isinstance(k, str) for k in x):
            raise TypeError("a dict with keys other than strings")
        return {"dict": [[k, _encode(v, tensors)] for k, v in x.items()]}
    if isinstance(x, (list, tuple)):
        return {"tuple" if isinstance(x, tuple) else "list": [_encode(v, tensors) for v in x]}
    if x is None or type(x) in (bool, int, float, str):
        return {"value": x}
    raise TypeError(f"cannot record a {type(x).__name__}")


def _decode(x, tensors: list[torch.Tensor], initial: dict):
    if "tensor" in x:
        return tensors[x["tensor"]]
    if "type" in x:
        values = {k: _decode(v, tensors, initial) for k, v in x["fields"].items()}
        cls = TYPES[x["type"]]
        if cls is UpdateCase:
            values["initial"] = initial
        return cls(**values)
    if "dict" in x:
        return {k: _decode(v, tensors, initial) for k, v in x["dict"]}
    if "tuple" in x:
        return tuple(_decode(v, tensors, initial) for v in x["tuple"])
    if "list" in x:
        return [_decode(v, tensors, initial) for v in x["list"]]
    return x["value"]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _pack(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
    """One uint8 buffer holding every tensor's bytes, each at an offset aligned for any dtype, and
    [dtype, shape, offset] of each: reading thousands of small tensors one by one from a
    safetensors file takes a second, slicing one buffer a few milliseconds."""
    layout, chunks, offset = [], [], 0
    for t in tensors:
        data = _bytes(t)
        pad = -data.numel() % ALIGN
        layout.append([str(t.dtype).removeprefix("torch."), list(t.shape), offset])
        chunks += [data, torch.zeros(pad, dtype=torch.uint8)]
        offset += data.numel() + pad
    return torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.uint8), layout


def _unpack(buffer: torch.Tensor, layout: list) -> list[torch.Tensor]:
    """The tensors of _pack, each a copy with storage of its own (a frame cannot carry views)."""
    out = []
    for dtype, shape, offset in layout:
        dtype = getattr(torch, dtype)
        n = math.prod(shape) * dtype.itemsize
        out.append(buffer[offset:offset + n].view(dtype).reshape(shape).clone())
    return out


def digest(case) -> str:
    """A digest of one example (its tensors' dtypes, shapes and bytes, and everything else)."""
    tensors: list[torch.Tensor] = []
    h = hashlib.sha256(json.dumps(_encode(case, tensors)).encode())
    for t in tensors:
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(_bytes(t).numpy().tobytes())
    return h.hexdigest()


def load(name: str, model: torch.nn.Module | None) -> list[tuple[object, object]] | None:
    """The recorded [(case, reference's result)] of a check, or None if there is none. Exercise
    5's cases get ``model``'s parameters as their ``initial``."""
    try:
        with safe_open(directory() / f"{name}.safetensors", framework="pt") as f:
            description = json.loads(f.metadata()["examples"])
            tensors = _unpack(f.get_tensor("bytes"), json.loads(f.metadata()["layout"]))
    except (OSError, SafetensorError, ValueError, KeyError, TypeError, AttributeError, RuntimeError):
        return None
    initial = dict(model.named_parameters()) if model is not None else {}
    return [(_decode(case, tensors, initial), _decode(ref, tensors, initial)) for case, ref in description]


def save(name: str, examples: list[tuple[object, object]]) -> None:
    """Record a check's examples (see load); silently keep nothing if they cannot be recorded."""
    tensors: list[torch.Tensor] = []
    try:
        description = [[_encode(case, tensors), _encode(ref, tensors)] for case, ref in examples]
    except TypeError:
        return
    buffer, layout = _pack(tensors)
    folder = directory()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".recording-")
        os.close(fd)
        save_file({"bytes": buffer}, tmp, metadata={"examples": json.dumps(description), "layout": json.dumps(layout)})
        os.replace(tmp, folder / f"{name}.safetensors")
    except OSError:
        return
