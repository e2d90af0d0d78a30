"""Run untrusted submissions in worker processes, isolated as well as the machine allows.

A grading gets a *stage*: a fresh world-readable folder holding a copy of the worker package
(``ppo_worker``), a copy of the student-facing package ``assignment`` and the submission.
Workers import only from the stage and the Python environment, never from the project tree,
so the project tree (the solution, the grader, grading.yaml, .git, the README) can be hidden
from them entirely. A fork server (worker/zygote.py) imports torch once in the stage and forks
one fresh worker per request; each worker drops to the sandbox's privileges before it reads
the submission.

Strategies, strongest first (``detect_strategy`` picks one; results.json records it):

namespaces  root and ``unshare`` works (a VM, a TA's machine as root). Deny by default: the
            server runs in new mount, PID and network namespaces, chrooted into a root the
            sandbox builds (``_new_root_steps``): the Python environment and the system's
            libraries read-only, the stage read-only, a private /tmp, /dev/null, its own /proc;
            nothing else of the host, so a copy of the answer key anywhere else (an unzipped
            release in /tmp, a clone in a home folder) does not exist for a worker. The server
            keeps only the capabilities it needs (SERVER_CAPS); each worker becomes an
            unprivileged uid (the sandbox user, else nobody) before it reads the submission.
            The server is the namespace's init, so no worker can kill it, and ending it ends
            every process a worker started.
user        root without namespaces (Gradescope's Docker has no CAP_SYS_ADMIN). The server stays
            root; each worker becomes the unprivileged sandbox user (setup.sh creates it) with
            RLIMIT_NPROC set, and the project tree must be unreadable to that user (setup.sh
            makes it root-only; the grader checks). After every worker, every process of that
            user is killed, so a double-forked daemon cannot outlive it. File modes are all it
            has: a world-readable copy of the answer key elsewhere would be readable (the staff
            log says so on every grading; Gradescope's image holds none).
process     not root. Workers run as your own user: they could read your files and signal the
            grader. Use it to check your own code, never to grade untrusted submissions.

Every strategy adds: a private socket per worker (stdout/stderr go to /dev/null, so printing
counts for nothing), an address-space cap, per-call timeouts, a seccomp filter that refuses
network sockets where libseccomp is available, and killing each worker's process group (and,
between workers, every process the sandbox holds).
"""

from __future__ import annotations

import os
import pwd
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import assignment

from .worker import protocol

if TYPE_CHECKING:  # not imported: the CLI starts the fork server before it imports torch (cli.py)
    import torch

    from .config import GradingConfig

WORKER_PACKAGE = Path(__file__).resolve().parent / "worker"
STUDENT_PACKAGE = Path(assignment.__file__).resolve().parent
PROJECT_ROOT = Path(__file__).resolve().parent.parent


class GraderFailure(RuntimeError):
    """The grader could not run the submission at all: its installation or sandbox is broken.
    Never the student's fault; the CLI exits 1 and results.json says so."""


class WorkerDied(RuntimeError):
    """The worker exited (crash, sys.exit, os._exit, killed for memory) or broke the protocol."""


class WorkerTimeout(RuntimeError):
    """The worker did not answer within the time limit and was killed."""


@dataclass(frozen=True)
class Limits:
    memory_mb: int
    start_timeout_s: float
    threads: int
    nproc: int


def interpreter() -> str:
    """The running Python's path, its folder resolved: sys.executable keeps the path it was started
    by (``../venv/bin/python`` becomes ``/project/../venv/bin/python``), which the namespaces
    sandbox's root cannot walk (the project's folder is not in it). The name stays as it is: a
    venv's python is a link to the base interpreter, and Python finds its venv from the link's own
    folder."""
    path = Path(sys.executable)
    return str(path.parent.resolve() / path.name)


# The exit statuses of sh and setpriv when the program they were to run is not executable (126) or
# not found (127).
EXEC_FAILED = {126: "not executable", 127: "not found"}


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


def secret_paths(extra: list[Path]) -> list[Path]:
    """What no worker may read: every entry of the project tree except the Python environment
    the grader runs in (which may live inside it, e.g. .venv), plus ``extra`` (grading.yaml
    passed by --config, the hidden-seed file)."""
    prefix = Path(sys.prefix).resolve()
    inside = [p for p in PROJECT_ROOT.iterdir() if not (prefix == p.resolve() or p.resolve() in prefix.parents)]
    return _outermost({p.resolve() for p in inside + [Path(e) for e in extra] if p.exists()})


def _outermost(paths: set[Path]) -> list[Path]:
    """``paths`` without those inside another, sorted: a hidden folder hides what it holds, and a
    mount on a path inside an already hidden folder would fail (e.g. --config configs/grading.yaml
    inside the project tree)."""
    kept: list[Path] = []
    for path in sorted(paths):
        if not any(k == path or k in path.parents for k in kept):
            kept.append(path)
    return kept


def check_unreadable(paths: list[Path], user: str) -> None:
    """The user strategy relies on file modes: refuse to grade if ``user`` could reach a secret."""
    account = pwd.getpwnam(user)
    for path in paths:
        if _reachable(path, account):
            raise GraderFailure(f"sandbox misconfigured: {path} is readable by the sandbox user {user}; run "
                                f"`chmod -R go-rwx {path}` (autograder/gradescope/setup.sh does this)")


def _reachable(path: Path, account: pwd.struct_passwd) -> bool:
    """Whether ``account`` can search every folder above ``path`` and read or search ``path``."""

    def bits(p: Path) -> int:  # the rwx bits that apply to the account: owner's, group's or others'
        st = p.stat()
        shift = 6 if st.st_uid == account.pw_uid else 3 if st.st_gid == account.pw_gid else 0
        return (st.st_mode >> shift) & 0o7

    return all(bits(parent) & 0o1 for parent in path.parents) and bool(bits(path) & 0o5)


def _copy_public(src: Path, dst: Path) -> None:
    """Copy a package with modes anyone can read, whatever the source's modes are (setup.sh
    makes the project tree root-only; the copy must stay readable by the sandbox user)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for folder, dirs, files in os.walk(dst):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)


# What the namespaces strategy's server keeps of root's powers: to become the workers' uid
# (setuid, setgid), to end their processes (kill) and to delete whatever they left in the
# scratch folder, whatever modes they gave it (dac_override, fowner). Workers keep none: a
# change of uid from 0 clears every capability.
SERVER_CAPS = ("setuid", "setgid", "kill", "dac_override", "fowner")


def worker_account(sandbox_user: str) -> tuple[int, int]:
    """(uid, gid) the namespaces strategy's workers run as: the sandbox user if this machine has
    one, else nobody. Never root: root may read every root-owned file the new root still holds."""
    for name in (sandbox_user, "nobody"):
        try:
            account = pwd.getpwnam(name)
            return account.pw_uid, account.pw_gid
        except KeyError:
            continue
    return 65534, 65534


def environment_paths() -> list[Path]:
    """What the worker's interpreter needs, outermost only: the system's programs and libraries
    (/usr; /lib, /bin... are links into it on a merged-/usr system, else folders) and the Python
    environment (the venv, its base interpreter: under /root for pyenv, /usr/local for Docker)."""
    wanted = {Path(p) for p in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")}
    wanted |= {Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}}
    return _outermost({p for p in wanted if p.exists() or p.is_symlink()})


def answer_keys_in_environment() -> list[Path]:
    """The answer key's package folder where it lies inside the environment the worker's root
    shows: a non-editable install (``pip install .``) copies ``solutions/`` into site-packages.
    An editable install (setup.sh, the README) leaves it in the project tree, which is not shown."""
    import importlib.util

    spec = importlib.util.find_spec("solutions")
    folders = [Path(p).resolve() for p in (spec.submodule_search_locations or [])] if spec else []
    environment = environment_paths()
    return [f for f in folders if any(f.is_relative_to(e.resolve()) for e in environment)]


def _new_root_steps(root: Path, stage: Path) -> list[str]:
    """Shell steps that build the worker's root in ``root`` (run inside the new mount namespace).

    It holds: the environment (``environment_paths``) read-only; a private tmpfs /tmp; /dev/null,
    /dev/zero and /dev/urandom (torch and the libraries it loads open them); a /proc of the new
    PID namespace; an /etc with only the dynamic loader's cache; the stage read-only with its scratch tmpfs, the one writable place the
    workers are pointed at. Nothing else of the host exists there."""
    q = lambda p: shlex.quote(str(p))  # noqa: E731
    r = lambda p: q(root / Path(p).relative_to("/"))  # noqa: E731  (a host path's place in the new root)
    steps = ["umask 022", f"mount -t tmpfs -o size=16m,mode=755 tmpfs {q(root)}",
             f"mkdir -p {r('/tmp')}", f"mount -t tmpfs -o size=64m,mode=1777 tmpfs {r('/tmp')}"]
    for path in environment_paths():
        if path.is_symlink() and str(path) in ("/lib", "/lib64", "/lib32", "/bin", "/sbin"):
            steps.append(f"ln -s {q(os.readlink(path))} {r(path)}")  # merged /usr: usr/bin, usr/lib...
        else:
            steps += [f"mkdir -p {r(path)}", f"mount --bind {q(path)} {r(path)}",
                      f"mount -o remount,bind,ro {r(path)}"]
    for key in answer_keys_in_environment():  # an empty folder over an installed answer key
        steps.append(f"mount -t tmpfs -o size=4k,mode=755 tmpfs {r(key)}")
    steps.append(f"mkdir -p {r('/dev')} {r('/proc')} {r('/etc')}")
    for device in ("null", "zero", "urandom"):
        steps += [f"touch {r('/dev/' + device)}", f"mount --bind /dev/{device} {r('/dev/' + device)}"]
    steps.append(f"mount -t proc proc {r('/proc')}")
    if Path("/etc/ld.so.cache").exists():
        steps += [f"touch {r('/etc/ld.so.cache')}", f"mount --bind /etc/ld.so.cache {r('/etc/ld.so.cache')}",
                  f"mount -o remount,bind,ro {r('/etc/ld.so.cache')}"]
    steps += [f"mkdir -p {r(stage)}", f"mount --bind {q(stage)} {r(stage)}", f"mount -o remount,bind,ro {r(stage)}",
              f"mount -t tmpfs -o size=512m,mode=1777 tmpfs {r(stage / 'scratch')}",
              f"mount -o remount,ro {q(root)}"]  # the root's own folders: nothing to write there
    return steps


def hidden_paths(cfg: GradingConfig, config_path, private: Sequence[Path] = ()) -> list[Path]:
    """What a sandbox for ``cfg`` hides from its workers: the project tree, grading.yaml, the
    hidden-seed file, the grader's recorded examples (replay.py: the reference's results, the
    hidden checks' included; recordings_dir makes the folder first, so a grading that records
    later finds it hidden) and ``private``."""
    from .config import recordings_dir

    recordings = recordings_dir()
    return secret_paths([config_path, *([cfg.seeds.hidden_file] if cfg.seeds.hidden_file else []),
                         *([recordings] if recordings else []), *private])


def open_sandbox(cfg: GradingConfig, config_path, private: Sequence[Path] = ()) -> "Sandbox":
    """A sandbox for ``cfg``: the strongest strategy available, with ``hidden_paths`` hidden
    (``private``: a batch's submissions, its out folder, ...). Raises GraderFailure when the user
    strategy would leave any of them readable."""
    w = cfg.worker
    strategy = detect_strategy(w.sandbox, w.sandbox_user)
    hide = hidden_paths(cfg, config_path, private)
    if strategy == "user":
        check_unreadable(hide, w.sandbox_user)
    return Sandbox(Limits(w.memory_mb, w.start_timeout_s, w.threads, w.nproc), strategy, hide, w.sandbox_user)


class Sandbox:
    """A fork server and its stage; ``add`` stages a submission, ``spawn`` starts a fresh worker.

    One sandbox may grade many submissions one after another (batch grading, the tests): the
    server never runs student code, each worker is a fresh fork, and between workers
    ``kill_all`` ends every process and deletes every file a worker left.
    """

    def __init__(self, limits: Limits, strategy: str, hide: list[Path], sandbox_user: str, deny_network: bool = True):
        self.limits, self.strategy = limits, strategy
        self.stage = Path(tempfile.mkdtemp(prefix="ppo-grade-"))
        os.chmod(self.stage, 0o755)
        _copy_public(WORKER_PACKAGE, self.stage / "ppo_worker")
        _copy_public(STUDENT_PACKAGE, self.stage / "assignment")
        scratch = self.stage / "scratch"
        scratch.mkdir(mode=0o700)
        self.uid = self.gid = -1
        if strategy == "user":
            account = pwd.getpwnam(sandbox_user)
            self.uid, self.gid = account.pw_uid, account.pw_gid
            os.chown(scratch, self.uid, self.gid)
        elif strategy == "namespaces":  # scratch is a tmpfs of mode 1777 there
            self.uid, self.gid = worker_account(sandbox_user)
        self.python = interpreter()
        self._owed = 0  # control replies not yet read (a preload runs while the grader works)
        self._hello = self._preloaded = False
        self._submissions = 0
        self._start_server(hide, deny_network)

    def add(self, source: str) -> Path:
        """Stage one submission's text (readable by the sandbox user); its path, for ``spawn``."""
        self._submissions += 1
        folder = self.stage / f"submission-{self._submissions}"
        folder.mkdir(mode=0o755)
        path = folder / "submission.py"
        path.write_text(source, encoding="utf-8")
        os.chmod(path, 0o644)
        return path

    # ---- the fork server ------------------------------------------------------------------

    def _start_server(self, hide: list[Path], deny_network: bool) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        python = [self.python, "-E", "-s", "-m", "ppo_worker", "--control", str(theirs.fileno()),
                  "--strategy", self.strategy, "--uid", str(self.uid), "--gid", str(self.gid),
                  "--memory-mb", str(self.limits.memory_mb), "--nproc", str(self.limits.nproc),
                  "--threads", str(self.limits.threads)] + (["--deny-network"] if deny_network else [])
        threads = str(self.limits.threads)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.stage / "scratch"),
               "TMPDIR": str(self.stage / "scratch"), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
               "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
        cmd = self._namespace_command(python) if self.strategy == "namespaces" else python
        try:
            self.server = subprocess.Popen(cmd, cwd=self.stage, env=env, stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           pass_fds=(theirs.fileno(),), start_new_session=True)
        except OSError as err:  # the process and user strategies start the interpreter itself
            ours.close()
            shutil.rmtree(self.stage, ignore_errors=True)
            raise GraderFailure(f"the sandbox could not execute {cmd[0]}: {err.strerror}") from None
        finally:
            theirs.close()
        self.control = ours

    def _await_hello(self) -> None:
        """The server's hello comes once it has imported torch; the grader works meanwhile."""
        if not self._hello:
            hello = self._reply(self.limits.start_timeout_s, "starting the fork server (importing torch)")
            if hello.get("op") != "hello":
                raise GraderFailure(f"the fork server answered {hello.get('op')!r} instead of its hello")
            self._hello = True

    def _namespace_command(self, python: list[str]) -> list[str]:
        """The server's command line: new mount, PID and network namespaces in which a shell
        builds the worker's root (``_new_root_steps``), chroots into it and starts the server.

        Deny by default: the root holds only what a worker needs, so a copy of the answer key
        anywhere else (an unzipped release in /tmp, a second clone in a home folder) is not in
        it; the project tree is simply not mounted."""
        root = self.stage / "root"
        root.mkdir(mode=0o755)
        caps = "-all," + ",".join(f"+{c}" for c in SERVER_CAPS)
        server = ("exec setpriv --bounding-set=" + caps + " --inh-caps=-all --no-new-privs -- "
                  + " ".join(shlex.quote(p) for p in python))
        steps = ["set -e", "mount --make-rprivate /", *_new_root_steps(root, self.stage),
                 f"exec chroot {shlex.quote(str(root))} /bin/sh -c "
                 + shlex.quote(f"cd {shlex.quote(str(self.stage))} && {server}")]
        return ["unshare", "--mount", "--pid", "--net", "--fork", "--mount-proc", "--kill-child",
                "sh", "-c", "; ".join(steps)]

    def _reply(self, timeout_s: float, what: str) -> dict:
        ready, _, _ = select.select([self.control], [], [], timeout_s)
        if not ready:
            raise GraderFailure(f"{what} took longer than {timeout_s:g} s")
        try:
            message, fds = protocol.receive_control(self.control, max_fds=0)
        except (EOFError, ConnectionError, protocol.ProtocolError) as err:
            try:  # its channel closed: it has exited, or is exiting
                code = self.server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            raise GraderFailure(f"{what}: the fork server stopped ({err}; exit status {code}){self._why(code)}") from None
        return message

    def _why(self, code: int | None) -> str:
        """What an exit status of the server's start says: 126 and 127 are the shell's and setpriv's
        for a program that cannot be executed, and found."""
        if code not in EXEC_FAILED:
            return ""
        where = " inside the sandbox's root, which shows only " + ", ".join(map(str, environment_paths())) \
            if self.strategy == "namespaces" else ""
        return f": the sandbox could not execute the Python interpreter {self.python} ({EXEC_FAILED[code]}{where})"

    def _request(self, message: dict, what: str, fds: tuple[int, ...] = ()) -> dict:
        self._await_hello()
        while self._owed:
            self._reply(self.limits.start_timeout_s, "importing the model code (transformers)")
            self._owed -= 1
        protocol.send_control(self.control, message, fds)
        return self._reply(self.limits.start_timeout_s, what)

    def preload(self) -> None:
        """Have the server import the model code (exercise 5, the training check need it) while
        the grader goes on; once per sandbox."""
        if self._preloaded:
            return
        self._await_hello()
        protocol.send_control(self.control, {"op": "preload"})
        self._owed += 1
        self._preloaded = True

    def spawn(self, role: str, submission: Path) -> "Worker":
        """A fresh worker that has said hello (GraderFailure if it cannot) and is importing ``submission``."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            reply = self._request({"op": "spawn", "role": role, "submission": str(submission)},
                                  f"starting the {role} worker", (theirs.fileno(),))
        finally:
            theirs.close()
        worker = Worker(self, ours, int(reply["pid"]), role)
        worker.wait_hello()
        return worker

    def kill(self, pid: int) -> int | None:
        """SIGKILL a worker's process group and reap it; its exit status."""
        return self._request({"op": "kill", "pid": pid}, "stopping a worker").get("status")

    def kill_all(self) -> None:
        """End every process a worker left behind (see the module docstring)."""
        self._request({"op": "killall"}, "stopping every sandboxed process")

    def close(self) -> None:
        """Kill every worker process, then the server itself (nothing of it needs a clean exit:
        an interpreter with torch and transformers takes a second to tear down)."""
        try:
            self.kill_all()
        except GraderFailure:
            pass
        self.control.close()
        try:
            os.killpg(self.server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.server.wait()
        shutil.rmtree(self.stage, ignore_errors=True)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()



class Worker:
    """One worker process running one submission; ``request`` sends a frame and waits."""

    def __init__(self, sandbox: Sandbox, sock: socket.socket, pid: int, role: str):
        self.sandbox, self.sock, self.pid, self.role = sandbox, sock, pid, role
        self.fd = sock.fileno()
        self.network = "unknown"
        self.import_error: dict | None = None
        self.callable: list[str] = []
        self.ready = False
        self.alive = True

    def wait_hello(self) -> None:
        """The worker's first frame, sent as the sandbox user before it touches the submission."""
        try:
            header, _ = self._receive(self.sandbox.limits.start_timeout_s, "starting the worker")
        except (WorkerDied, WorkerTimeout) as err:
            raise GraderFailure(f"the {self.role} worker never said hello: {err}") from None
        if header.get("op") != "hello" or header.get("error"):
            self.kill()
            raise GraderFailure(f"the {self.role} worker could not start: {header.get('error', header.get('op'))}")
        self.network = str(header.get("network", "unknown"))

    def wait_ready(self) -> None:
        """Wait for the import of the submission; afterwards ``import_error`` says how it went.
        Dying or hanging here is the submission's doing (it runs its module code)."""
        try:
            header, _ = self._receive(self.sandbox.limits.start_timeout_s, "importing the submission")
            if header.get("op") != "ready":
                raise WorkerDied("the worker sent something other than the result of the import")
            self.import_error = header.get("import_error")
            self.callable = list(header.get("callable", []))
        except (WorkerDied, WorkerTimeout) as err:
            self.import_error = {"type": type(err).__name__, "message": str(err), "where": []}
        self.ready = True

    def request(self, header: dict, tensors: dict[str, torch.Tensor], timeout_s: float,
                oracle=None, meanwhile=None) -> tuple[dict, dict[str, torch.Tensor]]:
        """Send one request; answer ``oracle`` frames with ``oracle(header, tensors)`` until the reply.

        ``meanwhile()`` runs after the request is sent, so the grader's own work (the reference)
        overlaps the worker's.
        """
        try:
            protocol.send(self.fd, header, tensors)
        except OSError:
            raise WorkerDied(self._death("the worker exited before the request could be sent")) from None
        deadline = time.monotonic() + timeout_s
        if meanwhile is not None:
            meanwhile()
        while True:
            reply, reply_tensors = self._receive(deadline - time.monotonic(), "the call", timeout_s)
            if reply.get("op") != "oracle":
                return reply, reply_tensors
            if oracle is None:
                raise WorkerDied(self._death("the worker asked for the reference outside exercise 5"))
            answer, answer_tensors = oracle(reply, reply_tensors)
            protocol.send(self.fd, answer, answer_tensors)

    def _receive(self, timeout_s: float, what: str, limit_s: float | None = None) -> tuple[dict, dict]:
        """The next frame within ``timeout_s`` (what is left of the limit ``limit_s``, for the message)."""
        ready, _, _ = select.select([self.fd], [], [], max(timeout_s, 0.0))
        if not ready:
            self.kill()
            limit = timeout_s if limit_s is None else limit_s
            raise WorkerTimeout(f"{what} took longer than its time limit of {limit:g} s: look for a loop that never "
                                "ends, or one over every element where a tensor operation would do")
        try:
            return protocol.receive(self.fd)
        except (EOFError, protocol.ProtocolError, OSError) as err:
            raise WorkerDied(self._death(_reason(err))) from None

    def _death(self, reason: str) -> str:
        code = self.kill()
        return _death_reason(code, reason)

    def kill(self) -> int | None:
        """Kill the worker's process group and reap it; its exit status (None if unknown)."""
        if not self.alive:
            return None
        self.alive = False
        self.sock.close()
        return self.sandbox.kill(self.pid)

    def close(self) -> None:
        """Kill this worker and everything the sandbox still holds (no process outlives a worker)."""
        self.kill()
        self.sandbox.kill_all()


def _reason(err: BaseException) -> str:
    if isinstance(err, protocol.ProtocolError):
        return f"the worker broke the protocol ({err})"
    return "the worker stopped answering"


def _death_reason(code: int | None, reason: str) -> str:
    if code is None:
        return reason
    if code < 0:
        name = signal.Signals(-code).name
        extra = " (likely over the memory cap)" if -code in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT) else ""
        return f"the worker was killed by {name}{extra}"
    return f"the worker exited with status {code}"
