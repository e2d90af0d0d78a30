"""The wire format between the grader and its worker: JSON headers and safetensors payloads.

Nothing executable crosses the pipe (no pickle): a frame is a JSON object plus a safetensors
blob of named tensors, each length-prefixed. Both sides validate what they read; a malformed
frame raises ProtocolError.

This module is copied into the worker's sandbox with the rest of this package, so it imports
nothing from the project.
"""

from __future__ import annotations

import json
import os
import struct

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

_LEN = struct.Struct("<Q")
MAX_FRAME = 1 << 30  # 1 GiB: far above any legitimate frame, low enough to refuse garbage


class ProtocolError(RuntimeError):
    """The other side sent something that is not a valid frame."""


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def send(fd: int, header: dict, tensors: dict[str, torch.Tensor] | None = None) -> None:
    """Write one frame: ``header`` (JSON-serialisable) and named tensors."""
    head = json.dumps(header).encode()
    tensors = {k: t.detach().contiguous() for k, t in (tensors or {}).items()}
    blob = st_save(tensors) if tensors else b""
    _write_all(fd, _LEN.pack(len(head)) + head + _LEN.pack(len(blob)) + blob)


def receive(fd: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read one frame; raise ProtocolError on anything malformed, EOFError on a closed pipe."""
    n = _LEN.unpack(_read_exact(fd, _LEN.size))[0]
    if n > MAX_FRAME:
        raise ProtocolError(f"header of {n} bytes")
    try:
        header = json.loads(_read_exact(fd, n))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProtocolError(f"header is not JSON: {err}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not an object")
    m = _LEN.unpack(_read_exact(fd, _LEN.size))[0]
    if m > MAX_FRAME:
        raise ProtocolError(f"payload of {m} bytes")
    blob = _read_exact(fd, m)
    try:
        tensors = st_load(blob) if m else {}
    except Exception as err:  # safetensors raises its own error types
        raise ProtocolError(f"payload is not safetensors: {err}") from None
    return header, tensors
