"""The wire formats between the grader, its fork server and its workers. No pickle anywhere.

Worker channel (a stream socket per worker): a frame is a JSON object plus a safetensors blob
of named tensors, each length-prefixed. Both sides validate what they read; a malformed frame
raises ProtocolError.

Control channel (one SOCK_SEQPACKET socket between the grader and the fork server): one JSON
object per message, optionally carrying file descriptors (SCM_RIGHTS): the grader hands the
server the child's end of each new worker channel that way.

This module is copied into the worker's sandbox with the rest of this package, so it imports
nothing from the project.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
# torch and safetensors are imported on first use, not with this module: the grader starts its
# sandbox's fork server before it imports torch itself, so that the two import it at once.

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


def _safetensors(tensors: dict[str, torch.Tensor]) -> bytes:
    """The safetensors serialisation of ``tensors`` (contiguous). Through safetensors' numpy writer
    for the dtypes a frame usually carries: its torch writer first looks for shared storage
    through ctypes, which took longer than the small calls a grading's thousands of frames carry.
    Anything else (bfloat16, float8, a sparse tensor) goes to the torch writer, which accepts or
    refuses it as it always did. receive() reads either back as torch tensors."""
    import torch
    from safetensors.numpy import save as np_save
    from safetensors.torch import save as st_save

    numpy_dtypes = (torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8,
                    torch.uint8, torch.bool)
    if all(t.dtype in numpy_dtypes and t.layout == torch.strided and not (t.is_neg() or t.is_conj())
           for t in tensors.values()):
        return np_save({k: t.numpy() for k, t in tensors.items()})
    return st_save(tensors)


def send(fd: int, header: dict, tensors: dict[str, torch.Tensor] | None = None) -> None:
    """Write one frame: ``header`` (JSON-serialisable) and named tensors."""
    head = json.dumps(header).encode()
    tensors = {k: t.detach().contiguous() for k, t in (tensors or {}).items()}
    blob = _safetensors(tensors) if tensors else b""
    _write_all(fd, _LEN.pack(len(head)) + head + _LEN.pack(len(blob)) + blob)


def receive(fd: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read one frame; raise ProtocolError on anything malformed, EOFError on a closed pipe."""
    from safetensors.torch import load as st_load

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
        # safetensors hands them back in an order that changes from process to process (a hash
        # map's): by name, so that whatever iterates over them (a feedback naming the first changed
        # parameter) says the same every time.
        tensors = dict(sorted(st_load(blob).items())) if m else {}
    except Exception as err:  # safetensors raises its own error types
        raise ProtocolError(f"payload is not safetensors: {err}") from None
    return header, tensors


MAX_CONTROL = 1 << 16


def send_control(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    """Send one control message, with ``fds`` attached."""
    data = json.dumps(message).encode()
    if len(data) > MAX_CONTROL:
        raise ProtocolError(f"control message of {len(data)} bytes")
    socket.send_fds(sock, [data], list(fds)) if fds else sock.sendall(data)


def receive_control(sock: socket.socket, max_fds: int = 1) -> tuple[dict, list[int]]:
    """Receive one control message and the descriptors it carries; EOFError when closed."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_CONTROL, max_fds)
    if not data:
        for fd in fds:
            os.close(fd)
        raise EOFError("control channel closed")
    try:
        message = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProtocolError(f"control message is not JSON: {err}") from None
    if not isinstance(message, dict):
        raise ProtocolError("control message is not an object")
    return message, fds
