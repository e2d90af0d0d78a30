"""The fork server: import torch once, then fork one fresh worker per request.

Importing torch takes seconds and transformers several more; a grading needs up to seven
workers (the visible checks, then a fresh one per exercise for the hidden checks). The server
imports them once and forks; each child drops to the sandbox's privileges before it reads the
submission (serve.py). Under the ``user`` strategy the server itself stays root, so no worker
can signal or trace it; under ``namespaces`` it is the init process of the sandbox's PID
namespace (root with a few capabilities, sandbox.SERVER_CAPS), which its children, an
unprivileged uid, cannot kill either.

Control messages (protocol.send_control): ``spawn`` (with the child's channel attached),
``preload`` (import the model code, transformers), ``kill`` (a worker's process group, then
reap it) and ``killall`` (every process a worker left behind: all of the sandbox user's, all
of the namespace's, and every descendant of the server). Every message gets one reply.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import socket

import torch

from . import protocol, serve


def _status(pid: int, block: bool = True) -> int | None:
    """Reap ``pid``; its exit status as subprocess does (negative: killed by that signal)."""
    try:
        done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return None
    if done == 0:
        return None
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    """Orphaned descendants (a double fork, a daemon) are reparented to us, so we can end them."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _children() -> list[int]:
    """PIDs whose parent is this process (/proc/PID/stat field 4; the name in field 2 may hold spaces)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.append(int(entry))
    return found


def _kill_uid(uid: int, gid: int) -> None:
    """Kill every process of ``uid``: a child that becomes that user sends SIGKILL to pid -1,
    which the kernel delivers to all of the user's processes at once (a fork bomb cannot outrun it)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")


def _remove(folder: str, owner: int | None) -> None:
    """Delete the entries of ``folder`` (those of ``owner`` only, if given)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for name in entries:
        path = os.path.join(folder, name)
        try:
            if owner is None or os.lstat(path).st_uid == owner:
                shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        except OSError:
            pass


def _kill_all(args: argparse.Namespace) -> None:
    """End every process a worker started, whatever it did to hide (setsid, double fork)."""
    if args.strategy == "user":
        _kill_uid(args.uid, args.gid)
        for folder in SHARED_WRITABLE:  # what the sandbox user left where anyone may write
            _remove(folder, args.uid)
    elif os.getpid() == 1:  # the PID namespace's init: everything else here is a worker
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for _ in range(100):  # what is left are our descendants, reparented to us as they lose parents
        children = _children()
        if not children:
            return
        for pid in children:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            _status(pid)
    _remove("scratch", None)  # no worker finds what an earlier one wrote (another student's, in a batch)


def _fork(channel: int, message: dict, args: argparse.Namespace) -> int:
    pid = os.fork()
    if pid == 0:  # the child never returns into the server's loop
        code = 1
        try:
            code = serve.run(channel, message["submission"], message.get("role", "call"), args)
        finally:
            os._exit(code)
    return pid


def main() -> None:
    parser = argparse.ArgumentParser(prog="ppo_worker")
    parser.add_argument("--control", type=int, required=True)
    parser.add_argument("--strategy", choices=("namespaces", "user", "process"), required=True)
    parser.add_argument("--uid", type=int, default=-1)
    parser.add_argument("--gid", type=int, default=-1)
    parser.add_argument("--memory-mb", type=int, required=True)
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--deny-network", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    _become_subreaper()
    import assignment.helpers  # noqa: F401  (every submission imports it)

    control = socket.socket(fileno=args.control)
    protocol.send_control(control, {"op": "hello", "pid": os.getpid()})
    while True:
        try:
            message, fds = protocol.receive_control(control)
        except (EOFError, ConnectionError):
            return
        op = message.get("op")
        if op == "spawn" and len(fds) == 1:
            pid = _fork(fds[0], message, args)
            os.close(fds[0])
            reply = {"op": "spawned", "pid": pid}
        elif op == "preload":
            import assignment.model  # noqa: F401  (transformers: seconds, paid once per grading)
            reply = {"op": "preloaded"}
        elif op == "kill":
            pid = int(message["pid"])
            for kill in (os.killpg, os.kill):  # its group, and itself in case it has no group yet
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            reply = {"op": "killed", "status": _status(pid)}
        elif op == "killall":
            _kill_all(args)
            reply = {"op": "killedall"}
        else:
            for fd in fds:
                os.close(fd)
            reply = {"op": "error", "message": f"unknown request {op!r}"}
        protocol.send_control(control, reply)


if __name__ == "__main__":
    main()
