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

A recording is valid for one check (exercise, id, seed, number of examples) under one grader.
Hypothesis mixes into its draws literals of the local modules imported when it draws (the
grader's, the reference's, the student package's), so the key hashes which of them those are
(those imported now, and exercise 5's model module, which a grading of exercise 5 imports before
it draws), the text of every file of their packages (the strategies, the reference), the
versions of the libraries that build the examples and the reference's results, the CPU's
vector extension (torch's kernels round differently on another one) and torch's thread count.
Any change makes a new key, so a stale recording is never read. The hidden checks are recorded
under the hidden seed's keys (a grading under another seed draws its own): they are as secret as
the seed and the answer key, and kept as those are. Exercise 5's recordings hold the grading
model's parameters too: a grading that replays every check never imports transformers.

Recordings are safetensors files (tensors) with a JSON description, never pickle, in a folder
private to the grader's user (config.recordings_dir: $PPO_GRADER_CACHE, else ~/.cache/ppo-grade;
one that others may read or write is not used). Every sandbox hides it from its workers
(sandbox.hidden_paths: the user sandbox refuses to grade if its user could read it); under the
process sandbox, where a submission runs as the grader's user and could rewrite a recording,
the grader neither records nor replays (grade.py).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
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
from .config import recordings_dir
from .cases import Case
from .exercises.update import UpdateCase, Updated

FORMAT = "ppo-grade replay 1"
LIBRARIES = ("torch", "numpy", "hypothesis", "transformers", "safetensors")
# What a recording holds, by type name. UpdateCase.initial, the grading model's parameters (the
# same for every case), is recorded once for the whole check.
TYPES = {t.__name__: t for t in (Case, Called, UpdateCase, Updated)}
NOT_RECORDED = {"initial"}
ALIGN = 8  # bytes: the largest itemsize a recorded tensor has (float64, int64)


# The entry script (ppo-grade, python -m autograder, a batch's worker process) adds only its
# literals to Hypothesis's pool: they, not its text, go into the key.
ENTRY_MODULES = ("__main__", "__mp_main__")


def _local_modules() -> tuple[str, ...]:
    """The names of the modules whose literals Hypothesis may draw (its own test of a local
    module: not in site-packages, not the standard library)."""
    return _local_among(tuple(sys.modules))  # what is imported changes rarely: look again only then


@functools.lru_cache(maxsize=1)
def _local_among(names: tuple[str, ...]) -> tuple[str, ...]:
    from hypothesis.internal.constants_ast import is_local_module_file

    return tuple(sorted(name for name in names
                        if isinstance(getattr(sys.modules.get(name), "__file__", None), str)
                        and is_local_module_file(sys.modules[name].__file__)))


@functools.lru_cache(maxsize=None)
def _grader_digest(modules: tuple[str, ...]) -> str:
    """The grader's part of every key: which local modules are imported when Hypothesis draws
    (their literals are its pool), the text of every file of the packages they belong to (the
    strategies, the reference, and what they import later), the libraries and the CPU."""
    from hypothesis.internal.constants_ast import constants_from_module, is_local_module_file

    h = hashlib.sha256(json.dumps([FORMAT, modules]).encode())
    files = set()
    for name in modules:
        if name in ENTRY_MODULES:
            h.update(repr(sorted(map(repr, constants_from_module(sys.modules[name])))).encode())
            continue
        module = sys.modules.get(name)
        files.add(Path(module.__file__ if module is not None else importlib.util.find_spec(name).origin))
        package = sys.modules.get(name.split(".")[0])
        folders = getattr(package, "__path__", [])
        if folders and is_local_module_file(package.__file__):
            files.update(Path(folders[0]).rglob("*.py"))
    for path in sorted(files):
        try:
            content = path.read_bytes()
        except OSError:
            content = b"(unreadable)"
        h.update(f"\0{path}\0{len(content)}\0".encode() + content)
    versions = {lib: _version(lib) for lib in LIBRARIES}
    h.update(json.dumps([versions, sys.version, platform.machine(), torch.backends.cpu.get_cpu_capability(),
                         torch.get_num_threads()]).encode())
    return h.hexdigest()


def _version(lib: str) -> str:
    try:
        return metadata.version(lib)
    except metadata.PackageNotFoundError:
        return "absent"


def key(number: int, check: str, seed: int, examples: int, modules: tuple[str, ...] = ()) -> str:
    """The name of one check's recording under this grader (see the module docstring).
    ``modules``: the project's modules the grading imports before Hypothesis draws, beyond those
    imported now (update.MODEL_MODULES, when it includes exercise 5)."""
    grader = _grader_digest(tuple(sorted(set(_local_modules()) | set(modules))))
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


def _decode(x, tensors: list[torch.Tensor], initial: dict | None, sent: bool):
    """The recorded object ``x``; ``sent``: its tensors travel to the worker, so each gets storage
    of its own (a frame cannot carry views of one buffer); the reference's results stay views."""
    if "tensor" in x:
        t = tensors[x["tensor"]]
        return t.clone() if sent else t
    if "type" in x:
        values = {k: _decode(v, tensors, initial, sent) for k, v in x["fields"].items()}
        cls = TYPES[x["type"]]
        if cls is UpdateCase:
            values["initial"] = initial
        return cls(**values)
    if "dict" in x:
        return {k: _decode(v, tensors, initial, sent) for k, v in x["dict"]}
    if "tuple" in x:
        return tuple(_decode(v, tensors, initial, sent) for v in x["tuple"])
    if "list" in x:
        return [_decode(v, tensors, initial, sent) for v in x["list"]]
    return x["value"]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of contiguous ``t`` (any shape) as a flat uint8 view, (t.numel() * itemsize,)."""
    return t.reshape(-1).view(torch.uint8)


def _pack(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
    """One uint8 buffer holding every tensor's bytes, each at an offset aligned for any dtype, and
    [dtype, shape, offset] of each: reading thousands of small tensors one by one from a
    safetensors file takes a second, slicing one buffer a few milliseconds."""
    layout, chunks, offset = [], [], 0
    for t in tensors:
        data = _bytes(t).numpy().tobytes()
        layout.append([str(t.dtype).removeprefix("torch."), list(t.shape), offset])
        chunks += [data, bytes(-len(data) % ALIGN)]
        offset += len(data) + len(chunks[-1])
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8) if offset else \
        torch.zeros(0, dtype=torch.uint8), layout


def _unpack(buffer: torch.Tensor, layout: list) -> list[torch.Tensor]:
    """The tensors of _pack: views of ``buffer``."""
    out = []
    for dtype, shape, offset in layout:
        dtype = getattr(torch, dtype)
        n = math.prod(shape) * dtype.itemsize
        out.append(buffer[offset:offset + n].view(dtype).reshape(shape))
    return out


def digest(case) -> str:
    """A digest of one example (its tensors' dtypes, shapes and bytes, and everything else)."""
    tensors: list[torch.Tensor] = []
    h = hashlib.sha256(json.dumps(_encode(case, tensors)).encode())
    for t in tensors:
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(_bytes(t).numpy().tobytes())
    return h.hexdigest()


def _initial(examples: list[tuple[object, object]]) -> dict[str, torch.Tensor] | None:
    """The parameters every UpdateCase of a check starts from (one dict of the same tensors)."""
    initials = [case.initial for case, _ in examples if isinstance(case, UpdateCase)]
    if not initials:
        return None
    first = initials[0]
    if any(i.keys() != first.keys() or any(i[k] is not first[k] for k in first) for i in initials):
        raise TypeError("cases starting from different parameters")
    return first


def exists(name: str) -> bool:
    folder = recordings_dir()
    return folder is not None and (folder / f"{name}.safetensors").exists()


def load(name: str) -> list[tuple[object, object]] | None:
    """The recorded [(case, reference's result)] of a check, or None if there is none (or it
    cannot be read: a damaged file is as good as none)."""
    folder = recordings_dir()
    if folder is None:
        return None
    try:
        with safe_open(folder / f"{name}.safetensors", framework="pt") as f:
            description = json.loads(f.metadata()["examples"])
            tensors = _unpack(f.get_tensor("bytes"), json.loads(f.metadata()["layout"]))
        initial = _decode(description["initial"], tensors, None, sent=True)
        return [(_decode(case, tensors, initial, sent=True), _decode(ref, tensors, initial, sent=False))
                for case, ref in description["examples"]]
    except (OSError, SafetensorError, ValueError, KeyError, TypeError, AttributeError, RuntimeError, IndexError):
        return None


def save(name: str, examples: list[tuple[object, object]]) -> None:
    """Record a check's examples (see load); silently keep nothing if they cannot be recorded."""
    folder = recordings_dir()
    tensors: list[torch.Tensor] = []
    try:
        description = {"initial": _encode(_initial(examples), tensors),
                       "examples": [[_encode(case, tensors), _encode(ref, tensors)] for case, ref in examples]}
    except TypeError:
        return
    if folder is None:
        return
    buffer, layout = _pack(tensors)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".recording-")
        os.close(fd)
    except OSError:
        return
    try:  # written aside, then renamed: a grading running beside this one reads all of it or nothing
        save_file({"bytes": buffer}, tmp, metadata={"examples": json.dumps(description), "layout": json.dumps(layout)})
        os.replace(tmp, folder / f"{name}.safetensors")
    except (OSError, SafetensorError):
        Path(tmp).unlink(missing_ok=True)
