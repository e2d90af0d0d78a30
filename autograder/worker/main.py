"""Worker process: load the submission by path and answer the grader's requests.

Requests (JSON header + safetensors payload, see protocol.py):
    call    run one of exercises 1-4 on the given tensors; optionally differentiate output 0
    update  run exercise 5's scenario on a tiny model: a sequence of minibatch calls
Every reply describes each returned object (type, dtype, shape, requires_grad) so that the
grader can validate it; the values travel as plain tensors.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import traceback
from types import ModuleType, SimpleNamespace

import torch

from . import protocol

SUBMISSION_NAME = "submission"


def _load_submission(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(SUBMISSION_NAME, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[SUBMISSION_NAME] = module
    spec.loader.exec_module(module)
    return module


def _error_reply(err: BaseException, path: str) -> dict:
    """Describe an exception raised by student code, keeping only the submission's frames."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == path]
    where = [f"line {f.lineno}, in {f.name}: {(f.line or '').strip()}" for f in frames][-3:]
    kind = type(err).__name__
    # torch reports a failed allocation (here: the worker's address-space cap) as RuntimeError
    if isinstance(err, MemoryError) or "can't allocate memory" in str(err) or "out of memory" in str(err):
        kind = "MemoryError"
    return {"op": "error", "type": kind, "message": str(err)[:2000], "where": where}


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
    reply = {"op": "result", "output": _describe(out, "out", reply_tensors), "grads": {}}
    grad_wrt = header.get("grad_wrt", [])
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    if grad_wrt and isinstance(first, torch.Tensor) and first.requires_grad and first.numel() == 1:
        inputs = [kwargs[n] for n in grad_wrt]
        grads = torch.autograd.grad(first.sum(), inputs, allow_unused=True)
        for n, g in zip(grad_wrt, grads):
            reply["grads"][n] = g is not None
            if g is not None:
                reply_tensors[f"grad.{n}"] = g.detach().as_subclass(torch.Tensor).clone()
    return reply, reply_tensors


class _Oracle:
    """Stand-ins for exercises 1-3 while exercise 5 is graded.

    Each asks the grader for the reference outputs and the gradient of the loss with respect to
    the differentiable input, then returns ``value + <x - x.detach(), grad>``: a tensor equal to
    the reference loss whose gradient is exactly the reference gradient. The solution's code
    never enters this process.
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
        value, grad = tensors["value"], tensors["grad"]
        loss = value.to(x.dtype if x.dtype.is_floating_point else value.dtype)
        if x.requires_grad:
            loss = loss + ((x - x.detach()) * grad.to(x.dtype)).sum().to(loss.dtype)
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
    from assignment.model import PolicyWithValueHead, tiny_llama  # transformers: only when needed

    for name in ("compute_policy_loss", "compute_value_loss", "compute_entropy_loss"):
        setattr(module, name, getattr(oracle, name))
    key = repr((header["model"], header["dtype"]))
    if key not in _MODELS:  # build once per worker; every request loads its own weights below
        _MODELS[key] = PolicyWithValueHead(tiny_llama(**header["model"])).to(getattr(torch, header["dtype"]))
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
    from assignment.learning_check import run

    torch.set_num_threads(header["threads"])
    check = run(module, seed=header["seed"], threshold=header["threshold"])
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--submission", required=True)
    parser.add_argument("--fd-in", type=int, required=True)
    parser.add_argument("--fd-out", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--preload", action="store_true", help="import the model code (transformers) up front")
    args = parser.parse_args()
    fd_in, fd_out = args.fd_in, args.fd_out
    torch.set_num_threads(args.threads)
    sys.setrecursionlimit(10_000)
    if args.preload:
        import assignment.model  # noqa: F401  (slow: transformers; overlaps the grader's own work)

    try:
        module = _load_submission(args.submission)
    except BaseException as err:  # SystemExit and KeyboardInterrupt from student code too
        protocol.send(fd_out, {"op": "ready", "import_error": _error_reply(err, args.submission)})
        return
    protocol.send(fd_out, {"op": "ready", "import_error": None,
                           "callable": sorted(n for n in dir(module) if callable(getattr(module, n, None)))})
    oracle = _Oracle(fd_in, fd_out)
    while True:
        try:
            header, tensors = protocol.receive(fd_in)
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
            reply, reply_tensors = _error_reply(err, args.submission), {}
        protocol.send(fd_out, reply, reply_tensors)
        os.sched_yield()


if __name__ == "__main__":
    main()
