"""Exercise 5, ppo_minibatch_update: scenarios, error scales, checks, hints and the oracle.

A case is a scenario of minibatch calls on a tiny float64 Llama with a value head: one
accumulating call ("single"; "gradients" where its gradients are compared), two accumulation
cycles of two minibatches ("steps"), one call at an unchanged policy ("unit_ratio") or one
stepping call whose advantages are infinite ("nonfinite"). The submission's exercises 1-3 are
replaced by the reference's (the oracle): exercise 5 is graded on its own, and a bug in 1-3 is
not charged twice.

Error scales (see compare.py). A correct submission may compute the response log-probs in
float32 (``log_softmax(logits.float())``). For a real token t with sliced, tempered logits z,
M_t = max(1, max |z|), vocabulary V, that perturbs the log-prob by at most u K_t with
    K_t = 2 M_t + V + 2 log V + 8     (the temperature division, the shift by the maximum,
                                       a sum of V exponentials in any order, log, the gather)
and everything downstream inherits it; the reference exercises 1-3 then run in float64 on what
the submission passes them, and round their result to its dtype. Over the n real tokens:
    loss/policy     mean(|A| r K_t) + |loss|
    loss/value      mean(2 w_t |v_t|) + |loss|        w_t = |v_t| + |v_old| + |R_t| + c: values cast to float32
    loss/entropy    mean(4 M_t^2) + |loss|            |dH/dz| summed against a float32 rounding of z
    loss/total      the three above, weighted, + 4 (|policy| + vf |value| + ent |entropy|)
    approx_kl       mean(K_t) + |approx_kl|
    clip fractions  an interval, not a tolerance: a token counts as clipped for sure only when
                    its decision is more than rounding away from a tie; tokens whose ratio lies
                    within 1e-5 of 1 +- eps, or whose new value lies within the clip range (where
                    the contract's two squared errors are mathematically equal, so rounding
                    alone decides its strict >), may go either way
    gradients       per element j of every parameter (magnitudes()): a correct submission's
                    gradient differs from the reference's only where its own arithmetic changes
                    what flows back into the model. Per real token t (response token y_t, softmax
                    p of z), the gradient w.r.t. z errs by at most u E_z[t, v], w.r.t. the value
                    by at most u E_v[t], both over grad_accum_steps (E_z over the temperature too):
                        E_z = (2 K_t + 5) |w_t| ([v = y_t] + p_v) + c_ent E_H[t, v]
                        E_v = c_vf E_V[t]
                    w_t = d loss/policy / d logprob_t (the reference's): log_softmax's backward is
                    w (onehot - p); w errs relatively by u (K_t + 1) (the log-prob's error moves
                    the ratio; the oracle's answer is cast to the log-prob's dtype), p = exp(log
                    softmax) by u (K_t + 1) as well, and the product and the difference round
                    once each. E_H and E_V are exercises 3's and 2's error scales of their
                    gradients (entropy.py, value.py: logits or values cast to float32). The model
                    is float64 throughout (autograder/worker/model.py) and runs the same backward
                    on both sides, linear in these perturbations, so to first order
                        S_j = sum over tokens t, hidden units k of E_h[t, k] |d h[t, k] / d theta_j|
                        E_h[t, k] = sum_v E_z[t, v] |W_lm[v, k]| + E_v[t] |W_value[k]|
                    for the body (h: the last hidden state both heads read; |d h / d theta| is its
                    Jacobian, one backward per token and unit) and the heads' own sums for the
                    heads: lm_head[v, k] sum_t E_z[t, v] |h[t, k]|, the value head's weight[k]
                    sum_t E_v[t] |h[t, k]| and bias sum_t E_v[t]. Every term is a magnitude: S does
                    not shrink where the gradient itself cancels. The float64 backward rounds too,
                    u_64 = 2^-29 u of the magnitudes it meets, the same operations on slightly other
                    numbers on either side: S adds 2^-29 of the sum of S over all parameters.
    grad_norm       of a step on gradient G (norm g; S_G the sum of S over the step's calls):
                    ||S_G|| + g. The norm's error is sum_j |G_j| u S_G[j] / g <= u ||S_G||
                    (Cauchy-Schwarz), and float() rounds g once.
    parameters      after the steps: the sum over steps of lr c S_G + |change| ||S_G|| / g
                    + 2^-29 |theta|. SGD moves theta by lr c G with c = min(1, max_grad_norm /
                    (g + 1e-6)), clip_grad_norm_'s coefficient, whose relative error is at most
                    g's; the float64 update rounds once. The second cycle runs at parameters
                    already off by the first step's error (its gradient moves by lr times the
                    Hessian times that error): ulps 4 in grading.yaml, a second copy of the bound.

Why not the former bound, K n max|x| per tensor x (K the largest K_t, n the most real tokens):
it was proportional to the size of the result, which can cancel. Where every query of a case
attends to itself alone (one-token prompts and responses), the attention's q and k projections
get an exact 0 computed as a difference of equal terms: max|x| is rounding noise, and the bound
with it, while the two sides' noise differs by as much again (measured in process for
tests/submissions/correct_float32_internals.py on 400 drawn cases: 8 beyond that bound, by up
to 1.4e5 times). And transformers' LlamaRMSNorm computes in float32 even in a float64 model, so every
gradient crossing a norm was rounded to float32 on both sides, differently: a difference no part
of the submission made and no scale counted. Which examples meet such a case depends on the
seed and which of these roundings tip depends on the CPU's vector unit: so a seed could cost
correct float32 code a point on one machine and not on another.
"""

from __future__ import annotations

import copy
import inspect
import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from hypothesis import strategies as st

from assignment.contract import exercise
from assignment.helpers import logprobs_from_logits
from solutions import exercises as reference

from ..calls import StudentError
from ..cases import Case, fmt, padding
from ..compare import U, bound, compare
from . import Check

EXERCISE = exercise(5)
MODEL = {"vocab_size": 32, "hidden_size": 16, "num_layers": 1, "seed": 0}
LR = 0.1
RATIO_AMBIGUITY = 1e-5  # relative: far above K u for these logits, far below any ratio's distance otherwise
CFG_CHOICES = {
    "temperature": (1.0, 0.7, 1.3),
    "clip_ratio": (0.2, 0.1),
    "clip_range_value": (0.2, 0.5),
    "vf_coeff": (0.5, 0.1),
    "entropy_coeff": (0.01, 0.0, 0.05),
    "max_grad_norm": (1.0, 0.05, 100.0),
}
VALUE_HEAD_SEED = 1
# The modules of the project that grading_model imports (with transformers, seconds): a grading
# imports them before Hypothesis draws anything, so their literals are in its pool (replay.py).
MODEL_MODULES = ("assignment.model", "autograder.worker.model")


def grading_model() -> torch.nn.Module:
    """The tiny float64 policy exercise 5 is graded on; its value head is random (not zero, as
    the trainer's starts) so that the value loss reaches the shared body."""
    from ..worker.model import build

    model = build(MODEL, "float64")
    g = torch.Generator().manual_seed(VALUE_HEAD_SEED)
    with torch.no_grad():
        model.value_head.weight.copy_(torch.randn(model.value_head.weight.shape, generator=g, dtype=torch.float64))
    return model


@dataclass
class UpdateCase:
    """A model state, minibatches, the calls to make on them, and the update config."""

    minibatches: list[dict[str, torch.Tensor]]
    prompt_lengths: list[int]
    calls: list[dict]  # {"minibatch": i, "step_optimizer": bool, "record_grads": bool}
    cfg: dict[str, float]
    seed: int
    scenario: str
    initial: dict[str, torch.Tensor]  # the model's parameters before the first call (not a copy): what the worker loads

    def describe(self) -> str:
        """The shape of the case; the snippet below it holds every value."""
        lines = [f"{len(self.calls)} call(s) (minibatch, step_optimizer): "
                 f"{[(c['minibatch'], c['step_optimizer']) for c in self.calls]}", f"cfg = {self.cfg}"]
        for i, (mb, P) in enumerate(zip(self.minibatches, self.prompt_lengths)):
            B, T = mb["response_mask"].shape
            lines.append(f"minibatch {i}: B = {B}, P = {P}, T = {T}, response_mask = {mb['response_mask'].tolist()}")
        return "\n".join(lines)

    def __repr__(self) -> str:  # Hypothesis prints failing examples: keep it short
        return f"UpdateCase({self.scenario}, seed={self.seed})"

    def snippet(self) -> str:
        """Python a student can paste to rerun this case with what the release ships."""
        out = ["import torch", "from types import SimpleNamespace",
               "from assignment.exercises import ppo_minibatch_update",
               "from assignment.model import PolicyWithValueHead, tiny_llama", "",
               f"model = PolicyWithValueHead(tiny_llama({', '.join(f'{k}={v}' for k, v in MODEL.items())})).double()",
               "# (the grader computes the model's RMSNorms in float64, where transformers rounds them to float32:",
               "# your numbers may differ from the grader's in their last few digits, never by a mistake's amount)",
               "with torch.no_grad():  # the grader's value head is random, not zero",
               f"    g = torch.Generator().manual_seed({VALUE_HEAD_SEED})",
               "    model.value_head.weight.copy_(torch.randn(model.value_head.weight.shape, generator=g, dtype=torch.float64))",
               f"optimizer = torch.optim.SGD(model.parameters(), lr={LR})",
               f"cfg = SimpleNamespace({', '.join(f'{k}={v!r}' for k, v in self.cfg.items())})"]
        for i, (mb, P) in enumerate(zip(self.minibatches, self.prompt_lengths)):
            items = [f"    {k!r}: torch.tensor({_literal(v.tolist())}, dtype=torch.{str(v.dtype).removeprefix('torch.')})"
                     for k, v in mb.items()]
            out += [f"minibatch{i} = {{", *[s + "," for s in items], f"    'prompt_length': {P},", "}"]
        for c in self.calls:
            out.append(f"print(ppo_minibatch_update(model, optimizer, minibatch{c['minibatch']}, cfg, "
                       f"step_optimizer={c['step_optimizer']}))")
        return "\n".join(out)


def _literal(x) -> str:
    """Python source for nested lists of numbers, exact (repr), infinities included."""
    if isinstance(x, list):
        return "[" + ", ".join(_literal(v) for v in x) + "]"
    return repr(x) if math.isfinite(x) else f"float('{x}')"


@st.composite
def update_case(draw, model, scenario: str = "single") -> UpdateCase:
    """Minibatches for ``model``; logprobs_old and values_old are the model's own, perturbed."""
    cfg = {k: draw(st.sampled_from(v)) for k, v in CFG_CHOICES.items()}
    cfg["grad_accum_steps"] = 2 if scenario == "steps" else draw(st.sampled_from([1, 2, 4]))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    noise = 0.0 if scenario == "unit_ratio" else draw(st.sampled_from([0.0, 0.1, 0.5]))
    minibatches, prompt_lengths = [], []
    for _ in range(2 if scenario == "steps" else 1):
        mask = draw(padding(max_b=4, max_t=6))
        B, T = mask.shape
        prompt_lens = draw(st.lists(st.integers(1, 5), min_size=B, max_size=B))
        P = max(prompt_lens)
        prompt_mask = torch.arange(P)[None, :] >= (P - torch.tensor(prompt_lens))[:, None]  # left padding
        ids = torch.randint(0, MODEL["vocab_size"], (B, P + T), generator=g)
        attention_mask = torch.cat([prompt_mask, mask], dim=1).long()
        with torch.no_grad():
            logits, values = model(ids, attention_mask)
        logprobs = logprobs_from_logits(logits[:, P - 1:P + T - 1] / cfg["temperature"], ids[:, P:])
        advantages = torch.randn(B, T, generator=g, dtype=torch.float64)
        if scenario == "nonfinite":
            advantages = torch.full_like(advantages, math.inf)
        minibatches.append({
            "input_ids": ids, "attention_mask": attention_mask, "response_ids": ids[:, P:].clone(),
            "response_mask": mask.long(), "logprobs_old": logprobs + noise * torch.randn(B, T, generator=g, dtype=torch.float64),
            "values_old": values[:, P - 1:P + T - 1] + noise * torch.randn(B, T, generator=g, dtype=torch.float64),
            "advantages": advantages, "returns": torch.randn(B, T, generator=g, dtype=torch.float64),
        })
        prompt_lengths.append(P)
    if scenario == "steps":
        calls = [{"minibatch": i % 2, "step_optimizer": i % 2 == 1, "record_grads": False} for i in range(4)]
    else:
        calls = [{"minibatch": 0, "step_optimizer": scenario == "nonfinite", "record_grads": True}]
    return UpdateCase(minibatches, prompt_lengths, calls, cfg, seed, scenario, dict(model.named_parameters()))


# ---- the reference, instrumented ------------------------------------------------------------------

@dataclass
class Updated:
    """What a scenario produced."""

    metrics: list[dict]                      # per call: {key: float}
    grads: dict[str, torch.Tensor]           # after the last call flagged record_grads
    params: dict[str, torch.Tensor]          # after the last call
    final_grads: dict[str, torch.Tensor]     # .grad after the last call (absent: None)
    seen: list[dict] | None = None           # the reference only: per call, what exercises 1-3 received
    answers: list[dict] | None = None        # the reference only: per call, the oracle's answer to exactly ``seen``
    scales: dict[str, torch.Tensor] | None = None  # the reference only ("gradients", "steps"): error scales,
                                                   # "grad.NAME", "param.NAME" (each its parameter's shape),
                                                   # "grad_norm.I" (call I's, a scalar): see magnitudes()


_SCRATCH: dict[int, torch.nn.Module] = {}


def _scratch(model: torch.nn.Module) -> torch.nn.Module:
    """A reusable copy of ``model``, reset to its weights (deepcopy per example is slow)."""
    if id(model) not in _SCRATCH:
        _SCRATCH.clear()
        _SCRATCH[id(model)] = copy.deepcopy(model)
    scratch = _SCRATCH[id(model)]
    scratch.load_state_dict(model.state_dict())
    scratch.zero_grad(set_to_none=True)
    return scratch


class _Recording:
    """Calls the reference exercises 1-3 and keeps their float64 inputs, one dict per minibatch call."""

    def __init__(self):
        self.calls: list[dict] = []
        self.paused = False  # while the grader computes error scales with the same functions

    def __enter__(self):
        self.saved = {n: getattr(reference, n) for n in ("compute_policy_loss", "compute_value_loss",
                                                          "compute_entropy_loss")}
        for name, fn in self.saved.items():
            setattr(reference, name, self._wrap(name, fn))
        return self

    def _wrap(self, name, fn):
        signature = inspect.signature(fn)

        def wrapped(*args, **kwargs):
            if self.paused:
                return fn(*args, **kwargs)
            if name == "compute_policy_loss":
                self.calls.append({})
            bound_args = signature.bind(*args, **kwargs).arguments
            self.calls[-1][name] = {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in bound_args.items()}
            return fn(*args, **kwargs)
        return wrapped

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(reference, name, fn)


def run_reference(model: torch.nn.Module, case: UpdateCase, mistake: str | None = None, answers: bool = False,
                  scales: bool = True) -> Updated:
    """The reference scenario on a scratch copy of ``model``. ``mistake`` reproduces a known
    update-order bug around the reference (for hints): "zero_grad_first" or "never_zero_grad".
    ``answers``: also the oracle's answers to the requests a submission that computes exactly as
    the reference does will make (one per call of exercises 1-3: see oracle_for). ``scales``: also
    the error scales of the gradients and parameters ("gradients" and "steps" scenarios)."""
    model = _scratch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    if mistake == "never_zero_grad":
        optimizer.zero_grad = lambda *a, **k: None
    metrics, grads = [], {}
    cfg = SimpleNamespace(**case.cfg)
    scales = {} if scales and case.scenario in SCALED else None
    cycle: dict[str, torch.Tensor] = {}  # the magnitudes of the accumulation cycle so far
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with _Recording() as seen:
        for i, call in enumerate(case.calls):
            mb = dict(case.minibatches[call["minibatch"]], prompt_length=case.prompt_lengths[call["minibatch"]])
            if scales is not None:
                seen.paused = True
                for n, m in magnitudes(model, mb, cfg).items():
                    cycle[n] = cycle[n] + m if n in cycle else m
                seen.paused = False
            if mistake == "zero_grad_first":
                model.zero_grad()
            metrics.append(reference.ppo_minibatch_update(model, optimizer, mb, cfg, call["step_optimizer"]))
            if call["record_grads"]:
                grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
                if scales is not None:
                    scales.update({f"grad.{n}": m for n, m in cycle.items()})
            if call["step_optimizer"] and scales is not None:
                _step_scales(scales, i, cycle, metrics[-1], before, model, cfg)
                cycle, before = {}, {n: p.detach().clone() for n, p in model.named_parameters()}
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    final = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    answered = [{name: _answer(name, args) for name, args in call.items()} for call in seen.calls] if answers else None
    return Updated(metrics, grads, params, final, seen.calls, answered, scales)


# ---- error scales of the gradients and parameters ---------------------------------------------------

SCALED = ("gradients", "steps")  # the scenarios whose checks compare gradients or parameters
# The float64 model's own backward rounds too: each rounding is u64 = 2^-53 of a magnitude the
# backward meets, in units of the float32 u of the scales, 2^-29 of it.
FLOAT64_OVER_FLOAT32 = 2.0 ** -29


def _exercise_inputs(mb: dict, P: int, logits: torch.Tensor, values: torch.Tensor, cfg) -> dict:
    """The float64 response slice of ``logits`` (B, L, V) and ``values`` (B, L), tempered, and what
    exercises 1-3 receive from it: z (B, T, V), logprobs_new and values_new (B, T)."""
    T = mb["response_mask"].shape[1]
    z = logits[:, P - 1:P + T - 1] / cfg.temperature
    return {"z": z, "logprobs_new": logprobs_from_logits(z, mb["response_ids"]), "values_new": values[:, P - 1:P + T - 1]}


def magnitudes(model: torch.nn.Module, mb: dict, cfg) -> dict[str, torch.Tensor]:
    """Per parameter (its shape, float64): the error scale S of one call's gradient (module
    docstring), at ``model``'s present weights. Leaves ``model`` and its .grad as they are."""
    from assignment.model import position_ids_from_mask

    from .entropy import scales as entropy_scales
    from .value import scales as value_scales

    P, mask, ids = mb["prompt_length"], mb["response_mask"].bool(), mb["response_ids"].long()
    out = model.lm(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], use_cache=False,
                   position_ids=position_ids_from_mask(mb["attention_mask"]), output_hidden_states=True)
    hidden = out.hidden_states[-1]  # (B, L, H): what both heads read
    T, H = mask.shape[1], hidden.shape[-1]
    with torch.no_grad():
        x = _exercise_inputs(mb, P, out.logits, model.value_head(hidden).squeeze(-1), cfg)
        z, V = x["z"], out.logits.shape[-1]
        args = {"logprobs_new": x["logprobs_new"], "logprobs_old": mb["logprobs_old"], "advantages": mb["advantages"],
                "response_mask": mask, "clip_ratio": cfg.clip_ratio}
        with torch.enable_grad():  # |w|: the reference's |d policy loss / d logprobs_new|, (B, T)
            w = _answer("compute_policy_loss", args)[1]["grad"].abs()
        K = 2 * z.abs().amax(-1).clamp(min=1.0) + V + 2 * math.log(V) + 8  # (B, T)
        picked = torch.nn.functional.one_hot(ids, V).double()  # (B, T, V)
        at_logits = ((2 * K + 5)[..., None] * w[..., None] * (picked + torch.softmax(z, -1))
                     + cfg.entropy_coeff * entropy_scales(Case({"logits": z, "response_mask": mask}))["grad"])
        at_logits = at_logits * mask[..., None] / (cfg.temperature * cfg.grad_accum_steps)  # E_z: (B, T, V)
        value_case = Case({"values_new": x["values_new"], "values_old": mb["values_old"], "returns": mb["returns"],
                           "response_mask": mask}, {"clip_range_value": cfg.clip_range_value})
        at_value = cfg.vf_coeff * value_scales(value_case)["grad"] * mask / cfg.grad_accum_steps  # E_v: (B, T)
        h = hidden[:, P - 1:P + T - 1].abs()  # (B, T, H)
        scales = {"lm.lm_head.weight": torch.einsum("btv,bth->vh", at_logits, h),
                  "value_head.weight": torch.einsum("bt,bth->h", at_value, h)[None],
                  "value_head.bias": at_value.sum()[None]}
        at_hidden = at_logits @ model.lm.lm_head.weight.abs() + at_value[..., None] * model.value_head.weight.abs()
        # the Jacobian of the hidden states of the real tokens: row (i, k) seeds d h[token i, unit k]
        b, t = mask.nonzero().unbind(1)
        rows = torch.arange(len(b) * H)
        seeds = torch.zeros((len(rows), *hidden.shape), dtype=hidden.dtype)
        seeds[rows, b.repeat_interleave(H), (P - 1 + t).repeat_interleave(H), torch.arange(H).repeat(len(b))] = 1.0
    body = {n: p for n, p in model.named_parameters() if n not in scales}
    jacobian = torch.autograd.grad(hidden, list(body.values()), seeds, is_grads_batched=True, allow_unused=True)
    weight = at_hidden[b, t].reshape(-1)  # E_h of row (i, k)
    for (name, p), j in zip(body.items(), jacobian):
        scales[name] = torch.zeros_like(p.detach()) if j is None else torch.einsum("r,r...->...", weight, j.abs())
    floor = FLOAT64_OVER_FLOAT32 * sum(float(m.sum()) for m in scales.values())
    return {name: (m + floor).contiguous() for name, m in scales.items()}


def _step_scales(scales: dict, i: int, cycle: dict[str, torch.Tensor], metrics: dict, before: dict,
                 model: torch.nn.Module, cfg) -> None:
    """Call ``i`` stepped on the gradient G whose magnitudes are ``cycle``: add the error scales of
    its grad_norm and of the parameters' change to ``scales`` (module docstring)."""
    grad_norm = metrics["stats/grad_norm"]
    if not math.isfinite(grad_norm):  # no step was taken
        return
    norm = math.sqrt(sum(float((m ** 2).sum()) for m in cycle.values()))  # ||S||
    scales[f"grad_norm.{i}"] = torch.tensor(norm + grad_norm, dtype=torch.float64)
    coefficient = min(1.0, cfg.max_grad_norm / (grad_norm + 1e-6))  # clip_grad_norm_'s
    relative = norm / grad_norm if grad_norm > 0 else 0.0  # the coefficient's relative error, over u
    for n, p in model.named_parameters():
        step = LR * coefficient * cycle[n] + (p.detach() - before[n]).abs() * relative \
            + FLOAT64_OVER_FLOAT32 * p.detach().abs()
        key = f"param.{n}"
        scales[key] = scales[key] + step if key in scales else step


# ---- the submission, through the worker ------------------------------------------------------------

def call_submission(case: UpdateCase, run) -> tuple[Updated | None, list[str]]:
    tensors = {f"param.{k}": v for k, v in case.initial.items()}
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
        wrong = [f"{k} ({v['type']})" for k, v in desc["items"].items() if v["kind"] != "float"]
        if wrong:
            problems.append(f"call {i}: these metrics are not Python floats: {', '.join(wrong)}")
        metrics.append({k: v.get("value") for k, v in desc["items"].items()})
    if problems:
        return None, problems
    recorded = max((i for i, c in enumerate(case.calls) if c["record_grads"]), default=None)

    def named(prefix: str) -> dict[str, torch.Tensor]:
        return {k.removeprefix(prefix): v for k, v in out.items() if k.startswith(prefix)}

    return Updated(metrics, named(f"call{recorded}.grad."), named("param."), named("grad.")), []


def _exercises_1_to_3() -> dict:
    from .entropy import EXERCISE as ENTROPY
    from .policy import EXERCISE as POLICY
    from .value import EXERCISE as VALUE

    return {e.name: e for e in (POLICY, VALUE, ENTROPY)}


def _answer(name: str, args: dict) -> tuple[dict, dict[str, torch.Tensor]]:
    """The oracle's answer to a request for exercise ``name`` (1-3) on ``args`` (its tensors and
    scalars): the reply's header and tensors, "value" the reference's loss (a scalar), "grad" its
    gradient w.r.t. the differentiable input (that input's shape, e.g. (B, T) or (B, T, V)),
    "metric.i" its metrics (scalars)."""
    from .. import calls as function_calls

    ex = _exercises_1_to_3()[name]
    called = function_calls.call_reference(ex, Case({k: args[k] for k in ex.tensor_params},
                                                    {k: args[k] for k in ex.scalar_params}))
    grad = called.grad if called.grad is not None else torch.zeros_like(args[ex.grad_param])
    out = {"value": called.outputs["loss"], "grad": grad}
    out.update({f"metric.{i}": called.outputs[n] for i, n in enumerate(ex.outputs[1:])})
    return {"op": "oracle_result", "n_metrics": len(ex.outputs) - 1}, out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` (any shapes) have the same dtype, shape and bytes (NaNs included)."""
    return a.dtype == b.dtype and a.shape == b.shape and \
        torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def oracle_for(case: UpdateCase, reference=lambda: None):
    """The grader's answer to the worker's requests for the reference exercises 1-3, for this
    case only: the tensors the contract fixes (everything but the one the gradient flows to)
    must be the case's own minibatch tensors, so student code cannot query the reference on
    inputs of its choosing. ``reference()``: the reference's Updated once computed; a request
    identical, bit for bit, to one the reference made gets the answer computed with it."""
    specs = _exercises_1_to_3()
    policy, value, entropy = specs
    fixed = {policy: {"logprobs_old": "logprobs_old", "advantages": "advantages"},
             value: {"values_old": "values_old", "returns": "returns"}, entropy: {}}
    scalars = {policy: {"clip_ratio": case.cfg["clip_ratio"]},
               value: {"clip_range_value": case.cfg["clip_range_value"]}, entropy: {}}

    def matches(name: str, tensors: dict, header: dict) -> bool:
        ex = specs[name]
        if set(tensors) != set(ex.tensor_params) or header.get("grad_wrt") != ex.grad_param:
            return False
        if header.get("scalars") != scalars[name]:
            return False
        for mb in case.minibatches:
            mask = tensors["response_mask"]
            if mask.shape != mb["response_mask"].shape or not torch.equal(mask.bool(), mb["response_mask"].bool()):
                continue
            if all(tensors[k].shape == mb[v].shape and torch.equal(tensors[k], mb[v].to(tensors[k].dtype))
                   for k, v in fixed[name].items()):
                return tensors[ex.grad_param].shape[:2] == mask.shape
        return False

    def answered(name: str, tensors: dict) -> tuple[dict, dict] | None:
        ref = reference()
        if ref is None or ref.answers is None:
            return None
        for seen, answers in zip(ref.seen, ref.answers):
            if name in seen and all(_same_bits(tensors[k], seen[name][k]) for k in tensors):
                header, out = answers[name]
                return dict(header), {k: v.clone() for k, v in out.items()}
        return None

    def answer(header: dict, tensors: dict[str, torch.Tensor]) -> tuple[dict, dict]:
        name = header.get("fn")
        if name not in specs or not matches(name, tensors, header):
            return {"op": "oracle_error", "message": (
                f"exercise 5 must call {name} with the minibatch's own tensors and cfg's values (the contract: "
                f"{', '.join(specs[name].params) if name in specs else 'exercises 1-3'}); "
                "the grader's reference answers only those")}, {}
        return answered(name, tensors) or _answer(name, {**tensors, **scalars[name]})

    return answer


# ---- error scales and comparisons ---------------------------------------------------------------

@torch.no_grad()  # what the reference received still carries its graph
def _call_scales(seen: dict) -> dict[str, torch.Tensor]:
    """The error scales of one call's metrics, from what the reference exercises 1-3 received."""
    policy, value, entropy = (seen[n] for n in ("compute_policy_loss", "compute_value_loss", "compute_entropy_loss"))
    mask = policy["response_mask"].bool()
    z = entropy["logits"].double()
    V = z.shape[-1]
    M = z.abs().amax(-1).clamp(min=1.0)[mask]
    K = 2 * M + V + 2 * math.log(V) + 8
    log_ratio = (policy["logprobs_new"].double() - policy["logprobs_old"].double())[mask]
    adv = policy["advantages"].double()[mask]
    v_new, v_old, ret = (value[k].double()[mask] for k in ("values_new", "values_old", "returns"))
    c = value["clip_range_value"]
    w = v_new.abs() + v_old.abs() + ret.abs() + c
    return {"K": K, "n": torch.tensor(float(mask.sum())), "log_ratio": log_ratio, "eps": policy["clip_ratio"],
            "adv": adv, "v_new": v_new, "v_old": v_old, "ret": ret, "c": c, "w": w,
            "loss/policy": (adv.abs() * log_ratio.exp() * K).mean(), "loss/value": (2 * w * v_new.abs()).mean(),
            "loss/entropy": (4 * M ** 2).mean(), "stats/approx_kl": K.mean()}


def _clip_interval(sc: dict, key: str) -> tuple[float, float]:
    """[fewest, most] tokens a correct implementation may count as clipped, over n."""
    if key == "stats/policy_clipfrac":
        r, eps, adv = sc["log_ratio"].exp(), sc["eps"], sc["adv"]
        clipped = -adv * r.clamp(1 - eps, 1 + eps) > -adv * r
        near = 4 * U * sc["K"]
        ambiguous = ((sc["log_ratio"] - math.log(1 + eps)).abs() <= near) | ((sc["log_ratio"] - math.log(1 - eps)).abs() <= near)
    else:
        v_new, v_old, ret, c, w = sc["v_new"], sc["v_old"], sc["ret"], sc["c"], sc["w"]
        v_clip = v_old + (v_new - v_old).clamp(-c, c)
        e_un, e_cl = (v_new - ret) ** 2, (v_clip - ret) ** 2
        clipped = e_cl > e_un
        ambiguous = ((v_new - v_old).abs() <= c + 4 * U * w) | ((e_cl - e_un).abs() <= 8 * U * w ** 2)
    n = float(sc["n"])
    return float((clipped & ~ambiguous).sum()) / n, float((clipped | ambiguous).sum()) / n


def _metrics(case: UpdateCase, ref: Updated, sub: Updated, ulps: float) -> list[str]:
    problems = []
    for i, (want, got) in enumerate(zip(ref.metrics, sub.metrics)):
        if set(got) != set(want):
            problems.append(f"call {i}: metric keys differ: missing {sorted(set(want) - set(got))}, "
                            f"unexpected {sorted(set(got) - set(want))}")
            continue
        sc = _call_scales(ref.seen[i])
        cfg = case.cfg
        scale = {k: sc[k] + abs(want[k]) for k in ("loss/policy", "loss/value", "loss/entropy", "stats/approx_kl")}
        scale["loss/total"] = (scale["loss/policy"] + cfg["vf_coeff"] * scale["loss/value"]
                               + cfg["entropy_coeff"] * scale["loss/entropy"]
                               + 4 * (abs(want["loss/policy"]) + cfg["vf_coeff"] * abs(want["loss/value"])
                                      + cfg["entropy_coeff"] * abs(want["loss/entropy"])))
        if ref.scales is not None and f"grad_norm.{i}" in ref.scales:
            scale["stats/grad_norm"] = ref.scales[f"grad_norm.{i}"]
        for key in want:
            label = f"call {i}: {key}"
            if key.endswith("clipfrac"):
                lo, hi = _clip_interval(sc, key)
                if not lo - 2 * U <= got[key] <= hi + 2 * U:
                    allowed = fmt(lo) if lo == hi else f"between {fmt(lo)} and {fmt(hi)}"
                    problems.append(f"{label}: expected {allowed}, got {fmt(got[key])}")
            elif key == "stats/grad_norm" and case.scenario == "nonfinite":
                if math.isfinite(got[key]):
                    problems.append(f"{label} is {fmt(got[key])}, but the gradient is not finite (advantages are inf)")
            else:
                problems += compare(label, torch.tensor(got[key], dtype=torch.float64),
                                    torch.tensor(want[key], dtype=torch.float64), bound(ulps, scale[key]))
    return problems


def _tensors(label: str, want: dict[str, torch.Tensor], got: dict[str, torch.Tensor], scale: dict[str, float],
             ulps: float) -> list[str]:
    problems = []
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            problems.append(f"{label} {name}: none (no gradient reached it)")
        elif g.shape != w.shape:
            problems.append(f"{label} {name} has shape {tuple(g.shape)}, expected {tuple(w.shape)}")
        else:
            problems += compare(f"{label} {name}", g, w, bound(ulps, scale[name]))
    problems += [f"{label} {name}: present in the submission but not in the reference" for name in got if name not in want]
    return problems


def _gradients(case: UpdateCase, ref: Updated, sub: Updated, ulps: float) -> list[str]:
    return _tensors("gradient of", ref.grads, sub.grads, {n: ref.scales[f"grad.{n}"] for n in ref.grads}, ulps)


def _zeroed(sub: Updated) -> list[str]:
    leftover = [n for n, g in sub.final_grads.items() if bool((g != 0).any())]
    return [f"gradients are not zeroed after the last optimizer step (e.g. {leftover[0]})"] if leftover else []


def _steps(case: UpdateCase, ref: Updated, sub: Updated, ulps: float) -> list[str]:
    scale = {n: ref.scales[f"param.{n}"] for n in ref.params}
    return _metrics(case, ref, sub, ulps) + _tensors("parameter", ref.params, sub.params, scale, ulps) + _zeroed(sub)


def _unit_ratio(case: UpdateCase, ref: Updated, sub: Updated, ulps: float) -> list[str]:
    """At an unchanged policy: approx_kl = 0, policy_clipfrac = 0, loss/policy = -token-mean(A)."""
    got, sc = sub.metrics[0], _call_scales(ref.seen[0])
    adv = sc["adv"]
    closed = {"stats/approx_kl": (0.0, sc["K"].mean()), "stats/policy_clipfrac": (0.0, 1.0),
              "loss/policy": (-float(adv.mean()), (adv.abs() * sc["K"]).mean() + (sc["n"] + 2) * adv.abs().mean())}
    problems = []
    for key, (want, scale) in closed.items():
        if key not in got:
            problems.append(f"metric {key} is missing")
            continue
        problems += compare(f"{key} at the first minibatch (the ratio must be exactly 1)",
                            torch.tensor(got[key], dtype=torch.float64), torch.tensor(want, dtype=torch.float64),
                            bound(ulps, scale))
    return problems


def _nonfinite(case: UpdateCase, ref: Updated, sub: Updated, ulps: float) -> list[str]:
    """The loss is -inf: the metrics match the reference's, optimizer.step() is skipped and the
    gradients are still zeroed. Doing nothing at all does not pass: the metrics must be right."""
    problems = _metrics(case, ref, sub, ulps)
    moved = [n for n, p in sub.params.items() if not torch.equal(p, ref.params[n])]
    if moved:
        problems.append(f"the optimizer stepped on a non-finite gradient (parameter {moved[0]} changed)")
    if any(bool((g != 0).any()) for g in sub.final_grads.values()):
        problems.append("gradients were not zeroed after the skipped step")
    return problems


HINTS = [
    (dict(prompt_shift=1), None, "your slice is off by one: the logits and values of response token t sit at P - 1 + t"),
    (dict(temperature=1.0), None, "divide the sliced logits by cfg.temperature, as the rollout did"),
    (dict(grad_accum_steps=1), None, "divide the loss by cfg.grad_accum_steps before backward()"),
    (dict(max_grad_norm=1e30), None, "clip the gradient norm with clip_grad_norm_(model.parameters(), "
                                     "cfg.max_grad_norm) before optimizer.step()"),
    (dict(vf_coeff=1.0), None, "weight the value loss by cfg.vf_coeff"),
    (dict(entropy_coeff=0.0), None, "add cfg.entropy_coeff * entropy_loss to the total loss"),
    ({}, "zero_grad_first", "you zero the gradients at the start of every call: that throws away the gradients of the "
                            "earlier minibatches of an accumulation cycle. Zero them only after optimizer.step()"),
    ({}, "never_zero_grad", "call optimizer.zero_grad() after optimizer.step(): otherwise the next cycle adds to old "
                            "gradients"),
]


def hint(case: UpdateCase, sub: Updated | None, model: torch.nn.Module, compare_fn, ulps: float,
         reference: Updated | None = None) -> str | None:
    """Rerun the reference with one known mistake; if it reproduces the submission, name it. The
    comparison takes its error scales from ``reference``, the reference's own run of the case."""
    if sub is None or (case.scenario in SCALED and (reference is None or reference.scales is None)):
        return None
    for changes, mistake, message in HINTS:
        if any(k in case.cfg and case.cfg[k] == v for k, v in changes.items()):
            continue  # this variant equals the case itself
        variant = copy.deepcopy(case)
        variant.initial = case.initial
        if "prompt_shift" in changes:
            variant.prompt_lengths = [p + changes["prompt_shift"] for p in variant.prompt_lengths]
        variant.cfg.update({k: v for k, v in changes.items() if k != "prompt_shift"})
        try:
            wrong = run_reference(model, variant, mistake, scales=False)
        except Exception:  # e.g. the shifted slice runs past the sequence
            continue
        wrong.scales = reference.scales if reference is not None else None
        if not compare_fn(case, wrong, sub, ulps):
            return message
    return None


def _context(scenario: str):
    return lambda context: update_case(context["model"], scenario)


# An UpdateCase is a scenario on a model, not rows of a batch: nothing to drop.
CHECKS = (
    Check("metrics", "the returned metrics equal the reference (slice [P-1:P+T-1], temperature, loss sum)",
          _context("single"), _metrics, fewer_rows=None),
    Check("gradients", "after one accumulating call, every parameter's gradient equals the reference's",
          _context("gradients"), _gradients, fewer_rows=None),
    Check("optimizer_steps", "two accumulation cycles: metrics, grad_norm, parameters and zeroed grads match",
          _context("steps"), _steps, fewer_rows=None),
    Check("unit_ratio", "at an unchanged policy the ratio is 1: approx_kl = clipfrac = 0, loss/policy = -mean(A)",
          _context("unit_ratio"), _unit_ratio, fewer_rows=None),
    Check("nonfinite_skip", "a non-finite gradient norm skips optimizer.step() but still zeroes the gradients",
          _context("nonfinite"), _nonfinite, fewer_rows=None),
    Check("hidden_metrics", "the metrics on the hidden inputs", _context("single"), _metrics, fewer_rows=None),
    Check("hidden_gradients", "the gradients on the hidden inputs", _context("gradients"), _gradients, fewer_rows=None),
    Check("hidden_steps", "two accumulation cycles on the hidden inputs", _context("steps"), _steps, fewer_rows=None),
)
