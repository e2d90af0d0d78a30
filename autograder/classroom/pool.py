"""The grading processes of a class: ``jobs`` spawned processes, each with its own sandbox.

Spawned, not forked: the parent holds torch and threads. Each process grades one student after
another, as a single grading does. On top of what ``grade.open_sandbox`` hides, every sandbox
hides the submissions folder, the out folder and the other processes' stages, and each
student's staged file is deleted once graded: otherwise a submission could read its
classmates' code and raise it into its own feedback.
"""

from __future__ import annotations

import dataclasses
import importlib
import multiprocessing
import os
import shutil
import signal
import stat
import sys
import tempfile
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Callable, Iterator

from ..grade import open_sandbox
from ..sandbox import Sandbox
from .discovery import Student
from .grading import Outcome, Setup, grade_student, record_failure


def open_private_sandbox(setup: Setup, slot: int) -> Sandbox:
    """grade.open_sandbox, hiding as well what is private to the class: the submissions, the out
    folder and the other grading processes' temporary folders (their stages)."""
    others = [s for i, s in enumerate(setup.slots) if i != slot]
    # RLIMIT_NPROC counts every process and thread of a uid on the host, and every sandbox's
    # workers run as the same one: the grading processes share worker.nproc times their number,
    # so that each may hold as many as a single grading's.
    worker = dataclasses.replace(setup.cfg.worker, nproc=setup.cfg.worker.nproc * max(1, len(setup.slots)))
    return open_sandbox(dataclasses.replace(setup.cfg, worker=worker), setup.config_path, [*setup.private, *others])


class _SandboxHolder:
    """A grading process's one sandbox: opened when first needed, replaced after a grader failure."""

    def __init__(self, setup: Setup, slot: int):
        self.setup, self.slot, self.current = setup, slot, None

    def get(self) -> Sandbox:
        if self.current is None:
            self.current = open_private_sandbox(self.setup, self.slot)
        return self.current

    def after(self, outcome: Outcome) -> None:
        if outcome.failed:
            self.close()
        elif self.current is not None:  # the next submission must not find this one's file
            for staged in self.current.stage.glob("submission-*"):
                shutil.rmtree(staged, ignore_errors=True)

    def close(self) -> None:
        sandbox, self.current = self.current, None
        if sandbox is None:
            return
        try:
            sandbox.close()
        except BaseException:  # stopped mid-request: end the server the blunt way
            try:
                os.killpg(sandbox.server.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            shutil.rmtree(sandbox.stage, ignore_errors=True)


class _Stopped(BaseException):
    """SIGTERM or SIGINT in a grading process: close the sandbox and exit."""


def _stop(signum, frame) -> None:
    for number in (signal.SIGINT, signal.SIGTERM):  # once: the parent's SIGTERM follows a Ctrl-C
        signal.signal(number, _ignore)
    raise _Stopped


def _ignore(signum, frame) -> None:
    """Not SIG_IGN: a signal already pending when the handler changes would raise an OSError."""


def _examples_as_alone(as_alone: tuple[str, ...]) -> None:
    """Have this process draw the examples that ``ppo-grade FILE`` draws.

    Hypothesis (6.170, pinned) draws some examples from the literals of every *local* module in
    sys.modules (hypothesis.internal.conjecture.providers._get_local_constants): an int literal
    of this package could become an exercise's seed. A single grading has imported its entry
    module (the CLI: the caller names it in ``as_alone``) and none of this package's modules nor
    a spawn parent's __mp_main__, so the same here.
    """
    for name in as_alone:
        importlib.import_module(name)
    try:
        from hypothesis.internal.conjecture import providers

        ours = [m for name, m in list(sys.modules.items())
                if name == "__mp_main__" or name == __package__ or name.startswith(__package__ + ".")]
        providers._seen_modules.update(id(m) for m in ours)
    except (ImportError, AttributeError):  # another Hypothesis: tests/test_batch.py would tell
        pass


def _serve(conn, setup: Setup, slot: int) -> None:
    """A grading process: students from ``conn``, one after another, until None or EOF."""
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    _examples_as_alone(setup.as_alone)
    tempfile.tempdir = str(setup.slots[slot])  # this process's stages, hidden from the other sandboxes
    holder = _SandboxHolder(setup, slot)
    try:
        while True:
            student = conn.recv()
            if student is None:
                break
            outcome = grade_student(student, setup, holder.get)
            holder.after(outcome)
            conn.send(outcome)
    except (_Stopped, EOFError, BrokenPipeError):
        pass
    finally:
        holder.close()


@dataclass
class _Process:
    process: multiprocessing.process.BaseProcess
    conn: object
    slot: int
    student: Student | None = None


def _start(ctx, setup: Setup, slot: int) -> _Process:
    ours, theirs = ctx.Pipe()
    process = ctx.Process(target=_serve, args=(theirs, setup, slot), name=f"ppo-grade-{slot}", daemon=True)
    process.start()
    theirs.close()
    return _Process(process, ours, slot)


def _give(p: _Process, queue: deque) -> None:
    if queue:
        p.student = queue.popleft()
        try:
            p.conn.send(p.student)
        except OSError:
            pass  # it died: its sentinel says so


def _collect(p: _Process, setup: Setup) -> Outcome:
    student, p.student = p.student, None
    try:
        if p.conn.poll():
            return p.conn.recv()
    except (EOFError, OSError):
        pass
    p.process.join(5)
    return record_failure(setup.out, student.id, f"the grading process died (exit status {p.process.exitcode})")


def run_pool(todo: list[Student], setup: Setup, jobs: int, on_done: Callable[[Outcome], None]) -> None:
    """Grade ``todo`` in ``jobs`` spawned processes; ``on_done`` gets each outcome as it comes.
    A process that dies costs its current student a grader failure and is replaced."""
    ctx = multiprocessing.get_context("spawn")
    queue = deque(todo)
    procs = [_start(ctx, setup, slot) for slot in range(min(jobs, len(todo)))]
    try:
        for p in procs:
            _give(p, queue)
        while busy := [p for p in procs if p.student is not None]:
            ready = set(wait([p.conn for p in busy] + [p.process.sentinel for p in busy]))
            for p in busy:
                if p.conn in ready or p.process.sentinel in ready:
                    on_done(_collect(p, setup))
                    if not p.process.is_alive() and queue:
                        p.conn.close()
                        procs[procs.index(p)] = p = _start(ctx, setup, p.slot)
                    _give(p, queue)
    except BaseException:
        _stop_all(procs, force=True)
        raise
    _stop_all(procs, force=False)


def _stop_all(procs: list[_Process], force: bool) -> None:
    """Ask each process to finish (None) or, when interrupted, stop it now (SIGTERM: it closes its
    sandbox first); kill what does not exit in time."""
    for p in procs:
        try:
            p.process.terminate() if force else p.conn.send(None)
        except OSError:
            pass
    for p in procs:
        p.process.join(15)
        if p.process.is_alive():
            p.process.kill()
            p.process.join()
        p.conn.close()


@contextmanager
def slots(jobs: int) -> Iterator[tuple[Path, ...]]:
    """A private temporary folder per grading process (the sandboxes' stages go there)."""
    root = Path(tempfile.mkdtemp(prefix="ppo-batch-"))
    traverse_only = stat.S_IRWXU | stat.S_IXGRP | stat.S_IXOTH  # the user strategy's sandbox user reaches its stage
    try:
        os.chmod(root, traverse_only)
        found = tuple(root / f"slot-{i}" for i in range(jobs))
        for slot in found:
            slot.mkdir()
            os.chmod(slot, traverse_only)
        yield found
    finally:
        shutil.rmtree(root, ignore_errors=True)
