"""A corpus of test submissions for the autograder's own tests.

Every submission is the reference solution ``solutions/exercises.py`` with a few textual edits
applied, so the corpus stays compact and follows the solution when it changes:

* ``MUTANTS``: realistic buggy submissions. Each differs from the contract (handout.md, section 4) on
  exactly one exercise, ``Variant.exercise``; that exercise, and only that one, must lose
  points. Exercise 5 mutants are bugs inside ``ppo_minibatch_update``'s own region (the grader
  substitutes the reference exercises 1-3 while grading exercise 5).
* ``ALTERNATIVES``: correct implementations written differently. They must get full marks.
* ``ATTACKS``: hostile submissions. ``exercise`` names the exercise whose function misbehaves,
  0 when the misbehaviour happens at import time. NEVER import an attack in-process: run it
  only in the grader's sandbox. They are written so that an accidental unsandboxed run does
  no lasting harm (bounded memory, bounded and self-terminating forks), but some of them
  still kill or exit their own process, or its parent.

``render(variant)`` returns the full module source of a variant.
``tests/test_corpus.py`` shows, without the grader, that each mutant really differs from the
solution on its own exercise (and only there) and that each alternative really agrees.

Inputs a grader needs to catch some mutants (found while building the corpus):

* (dropped: masking by ``(x * mask).sum() / mask.sum()`` is only wrong when padding holds
  inf/NaN; the grader's junk is finite, as a trainer's is, so it counts as correct);
* logits of magnitude ~1e3: ``entropy_naive_log_softmax`` is finite and right for moderate ones;
* bfloat16 logits: ``entropy_no_upcast``;
* exercise 5: a max_grad_norm large enough that clipping is inactive (else clipping hides
  ``update_no_accum_division``), one small enough that it is active (``update_clip_after_step``,
  ``update_no_grad_clipping``), a minibatch with a non-finite gradient norm
  (``update_steps_on_nonfinite``), at least two accumulation cycles or a look at the gradients
  after the step (``update_never_zero_grad``), temperature != 1, vf_coeff != 1, entropy_coeff != 0.

Tolerances: the contract's entropy lse(z) - sum(p z) cancels, with an absolute error of about
ulp(max|z|) (~6e-5 for logits of 1e3), so correct alternatives (Categorical, log_softmax) differ
by that much; and the strict ``>`` of the value clip fraction counts float32 rounding of
values_old + (values_new - values_old) as clipping (~0.15% of tokens), so a float64
implementation of that indicator disagrees with the contract on some tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from assignment.contract import PART_I_NAMES

ROOT = Path(__file__).resolve().parent.parent
SOLUTION_PATH = ROOT / "solutions" / "exercises.py"
EXERCISE_NAMES = PART_I_NAMES  # Part I's five names, in order (Part II has lists of its own, below)
BEGIN, END = "### BEGIN SOLUTION\n", "### END SOLUTION"


@dataclass(frozen=True)
class Variant:
    name: str  # short id, e.g. "policy_sign_flipped"
    exercise: int  # 1..5: the only exercise that must lose points (mutants) / that misbehaves (attacks); 0: none / import time
    why: str  # the student mistake, the alternative idea or the attack, in one sentence
    edits: tuple[tuple[str, str], ...]  # (old, new) replacements on the solution source; each old occurs exactly once
    # mutants: the phrase that names this mistake. The grader's hint for it and the public tests' message
    # for it contain it; no message that another mistake gets does (benchmarks/messages.py counts both).
    hint: str = ""


@functools.lru_cache(maxsize=None)
def solution_source() -> str:
    """The text of the reference solution module."""
    return SOLUTION_PATH.read_text()


def exercises_edited(v: Variant) -> set[int] | None:
    """The exercises whose functions hold ``v``'s edits, or None when an edit lies outside every
    exercise function (a helper, the imports): then any exercise may differ. The exercises are
    graded apart (exercise 5 with the reference's 1-3), so only these can grade otherwise than
    the solution does."""
    import ast

    from assignment.contract import BY_NAME

    text = solution_source()
    body = ast.parse(text).body
    # a function's lines run to the next top-level statement: the comments after its last line
    # (the solution's END marker) are its own
    ends = [after.lineno - 1 for after in body[1:]] + [text.count("\n") + 1]
    spans = {node.name: (node.lineno, end) for node, end in zip(body, ends)
             if isinstance(node, ast.FunctionDef) and node.name in BY_NAME}
    edited = set()
    for old, _ in v.edits:
        at = text.find(old)
        if at < 0:  # it edits an earlier edit's text
            return None
        first = text.count("\n", 0, at) + 1
        last = first + old.count("\n")
        inside = [name for name, (start, end) in spans.items() if start <= first and last <= end]
        if not inside:
            return None
        edited.add(BY_NAME[inside[0]].number)
    return edited


def render(v: Variant, source: str | None = None) -> str:
    """The solution source (or ``source``) with ``v``'s edits applied, in order.

    Raises ValueError if an ``old`` does not occur exactly once in the text it is applied to.
    """
    text = solution_source() if source is None else source
    for i, (old, new) in enumerate(v.edits):
        count = text.count(old)
        if count != 1:
            raise ValueError(f"{v.name}: edit {i} old text occurs {count} times, expected once: {old[:80]!r}")
        text = text.replace(old, new)
    return text


def _region(exercise: int) -> str:
    """The exact text of exercise ``exercise``'s solution region, markers excluded (unique in the file)."""
    src = solution_source()
    start = -1
    for _ in range(exercise):
        start = src.index(BEGIN, start + 1)
    body_start = start + len(BEGIN)
    body_end = src.index(END, body_start)
    # Back up to the start of the END marker's line, so the body keeps whole lines.
    body_end = src.rindex("\n", body_start, body_end) + 1
    return src[body_start:body_end]


def _replace_region(exercise: int, body: str) -> tuple[str, str]:
    """Edit that replaces exercise ``exercise``'s whole solution body with ``body``."""
    return (BEGIN + _region(exercise), BEGIN + body)


def _prepend_region(exercise: int, code: str) -> tuple[str, str]:
    """Edit that inserts ``code`` at the top of exercise ``exercise``'s solution body."""
    first_line = _region(exercise).splitlines(keepends=True)[0]
    return (BEGIN + first_line, BEGIN + code + first_line)


def _sub(old: str, new: str) -> tuple[str, str]:
    return (old, new)


# Anchors. They start with "\n" + indentation so that they cannot match the docstrings, whose
# copies of the same code are indented differently.
IMPORTS = "\nfrom assignment.helpers import logprobs_from_logits, masked_mean, masked_whiten, reduction_dtype\n"
END_OF_FILE = "\n    return metrics\n    ### END SOLUTION\n"

E1_LOG_RATIO = "\n    log_ratio = logprobs_new - logprobs_old\n"
E1_UNCLIPPED = "\n    unclipped = -advantages * ratio\n"
E1_CLIPPED = "\n    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)\n"
E1_LOSS = "\n    loss = masked_mean(torch.maximum(unclipped, clipped), response_mask)\n"
E1_NO_GRAD = "\n    with torch.no_grad():\n        clip_frac = masked_mean((clipped > unclipped)"
E1_CLIP_FRAC = "\n        clip_frac = masked_mean((clipped > unclipped).to(reduction_dtype(ratio.dtype)), response_mask)\n"
E1_KL = "\n        approx_kl = masked_mean(-log_ratio, response_mask)\n"

E2_V_CLIP = "\n    v_clip = values_old + torch.clamp(values_new - values_old, -clip_range_value, clip_range_value)\n"
E2_ERR_CLIPPED = "\n    err_clipped = (v_clip - returns) ** 2\n"
E2_LOSS = "\n    loss = 0.5 * masked_mean(torch.maximum(err_unclipped, err_clipped), response_mask)\n"
E2_CLIP_FRAC_CMP = "(err_clipped > err_unclipped)"

E3_Z = "\n    z = logits.to(reduction_dtype(logits.dtype))\n"
E3_ENTROPY = "\n    entropy = torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)  # (B, T)\n"
E3_RETURN = "\n    return -masked_mean(entropy, response_mask)\n"

E4_VALUES = "\n        values = torch.where(mask, values.to(dtype), 0.0)\n"
E4_REWARDS = "\n        rewards = torch.where(mask, -kl_penalties.to(dtype), 0.0)  # (B, T)\n"
E4_FINAL = "\n        rewards[rows, lengths[rows] - 1] += final_rewards.to(dtype)[rows]\n"
E4_LOOP = "\n        for t in reversed(range(T)):\n"
E4_DELTA = "\n            delta = rewards[:, t] + gamma * next_value * next_mask - values[:, t]\n"
E4_ADV = "\n            next_advantage = delta + gamma * lam * next_mask * next_advantage\n"
E4_RETURN = "\n        returns = advantages + values\n        return masked_whiten(advantages, mask), returns\n"

E5_LOGITS = "\n    logits = logits[:, P - 1 : P + T - 1] / cfg.temperature  # (B, T, V)\n"
E5_VALUES = "\n    values_new = values[:, P - 1 : P + T - 1]  # (B, T)\n"
E5_LOGPROBS = "\n    logprobs_new = logprobs_from_logits(logits, response_ids)  # (B, T)\n"
E5_ENTROPY = "\n    entropy_loss = compute_entropy_loss(logits, response_mask)\n"
E5_LOSS = "\n    loss = policy_loss + cfg.vf_coeff * value_loss + cfg.entropy_coeff * entropy_loss\n"
E5_BACKWARD = "\n    (loss / cfg.grad_accum_steps).backward()\n"
E5_METRICS = """
    metrics = {
        "loss/policy": policy_loss.item(),
        "loss/value": value_loss.item(),
        "loss/entropy": entropy_loss.item(),
        "loss/total": loss.item(),
        "stats/policy_clipfrac": policy_clipfrac.item(),
        "stats/value_clipfrac": value_clipfrac.item(),
        "stats/approx_kl": approx_kl.item(),
    }
"""
E5_STEP = """
    if step_optimizer:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        if torch.isfinite(grad_norm):
            optimizer.step()
        optimizer.zero_grad()
        metrics["stats/grad_norm"] = grad_norm.item()
"""


# ----------------------------------------------------------------------------------------------
# Mutants: one realistic bug each, confined to one exercise.
# ----------------------------------------------------------------------------------------------

_POLICY_MUTANTS = [
    Variant(
        "policy_sign_flipped", 1,
        "Copies the paper's objective L^CLIP = min(A r, A clip(r)) and minimises it, so the loss has the wrong sign.",
        (_sub(E1_LOSS, "\n    loss = masked_mean(torch.minimum(advantages * ratio, advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)), response_mask)\n"),),
        hint="your loss has the opposite sign",
    ),
    Variant(
        "policy_missing_minus", 1,
        "Forgets the minus sign in front of the advantages in both surrogate terms but keeps the max.",
        (_sub(E1_UNCLIPPED, "\n    unclipped = advantages * ratio\n"),
         _sub(E1_CLIPPED, "\n    clipped = advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)\n")),
        hint="your loss has the opposite sign",
    ),
    Variant(
        "policy_min_instead_of_max", 1,
        "Takes the elementwise minimum of the two (negated) surrogate terms: the optimistic instead of the pessimistic bound.",
        (_sub(E1_LOSS, "\n    loss = masked_mean(torch.minimum(unclipped, clipped), response_mask)\n"),),
        hint="you take the minimum of the two",
    ),
    Variant(
        "policy_clamp_log_ratio", 1,
        "Clamps the log-ratio to [-eps, eps] and exponentiates, i.e. clips the ratio to [e^-eps, e^eps] instead of [1-eps, 1+eps].",
        (_sub(E1_CLIPPED, "\n    clipped = -advantages * torch.exp(torch.clamp(log_ratio, -clip_ratio, clip_ratio))\n"),),
        hint="not the log-ratio",
    ),
    Variant(
        "policy_clamp_product", 1,
        "Clamps the product A * ratio to [1-eps, 1+eps] instead of clamping the ratio alone.",
        (_sub(E1_CLIPPED, "\n    clipped = -torch.clamp(advantages * ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)\n"),),
        hint="you clamp A * ratio",
    ),
    Variant(
        "policy_ratio_inverted", 1,
        "Computes the ratio as exp(old - new), the inverse of the importance ratio (and so also flips approx_kl).",
        (_sub(E1_LOG_RATIO, "\n    log_ratio = logprobs_old - logprobs_new\n"),),
        hint="ratio is inverted",
    ),
    Variant(
        "policy_ratio_by_division", 1,
        "Computes ratio = exp(new) / exp(old), the division hint 1.1 forbids: below a log-prob of about -104 "
        "both exps are 0 in float32, so padding junk of -300 gives 0 / 0 = NaN and a NaN gradient there.",
        (_sub("\n    ratio = torch.exp(log_ratio)\n", "\n    ratio = torch.exp(logprobs_new) / torch.exp(logprobs_old)\n"),),
        hint="exp(logprobs_new) / exp(logprobs_old)",
    ),
    Variant(
        "policy_unmasked_mean", 1,
        "Averages the per-token loss with a plain .mean() over all B*T positions, padding included.",
        (_sub(E1_LOSS, "\n    loss = torch.maximum(unclipped, clipped).mean()\n"),),
        hint="includes padded positions",
    ),
    Variant(
        "policy_mean_of_row_means", 1,
        "Averages per-response means (every response weighs the same) instead of taking the token-mean of the batch.",
        (_sub(E1_LOSS, "\n    _m = response_mask.bool()\n"
                       "    _per_tok = torch.where(_m, torch.maximum(unclipped, clipped), 0.0)\n"
                       "    loss = (_per_tok.sum(dim=-1) / _m.sum(dim=-1).clamp(min=1)).mean()\n"),),
        hint="you average per-row means",
    ),
    Variant(
        "policy_clipfrac_cleanrl", 1,
        "Uses CleanRL's clip fraction |ratio - 1| > eps, which also counts tokens whose unclipped term is the active one.",
        (_sub(E1_CLIP_FRAC, "\n        clip_frac = masked_mean(((ratio - 1.0).abs() > clip_ratio).to(reduction_dtype(ratio.dtype)), response_mask)\n"),),
        hint="not every ratio outside",
    ),
    Variant(
        "policy_clipfrac_unclipped_active", 1,
        "Flags a token as clipped where the unclipped term is the active (larger) one: the comparison the wrong way round.",
        (_sub(E1_CLIP_FRAC, "\n        clip_frac = masked_mean((unclipped > clipped).to(reduction_dtype(ratio.dtype)), response_mask)\n"),),
        hint="where the unclipped one is",
    ),
    Variant(
        "policy_clipfrac_ge", 1,
        "Counts the clipped term as active with >= instead of strict >, so every token inside the trust region counts as clipped.",
        (_sub(E1_CLIP_FRAC, "\n        clip_frac = masked_mean((clipped >= unclipped).to(reduction_dtype(ratio.dtype)), response_mask)\n"),),
        hint="use a strict >",
    ),
    Variant(
        "policy_kl_sign_flipped", 1,
        "Reports approx_kl as the token-mean of new - old instead of old - new.",
        (_sub(E1_KL, "\n        approx_kl = masked_mean(log_ratio, response_mask)\n"),),
        hint="yours is token-mean(logprobs_new - logprobs_old)",
    ),
    Variant(
        "policy_kl_k3", 1,
        "Reports approx_kl with the k3 estimator (ratio - 1) - log ratio instead of the contract's k1 estimator.",
        (_sub(E1_KL, "\n        approx_kl = masked_mean((ratio - 1.0) - log_ratio, response_mask)\n"),),
        hint="not k3",
    ),
    Variant(
        "policy_metrics_not_detached", 1,
        "Computes the metrics outside torch.no_grad(), so approx_kl carries a gradient (keeps the graph alive).",
        (_sub(E1_NO_GRAD, "\n    if True:\n        clip_frac = masked_mean((clipped > unclipped)"),),
        hint="carries a gradient; the contract says",
    ),
    Variant(
        "policy_loss_detached", 1,
        "Detaches the loss (e.g. computes everything under no_grad), so no gradient reaches logprobs_new.",
        (_sub(E1_LOSS, "\n    loss = masked_mean(torch.maximum(unclipped, clipped), response_mask).detach()\n"),),
        hint="carries no gradient to",
    ),
]

_VALUE_MUTANTS = [
    Variant(
        "value_missing_half", 2,
        "Forgets the factor 0.5 in front of the value loss.",
        (_sub(E2_LOSS, "\n    loss = masked_mean(torch.maximum(err_unclipped, err_clipped), response_mask)\n"),),
        hint="factor 0.5",
    ),
    Variant(
        "value_clips_returns", 2,
        "Clips the returns around values_old (and regresses values_new onto them) instead of clipping values_new.",
        (_sub(E2_V_CLIP, "\n    v_clip = values_old + torch.clamp(returns - values_old, -clip_range_value, clip_range_value)\n"),
         _sub(E2_ERR_CLIPPED, "\n    err_clipped = (values_new - v_clip) ** 2\n")),
        hint="you clip the returns",
    ),
    Variant(
        "value_clip_absolute", 2,
        "Clips values_new itself to [-c, c] instead of clipping its change relative to values_old.",
        (_sub(E2_V_CLIP, "\n    v_clip = torch.clamp(values_new, -clip_range_value, clip_range_value)\n"),),
        hint="you clip values_new itself",
    ),
    Variant(
        "value_min_instead_of_max", 2,
        "Takes the elementwise minimum of the two squared errors instead of the maximum.",
        (_sub(E2_LOSS, "\n    loss = 0.5 * masked_mean(torch.minimum(err_unclipped, err_clipped), response_mask)\n"),),
        hint="you take the minimum of the two",
    ),
    Variant(
        "value_no_clipping", 2,
        "Ignores value clipping altogether: plain 0.5 * masked MSE.",
        (_sub(E2_LOSS, "\n    loss = 0.5 * masked_mean(err_unclipped, response_mask)\n"),),
        hint="ignores the clipped term",
    ),
    Variant(
        "value_clipfrac_swapped", 2,
        "Swaps the clip-fraction comparison: counts tokens where the unclipped error is the larger.",
        (_sub(E2_CLIP_FRAC_CMP, "(err_unclipped > err_clipped)"),),
        hint="where the unclipped one is",
    ),
    Variant(
        "value_clipfrac_ge", 2,
        "Counts the clipped error as active with >= instead of strict >, so unclipped tokens (equal errors) count too.",
        (_sub(E2_CLIP_FRAC_CMP, "(err_clipped >= err_unclipped)"),),
        hint="use a strict >",
    ),
    Variant(
        "value_unmasked_mean", 2,
        "Averages the squared errors with a plain .mean() over all positions, padding included.",
        (_sub(E2_LOSS, "\n    loss = 0.5 * torch.maximum(err_unclipped, err_clipped).mean()\n"),),
        hint="includes padded positions",
    ),
]

_ENTROPY_MUTANTS = [
    Variant(
        "entropy_naive_log_softmax", 3,
        "Computes -sum(p * log p) with log(softmax(z)): softmax underflows to 0 for extreme logits and 0 * log 0 is NaN (fine for moderate logits).",
        (_sub(E3_ENTROPY, "\n    p = torch.softmax(z, dim=-1)\n    entropy = -(p * torch.log(p)).sum(dim=-1)  # (B, T)\n"),),
        hint="log(softmax(z)) underflows",
    ),
    Variant(
        "entropy_sign_flipped", 3,
        "Returns +H (the entropy) instead of the loss -H.",
        (_sub(E3_RETURN, "\n    return masked_mean(entropy, response_mask)\n"),),
        hint="your entropy loss has the opposite sign",
    ),
    Variant(
        "entropy_unmasked", 3,
        "Averages the entropy over all B*T positions with .mean(), padding included.",
        (_sub(E3_RETURN, "\n    return -entropy.mean()\n"),),
        hint="includes padded positions",
    ),
    Variant(
        "entropy_mean_over_all_positions", 3,
        "Zeroes the padding with (entropy * mask) and takes .mean(): divides by all B*T positions, not the real tokens.",
        (_sub(E3_RETURN, "\n    return -(entropy * response_mask).mean()\n"),),
        hint="divide by every position",
    ),
    Variant(
        "entropy_softmax_wrong_dim", 3,
        "Takes the softmax over the sequence dimension (dim=1) instead of the vocabulary.",
        (_sub(E3_ENTROPY, "\n    entropy = torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=1) * z).sum(dim=-1)  # (B, T)\n"),),
        hint="softmax over the vocabulary",
    ),
    Variant(
        "entropy_mean_over_vocab", 3,
        "Averages p * z over the vocabulary (mean) instead of summing it.",
        (_sub(E3_ENTROPY, "\n    entropy = torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).mean(dim=-1)  # (B, T)\n"),),
        hint="sum p * z over the vocabulary",
    ),
    Variant(
        "entropy_mean_of_row_means", 3,
        "Averages per-response mean entropies (every response weighs the same) instead of the token-mean.",
        (_sub(E3_RETURN, "\n    _m = response_mask.bool()\n"
                         "    _per_row = torch.where(_m, entropy, 0.0).sum(dim=-1) / _m.sum(dim=-1).clamp(min=1)\n"
                         "    return -_per_row[_m.any(dim=-1)].mean()\n"),),
        hint="you average per-row means",
    ),
    Variant(
        "entropy_no_upcast", 3,
        "Computes the entropy in the input dtype: with bfloat16 logits the cancellation logsumexp - sum(p z) loses most digits.",
        (_sub(E3_Z, "\n    z = logits\n"),),
        hint="upcast the logits to float32",
    ),
]

_GAE_MUTANTS = [
    Variant(
        "gae_reward_at_last_position", 4,
        "Adds the final reward at index T-1 (the last padded position) instead of the last real token L_b - 1.",
        (_sub(E4_FINAL, "\n        rewards[:, -1] += final_rewards.to(dtype)\n"),),
        hint="goes at each row's last real token",
    ),
    Variant(
        "gae_reward_at_first_token", 4,
        "Adds the final reward at the first response token instead of the last real one.",
        (_sub(E4_FINAL, "\n        rewards[rows, 0] += final_rewards.to(dtype)[rows]\n"),),
        hint="goes at each row's last real token",
    ),
    Variant(
        "gae_reward_overwrites_kl", 4,
        "Assigns the final reward at the last real token (=) instead of adding it, dropping that token's KL penalty.",
        (_sub(E4_FINAL, "\n        rewards[rows, lengths[rows] - 1] = final_rewards.to(dtype)[rows]\n"),),
        hint="yours overwrites",
    ),
    Variant(
        "gae_forward_loop", 4,
        "Runs the recursion forwards (t = 0..T-1), so A_t is built from A_{t-1} instead of A_{t+1}.",
        (_sub(E4_LOOP, "\n        for t in range(T):\n"),),
        hint="your loop runs forward",
    ),
    Variant(
        "gae_final_reward_scatter", 4,
        "Places the final reward with scatter_add_ at index L_b - 1: right wherever a row has a real token (every "
        "row the trainer makes), an error for an empty row (index -1).",
        (_sub(E4_FINAL, "\n        rewards.scatter_add_(1, (lengths - 1)[:, None], final_rewards.to(dtype)[:, None])\n"),),
    ),
    Variant(
        "gae_loop_skips_last", 4,
        "Loops over reversed(range(T - 1)), so the last position T - 1 is never computed and A_{T-1} stays 0.",
        (_sub(E4_LOOP, "\n        for t in reversed(range(T - 1)):\n"),),
        hint="never computes the last position",
    ),
    Variant(
        "gae_no_next_mask", 4,
        "Drops the m_{t+1} factors and uses the raw values, so junk values in padding leak into the last real token.",
        (_sub(E4_VALUES, "\n        values = values.to(dtype)\n"),
         _sub(E4_DELTA, "\n            delta = rewards[:, t] + gamma * next_value - values[:, t]\n"),
         _sub(E4_ADV, "\n            next_advantage = delta + gamma * lam * next_advantage\n")),
        hint="the next position's mask",
    ),
    Variant(
        "gae_returns_from_whitened", 4,
        "Whitens the advantages first and computes the returns from the whitened advantages.",
        (_sub(E4_RETURN, "\n        advantages = masked_whiten(advantages, mask)\n"
                         "        returns = advantages + values\n"
                         "        return advantages, returns\n"),),
        hint="from the unwhitened advantages",
    ),
    Variant(
        "gae_whiten_biased_variance", 4,
        "Whitens with the biased variance (divides by n instead of n - 1).",
        (_sub(E4_RETURN, "\n        returns = advantages + values\n"
                         "        mean = masked_mean(advantages, mask)\n"
                         "        var = masked_mean((advantages - mean) ** 2, mask)\n"
                         "        return (advantages - mean) * torch.rsqrt(var + 1e-8), returns\n"),),
        hint="divide by n (the population",
    ),
    Variant(
        "gae_whiten_no_mean_shift", 4,
        "Whitens without subtracting the mean (TRL's whiten(shift_mean=False)): only divides by the std.",
        (_sub(E4_RETURN, "\n        returns = advantages + values\n"
                         "        mean = masked_mean(advantages, mask)\n"
                         "        n = mask.sum()\n"
                         "        var = masked_mean((advantages - mean) ** 2, mask) * n / (n - 1)\n"
                         "        return advantages * torch.rsqrt(var + 1e-8), returns\n"),),
        hint="subtract the mean before",
    ),
    Variant(
        "gae_no_whitening", 4,
        "Returns the raw advantages, never whitened.",
        (_sub(E4_RETURN, "\n        returns = advantages + values\n        return advantages, returns\n"),),
        hint="must be whitened",
    ),
    Variant(
        "gae_whiten_all_positions", 4,
        "Whitens with the plain mean and std over all B*T positions, padding included.",
        (_sub(E4_RETURN, "\n        returns = advantages + values\n"
                         "        return (advantages - advantages.mean()) / (advantages.std() + 1e-8), returns\n"),),
        hint="count the padded positions too",
    ),
    Variant(
        "gae_gamma_lam_swapped", 4,
        "Discounts the bootstrap value with lam instead of gamma in the TD error.",
        (_sub(E4_DELTA, "\n            delta = rewards[:, t] + lam * next_value * next_mask - values[:, t]\n"),),
        hint="gamma and lam are swapped",
    ),
    Variant(
        "gae_missing_gamma_in_trace", 4,
        "Decays the advantage trace by lam only instead of gamma * lam.",
        (_sub(E4_ADV, "\n            next_advantage = delta + lam * next_mask * next_advantage\n"),),
        hint="decays by gamma * lam",
    ),
    Variant(
        "gae_kl_sign_flipped", 4,
        "Adds the KL penalty to the token rewards instead of subtracting it.",
        (_sub(E4_REWARDS, "\n        rewards = torch.where(mask, kl_penalties.to(dtype), 0.0)  # (B, T)\n"),),
        hint="the token reward is -kl_penalties",
    ),
]

_UPDATE_MUTANTS = [
    Variant(
        "update_slice_off_by_one", 5,
        "Slices [P : P+T] instead of [P-1 : P+T-1], so each position scores the token after its own.",
        (_sub(E5_LOGITS, "\n    logits = logits[:, P : P + T] / cfg.temperature  # (B, T, V)\n"),
         _sub(E5_VALUES, "\n    values_new = values[:, P : P + T]  # (B, T)\n")),
        hint="slice is off by one",
    ),
    Variant(
        "update_values_slice_off_by_one", 5,
        "Slices the logits right but the values at [P : P+T], one position late.",
        (_sub(E5_VALUES, "\n    values_new = values[:, P : P + T]  # (B, T)\n"),),
        hint="slice is off by one",
    ),
    Variant(
        "update_no_temperature", 5,
        "Forgets to divide the logits by the sampling temperature.",
        (_sub(E5_LOGITS, "\n    logits = logits[:, P - 1 : P + T - 1]  # (B, T, V)\n"),),
        hint="divide the sliced logits by cfg.temperature",
    ),
    Variant(
        "update_temperature_multiplied", 5,
        "Multiplies the logits by the temperature instead of dividing.",
        (_sub(E5_LOGITS, "\n    logits = logits[:, P - 1 : P + T - 1] * cfg.temperature  # (B, T, V)\n"),),
        hint="multiply the logits by cfg.temperature",
    ),
    Variant(
        "update_temperature_twice", 5,
        "Divides by the temperature twice: once after slicing and again inside the log-prob computation.",
        (_sub(E5_LOGPROBS, "\n    logprobs_new = logprobs_from_logits(logits / cfg.temperature, response_ids)  # (B, T)\n"),),
        hint="by cfg.temperature twice",
    ),
    Variant(
        "update_entropy_unscaled_logits", 5,
        "Computes the entropy on the logits before the temperature division.",
        (_sub(E5_LOGITS, "\n    raw_logits = logits[:, P - 1 : P + T - 1]\n    logits = raw_logits / cfg.temperature  # (B, T, V)\n"),
         _sub(E5_ENTROPY, "\n    entropy_loss = compute_entropy_loss(raw_logits, response_mask)\n")),
        hint="the entropy takes the same",
    ),
    Variant(
        "update_no_accum_division", 5,
        "Calls loss.backward() without dividing by grad_accum_steps, so accumulated gradients sum instead of average.",
        (_sub(E5_BACKWARD, "\n    loss.backward()\n"),),
        hint="divide the loss by cfg.grad_accum_steps",
    ),
    Variant(
        "update_zero_grad_first", 5,
        "Calls optimizer.zero_grad() at the start of every minibatch, the supervised-learning habit: gradient "
        "accumulation then keeps only the last minibatch of each cycle.",
        (_prepend_region(5, "    optimizer.zero_grad()\n"),),
        hint="at the start of every call",
    ),
    Variant(
        "update_zero_grad_before_step", 5,
        "Zeroes the gradients before clipping and stepping, so the optimizer steps on zero gradients.",
        (_sub(E5_STEP, """
    if step_optimizer:
        optimizer.zero_grad()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        if torch.isfinite(grad_norm):
            optimizer.step()
        metrics["stats/grad_norm"] = grad_norm.item()
"""),),
        hint="before clipping and stepping",
    ),
    Variant(
        "update_never_zero_grad", 5,
        "Never zeroes the gradients, so they keep accumulating across optimizer steps.",
        (_sub(E5_STEP, """
    if step_optimizer:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        if torch.isfinite(grad_norm):
            optimizer.step()
        metrics["stats/grad_norm"] = grad_norm.item()
"""),),
        hint="zero_grad() after optimizer.step()",
    ),
    Variant(
        "update_no_grad_clipping", 5,
        "Measures the gradient norm without clipping (max_norm = inf), ignoring cfg.max_grad_norm.",
        (_sub(E5_STEP, """
    if step_optimizer:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        if torch.isfinite(grad_norm):
            optimizer.step()
        optimizer.zero_grad()
        metrics["stats/grad_norm"] = grad_norm.item()
"""),),
        hint="clip the gradient norm",
    ),
    Variant(
        "update_clip_after_step", 5,
        "Steps first and clips afterwards, so the step uses the unclipped gradients.",
        (_sub(E5_STEP, """
    if step_optimizer:
        optimizer.step()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.zero_grad()
        metrics["stats/grad_norm"] = grad_norm.item()
"""),),
        hint="clip the gradient norm",
    ),
    Variant(
        "update_steps_on_nonfinite", 5,
        "Steps even when the gradient norm is inf/NaN, writing NaN into the weights.",
        (_sub(E5_STEP, """
    if step_optimizer:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        metrics["stats/grad_norm"] = grad_norm.item()
"""),),
        hint="step only if grad_norm is finite",
    ),
    Variant(
        "update_ignores_step_flag", 5,
        "Steps the optimizer on every minibatch, ignoring step_optimizer (no gradient accumulation).",
        (_sub(E5_STEP, E5_STEP.replace("    if step_optimizer:\n", "    if True:\n")),),
        hint="only when step_optimizer",
    ),
    Variant(
        "update_missing_vf_coeff", 5,
        "Adds the value loss without multiplying by cfg.vf_coeff.",
        (_sub(E5_LOSS, "\n    loss = policy_loss + value_loss + cfg.entropy_coeff * entropy_loss\n"),),
        hint="by cfg.vf_coeff",
    ),
    Variant(
        "update_entropy_coeff_sign", 5,
        "Subtracts cfg.entropy_coeff * entropy_loss (the entropy loss is already -H), so minimising lowers entropy.",
        (_sub(E5_LOSS, "\n    loss = policy_loss + cfg.vf_coeff * value_loss - cfg.entropy_coeff * entropy_loss\n"),),
        hint="yours subtracts it",
    ),
    Variant(
        "update_backward_policy_only", 5,
        "Calls backward on the policy loss alone, so the value head and the entropy bonus never get gradients.",
        (_sub(E5_BACKWARD, "\n    (policy_loss / cfg.grad_accum_steps).backward()\n"),),
        hint="backward() the total loss",
    ),
    Variant(
        "update_metrics_tensors", 5,
        "Returns the metrics as detached tensors instead of Python floats.",
        (_sub(E5_METRICS, E5_METRICS.replace(".item()", ".detach()")),
         _sub('\n        metrics["stats/grad_norm"] = grad_norm.item()\n', '\n        metrics["stats/grad_norm"] = grad_norm.detach()\n')),
        hint="is a Python float",
    ),
]

MUTANTS: list[Variant] = _POLICY_MUTANTS + _VALUE_MUTANTS + _ENTROPY_MUTANTS + _GAE_MUTANTS + _UPDATE_MUTANTS


# ----------------------------------------------------------------------------------------------
# Alternatives: correct, written differently.
# ----------------------------------------------------------------------------------------------

_ALT_VECTORIZED_GAE = """\
    with torch.no_grad():
        dtype = reduction_dtype(values.dtype)
        mask = response_mask.bool()
        m = mask.to(dtype)
        B, T = mask.shape
        v = torch.where(mask, values.to(dtype), 0.0)
        r = torch.where(mask, -kl_penalties.to(dtype), 0.0)
        lengths = mask.sum(dim=-1)
        last = torch.nn.functional.one_hot((lengths - 1).clamp(min=0), T).to(dtype)
        last = last * (lengths > 0).to(dtype).unsqueeze(-1)  # (B, T): 1 at index L_b - 1
        r = r + last * final_rewards.to(dtype).unsqueeze(-1)
        zero = torch.zeros(B, 1, dtype=dtype, device=v.device)
        v_next = torch.cat([v[:, 1:], zero], dim=1)
        m_next = torch.cat([m[:, 1:], zero], dim=1)
        delta = r + gamma * v_next * m_next - v  # (B, T)
        # A_t = sum_{k >= t} W[t, k] delta_k with W[t, k] = prod_{j = t+1..k} gamma * lam * m_j.
        c = (gamma * lam) * m  # (B, T)
        idx = torch.arange(T, device=v.device)
        strictly_after = idx.view(1, T) > idx.view(T, 1)  # [t, k]: k > t
        factors = torch.where(strictly_after, c.unsqueeze(1), torch.ones((), dtype=dtype))  # (B, T, T)
        weights = torch.cumprod(factors, dim=-1) * (idx.view(1, T) >= idx.view(T, 1)).to(dtype)
        advantages = (weights * delta.unsqueeze(1)).sum(dim=-1)  # (B, T)
        returns = advantages + v
        return masked_whiten(advantages, mask), returns
"""

_ALT_TRL_STYLE_GAE = """\
    with torch.no_grad():
        dtype = reduction_dtype(values.dtype)
        mask = response_mask.bool()
        T = mask.shape[1]
        values = values.to(dtype).masked_fill(~mask, 0.0)
        rewards = (-kl_penalties.to(dtype)).masked_fill(~mask, 0.0)
        lengths = mask.long().sum(dim=-1)
        for b in range(rewards.shape[0]):
            if lengths[b] > 0:
                rewards[b, lengths[b] - 1] = rewards[b, lengths[b] - 1] + final_rewards[b].to(dtype)
        lastgaelam = torch.zeros_like(values[:, 0])
        advantages_reversed = []
        for t in reversed(range(T)):
            m_next = mask[:, t + 1].to(dtype) if t + 1 < T else torch.zeros_like(lastgaelam)
            next_values = values[:, t + 1] if t + 1 < T else torch.zeros_like(lastgaelam)
            delta = rewards[:, t] + gamma * next_values * m_next - values[:, t]
            lastgaelam = delta + gamma * lam * m_next * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
        n = mask.sum()
        mean = torch.where(mask, advantages, 0.0).sum() / n
        var = torch.where(mask, (advantages - mean) ** 2, 0.0).sum() / (n - 1)
        whitened = (advantages - mean) / torch.sqrt(var + 1e-8)
        return whitened.detach(), returns.detach()
"""

_ALT_GARBAGE_PADDING_GAE = """\
    with torch.no_grad():
        dtype = reduction_dtype(values.dtype)
        mask = response_mask.bool()
        m = mask.to(dtype)
        values = torch.where(mask, values.to(dtype), 0.0)
        rewards = torch.where(mask, -kl_penalties.to(dtype), 0.0)  # (B, T)
        lengths = mask.sum(dim=-1)  # (B,)
        rows = torch.nonzero(lengths > 0).squeeze(-1)
        rewards[rows, lengths[rows] - 1] += final_rewards.to(dtype)[rows]

        B, T = values.shape
        advantages = torch.zeros_like(values)
        next_value = torch.zeros(B, dtype=dtype, device=values.device)
        next_mask = torch.zeros(B, dtype=dtype, device=values.device)
        next_advantage = torch.zeros(B, dtype=dtype, device=values.device)
        for t in reversed(range(T)):
            delta = rewards[:, t] + gamma * next_value * next_mask - values[:, t]
            next_advantage = delta + gamma * lam * next_mask * next_advantage
            advantages[:, t] = next_advantage
            next_value, next_mask = values[:, t], m[:, t]
        returns = advantages + values
        whitened = masked_whiten(advantages, mask)
        # Padded positions are never graded: fill them with garbage.
        return whitened.masked_fill(~mask, 1234.5), returns.masked_fill(~mask, -1234.5)
"""

_ALT_WHERE_POLICY = """\
    mask = response_mask.bool()
    n = mask.sum()
    log_ratio = torch.where(mask, logprobs_new - logprobs_old, 0.0)  # padding junk never reaches exp
    ratio = log_ratio.exp()
    surrogate = torch.max(-advantages * ratio, -advantages * torch.clip(ratio, min=1.0 - clip_ratio, max=1.0 + clip_ratio))
    loss = torch.where(mask, surrogate.to(reduction_dtype(surrogate.dtype)), 0.0).sum() / n
    metric_dtype = reduction_dtype(ratio.dtype)
    pg_clipped = -advantages.detach() * torch.clip(ratio.detach(), 1.0 - clip_ratio, 1.0 + clip_ratio)
    is_clipped = pg_clipped > -advantages.detach() * ratio.detach()
    clip_frac = torch.where(mask, is_clipped, False).to(metric_dtype).sum() / n
    approx_kl = torch.where(mask, -log_ratio.detach().to(metric_dtype), 0.0).sum() / n
    return loss, clip_frac, approx_kl
"""

_ALT_WHERE_VALUE = """\
    mask = response_mask.bool()
    n = mask.sum()
    delta = torch.clip(values_new - values_old, -clip_range_value, clip_range_value)
    v_clip = values_old + delta
    e1 = torch.square(values_new - returns)
    e2 = torch.square(v_clip - returns)
    per_token = torch.where(e2 > e1, e2, e1)  # elementwise max
    loss = torch.where(mask, 0.5 * per_token.to(reduction_dtype(per_token.dtype)), 0.0).sum() / n
    clip_frac = torch.where(mask, (e2 > e1).detach(), False).to(reduction_dtype(values_new.dtype)).sum() / n
    return loss, clip_frac
"""

_ALT_LOG_SOFTMAX_ENTROPY = """\
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    logp = torch.log_softmax(z, dim=-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)  # log_softmax stays finite, exp(-big) = 0, 0 * finite = 0
    mask = response_mask.bool()
    return -torch.where(mask, entropy, 0.0).sum() / mask.sum()
"""

_ALT_CATEGORICAL_ENTROPY = """\
    z = logits.to(reduction_dtype(logits.dtype))
    entropy = torch.distributions.Categorical(logits=z, validate_args=False).entropy()  # (B, T)
    return -masked_mean(entropy, response_mask)
"""

_ALT_PESSIMISTIC_MIN_POLICY = """\
    ratio = torch.exp(logprobs_new - logprobs_old)
    surr1 = advantages * ratio
    surr2 = advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    loss = -masked_mean(torch.min(surr1, surr2), response_mask)  # -min(x, y) == max(-x, -y)
    clip_frac = masked_mean((surr2 < surr1).to(reduction_dtype(ratio.dtype)), response_mask).detach()
    approx_kl = masked_mean(logprobs_old - logprobs_new, response_mask).detach()
    return loss, clip_frac, approx_kl
"""

_ALT_FP64_POLICY = """\
    metric_dtype = reduction_dtype(torch.promote_types(logprobs_new.dtype, logprobs_old.dtype))
    out = reduction_dtype(torch.promote_types(metric_dtype, advantages.dtype))
    mask = response_mask.bool()
    lr64 = logprobs_new.double() - logprobs_old.double()
    ratio64 = torch.exp(lr64)
    adv64 = advantages.double()
    surr = torch.maximum(-adv64 * ratio64, -adv64 * torch.clamp(ratio64, 1.0 - clip_ratio, 1.0 + clip_ratio))
    loss = (torch.where(mask, surr, 0.0).sum() / mask.sum()).to(out)
    with torch.no_grad():
        # The clip indicator is a step function: evaluate it in the contract's precision so that a
        # boundary token (ratio within rounding of 1 +- eps) is counted the same way.
        lr = logprobs_new.detach() - logprobs_old
        ratio = torch.exp(lr)
        unclipped = -advantages * ratio
        clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
        clip_frac = (torch.where(mask, (clipped > unclipped).double(), 0.0).sum() / mask.sum()).to(metric_dtype)
        approx_kl = (torch.where(mask, -lr64, 0.0).sum() / mask.sum()).to(metric_dtype)
    return loss, clip_frac, approx_kl
"""

_ALT_FP64_VALUE = """\
    out = reduction_dtype(torch.promote_types(torch.promote_types(values_new.dtype, values_old.dtype), returns.dtype))
    mask = response_mask.bool()
    vn, vo, R = values_new.double(), values_old.double(), returns.double()
    v_clip64 = vo + torch.clamp(vn - vo, -clip_range_value, clip_range_value)
    per_token = torch.maximum((vn - R) ** 2, (v_clip64 - R) ** 2)
    loss = (0.5 * torch.where(mask, per_token, 0.0).sum() / mask.sum()).to(out)
    with torch.no_grad():
        # Same comparison as the contract, in its precision: vo + (vn - vo) is not always vn in
        # float32, and the strict > counts such rounding as clipping.
        v_clip = values_old + torch.clamp(values_new.detach() - values_old, -clip_range_value, clip_range_value)
        hit = (v_clip - returns) ** 2 > (values_new.detach() - returns) ** 2
        clip_frac = (torch.where(mask, hit.double(), 0.0).sum() / mask.sum()).to(reduction_dtype(values_new.dtype))
    return loss, clip_frac
"""

_ALT_FP64_ENTROPY = """\
    out = reduction_dtype(logits.dtype)
    z = logits.double()
    entropy = torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)
    mask = response_mask.bool()
    return (-torch.where(mask, entropy, 0.0).sum() / mask.sum()).to(out)
"""

_ALT_FP64_GAE = """\
    with torch.no_grad():
        out = reduction_dtype(values.dtype)
        mask = response_mask.bool()
        m = mask.double()
        v = torch.where(mask, values.double(), 0.0)
        r = torch.where(mask, -kl_penalties.double(), 0.0)
        B, T = v.shape
        for b in range(B):
            L = int(mask[b].sum())
            if L > 0:
                r[b, L - 1] += float(final_rewards[b])
        adv = torch.zeros_like(v)
        running = torch.zeros(B, dtype=torch.float64, device=v.device)
        for t in range(T - 1, -1, -1):
            v_next = v[:, t + 1] * m[:, t + 1] if t + 1 < T else torch.zeros_like(running)
            m_next = m[:, t + 1] if t + 1 < T else torch.zeros_like(running)
            running = r[:, t] + gamma * v_next - v[:, t] + gamma * lam * m_next * running
            adv[:, t] = running
        returns = adv + v
        n = mask.sum()
        mean = torch.where(mask, adv, 0.0).sum() / n
        var = torch.where(mask, (adv - mean) ** 2, 0.0).sum() / (n - 1)
        whitened = (adv - mean) / torch.sqrt(var + 1e-8)
        return whitened.to(out), returns.to(out)
"""

# The float32 paths the contract allows for float64 inputs: compute, and return, in float32.
_ALT_FLOAT32_POLICY = """\
    new, old, adv = logprobs_new.float(), logprobs_old.float(), advantages.float()
    mask = response_mask.bool()
    ratio = torch.exp(new - old)
    per_token = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio))
    n = mask.sum()
    loss = torch.where(mask, per_token, 0.0).sum() / n
    with torch.no_grad():
        clipped = ((adv > 0) & (ratio > 1.0 + clip_ratio)) | ((adv < 0) & (ratio < 1.0 - clip_ratio))
        clip_frac = (clipped & mask).float().sum() / n
        approx_kl = torch.where(mask, old - new, 0.0).sum() / n
    return loss, clip_frac, approx_kl
"""

_ALT_FLOAT32_VALUE = """\
    new, old, ret = values_new.float(), values_old.float(), returns.float()
    m = response_mask.float()
    v_clip = old + (new - old).clamp(-clip_range_value, clip_range_value)
    e1, e2 = (new - ret) ** 2, (v_clip - ret) ** 2
    loss = 0.5 * (torch.maximum(e1, e2) * m).sum() / m.sum()
    clip_frac = ((e2 > e1).float() * m).sum().detach() / m.sum()
    return loss, clip_frac
"""

_ALT_FLOAT32_ENTROPY = """\
    logp = torch.log_softmax(logits.float(), dim=-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return -entropy[response_mask.bool()].mean()
"""

_ALT_FLOAT32_GAE = """\
    with torch.no_grad():
        mask = response_mask.bool()
        m = mask.float()
        v = torch.where(mask, values.float(), 0.0)
        r = torch.where(mask, -kl_penalties.float(), 0.0)
        lengths = mask.sum(-1)
        for b in range(r.shape[0]):
            if lengths[b] > 0:
                r[b, lengths[b] - 1] += final_rewards[b].float()
        T = r.shape[1]
        adv = torch.zeros_like(r)
        running = torch.zeros_like(r[:, 0])
        for t in range(T - 1, -1, -1):
            m_next = m[:, t + 1] if t + 1 < T else torch.zeros_like(running)
            v_next = v[:, t + 1] if t + 1 < T else torch.zeros_like(running)
            running = r[:, t] + gamma * v_next * m_next - v[:, t] + gamma * lam * m_next * running
            adv[:, t] = running
        returns = adv + v
        real = adv[mask]
        whitened = (adv - real.mean()) / torch.sqrt(real.var(unbiased=True) + 1e-8)
        return whitened, returns
"""

_ALT_FLOAT32_LOGPROBS = ("\n    logprobs_new = torch.log_softmax(logits.float(), dim=-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)"
                         "  # (B, T)\n")

_ALT_LOG_SOFTMAX_GATHER = "\n    logprobs_new = torch.nn.functional.log_softmax(logits.to(reduction_dtype(logits.dtype)), dim=-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)\n"

ALTERNATIVES: list[Variant] = [
    Variant(
        "alt_float32_everywhere", 0,
        "Computes exercises 1-4 in float32 and returns float32 even for float64 inputs (.float() upcasts, boolean "
        "indexing, torch.var), and the ex-5 log-probs as log_softmax(logits.float()).gather, the line TRL and verl write.",
        (_replace_region(1, _ALT_FLOAT32_POLICY), _replace_region(2, _ALT_FLOAT32_VALUE),
         _replace_region(3, _ALT_FLOAT32_ENTROPY), _replace_region(4, _ALT_FLOAT32_GAE),
         _sub(E5_LOGPROBS, _ALT_FLOAT32_LOGPROBS)),
    ),
    Variant(
        "alt_vectorized_gae", 0,
        "GAE without a Python loop over t: A = W @ delta with W[t, k] = prod_{j=t+1..k} gamma*lam*m_j built by a cumprod over a (B, T, T) tensor.",
        (_replace_region(4, _ALT_VECTORIZED_GAE),),
    ),
    Variant(
        "alt_trl_style_gae", 0,
        "TRL-style GAE: lastgaelam loop appending to a list, reversed and stacked; reward added per row; whitening written out with torch.where and torch.sqrt.",
        (_replace_region(4, _ALT_TRL_STYLE_GAE),),
    ),
    Variant(
        "alt_garbage_padding", 0,
        "Writes garbage (1234.5 / -1234.5) into the padded positions of both per-token outputs of GAE, which are never graded.",
        (_replace_region(4, _ALT_GARBAGE_PADDING_GAE),),
    ),
    Variant(
        "alt_categorical_entropy", 0,
        "Entropy via torch.distributions.Categorical(logits=..., validate_args=False).entropy().",
        (_replace_region(3, _ALT_CATEGORICAL_ENTROPY),),
    ),
    Variant(
        "alt_where_masking", 0,
        "Masks with torch.where and explicit sums instead of the helpers, torch.clip / torch.max / torch.where-as-max, and the entropy as -sum(exp(log_softmax) * log_softmax).",
        (_replace_region(1, _ALT_WHERE_POLICY),
         _replace_region(2, _ALT_WHERE_VALUE),
         _replace_region(3, _ALT_LOG_SOFTMAX_ENTROPY)),
    ),
    Variant(
        "alt_pessimistic_min", 0,
        "Writes the policy loss as -min(A r, A clip(r)) (the paper's form, negated) and the clip fraction as A clip(r) < A r.",
        (_replace_region(1, _ALT_PESSIMISTIC_MIN_POLICY),),
    ),
    Variant(
        "alt_fp64_internals", 0,
        "Computes the losses, approx_kl and GAE in float64 and casts back to the contract's dtype (clip indicators evaluated in the input precision, see the comments).",
        (_replace_region(1, _ALT_FP64_POLICY),
         _replace_region(2, _ALT_FP64_VALUE),
         _replace_region(3, _ALT_FP64_ENTROPY),
         _replace_region(4, _ALT_FP64_GAE)),
    ),
    Variant(
        "alt_log_softmax_gather", 0,
        "Computes the response log-probs with F.log_softmax + gather instead of the helper, and zero_grad(set_to_none=False).",
        (_sub(E5_LOGPROBS, _ALT_LOG_SOFTMAX_GATHER),
         _sub(E5_STEP, E5_STEP.replace("optimizer.zero_grad()", "optimizer.zero_grad(set_to_none=False)"))),
    ),
]


# ----------------------------------------------------------------------------------------------
# Attacks: hostile submissions. Never import them in-process.
# ----------------------------------------------------------------------------------------------

_FAKE_RESULTS = '''
def _fake_results():
    import json as _json
    import os as _os
    import sys as _sys
    fake = {
        "score": 100.0, "max_score": 100.0, "passed": True, "output": "All tests passed!",
        "tests": [{"name": n, "score": 20.0, "max_score": 20.0, "status": "passed"} for n in (
            "compute_policy_loss", "compute_value_loss", "compute_entropy_loss",
            "compute_gae_advantages", "ppo_minibatch_update")],
    }
    targets = [_os.path.join(_os.getcwd(), "results.json")]
    for arg in _sys.argv[1:]:
        if arg.endswith(".json"):
            targets.append(arg)
        elif _os.path.isdir(arg):
            targets.append(_os.path.join(arg, "results.json"))
    for path in targets:
        try:
            with open(path, "w") as fh:
                _json.dump(fake, fh)
        except OSError:
            pass


_fake_results()
'''

_SPAM = '''
import sys as _sys

for _stream in (_sys.stdout, _sys.stderr):
    for _ in range(8):
        _stream.write("JUNK " * 209715 + "\\n")  # ~1 MiB a line, 8 MiB per stream
    _stream.flush()
'''

_FORK_BOMB = '''
def _forks():
    """Bounded: at most 500 children, for at most 10 s; every child sleeps 20 s and exits."""
    import os as _os
    import time as _time
    deadline = _time.monotonic() + 10.0
    for _ in range(500):
        if _time.monotonic() > deadline:
            break
        try:
            pid = _os.fork()
        except OSError:
            break
        if pid == 0:
            try:
                _time.sleep(20.0)
            finally:
                _os._exit(0)


_forks()
'''

_PATCH_COMPARISONS = '''
def _patch():
    import math as _math
    import torch as _t
    import torch.testing as _tt
    _t.allclose = lambda *a, **k: True
    _t.equal = lambda *a, **k: True
    _t.isclose = lambda a, b, *r, **k: _t.ones(_t.broadcast_shapes(_t.as_tensor(a).shape, _t.as_tensor(b).shape), dtype=_t.bool)
    _t.Tensor.allclose = lambda self, *a, **k: True
    _t.Tensor.equal = lambda self, *a, **k: True
    _t.Tensor.__eq__ = lambda self, other: _t.ones_like(self, dtype=_t.bool)
    _t.Tensor.__ne__ = lambda self, other: _t.zeros_like(self, dtype=_t.bool)
    _tt.assert_close = lambda *a, **k: None
    _tt.assert_allclose = lambda *a, **k: None
    _math.isclose = lambda *a, **k: True
    try:
        import numpy as _np
        _np.allclose = lambda *a, **k: True
        _np.isclose = lambda a, b, *r, **k: _np.ones(_np.broadcast_shapes(_np.shape(a), _np.shape(b)), dtype=bool)
        _np.testing.assert_allclose = lambda *a, **k: None
        _np.array_equal = lambda *a, **k: True
    except Exception:
        pass


_patch()
'''

_LIAR_CLASS = '''

class _Liar(torch.Tensor):
    """Claims to equal anything it is compared with."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("allclose", "equal", "__bool__"):
            return True
        if name in ("isclose", "eq", "__eq__", "ne", "__ne__", "le", "ge", "__le__", "__ge__"):
            shapes = [torch.Tensor.as_subclass(a, torch.Tensor).shape if isinstance(a, torch.Tensor) else ()
                      for a in args[:2]]
            value = name not in ("ne", "__ne__")
            return torch.full(torch.broadcast_shapes(*shapes), value, dtype=torch.bool)
        return super().__torch_function__(func, types, args, kwargs)

    def __eq__(self, other):
        return torch.ones(torch.Tensor.as_subclass(self, torch.Tensor).shape, dtype=torch.bool)

    __hash__ = torch.Tensor.__hash__

'''

_LIAR_POLICY = """\
    wrong = (logprobs_new * 0.0).sum() + 123.0
    return wrong.as_subclass(_Liar), torch.tensor(0.5).as_subclass(_Liar), torch.tensor(-7.0).as_subclass(_Liar)
"""

_MEMORY_HOG = """\
    import time as _time

    def _available_bytes():
        try:
            with open("/proc/meminfo") as fh:
                for line in fh:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            pass
        return None

    # Up to 20 GiB in 1 GiB chunks, touched so the pages are really committed. Stops early if the
    # machine itself runs low (less than 3 GiB available) or after 60 s: an unsandboxed run must
    # not take the host down.
    _hog = []
    _deadline = _time.monotonic() + 60.0
    while len(_hog) < 20 and _time.monotonic() < _deadline:
        _avail = _available_bytes()
        if _avail is not None and _avail < 3 * 2**30:
            break
        _chunk = torch.empty(2**28, dtype=torch.float32)  # 1 GiB
        _chunk.fill_(1.0)
        _hog.append(_chunk)
"""

_STEAL_REFERENCE = '''

def _steal_reference():
    """Find the reference solution and exec it over this module's (blank) functions."""
    import importlib as _importlib
    import os as _os
    import sys as _sys
    for modname in ("solutions.exercises", "solutions"):
        try:
            mod = _importlib.import_module(modname)
            if all(hasattr(mod, n) for n in ("compute_policy_loss", "ppo_minibatch_update")):
                for n in ("compute_policy_loss", "compute_value_loss", "compute_entropy_loss",
                          "compute_gae_advantages", "ppo_minibatch_update"):
                    globals()[n] = getattr(mod, n)
                return
        except Exception:
            pass
    me = _os.path.abspath(globals().get("__file__", "") or "")
    bases = [_os.getcwd(), _os.path.dirname(me), *[p for p in _sys.path if isinstance(p, str)]]
    for base in bases:
        d = _os.path.abspath(base or ".")
        for _ in range(5):
            path = _os.path.join(d, "solutions", "exercises.py")
            if path != me:
                try:
                    with open(path) as fh:
                        src = fh.read()
                    if "### BEGIN SOLUTION" in src:
                        exec(compile(src, path, "exec"), globals())
                        return
                except Exception:
                    pass
            d = _os.path.dirname(d)


_steal_reference()
'''

_BLANK = "    raise NotImplementedError  # blank: the reference is stolen at import\n"

# Records which process saw exercise 1's inputs (in HOME, the only writable place), then shows
# the record through an exception in exercise 2: were hidden inputs visible, a second process
# id (the fresh hidden worker's) would appear in exercise 2's visible feedback.
_LEAK_POLICY_RECORD = """\
    import os as _os
    with open(_os.path.join(_os.environ.get("HOME", "."), "seen.txt"), "a") as _f:
        _f.write(f"pid{_os.getpid()}:{logprobs_new.flatten()[:2].tolist()}\\n")
"""
_LEAK_VALUE_RAISE = """\
    import os as _os
    _path = _os.path.join(_os.environ.get("HOME", "."), "seen.txt")
    _seen = open(_path).read() if _os.path.exists(_path) else ""
    raise RuntimeError("LEAK " + " ".join(sorted({line.split(":")[0] for line in _seen.split()})))
"""

# Asks the grader's reference for exercise 1 on inputs of its own choosing, inside exercise 5.
_QUERY_ORACLE = """\
    _probe = torch.linspace(-1.0, 1.0, 6, dtype=torch.float64).reshape(2, 3)
    _answer = compute_policy_loss(_probe, torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64),
                                  torch.ones(2, 3, dtype=torch.bool), 0.2)
    raise RuntimeError(f"ORACLE SAYS {float(_answer[0])!r}")
"""

# A daemon: double fork, setsid, then `sleep` with a telltale argument, meant to outlive the grading.
_DAEMON = """
def _daemon():
    import os as _os
    if _os.fork() == 0:
        _os.setsid()
        if _os.fork() == 0:
            try:
                _os.execvp("sleep", ["sleep", "4242.5"])
            finally:
                _os._exit(0)
        _os._exit(0)


_daemon()
"""

# Tries to reach the network and reports what happened through an exception in exercise 1.
_NETWORK = """\
    import socket as _socket
    try:
        _s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        _s.settimeout(1.0)
        _s.connect(("127.0.0.1", 9))
        _outcome = "connected"
    except OSError as _err:
        _outcome = type(_err).__name__ + " " + str(_err)
    raise RuntimeError("NETWORK " + _outcome)
"""

ATTACKS: list[Variant] = [
    Variant(
        "attack_sys_exit_import", 0,
        "Calls sys.exit(0) at import time, hoping an exit status of 0 reads as success.",
        (_sub(IMPORTS, IMPORTS + "\nimport sys\n\nsys.exit(0)\n"),),
    ),
    Variant(
        "attack_kill_parent_import", 0,
        "Sends SIGKILL to its parent process at import time (the grader, if it imports submissions in-process or in a direct child).",
        (_sub(IMPORTS, IMPORTS + "\nimport os\nimport signal\n\nos.kill(os.getppid(), signal.SIGKILL)\n"),),
    ),
    Variant(
        "attack_fork_bomb_import", 0,
        "Forks up to 500 sleeping children at import time (bounded: children exit after 20 s, forking stops after 10 s).",
        (_sub(IMPORTS, IMPORTS + _FORK_BOMB),),
    ),
    Variant(
        "attack_fake_results_import", 0,
        "At import, writes a full-marks results.json into the working directory and into every .json path / directory named in sys.argv.",
        (_sub(IMPORTS, IMPORTS + _FAKE_RESULTS),),
    ),
    Variant(
        "attack_spam_output_import", 0,
        "Prints 8 MiB of junk to stdout and 8 MiB to stderr at import time.",
        (_sub(IMPORTS, IMPORTS + _SPAM),),
    ),
    Variant(
        "attack_copy_reference_import", 0,
        "Leaves all five bodies blank (raise NotImplementedError) and at import tries to import solutions.exercises or read solutions/exercises.py and exec it over itself: full marks means the reference was reachable.",
        (_prepend_region(1, _BLANK), _prepend_region(2, _BLANK), _prepend_region(3, _BLANK),
         _prepend_region(4, _BLANK), _prepend_region(5, _BLANK),
         _sub(END_OF_FILE, END_OF_FILE + _STEAL_REFERENCE)),
    ),
    Variant(
        "attack_patch_comparisons", 1,
        "At import monkeypatches torch.allclose/equal/isclose, Tensor.__eq__/allclose, torch.testing.assert_close, math.isclose and numpy's comparisons to always succeed, and returns wrong values (zeros) from exercise 1.",
        (_sub(IMPORTS, IMPORTS + _PATCH_COMPARISONS),
         _replace_region(1, "    zero = (logprobs_new * 0.0).sum()\n    return zero, zero.detach(), zero.detach()\n")),
    ),
    Variant(
        "attack_tensor_subclass_liar", 1,
        "Returns wrong values wrapped in a torch.Tensor subclass whose __eq__, eq/isclose/allclose/equal (via __torch_function__) always say equal.",
        (_sub(IMPORTS, IMPORTS + _LIAR_CLASS), _replace_region(1, _LIAR_POLICY)),
    ),
    Variant(
        "attack_wrong_dtype_fp16", 1,
        "Returns the three exercise 1 scalars in float16.",
        (_sub("\n    return loss, clip_frac, approx_kl\n    ### END SOLUTION",
              "\n    return loss.half(), clip_frac.half(), approx_kl.half()\n    ### END SOLUTION"),),
    ),
    Variant(
        "attack_os_exit_value", 2,
        "Calls os._exit(3) inside compute_value_loss (no cleanup, no exception).",
        (_prepend_region(2, "    import os\n    os._exit(3)\n"),),
    ),
    Variant(
        "attack_mutate_inputs_value", 2,
        "Zeroes values_new, values_old and returns in place, then returns zeros: a grader that computes the reference afterwards on the same tensors sees a match.",
        (_replace_region(2, "    with torch.no_grad():\n"
                            "        values_new.zero_()\n"
                            "        values_old.zero_()\n"
                            "        returns.zero_()\n"
                            "    loss = 0.5 * masked_mean((values_new - returns) ** 2, response_mask)\n"
                            "    clip_frac = masked_mean(torch.zeros_like(returns), response_mask)\n"
                            "    return loss, clip_frac\n"),),
    ),
    Variant(
        "attack_wrong_shape_value", 2,
        "Returns the value loss broadcast to shape (B, T) instead of a scalar (same value everywhere).",
        (_sub("\n    return loss, clip_frac\n    ### END SOLUTION",
              "\n    return loss.expand(values_new.shape), clip_frac\n    ### END SOLUTION"),),
    ),
    Variant(
        "attack_infinite_loop_entropy", 3,
        "Spins forever (while True: pass) inside compute_entropy_loss.",
        (_prepend_region(3, "    while True:\n        pass\n"),),
    ),
    Variant(
        "attack_python_float_entropy", 3,
        "Returns the entropy loss as a Python float instead of a tensor.",
        (_sub(E3_RETURN, "\n    return -masked_mean(entropy, response_mask).item()\n"),),
    ),
    Variant(
        "attack_memory_hog_gae", 4,
        "Allocates and touches up to 20 GiB in 1 GiB chunks inside compute_gae_advantages, then returns the right answer.",
        (_prepend_region(4, _MEMORY_HOG),),
    ),
    Variant(
        "attack_nan_gae", 4,
        "Returns NaN everywhere from compute_gae_advantages.",
        (_sub(E4_RETURN, "\n        returns = advantages + values\n"
                         "        return torch.full_like(advantages, float('nan')), torch.full_like(returns, float('nan'))\n"),),
    ),
    Variant(
        "attack_ignore_sigterm_gae", 4,
        "Ignores SIGTERM and SIGINT, then sleeps forever inside compute_gae_advantages: only SIGKILL stops it.",
        (_prepend_region(4, "    import signal\n    import time\n"
                            "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                            "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                            "    while True:\n        time.sleep(1.0)\n"),),
    ),
    Variant(
        "attack_mutate_minibatch_update", 5,
        "Zeroes the minibatch's advantages, returns, logprobs_old and values_old in place before using them.",
        (_prepend_region(5, "    with torch.no_grad():\n"
                            "        for key in (\"advantages\", \"returns\", \"logprobs_old\", \"values_old\"):\n"
                            "            minibatch[key].zero_()\n"),),
    ),
    Variant(
        "attack_leak_hidden_inputs", 2,
        "Records in HOME which process saw exercise 1's inputs and raises that record from exercise 2: were hidden "
        "inputs sent before the visible checks ended, the hidden worker's id would show in the visible feedback.",
        (_prepend_region(1, _LEAK_POLICY_RECORD), _prepend_region(2, _LEAK_VALUE_RAISE)),
    ),
    Variant(
        "attack_query_oracle_update", 5,
        "Inside exercise 5, calls compute_policy_loss (the grader's reference, there) on inputs of its own choosing "
        "and raises the answer into its feedback.",
        (_prepend_region(5, _QUERY_ORACLE),),
    ),
    Variant(
        "attack_daemon_import", 0,
        "At import, double-forks a setsid'd `sleep 4242.5` meant to outlive the grading.",
        (_sub(IMPORTS, IMPORTS + _DAEMON),),
    ),
    Variant(
        "attack_network_policy", 1,
        "Opens a TCP socket to 127.0.0.1 inside exercise 1 and raises what happened.",
        (_prepend_region(1, _NETWORK),),
    ),
    Variant(
        "attack_segfault_update", 5,
        "Dereferences a null pointer with ctypes inside ppo_minibatch_update (the process dies with SIGSEGV).",
        (_prepend_region(5, "    import ctypes\n    ctypes.string_at(0)\n"),),
    ),
]

# Right types, shapes, dtypes and gradient flags everywhere, wrong values everywhere: must score 0.
_WRONG_POLICY = """\
    loss = 2.0 * masked_mean(logprobs_new - logprobs_old, response_mask) + 1.0
    zero = torch.zeros((), dtype=reduction_dtype(logprobs_new.dtype))
    return loss, zero + 0.5, zero - 0.25
"""
_WRONG_VALUE = """\
    loss = masked_mean(values_new * 3.0, response_mask) + 1.0
    return loss, torch.zeros((), dtype=reduction_dtype(values_new.dtype)) + 0.5
"""
_WRONG_ENTROPY = """\
    return masked_mean(logits.to(reduction_dtype(logits.dtype)).sum(-1) * 0.1, response_mask) + 1.0
"""
_WRONG_GAE = """\
    with torch.no_grad():
        dtype = reduction_dtype(values.dtype)
        out = values.to(dtype) * 0.0 + 3.0
        return out, out + 1.0
"""
_WRONG_UPDATE = """\
    metrics = {"loss/policy": 1.0, "loss/value": 2.0, "loss/entropy": 3.0, "loss/total": 6.0,
               "stats/policy_clipfrac": 0.5, "stats/value_clipfrac": 0.5, "stats/approx_kl": 0.25}
    if step_optimizer:
        optimizer.zero_grad()
        metrics["stats/grad_norm"] = float("nan")
    return metrics
"""

WRONG_EVERYWHERE = Variant(
    "wrong_everywhere", 0,
    "Every function returns the right types, shapes, dtypes and gradient flags with wrong values; exercise 5 does "
    "no update but reports a non-finite grad_norm and zeroes the gradients.",
    (_replace_region(1, _WRONG_POLICY), _replace_region(2, _WRONG_VALUE), _replace_region(3, _WRONG_ENTROPY),
     _replace_region(4, _WRONG_GAE), _replace_region(5, _WRONG_UPDATE)),
)

ALL: list[Variant] = MUTANTS + ALTERNATIVES + ATTACKS + [WRONG_EVERYWHERE]


# Cases found reported as another mistake, or not at all: a student's trial of the release (the public tests)
# and public CS336 implementations through the grader. Each must be named in its channel, by no other message.
REPORTED = {"policy_unmasked_mean": "public", "policy_clipfrac_ge": "public", "value_missing_half": "public",
            "entropy_mean_of_row_means": "public", "gae_returns_from_whitened": "public",
            "grpo_population_std": "public", "kl_exp_before_mask": "public",
            "grpo_dr_divides_by_one_plus_eps": "grader", "agg_seq_mean_where_after_division": "grader"}


def misled(v: Variant, message: str) -> list[str]:
    """The phrases of other mistakes that ``message`` holds when it does not name ``v``'s own (a
    message that names both, where a case cannot tell them apart, still leads to the right fix)."""
    if v.hint and v.hint in message:
        return []
    return sorted({w.hint for w in MUTANTS + PART2_MUTANTS if w.hint and w.hint != v.hint and w.hint in message})


def by_name(name: str) -> Variant:
    """The variant called ``name`` (Part I's or Part II's)."""
    for v in ALL + PART2_MUTANTS + PART2_ALTERNATIVES:
        if v.name == name:
            return v
    raise KeyError(name)


# ----------------------------------------------------------------------------------------------
# Part II (exercises 6-8, bonus): mutants and correct alternatives, kept apart from the lists
# above so that Part I's corpus, and every test over it, stays exactly as it was.
# ----------------------------------------------------------------------------------------------

E6_STD = "\n            std = torch.sqrt(squares / (count - 1).clamp(min=1))  # (G,)\n"
E6_DIVIDE = "\n            scores = scores / (std[group] + eps)\n"
E6_CENTRE = "\n        scores = r - mean[group]  # (B,); exactly 0 in a group of one\n"
E6_FLAG = "\n        if norm_by_std:\n"
E7_SEQ = "\n        return (x.sum(dim=-1)[rows] / lengths[rows]).mean()\n"
E7_NORM = "\n        return x.sum() / (x.shape[0] * max_response_length)\n"
E8_LOG_RATIO = "\n    log_ratio = torch.where(mask, ref_logprobs.to(dtype) - logprobs.to(dtype), 0.0)  # (B, T)\n"
E8_K1 = "\n        kl = -log_ratio\n"
E8_K2 = "\n        kl = 0.5 * log_ratio ** 2\n"
E8_K3 = "\n        kl = torch.exp(log_ratio) - 1.0 - log_ratio\n"
E7_UNKNOWN = ("\n    raise ValueError(f\"unknown loss_agg_mode {loss_agg_mode!r}: use token-mean, seq-mean-token-mean \"\n"
              "                     f\"or seq-mean-token-sum-norm\")\n")
E8_UNKNOWN = "\n    else:\n        raise ValueError(f\"unknown kl_estimator {kl_estimator!r}: use k1, k2 or k3\")\n"

PART2_MUTANTS: list[Variant] = [
    Variant("grpo_batch_std", 6, "Divides by torch.std of the whole batch instead of the group's (NaN for a batch "
            "of one response).", (_sub(E6_DIVIDE, "\n            scores = scores / (torch.std(r) + eps)\n"),),
            hint="not over the whole batch"),
    Variant("grpo_eps_inside_sqrt", 6, "Divides by sqrt(var + eps) instead of std + eps.",
            (_sub(E6_DIVIDE, "\n            scores = scores / torch.sqrt(std[group] ** 2 + eps)\n"),),
            hint="outside the square root"),
    Variant("grpo_dr_divides_by_one_plus_eps", 6, "Dr. GRPO mode divides the centred reward by 1 + eps (a std of 1).",
            (_sub(E6_DIVIDE, "\n            scores = scores / (std[group] + eps)\n        else:\n"
                             "            scores = scores / (1.0 + eps)\n"),), hint="yours divides by 1 + eps"),
    Variant("grpo_population_std", 6, "Takes the population std (divides by n) instead of the sample std (n - 1).",
            (_sub(E6_STD, "\n            std = torch.sqrt(squares / count)  # (G,)\n"),), hint="divide by n (the population"),
    Variant("grpo_batch_mean", 6, "Subtracts the mean of the whole batch instead of the group's.",
            (_sub(E6_CENTRE, "\n        scores = r - r.mean()\n"),), hint="not over the whole batch"),
    Variant("grpo_ignores_norm_flag", 6, "Divides by the std in Dr. GRPO mode too.",
            (_sub(E6_FLAG, "\n        if True:\n"),), hint="(Dr. GRPO) the advantage is r - mean alone"),
    Variant("grpo_torch_std_singleton_nan", 6,
            "Loops over groups with torch.std and forgets that a group of one gives NaN.",
            (_sub(E6_STD, "\n            std = torch.stack([torch.std(r[group == g]) for g in range(G)])  # (G,)\n"),),
            hint="a group of one response gives NaN"),
    Variant("agg_sum_norm_own_length", 7, "Dr. GRPO mode divides each response by its own length (GRPO's length bias).",
            (_sub(E7_NORM, "\n        lengths = mask.sum(dim=-1)\n        rows = lengths > 0\n"
                           "        return (x.sum(dim=-1)[rows] / lengths[rows]).mean()\n"),), hint="own length"),
    Variant("agg_sum_norm_by_padded_width", 7, "Dr. GRPO mode divides by T, the padded width, not the budget.",
            (_sub(E7_NORM, "\n        return x.sum() / (x.shape[0] * x.shape[1])\n"),), hint="padded width"),
    Variant("agg_sum_norm_no_batch", 7, "Dr. GRPO mode divides by the budget alone (verl's form), not by B * budget.",
            (_sub(E7_NORM, "\n        return x.sum() / max_response_length\n"),), hint="the mean over the B responses stays"),
    Variant("agg_unknown_mode_falls_back", 7, "An unknown loss_agg_mode silently falls back to token-mean.",
            (_sub(E7_UNKNOWN, "\n    return x.sum() / mask.sum()\n"),), hint="is none of the three modes"),
    Variant("agg_seq_mean_where_after_division", 7, "GRPO mode takes each row's masked mean as (loss * mask).sum / "
            "mask.sum, then selects the non-empty rows with torch.where: an empty row's 0 / 0 is selected away, "
            "its NaN gradient is not (the mask multiplies it: NaN * 0).",
            (_sub(E7_SEQ, "\n        per_row = (loss_mat.to(x.dtype) * mask).sum(dim=-1) / lengths  # (B,)\n"
                          "        return torch.where(rows, per_row, 0.0).sum() / rows.sum()\n"),),
            hint="an empty row's count of real tokens is 0"),
    Variant("agg_seq_mean_counts_empty_rows", 7, "GRPO mode counts empty responses in the mean over responses.",
            (_sub(E7_SEQ, "\n        return (x.sum(dim=-1) / lengths.clamp(min=1)).mean()\n"),), hint="has no mean: leave it out"),
    Variant("kl_unknown_estimator_falls_back", 8, "An unknown kl_estimator silently falls back to k3.",
            (_sub(E8_UNKNOWN, "\n    else:\n        kl = torch.exp(log_ratio) - 1.0 - log_ratio\n"),), hint="is none of k1, k2 and k3"),
    Variant("kl_exp_before_mask", 8, "Takes exp of the log-ratio on every position and zeroes the padding afterwards: "
            "in float32 exp overflows on junk log-probs of -300, and the NaN gradient flows back through the select.",
            (_sub(E8_LOG_RATIO, "\n    log_ratio = ref_logprobs.to(dtype) - logprobs.to(dtype)  # (B, T)\n"),),
            hint="overflows float32 on the padding junk"),
    Variant("kl_k3_clamped", 8, "Clamps k3 to [-10, 10], as verl does: k3 and its gradient are wrong past the clamp.",
            (_sub(E8_K3, "\n        kl = torch.clamp(torch.exp(log_ratio) - 1.0 - log_ratio, min=-10.0, max=10.0)\n"),),
            hint="k3 has no clamp"),
    Variant("kl_k3_ratio_flipped", 8, "k3 with the ratio the wrong way up: exp(logprobs - ref) - 1 - (logprobs - ref).",
            (_sub(E8_K3, "\n        kl = torch.exp(-log_ratio) - 1.0 + log_ratio\n"),), hint="other way up"),
    Variant("kl_k1_sign", 8, "k1 as ref_logprobs - logprobs.", (_sub(E8_K1, "\n        kl = log_ratio\n"),), hint="the sign is flipped"),
    Variant("kl_k2_no_half", 8, "k2 without the factor 1/2.", (_sub(E8_K2, "\n        kl = log_ratio ** 2\n"),), hint="half the squared log-ratio"),
    Variant("kl_k3_no_minus_one", 8, "k3 without the - 1.", (_sub(E8_K3, "\n        kl = torch.exp(log_ratio) - log_ratio\n"),),
            hint="subtract the 1"),
]

_ALT_GRPO_LOOP = """\
    with torch.no_grad():
        r = rewards.double()
        scores = torch.zeros_like(r)
        for g in torch.unique(group_ids):
            members = group_ids == g
            centred = r[members] - r[members].mean()
            if norm_by_std and int(members.sum()) > 1:
                centred = centred / (torch.std(r[members]) + eps)
            scores[members] = centred
        return scores[:, None] * response_mask.double()
"""
_ALT_GRPO_SCATTER = """\
    with torch.no_grad():
        r = rewards.float()
        ids, group = torch.unique(group_ids, return_inverse=True)
        count = torch.zeros(len(ids)).scatter_add_(0, group, torch.ones_like(r))
        mean = torch.zeros(len(ids)).scatter_add_(0, group, r) / count
        centred = r - mean.gather(0, group)
        if norm_by_std:
            var = torch.zeros(len(ids)).scatter_add_(0, group, centred ** 2) / torch.clamp(count - 1, min=1)
            centred = centred / (var.sqrt().gather(0, group) + eps)
        return torch.where(response_mask.bool(), centred.unsqueeze(1), torch.zeros(()))
"""
_ALT_AGG_LOOP = """\
    mask = response_mask.bool()
    if loss_agg_mode not in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        raise ValueError(loss_agg_mode)
    per_row = [loss_mat[b][mask[b]].float() for b in range(loss_mat.shape[0])]
    if loss_agg_mode == "token-mean":
        return torch.cat(per_row).mean()
    if loss_agg_mode == "seq-mean-token-mean":
        return torch.stack([row.mean() for row in per_row if row.numel()]).mean()
    return torch.stack([row.sum() for row in per_row]).sum() / (len(per_row) * max_response_length)
"""
_ALT_KL_MULTIPLY = """\
    m = response_mask.float()
    x = (ref_logprobs.float() - logprobs.float()) * m
    kl = {"k1": lambda: -x, "k2": lambda: x * x / 2, "k3": lambda: torch.expm1(x) - x}
    if kl_estimator not in kl:
        raise ValueError(kl_estimator)
    return kl[kl_estimator]() * m
"""

PART2_ALTERNATIVES: list[Variant] = [
    Variant("alt_grpo_loop_torch_std", 0, "A Python loop over groups with torch.std, a group of one special-cased, in float64.",
            (_replace_region(6, _ALT_GRPO_LOOP),)),
    Variant("alt_grpo_scatter_float32", 0, "scatter_add_ and gather, everything in float32.",
            (_replace_region(6, _ALT_GRPO_SCATTER),)),
    Variant("alt_agg_loop_rows", 0, "Boolean indexing row by row, float32.", (_replace_region(7, _ALT_AGG_LOOP),)),
    Variant("alt_kl_mask_multiply_expm1", 0, "Multiplies by the mask instead of selecting, expm1 for k3, float32.",
            (_replace_region(8, _ALT_KL_MULTIPLY),)),
]
