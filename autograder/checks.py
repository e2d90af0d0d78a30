"""What each exercise is graded on: the checks, their strategies and their comparisons.

Every check is a Hypothesis property: for a generated case, run the reference here and the
submission in the worker, and compare. Checks named ``hidden`` repeat the comparisons of their
exercise on the hidden seed. Points, example counts and tolerances come from grading.yaml.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import torch
from hypothesis import strategies as st

from solutions import exercises as reference

from . import cases, hints
from .compare import Tolerance, compare_value, unpack, validate

# ---- exercises 1-4: one function call per case -----------------------------------------------


@dataclass(frozen=True)
class FunctionSpec:
    number: int
    name: str
    tensor_args: tuple[str, ...]
    scalar_args: tuple[str, ...]
    outputs: tuple[str, ...]      # names of the returned values, in order
    per_token: tuple[str, ...]    # which outputs are (B, T); the others are scalars
    grad_arg: str                 # the input the contract says gradient flows to (or through)


SPECS = {
    1: FunctionSpec(1, "compute_policy_loss", ("logprobs_new", "logprobs_old", "advantages", "response_mask"),
                    ("clip_ratio",), ("loss", "clip_frac", "approx_kl"), (), "logprobs_new"),
    2: FunctionSpec(2, "compute_value_loss", ("values_new", "values_old", "returns", "response_mask"),
                    ("clip_range_value",), ("loss", "clip_frac"), (), "values_new"),
    3: FunctionSpec(3, "compute_entropy_loss", ("logits", "response_mask"), (), ("loss",), (), "logits"),
    4: FunctionSpec(4, "compute_gae_advantages", ("final_rewards", "kl_penalties", "values", "response_mask"),
                    ("gamma", "lam"), ("advantages", "returns"), ("advantages", "returns"), "values"),
}


@dataclass
class Called:
    """The outputs of one call by name, and the gradient of output 0 w.r.t. the grad arg."""

    outputs: dict[str, torch.Tensor]
    requires_grad: dict[str, bool]
    grad: torch.Tensor | None


def call_reference(spec: FunctionSpec, case: cases.Case) -> Called:
    kwargs = {n: case.tensors[n].clone() for n in spec.tensor_args}
    kwargs.update({n: case.scalars[n] for n in spec.scalar_args})
    x = kwargs[spec.grad_arg] = kwargs[spec.grad_arg].requires_grad_(True)
    out = getattr(reference, spec.name)(**kwargs)
    out = out if isinstance(out, tuple) else (out,)
    grad = None
    if out[0].requires_grad:
        (grad,) = torch.autograd.grad(out[0], x)
    return Called(dict(zip(spec.outputs, [o.detach() for o in out])),
                  {n: o.requires_grad for n, o in zip(spec.outputs, out)}, grad)


def call_submission(spec: FunctionSpec, case: cases.Case, run) -> tuple[Called | None, list[str]]:
    """Run the submission via ``run(header, tensors)``; validate; (result, problems)."""
    header = {"op": "call", "fn": spec.name, "tensor_args": list(spec.tensor_args),
              "scalars": {n: case.scalars[n] for n in spec.scalar_args}, "grad_wrt": [spec.grad_arg]}
    reply, tensors = run(header, {n: case.tensors[n] for n in spec.tensor_args})
    if reply.get("op") == "error":
        raise StudentError(reply)
    out = unpack(reply["output"], tensors)
    n = len(spec.outputs)
    if n == 1:
        items = [out] if not isinstance(out, list) else None
        if items is None:
            return None, [f"returned a {reply['output'].get('type')} of {len(out)} items, expected one tensor (loss)"]
    else:
        if not isinstance(out, list) or len(out) != n:
            return None, [f"returned {_what(reply['output'])}, expected a tuple of {n} tensors ({', '.join(spec.outputs)})"]
        items = out
    B, T = case.tensors["response_mask"].shape
    problems = []
    for name, item in zip(spec.outputs, items):
        shape = (B, T) if name in spec.per_token else ()
        problems += validate(item, name, shape)
        if not problems:
            real = item.tensor[case.mask] if shape else item.tensor
            if not torch.isfinite(real).all():
                problems.append(f"{name} is not finite (NaN or inf)" + (" on real tokens" if shape else ""))
    if problems:
        return None, problems
    grad = tensors.get(f"grad.{spec.grad_arg}")
    return Called({name: item.tensor for name, item in zip(spec.outputs, items)},
                  {name: bool(item.desc["requires_grad"]) for name, item in zip(spec.outputs, items)}, grad), []


def _what(desc: dict) -> str:
    if desc.get("kind") == "sequence":
        return f"a {desc['type']} of {len(desc['items'])} items"
    return f"a {desc.get('type', desc.get('kind'))}"


class StudentError(Exception):
    """The submission raised; ``reply`` is the worker's description of the exception."""

    def __init__(self, reply: dict):
        super().__init__(reply.get("message", ""))
        self.reply = reply

    def describe(self) -> str:
        where = "".join(f"\n    {w}" for w in self.reply.get("where", []))
        return f"raised {self.reply.get('type')}: {self.reply.get('message')}{where}"


# ---- the checks --------------------------------------------------------------------------------

Compare = Callable[[object, object, object, Tolerance], list[str]]


@dataclass(frozen=True)
class Check:
    exercise: int
    id: str
    description: str
    strategy: Callable[[dict], st.SearchStrategy]   # context -> strategy
    compare: Compare                               # (case, reference, submission, tol) -> problems


def _real(case):
    return case.mask


def _logit_scale(case) -> float:
    """max(1, max|logit| over real tokens): float32 entropy arithmetic loses about that many ulps."""
    logits = case.tensors.get("logits")
    if logits is None:
        return 1.0
    return max(1.0, float(logits[case.mask].double().abs().max())) if case.mask.any() else 1.0


def _cmp_outputs(*names: str) -> Compare:
    def compare(case, ref: Called, sub: Called, tol: Tolerance) -> list[str]:
        problems = []
        for name in names:
            mask = _real(case) if ref.outputs[name].dim() == 2 else None
            problems += compare_value(name, sub.outputs[name], ref.outputs[name], tol, mask, _logit_scale(case))
        return problems
    return compare


def _cmp_metrics_detached(case, ref: Called, sub: Called, tol: Tolerance) -> list[str]:
    problems = _cmp_outputs("clip_frac", "approx_kl")(case, ref, sub, tol)
    problems += [f"{n} carries a gradient; the contract says metrics carry none"
                 for n in ("clip_frac", "approx_kl") if sub.requires_grad[n]]
    return problems


def _cmp_grad(arg: str) -> Compare:
    def compare(case, ref: Called, sub: Called, tol: Tolerance) -> list[str]:
        if not sub.requires_grad["loss"] or sub.grad is None:
            return [f"the loss carries no gradient to {arg}; it must (do not detach or use .item() inside)"]
        mask = _real(case)
        g_sub, g_ref = sub.grad, ref.grad
        if g_sub.shape != g_ref.shape:
            return [f"the gradient w.r.t. {arg} has shape {tuple(g_sub.shape)}, expected {tuple(g_ref.shape)}"]
        # a real token's gradient must match; a padded one must be zero (padding changes nothing)
        problems = compare_value(f"d loss / d {arg} (real tokens)", g_sub[mask], g_ref[mask], tol,
                                 atol_scale=_logit_scale(case))
        if (g_sub[~mask] != 0).any():
            problems.append(f"d loss / d {arg} is non-zero at padded positions: padding leaks into the loss")
        return problems
    return compare


def _cmp_clip_frac(case, ref: Called, sub: Called, tol: Tolerance) -> list[str]:
    problems = _cmp_outputs("clip_frac")(case, ref, sub, tol)
    if sub.requires_grad["clip_frac"]:
        problems.append("clip_frac carries a gradient; the contract says it carries none")
    return problems


def _cmp_unit_ratio(case, ref: Called, sub: Called, tol: Tolerance) -> list[str]:
    """With logprobs_new == logprobs_old: loss = -token-mean(A), clip_frac = approx_kl = 0."""
    adv = case.tensors["advantages"][case.mask].double()
    closed = {"loss": -adv.mean(), "clip_frac": torch.zeros((), dtype=torch.float64),
              "approx_kl": torch.zeros((), dtype=torch.float64)}
    problems = []
    for name, want in closed.items():
        problems += compare_value(f"{name} (closed form at ratio 1)", sub.outputs[name], want, tol)
    return problems


def _raw_std(case, ref: Called) -> float:
    """sqrt(var + 1e-8) of the reference's raw advantages: whitening scales errors by its inverse."""
    raw = (ref.outputs["returns"] - case.tensors["values"].to(ref.outputs["returns"].dtype))[case.mask].double()
    return math.sqrt(raw.var(unbiased=True).item() + 1e-8)


def _cmp_advantages(case, ref: Called, sub: Called, tol: Tolerance) -> list[str]:
    return compare_value("advantages (whitened)", sub.outputs["advantages"], ref.outputs["advantages"], tol,
                         case.mask, atol_scale=1.0 / _raw_std(case, ref))


def _cmp_td_errors(case, ref: Called, sub: Called, tol: Tolerance) -> list[str]:
    """lam = 0: raw advantages (returns - values) are the TD errors, computed here in closed form."""
    values = case.tensors["values"].double()
    B = values.shape[0]
    m = case.mask.double()
    v = torch.where(case.mask, values, 0.0)
    next_v = torch.cat([v[:, 1:] * m[:, 1:], torch.zeros(B, 1, dtype=torch.float64)], 1)
    delta = hints.token_rewards(case) + case.scalars["gamma"] * next_v - v
    raw = sub.outputs["returns"].double() - values
    return compare_value("returns - values (TD errors at lam = 0)", raw, delta, tol, case.mask)


def _cmp_reward_to_go(case, ref: Called, sub: Called, tol: Tolerance) -> list[str]:
    """gamma = lam = 1 and V = 0: returns are the reward-to-go, computed here in closed form."""
    to_go = hints.token_rewards(case).flip(1).cumsum(1).flip(1)
    return compare_value("returns (reward-to-go)", sub.outputs["returns"], to_go, tol, case.mask)


def _cmp_no_grad(case, ref: Called, sub: Called, tol: Tolerance) -> list[str]:
    return [f"{n} carries a gradient (values had requires_grad=True); the contract says no gradient flows"
            for n in ("advantages", "returns") if sub.requires_grad[n]]


def _all(*compares: Compare) -> Compare:
    def compare(case, ref, sub, tol):
        return [p for c in compares for p in c(case, ref, sub, tol)]
    return compare


def _s(strategy):
    return lambda ctx: strategy


CHECKS: dict[int, tuple[Check, ...]] = {
    1: (
        Check(1, "loss", "the loss equals the reference (clipped surrogate, token-mean over real tokens)",
              _s(cases.policy_case()), _cmp_outputs("loss")),
        Check(1, "metrics", "clip_frac (strict >) and approx_kl (k1) equal the reference and carry no gradient",
              _s(cases.policy_case()), _cmp_metrics_detached),
        Check(1, "gradient", "the gradient of the loss w.r.t. logprobs_new equals the reference's",
              _s(cases.policy_case()), _cmp_grad("logprobs_new")),
        Check(1, "unit_ratio", "with ratio = 1 the loss is -token-mean(A) and both metrics are 0",
              _s(cases.policy_case(unit_ratio=True)), _cmp_unit_ratio),
        Check(1, "hidden", "loss, metrics and gradient on the hidden inputs",
              _s(cases.policy_case()), _all(_cmp_outputs("loss"), _cmp_metrics_detached, _cmp_grad("logprobs_new"))),
    ),
    2: (
        Check(2, "loss", "the loss equals the reference (0.5 * token-mean of the larger squared error)",
              _s(cases.value_case()), _cmp_outputs("loss")),
        Check(2, "clip_frac", "clip_frac (strict >) equals the reference and carries no gradient",
              _s(cases.value_case()), _cmp_clip_frac),
        Check(2, "gradient", "the gradient of the loss w.r.t. values_new equals the reference's",
              _s(cases.value_case()), _cmp_grad("values_new")),
        Check(2, "hidden", "loss, clip_frac and gradient on the hidden inputs",
              _s(cases.value_case()), _all(_cmp_outputs("loss"), _cmp_clip_frac, _cmp_grad("values_new"))),
    ),
    3: (
        Check(3, "entropy", "the loss equals -token-mean of the per-token entropy",
              _s(cases.entropy_case()), _cmp_outputs("loss")),
        Check(3, "extreme_logits", "the loss stays finite and correct for logits of magnitude up to 1e3",
              _s(cases.entropy_case(scales=(100.0, 1000.0), offsets=(0.0, 1000.0, -1000.0))), _cmp_outputs("loss")),
        Check(3, "large_vocab", "the loss is correct for a 50257-token vocabulary",
              _s(cases.entropy_case(scales=(1.0, 10.0), vocab=50257, max_b=2, max_t=3)), _cmp_outputs("loss")),
        # float32/64 only: bfloat16 gradients of equivalent implementations can round differently
        Check(3, "gradient", "the gradient of the loss w.r.t. the logits equals the reference's",
              _s(cases.entropy_case(dtypes=cases.DTYPES)), _cmp_grad("logits")),
        Check(3, "hidden", "loss (moderate and extreme logits) and gradient on the hidden inputs",
              _s(cases.entropy_case(scales=(0.0, 1.0, 10.0, 1000.0), dtypes=cases.DTYPES)),
              _all(_cmp_outputs("loss"), _cmp_grad("logits"))),
    ),
    4: (
        Check(4, "advantages", "the whitened advantages equal the reference on real tokens",
              _s(cases.gae_case()), _cmp_advantages),
        Check(4, "returns", "the returns (unwhitened A + values) equal the reference on real tokens",
              _s(cases.gae_case()), _cmp_outputs("returns")),
        Check(4, "td_errors", "with lam = 0, returns - values are the one-step TD errors",
              _s(cases.gae_case(lam_zero=True)), _cmp_td_errors),
        Check(4, "reward_to_go", "with gamma = lam = 1 and V = 0, the returns are the reward-to-go",
              _s(cases.gae_case(reward_to_go=True)), _cmp_reward_to_go),
        Check(4, "no_grad", "no gradient flows through the advantages or the returns",
              _s(cases.gae_case()), _cmp_no_grad),
        Check(4, "hidden", "advantages and returns on the hidden inputs",
              _s(cases.gae_case()), _all(_cmp_advantages, _cmp_outputs("returns"), _cmp_no_grad)),
    ),
}


# ---- exercise 5: a scenario of minibatch calls on a tiny model ----------------------------------

MODEL = {"vocab_size": 32, "hidden_size": 16, "num_layers": 1, "seed": 0}
LR = 0.1


def grading_model() -> torch.nn.Module:
    """The tiny float64 policy exercise 5 is graded on; its value head is non-zero so that the
    value loss reaches the shared body."""
    from assignment.model import PolicyWithValueHead, tiny_llama

    model = PolicyWithValueHead(tiny_llama(**MODEL)).to(torch.float64)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model.value_head.weight.copy_(torch.randn(model.value_head.weight.shape, generator=g, dtype=torch.float64))
    return model


@dataclass
class Updated:
    """What a scenario produced: metrics per call, recorded grads, final params and grads."""

    metrics: list[dict]            # per call: {key: float}
    grads: dict[str, torch.Tensor]         # recorded after the call flagged record_grads
    params: dict[str, torch.Tensor]
    final_grads: dict[str, torch.Tensor]   # .grad after the last call (absent: None)


def _cfg_ns(cfg: dict):
    from types import SimpleNamespace
    return SimpleNamespace(**cfg)


_SCRATCH: dict[int, torch.nn.Module] = {}


def run_reference_update(model: torch.nn.Module, case: cases.UpdateCase) -> Updated:
    """Run the reference scenario on a scratch copy of ``model`` (reset to its weights)."""
    if id(model) not in _SCRATCH:
        _SCRATCH.clear()
        _SCRATCH[id(model)] = copy.deepcopy(model)
    scratch = _SCRATCH[id(model)]
    scratch.load_state_dict(model.state_dict())
    scratch.zero_grad(set_to_none=True)
    model = scratch
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    metrics, grads = [], {}
    for call in case.calls:
        mb = dict(case.minibatches[call["minibatch"]], prompt_length=case.prompt_lengths[call["minibatch"]])
        metrics.append(reference.ppo_minibatch_update(model, optimizer, mb, _cfg_ns(case.cfg), call["step_optimizer"]))
        if call["record_grads"]:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    final = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return Updated(metrics, grads, params, final)


def oracle(header: dict, tensors: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """Answer the worker's request for reference exercises 1-3 (value, gradient, metrics)."""
    specs = {s.name: s for s in SPECS.values() if s.number <= 3}
    spec = specs.get(header.get("fn"))
    try:
        if spec is None or header.get("grad_wrt") != spec.grad_arg or set(tensors) != set(spec.tensor_args):
            raise ValueError("malformed reference request")
        scalars = {n: float(header["scalars"][n]) for n in spec.scalar_args}
        called = call_reference(spec, cases.Case(dict(tensors), scalars))
    except Exception as err:  # the student's ex-5 code passed something the reference rejects
        return {"op": "oracle_error", "message": f"{spec.name if spec else 'reference'}: {err}"}, {}
    grad = called.grad if called.grad is not None else torch.zeros_like(tensors[spec.grad_arg])
    out = {"value": called.outputs["loss"], "grad": grad}
    metric_names = spec.outputs[1:]
    out.update({f"metric.{i}": called.outputs[n] for i, n in enumerate(metric_names)})
    return {"op": "oracle_result", "n_metrics": len(metric_names)}, out


def call_submission_update(case: cases.UpdateCase, model: torch.nn.Module, run) -> tuple[Updated | None, list[str]]:
    tensors = {f"param.{k}": v for k, v in model.state_dict().items()}
    for i, mb in enumerate(case.minibatches):
        tensors.update({f"mb{i}.{k}": v for k, v in mb.items()})
    calls = [dict(c, prompt_length=case.prompt_lengths[c["minibatch"]]) for c in case.calls]
    header = {"op": "update", "model": MODEL, "dtype": "float64", "lr": LR, "cfg": case.cfg, "calls": calls}
    reply, out = run(header, tensors)
    if reply.get("op") == "error":
        raise StudentError(reply)
    metrics, problems = [], []
    for i, desc in enumerate(reply["calls"]):
        if desc.get("kind") != "dict":
            problems.append(f"call {i} returned a {desc.get('type')}, expected a dict of Python floats")
            continue
        bad = [f"{k} ({v['type']})" for k, v in desc["items"].items() if v["kind"] != "float"]
        if bad:
            problems.append(f"call {i}: these metrics are not Python floats: {', '.join(bad)}")
        metrics.append({k: v.get("value") for k, v in desc["items"].items()})
    if problems:
        return None, problems
    last_record = max((i for i, c in enumerate(case.calls) if c["record_grads"]), default=None)
    grads = {k.removeprefix(f"call{last_record}.grad."): v for k, v in out.items()
             if k.startswith(f"call{last_record}.grad.")}
    params = {k.removeprefix("param."): v for k, v in out.items() if k.startswith("param.")}
    final = {k.removeprefix("grad."): v for k, v in out.items() if k.startswith("grad.")}
    return Updated(metrics, grads, params, final), []


def _cmp_metrics(case, ref: Updated, sub: Updated, tol: Tolerance) -> list[str]:
    problems = []
    for i, (r, s) in enumerate(zip(ref.metrics, sub.metrics)):
        if set(s) != set(r):
            missing, extra = sorted(set(r) - set(s)), sorted(set(s) - set(r))
            problems.append(f"call {i}: metric keys differ: missing {missing}, unexpected {extra}")
            continue
        for k in r:
            problems += compare_value(f"call {i}: {k}", torch.tensor(s[k], dtype=torch.float64),
                                      torch.tensor(r[k], dtype=torch.float64), tol)
    return problems


def _cmp_tensors(label: str, ref: dict[str, torch.Tensor], sub: dict[str, torch.Tensor], tol: Tolerance,
                 zero_is_absent: bool = False) -> list[str]:
    problems = []
    for name, r in ref.items():
        s = sub.get(name)
        if s is None:
            problems.append(f"{label} {name}: none (no gradient reached it)")
            continue
        problems += compare_value(f"{label} {name}", s, r, tol)
    for name, s in sub.items():
        if name not in ref and not (zero_is_absent and bool((s == 0).all())):
            problems.append(f"{label} {name}: present in the submission but not in the reference")
    return problems[:4]


def _cmp_grads(case, ref: Updated, sub: Updated, tol: Tolerance) -> list[str]:
    return _cmp_tensors("gradient of", ref.grads, sub.grads, tol)


def _cmp_steps(case, ref: Updated, sub: Updated, tol: Tolerance) -> list[str]:
    problems = _cmp_metrics(case, ref, sub, tol)
    problems += _cmp_tensors("parameter", ref.params, sub.params, tol)
    leftover = [n for n, g in sub.final_grads.items() if bool((g != 0).any())]
    if leftover:
        problems.append(f"gradients are not zeroed after the last optimizer step (e.g. {leftover[0]})")
    return problems


def _cmp_unit_ratio_update(case, ref: Updated, sub: Updated, tol: Tolerance) -> list[str]:
    """At an unchanged policy: approx_kl = 0, clipfrac = 0, loss/policy = -token-mean(A)."""
    m = sub.metrics[0]
    mb = case.minibatches[0]
    adv = mb["advantages"][mb["response_mask"].bool()]
    problems = []
    for key, want in (("stats/approx_kl", 0.0), ("stats/policy_clipfrac", 0.0), ("loss/policy", -adv.mean().item())):
        if key in m:
            problems += compare_value(f"{key} at the first minibatch (ratio must be 1)",
                                      torch.tensor(m[key], dtype=torch.float64), torch.tensor(want, dtype=torch.float64), tol)
        else:
            problems.append(f"metric {key} is missing")
    return problems


def _cmp_nonfinite(case, ref: Updated, sub: Updated, tol: Tolerance) -> list[str]:
    problems = []
    norm = sub.metrics[0].get("stats/grad_norm")
    if norm is None:
        problems.append("stats/grad_norm is missing from the metrics of a stepping call")
    elif math.isfinite(norm):
        problems.append(f"stats/grad_norm is {norm}, but the gradient is not finite (advantages are inf)")
    moved = [n for n, p in sub.params.items() if not torch.equal(p, ref.params[n])]
    if moved:
        problems.append(f"the optimizer stepped on a non-finite gradient (parameter {moved[0]} changed)")
    if any(bool((g != 0).any()) for g in sub.final_grads.values()):
        problems.append("gradients were not zeroed after the skipped step")
    return problems


def _u(scenario: str):
    return lambda ctx: cases.update_case(ctx["model"], MODEL["vocab_size"], scenario)


CHECKS[5] = (
    Check(5, "metrics", "the returned metrics equal the reference (slice [P-1:P+T-1], temperature, loss sum)",
          _u("single"), _cmp_metrics),
    Check(5, "gradients", "after one accumulating call, every parameter's gradient equals the reference's",
          _u("single"), _cmp_grads),
    Check(5, "optimizer_steps", "two accumulation cycles: metrics, grad_norm, parameters and zeroed grads match",
          _u("steps"), _cmp_steps),
    Check(5, "unit_ratio", "at an unchanged policy the ratio is 1: approx_kl = clipfrac = 0, loss/policy = -mean(A)",
          _u("unit_ratio"), _cmp_unit_ratio_update),
    Check(5, "nonfinite_skip", "a non-finite gradient norm skips optimizer.step() but still zeroes the gradients",
          _u("nonfinite"), _cmp_nonfinite),
    Check(5, "hidden", "metrics, gradients and optimizer steps on the hidden inputs",
          _u("steps"), _cmp_steps),
)

CHECK_IDS = {n: tuple(c.id for c in checks) for n, checks in CHECKS.items()}
