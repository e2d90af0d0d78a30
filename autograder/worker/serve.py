"""One worker, forked by the server (zygote.py): drop privileges, say hello, load the submission
by path, answer the grader's requests.

The hello comes after the worker has become the sandbox user and before it imports the
submission: a worker that never says hello is the grader's failure (a broken installation, a
copy it cannot read), one that fails after it is the submission's.

Requests (JSON header + safetensors payload, see protocol.py):
    call    run one of exercises 1-4 on the given tensors; optionally differentiate output 0
    update  run exercise 5's scenario on a tiny model: a sequence of minibatch calls
Every reply describes each returned object (type, dtype, shape, requires_grad) so that the
grader can validate it; the values travel as plain tensors.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import socket
import traceback
from types import ModuleType, SimpleNamespace

import torch

from . import protocol

try:  # imported by the server, before any fork; a platform without libseccomp keeps its network
    import pyseccomp as seccomp
except Exception:  # OSError when libseccomp.so is missing
    seccomp = None

SUBMISSION_NAME = "submission"
PR_SET_NO_NEW_PRIVS = 38


def _load_submission(path: str) -> ModuleType:
    from assignment.trainer.impl import load_module  # the project's one loader by path

    return load_module(path, SUBMISSION_NAME)


def _error_reply(err: BaseException, path: str) -> dict:
    """Describe an exception raised by student code, keeping only the submission's frames."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == path]
    where = [f"line {f.lineno}, in {f.name}: {(f.line or '').strip()}" for f in frames][-3:]
    kind = type(err).__name__
    # torch reports a failed allocation (here: the worker's address-space cap) as RuntimeError
    if isinstance(err, MemoryError) or "can't allocate memory" in str(err) or "out of memory" in str(err):
        kind = "MemoryError"
    return {"op": "error", "type": kind, "bases": [c.__name__ for c in type(err).__mro__],
            "message": str(err)[:2000], "where": where}


def _describe(obj, name: str, tensors: dict) -> dict:
    """JSON description of one returned object; its values go into ``tensors`` under ``name``."""
    if isinstance(obj, torch.Tensor):
        desc = {"kind": "tensor", "exact": type(obj) is torch.Tensor, "type": type(obj).__name__,
                "dtype": str(obj.dtype).removeprefix("torch."), "shape": list(obj.shape),
                "requires_grad": bool(obj.requires_grad)}
        plain = obj.detach().as_subclass(torch.Tensor).clone() if not desc["exact"] else obj.detach().clone()
        tensors[name] = plain.cpu()
        return desc
    if isinstance(obj, (tuple, list)):
        return {"kind": "sequence", "type": type(obj).__name__,
                "items": [_describe(x, f"{name}.{i}", tensors) for i, x in enumerate(obj)]}
    if isinstance(obj, float) and type(obj) is float:
        return {"kind": "float", "value": obj}
    return {"kind": "other", "type": type(obj).__name__}


def _call(module: ModuleType, header: dict, tensors: dict) -> tuple[dict, dict]:
    """Run one exercise function; return (reply header, reply tensors)."""
    fn = getattr(module, header["fn"])
    kwargs = dict(header["scalars"])
    for name in header["tensor_args"]:
        t = tensors[name]
        if name in header.get("grad_wrt", []):
            t = t.clone().requires_grad_(True)
        kwargs[name] = t
    out = fn(**kwargs)
    reply_tensors: dict[str, torch.Tensor] = {}
    reply = {"op": "result", "output": _describe(out, "out", reply_tensors)}
    grad_wrt = header.get("grad_wrt", [])
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    if grad_wrt and isinstance(first, torch.Tensor) and first.requires_grad \
            and (first.numel() == 1 or header.get("grad_of_sum")):
        inputs = [kwargs[n] for n in grad_wrt]
        grads = torch.autograd.grad(first.sum(), inputs, allow_unused=True)
        for n, g in zip(grad_wrt, grads):
            if g is not None:
                reply_tensors[f"grad.{n}"] = g.detach().as_subclass(torch.Tensor).clone()
    return reply, reply_tensors


class _WithGradient(torch.autograd.Function):
    """A tensor equal to ``value`` whose gradient w.r.t. ``x`` is ``grad``: the reference's loss
    and gradient, computed by the grader, standing in for student code. Infinite gradients pass
    through as they are (a sum of (x - x) * grad would turn them into NaN)."""

    @staticmethod
    def forward(ctx, x, value, grad):
        ctx.save_for_backward(grad)
        return value.clone()

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad_output * grad, None, None


class _Oracle:
    """Stand-ins for exercises 1-3 while exercise 5 is graded.

    Each asks the grader for the reference outputs and the gradient of the loss with respect to
    the differentiable input; the grader answers only for the current case's own tensors. The
    solution's code never enters this process.
    """

    def __init__(self, fd_in: int, fd_out: int):
        self.fd_in, self.fd_out = fd_in, fd_out

    def _ask(self, fn: str, tensor_args: dict, scalars: dict, grad_arg: str):
        x = tensor_args[grad_arg]
        protocol.send(self.fd_out, {"op": "oracle", "fn": fn, "scalars": scalars, "grad_wrt": grad_arg},
                      {k: v.detach().as_subclass(torch.Tensor) for k, v in tensor_args.items()})
        header, tensors = protocol.receive(self.fd_in)
        if header.get("op") != "oracle_result":
            raise RuntimeError(f"the reference for {fn} could not be computed: {header.get('message', '')}")
        dtype = x.dtype if x.dtype.is_floating_point else tensors["value"].dtype
        value, grad = tensors["value"].to(dtype), tensors["grad"].to(dtype)
        loss = _WithGradient.apply(x, value, grad) if x.requires_grad else value
        metrics = [tensors[f"metric.{i}"] for i in range(header["n_metrics"])]
        return (loss, *metrics) if metrics else loss

    def compute_policy_loss(self, logprobs_new, logprobs_old, advantages, response_mask, clip_ratio):
        return self._ask("compute_policy_loss", dict(logprobs_new=logprobs_new, logprobs_old=logprobs_old,
                         advantages=advantages, response_mask=response_mask), {"clip_ratio": float(clip_ratio)},
                         "logprobs_new")

    def compute_value_loss(self, values_new, values_old, returns, response_mask, clip_range_value):
        return self._ask("compute_value_loss", dict(values_new=values_new, values_old=values_old, returns=returns,
                         response_mask=response_mask), {"clip_range_value": float(clip_range_value)}, "values_new")

    def compute_entropy_loss(self, logits, response_mask):
        return self._ask("compute_entropy_loss", dict(logits=logits, response_mask=response_mask), {}, "logits")


_MODELS: dict[str, torch.nn.Module] = {}


def _update(module: ModuleType, header: dict, tensors: dict, oracle: _Oracle) -> tuple[dict, dict]:
    """Run exercise 5 over a sequence of minibatches on a tiny model; report metrics, grads, params."""
    from .model import build

    for name in ("compute_policy_loss", "compute_value_loss", "compute_entropy_loss"):
        setattr(module, name, getattr(oracle, name))
    key = repr((header["model"], header["dtype"]))
    if key not in _MODELS:  # build once per worker; every request loads its own weights below
        _MODELS[key] = build(header["model"], header["dtype"])
    model = _MODELS[key]
    model.zero_grad(set_to_none=True)
    model.load_state_dict({k.removeprefix("param."): v for k, v in tensors.items() if k.startswith("param.")})
    optimizer = torch.optim.SGD(model.parameters(), lr=header["lr"])
    cfg = SimpleNamespace(**header["cfg"])
    reply_tensors: dict[str, torch.Tensor] = {}
    calls = []
    for i, call in enumerate(header["calls"]):
        prefix = f"mb{call['minibatch']}."
        minibatch = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        minibatch["prompt_length"] = call["prompt_length"]
        out = module.ppo_minibatch_update(model, optimizer, minibatch, cfg, call["step_optimizer"])
        calls.append(_describe_metrics(out))
        if call.get("record_grads"):
            for name, p in model.named_parameters():
                if p.grad is not None:
                    reply_tensors[f"call{i}.grad.{name}"] = p.grad.detach().clone()
    for name, p in model.named_parameters():
        reply_tensors[f"param.{name}"] = p.detach().clone()
        if p.grad is not None:
            reply_tensors[f"grad.{name}"] = p.grad.detach().clone()
    return {"op": "result", "calls": calls}, reply_tensors


def _train(module: ModuleType, header: dict) -> tuple[dict, dict]:
    """The CPU learning check: train the assembled submission on the synthetic task."""
    from assignment.trainer.learning_check import run as learning_check

    torch.set_num_threads(header["threads"])
    check = learning_check(module, seed=header["seed"], threshold=header["threshold"])
    return {"op": "result", "rewards": [float(r) for r in check.rewards], "first10_mean": check.first10_mean,
            "last10_mean": check.last10_mean, "accuracy_before": check.accuracy_before,
            "accuracy_after": check.accuracy_after, "seconds": check.seconds}, {}


def _describe_metrics(out) -> dict:
    if not isinstance(out, dict):
        return {"kind": "other", "type": type(out).__name__}
    items = {}
    for k, v in out.items():
        if not isinstance(k, str):
            return {"kind": "other", "type": "dict with non-string keys"}
        items[k] = {"kind": "float", "value": v} if type(v) is float else {"kind": "other", "type": type(v).__name__}
    return {"kind": "dict", "items": items}


def _close_fds_except(keep: int) -> None:
    """Close every inherited descriptor but stdio (/dev/null) and our channel: the control
    socket and the other workers' channels must not reach student code."""
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))


def _limit(args) -> None:
    cap = args.memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 2**20, 64 * 2**20))
    if args.uid >= 0:  # counted per user: bounds every process and thread of the workers' uid
        resource.setrlimit(resource.RLIMIT_NPROC, (args.nproc, args.nproc))


def _drop_privileges(args) -> None:
    if args.uid >= 0:  # user and namespaces: an unprivileged uid, every capability gone with root
        os.setgroups([])
        os.setgid(args.gid)
        os.setuid(args.uid)
    # No setuid binary can give privileges back to this process or its children.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _deny_network() -> str:
    """A seccomp filter: socket() fails for every family but AF_UNIX (the grader's channel is a
    Unix socket pair that already exists). Returns how the network is closed, for results.json."""
    try:
        if seccomp is None:
            raise ImportError("pyseccomp")
        rules = seccomp.SyscallFilter(seccomp.ALLOW)
        rules.add_rule(seccomp.ERRNO(errno.EACCES), "socket", seccomp.Arg(0, seccomp.NE, socket.AF_UNIX))
        rules.add_rule(seccomp.ERRNO(errno.EACCES), "io_uring_setup")
        rules.load()
    except Exception as err:  # no libseccomp, or the platform forbids filters
        return f"open (seccomp unavailable: {type(err).__name__})"
    return "seccomp"


def run(fd: int, submission: str, role: str, args) -> int:
    """A forked worker's whole life; returns its exit status. ``role`` is for the logs only."""
    os.setsid()  # its own process group: the server kills the worker with everything it started
    _close_fds_except(fd)
    _limit(args)
    _drop_privileges(args)
    network = _deny_network() if args.deny_network else "open"
    os.environ.update(HOME=os.path.abspath("scratch"), TMPDIR=os.path.abspath("scratch"))
    try:  # the sandbox user must be able to read its copy: if not, the grader is misconfigured
        with open(submission, "rb"):
            pass
    except OSError as err:
        protocol.send(fd, {"op": "hello", "error": f"the worker cannot read the submission copy: {err}"})
        return 1
    protocol.send(fd, {"op": "hello", "network": network, "role": role, "pid": os.getpid()})
    try:
        module = _load_submission(submission)
    except BaseException as err:  # SystemExit and KeyboardInterrupt from student code too
        protocol.send(fd, {"op": "ready", "import_error": _error_reply(err, submission)})
        return 0
    protocol.send(fd, {"op": "ready", "import_error": None,
                       "callable": sorted(n for n in dir(module) if callable(getattr(module, n, None)))})
    _serve(module, fd, submission)
    return 0


def _serve(module: ModuleType, fd: int, submission: str) -> None:
    oracle = _Oracle(fd, fd)
    while True:
        try:
            header, tensors = protocol.receive(fd)
        except EOFError:
            return
        try:
            if header["op"] == "call":
                reply, reply_tensors = _call(module, header, tensors)
            elif header["op"] == "update":
                reply, reply_tensors = _update(module, header, tensors, oracle)
            elif header["op"] == "train":
                reply, reply_tensors = _train(module, header)
            else:
                reply, reply_tensors = {"op": "error", "type": "ProtocolError", "message": header["op"], "where": []}, {}
        except BaseException as err:  # the grader decides what an exception costs
            reply, reply_tensors = _error_reply(err, submission), {}
        protocol.send(fd, reply, reply_tensors)
