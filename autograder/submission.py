"""Read a submission safely: a regular file inside its submission folder, as UTF-8 text.

A student controls what they upload, so the path handed to the grader may be a symbolic link
(to the solution, say), a folder, a FIFO that blocks forever, or a file reached through a
linked folder. The grader is root and would follow all of them. So: the path must not be a
link (``lstat``), must stay inside the submission folder once resolved, and is opened with
``O_NOFOLLOW | O_NONBLOCK``; the opened descriptor must be a regular file (``fstat``), and the
text is read from that descriptor, so that nothing can be swapped in between the checks and
the read. Anything else is refused with a message and 0 points.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_BYTES = 1 << 20


class Refused(ValueError):
    """The file cannot be graded; the message says why, for the student."""


def read(path: Path, folder: Path | None = None) -> str:
    """The text of the submission at ``path``, which must lie in ``folder`` (default: its own folder)."""
    path = Path(os.path.abspath(path))
    folder = Path(os.path.realpath(folder if folder is not None else path.parent))
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise Refused(f"no file at {path}: submit your assignment/exercises.py") from None
    if stat.S_ISLNK(info.st_mode):
        raise Refused(f"{path.name} is a symbolic link, not a file: submit the Python file itself")
    if not stat.S_ISREG(info.st_mode):
        raise Refused(f"{path.name} is not a regular file: submit the Python file itself")
    resolved = Path(os.path.realpath(path))
    if folder != resolved.parent and folder not in resolved.parents:
        raise Refused(f"{path.name} lies outside the submission folder (through a linked folder): "
                      "submit the Python file itself")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise Refused(f"{path.name} cannot be opened ({err.strerror}): submit the Python file itself") from None
    with os.fdopen(fd, "rb") as f:
        opened = os.fstat(f.fileno())
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
            raise Refused(f"{path.name} changed while it was being read: submit the Python file itself")
        if opened.st_size > MAX_BYTES:
            raise Refused(f"{path.name} is larger than {MAX_BYTES // 1024} KiB: submit only exercises.py")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise Refused(f"{path.name} is larger than {MAX_BYTES // 1024} KiB: submit only exercises.py")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Refused(f"{path.name} is not UTF-8 text (byte {err.start} cannot be read): save it as UTF-8 in your "
                      "editor (e.g. 'Save with Encoding' > UTF-8) and submit it again") from None
    if not text.strip():
        raise Refused(f"the file is empty: {path.name} holds no code; save your work in it (the five functions) "
                      "and submit it again")
    return text
