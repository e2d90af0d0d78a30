"""Start and talk to worker processes that run untrusted submissions.

Isolation strategies, strongest first (``detect_strategy`` picks one, results.json records it):

namespaces  root and ``unshare`` works (a VM, a TA's machine as root). The worker gets new
            mount, PID and network namespaces; the whole filesystem is remounted read-only,
            the solution, the grader's own package, grading.yaml and the hidden-seed file are
            covered by empty mounts, and a private tmpfs is the only writable place. Then
            every capability is dropped (setpriv, no_new_privs): it cannot unmount, cannot see
            or signal the grader, has no network.
user        root but no namespaces (Gradescope's Docker). The worker runs as an unprivileged
            user, which setup.sh creates; solution and grader files are readable by root only.
process     not root. The worker is a separate process with resource limits and a scrubbed
            environment, but it runs as the grading user and could read what that user can:
            use it to check your own files, not to grade untrusted ones.

Every strategy adds: a private protocol pipe (stdout/stderr go to /dev/null, so printing
counts for nothing), an address-space cap, per-call timeouts, and killing the whole process
group (or PID namespace) on timeout or at the end.
"""

from __future__ import annotations

import os
import pwd
import resource
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .worker import protocol

WORKER_PACKAGE = Path(__file__).resolve().parent / "worker"


class WorkerDied(RuntimeError):
    """The worker exited (crash, sys.exit, os._exit, killed for memory) or broke the protocol."""


class WorkerTimeout(RuntimeError):
    """The worker did not answer within the time limit and was killed."""


@dataclass(frozen=True)
class Limits:
    memory_mb: int
    import_timeout_s: float
    threads: int


def _unshare_works() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        return False
    probe = ["unshare", "--mount", "--pid", "--net", "--fork", "--mount-proc", "true"]
    return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0


def detect_strategy(requested: str, sandbox_user: str) -> str:
    """The strategy to use: ``requested`` unless it is 'auto' (then the strongest available)."""
    if requested != "auto":
        return requested
    if _unshare_works():
        return "namespaces"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(sandbox_user)
            return "user"
        except KeyError:
            pass
    return "process"


def _limit_resources(memory_mb: int) -> None:
    """preexec_fn: caps that hold whatever the strategy."""
    cap = memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 2**20, 64 * 2**20))


class Worker:
    """One worker process running one submission; ``request`` sends a frame and waits."""

    def __init__(self, submission: Path, limits: Limits, strategy: str, hide: list[Path], sandbox_user: str,
                 preload: bool = False):
        self.limits = limits
        self.preload = preload
        self.strategy = strategy
        self.stage = Path(tempfile.mkdtemp(prefix="ppo-grade-"))
        shutil.copytree(WORKER_PACKAGE, self.stage / "ppo_worker", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copyfile(submission, self.stage / "submission.py")
        self.scratch = self.stage / "scratch"
        self.scratch.mkdir()
        os.chmod(self.stage, 0o755)
        self.proc: subprocess.Popen | None = None
        self.import_error: dict | None = None
        self.ready = False
        self.callable: list[str] = []
        self._start(hide, sandbox_user)

    def _start(self, hide: list[Path], sandbox_user: str) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        python = [sys.executable, "-E", "-s", "-m", "ppo_worker", "--submission", str(self.stage / "submission.py"),
                  "--fd-in", str(to_child_r), "--fd-out", str(from_child_w), "--threads", str(self.limits.threads)]
        if self.preload:
            python.append("--preload")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.scratch), "TMPDIR": str(self.scratch),
               "OMP_NUM_THREADS": str(self.limits.threads), "MKL_NUM_THREADS": str(self.limits.threads),
               "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        if self.strategy == "namespaces":
            cmd = self._namespace_command(python, hide)
        elif self.strategy == "user":
            user = pwd.getpwnam(sandbox_user)
            os.chown(self.scratch, user.pw_uid, user.pw_gid)
            cmd = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                   "--no-new-privs", "--", *python]
        else:
            cmd = python
        self.proc = subprocess.Popen(
            cmd, cwd=self.stage, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(to_child_r, from_child_w), start_new_session=True,
            preexec_fn=lambda: _limit_resources(self.limits.memory_mb))
        os.close(to_child_r)
        os.close(from_child_w)
        self.fd_out, self.fd_in = to_child_w, from_child_r

    def _namespace_command(self, python: list[str], hide: list[Path]) -> list[str]:
        steps = ["set -e", "mount --make-rprivate /", "mount -o remount,bind,ro /"]
        for path in hide:
            if path.is_dir():
                steps.append(f"mount -t tmpfs -o size=4k,mode=000 tmpfs {shlex.quote(str(path))}")
            elif path.exists():
                steps.append(f"mount --bind /dev/null {shlex.quote(str(path))}")
        steps.append(f"mount -t tmpfs -o size=512m,mode=1777 tmpfs {shlex.quote(str(self.scratch))}")
        steps.append("exec setpriv --bounding-set=-all --inh-caps=-all --no-new-privs -- "
                     + " ".join(shlex.quote(p) for p in python))
        return ["unshare", "--mount", "--pid", "--net", "--fork", "--mount-proc", "--kill-child",
                "sh", "-c", "; ".join(steps)]

    def wait_ready(self) -> None:
        """Wait for the handshake; afterwards ``import_error`` says whether the import failed."""
        header, _ = self._receive(self.limits.import_timeout_s, "starting and importing the submission")
        if header.get("op") != "ready":
            raise WorkerDied("the worker sent something other than its handshake")
        self.import_error = header.get("import_error")
        self.callable = list(header.get("callable", []))
        self.ready = True

    def request(self, header: dict, tensors: dict[str, torch.Tensor], timeout_s: float,
                oracle=None, meanwhile=None) -> tuple[dict, dict[str, torch.Tensor]]:
        """Send one request; answer ``oracle`` frames with ``oracle(header, tensors)`` until the reply.

        ``meanwhile()`` runs after the request is sent, so the grader's own work (the reference)
        overlaps the worker's.
        """
        try:
            protocol.send(self.fd_out, header, tensors)
        except (BrokenPipeError, OSError):
            self.kill()
            raise WorkerDied("the worker exited before the request could be sent") from None
        deadline = time.monotonic() + timeout_s
        if meanwhile is not None:
            meanwhile()
        while True:
            reply, reply_tensors = self._receive(deadline - time.monotonic(), "the call")
            if reply.get("op") != "oracle":
                return reply, reply_tensors
            if oracle is None:
                self.kill()
                raise WorkerDied("the worker asked for the reference outside exercise 5")
            answer, answer_tensors = oracle(reply, reply_tensors)
            protocol.send(self.fd_out, answer, answer_tensors)

    def _receive(self, timeout_s: float, what: str) -> tuple[dict, dict]:
        ready, _, _ = select.select([self.fd_in], [], [], max(timeout_s, 0.0))
        if not ready:
            self.kill()
            raise WorkerTimeout(f"{what} took longer than its time limit")
        try:
            return protocol.receive(self.fd_in)
        except (EOFError, protocol.ProtocolError, OSError) as err:
            code = self.kill()
            raise WorkerDied(_death_reason(code, err)) from None

    def kill(self) -> int | None:
        """Kill the worker's whole process group; return its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        for fd in (self.fd_in, self.fd_out):
            try:
                os.close(fd)
            except OSError:
                pass
        self.proc = None
        return code

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.stage, ignore_errors=True)


def _death_reason(code: int | None, err: BaseException) -> str:
    if isinstance(err, protocol.ProtocolError):
        return f"the worker broke the protocol ({err})"
    if code is None:
        return "the worker stopped answering"
    if code < 0:
        name = signal.Signals(-code).name
        extra = " (likely over the memory cap)" if -code in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT) else ""
        return f"the worker was killed by {name}{extra}"
    return f"the worker exited with status {code}"
