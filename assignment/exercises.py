"""The five PPO exercises: the core of a PPO trainer for language models.

This is the only file you edit. Fill in the five blanks, in order:

    1. compute_policy_loss     the clipped surrogate objective (the actor)
    2. compute_value_loss      the clipped value regression (the critic)
    3. compute_entropy_loss    the exploration bonus
    4. compute_gae_advantages  per-token advantages and returns, from one reward per response
    5. ppo_minibatch_update    forward, slice, the three losses, backward, optimizer step

Every function follows the contract (handout.md, section 4) to the letter; the autograder
compares your numbers with the reference on thousands of generated inputs.

Part II (optional, bonus points; handout.md, section 8) adds three more blanks at the end of
the file, for GRPO and Dr. GRPO on the same trainer:

    6. compute_grpo_advantages  the group-relative advantage that replaces the critic
    7. aggregate_loss           a per-token loss to one scalar, in the modes the field uses
    8. compute_kl               the per-token KL estimators k1, k2 and k3

Shapes used in every docstring:
    B  batch size (number of responses)
    T  padded response length
    P  padded prompt length
    V  vocabulary size

``response_mask`` (B, T) is 1 (or True) on real response tokens and 0 on padding, and it is
right-padded: ones, then zeros. A row may be all zeros (an empty response), but a batch
always holds at least two real tokens. "Token-mean" is the sum over all real tokens of the
batch divided by their number: use ``masked_mean`` from ``assignment.helpers``.
Whatever sits at padded positions of an input is finite junk (the log-probs and values a
trainer computes for pad tokens; the grader puts numbers of up to a few hundred there): it
must not change any result.
"""

from __future__ import annotations

from typing import Any

import torch

from assignment.helpers import logprobs_from_logits, masked_mean, masked_whiten, reduction_dtype

# TRY NOT TO MODIFY anything outside the eight marked blanks (five, and Part II's three): the
# autograder calls these functions by name with exactly these signatures.


def compute_policy_loss(
    logprobs_new: torch.Tensor,
    logprobs_old: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exercise 1: the PPO clipped surrogate loss (Schulman et al. 2017, eq. 7).

    Math, per real token t:
        ratio_t = exp(logprobs_new_t - logprobs_old_t)
        loss_t  = max(-A_t * ratio_t, -A_t * clamp(ratio_t, 1 - clip_ratio, 1 + clip_ratio))
    loss      = token-mean(loss_t)
    clip_frac = token-mean([-A_t * clamp(ratio_t, ...) > -A_t * ratio_t])   (strict >)
    approx_kl = token-mean(logprobs_old_t - logprobs_new_t)                  (the k1 estimator)

    Args:
        logprobs_new: (B, T) log-probs of the response tokens under the current policy;
            carries gradient.
        logprobs_old: (B, T) log-probs of the same tokens at rollout time; no gradient.
        advantages: (B, T) whitened advantages A_t; no gradient.
        response_mask: (B, T) 1/True on real tokens.
        clip_ratio: epsilon of the clip range [1 - eps, 1 + eps].

    Returns:
        loss: () scalar whose gradient reaches ``logprobs_new``.
        clip_frac: () scalar, fraction of real tokens where the clipped term is active; no gradient.
        approx_kl: () scalar, k1 estimate of KL(old || new); no gradient.

    Hints:
        1.1 Work with the log-ratio and exponentiate once; never divide two probabilities.
        1.2 Both surrogate terms carry a minus sign: we minimise the loss.
        1.3 Take the elementwise maximum of the two terms (torch.maximum), then masked_mean.
        1.4 The two metrics are diagnostics: compute them under torch.no_grad() or .detach() them.
    """
    # YOUR CODE HERE (exercise 1)
    raise NotImplementedError("Exercise 1 (compute_policy_loss) is not implemented yet")


def compute_value_loss(
    values_new: torch.Tensor,
    values_old: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip_range_value: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 2: the clipped value loss of the critic.

    Math, per real token t:
        v_clip_t = values_old_t + clamp(values_new_t - values_old_t, -clip_range_value, clip_range_value)
        loss_t   = max((values_new_t - R_t)**2, (v_clip_t - R_t)**2)
    loss      = 0.5 * token-mean(loss_t)
    clip_frac = token-mean([(v_clip_t - R_t)**2 > (values_new_t - R_t)**2])   (strict >)

    Args:
        values_new: (B, T) V(s_t) from the current value head; carries gradient.
        values_old: (B, T) V(s_t) recorded at rollout time; no gradient.
        returns: (B, T) regression targets R_t (from exercise 4); no gradient.
        response_mask: (B, T) 1/True on real tokens.
        clip_range_value: how far the new value may move from the old one.

    Returns:
        loss: () scalar whose gradient reaches ``values_new``.
        clip_frac: () scalar, fraction of real tokens where the clipped error is the larger; no gradient.

    Hints:
        2.1 Clip the change (values_new - values_old), then add it back to values_old.
        2.2 Take the elementwise maximum of the two squared errors (pessimistic, like exercise 1).
        2.3 Do not forget the factor 0.5.
    """
    # YOUR CODE HERE (exercise 2)
    raise NotImplementedError("Exercise 2 (compute_value_loss) is not implemented yet")


def compute_entropy_loss(logits: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Exercise 3: the entropy bonus, as a loss to minimise.

    Math, per real token t with logits z = logits[b, t, :]:
        H_t = logsumexp(z) - sum_v softmax(z)_v * z_v      (= -sum_v p_v log p_v)
    loss = -token-mean(H_t)

    Args:
        logits: (B, T, V) logits already aligned with the response tokens (and already divided
            by the sampling temperature by the caller).
        response_mask: (B, T) 1/True on real tokens.

    Returns:
        loss: () scalar, minus the token-mean entropy; minimising it raises entropy.

    Hints:
        3.1 Never compute log(softmax(z)) naively: softmax underflows to 0 and log(0) = -inf.
            logsumexp and softmax are both stable for logits of any magnitude (try 1e3).
        3.2 Reduce over the vocabulary first (dim=-1), giving (B, T), then masked_mean.
        3.3 Upcast bfloat16 logits to float32 before the arithmetic.
    """
    # YOUR CODE HERE (exercise 3)
    raise NotImplementedError("Exercise 3 (compute_entropy_loss) is not implemented yet")


def compute_gae_advantages(
    final_rewards: torch.Tensor,
    kl_penalties: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 4: Generalized Advantage Estimation (Schulman et al. 2016) with whitening.

    Token rewards: r_t = -kl_penalties_t on real tokens, and final_rewards[b] is added at the
    last real token of row b, index L_b - 1 (L_b = number of real tokens of row b). A row with
    no real tokens gets nothing.

    Backward recursion over t = T-1, ..., 0, with V_T = 0, m_T = 0, A_T = 0 and m = response_mask:
        delta_t = r_t + gamma * V_{t+1} * m_{t+1} - V_t
        A_t     = delta_t + gamma * lam * m_{t+1} * A_{t+1}
    returns = A + values                          (from the unwhitened A)
    advantages = (A - mean) / sqrt(var + 1e-8)    (mean, var over real tokens; var with n - 1)

    Args:
        final_rewards: (B,) one score per whole response.
        kl_penalties: (B, T) already kl_coeff * (logprobs_old - ref_logprobs).
        values: (B, T) V(s_t) recorded at rollout time.
        response_mask: (B, T) 1/True on real tokens, right-padded.
        gamma: discount factor in [0, 1].
        lam: GAE lambda in [0, 1].

    Returns:
        advantages: (B, T) whitened advantages; no gradient.
        returns: (B, T) value targets; no gradient.

    Hints:
        4.1 Build the (B, T) token rewards first; row b's last real token is at index L_b - 1.
        4.2 Loop t from T-1 down to 0: each A_t needs A_{t+1}, so the loop must run backwards.
        4.3 The factor m_{t+1} stops values and advantages leaking in from padding.
        4.4 Compute returns before whitening; whiten with masked_whiten.
        4.5 Nothing here needs gradients: work under torch.no_grad().
    """
    # YOUR CODE HERE (exercise 4)
    raise NotImplementedError("Exercise 4 (compute_gae_advantages) is not implemented yet")


def ppo_minibatch_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    minibatch: dict[str, Any],
    cfg: Any,
    step_optimizer: bool,
) -> dict[str, float]:
    """Exercise 5: one PPO minibatch: forward, losses, backward, and maybe an optimizer step.

    ``model(input_ids, attention_mask)`` returns ``(logits (B, P+T, V), values (B, P+T))``.
    The logits at position i predict token i+1, so the response tokens at positions
    P ... P+T-1 are predicted by positions P-1 ... P+T-2: slice ``[P-1 : P+T-1]``, for the
    logits and for the values alike.

    Steps:
        logits, values = model(input_ids, attention_mask)
        logits     = logits[:, P-1:P+T-1] / cfg.temperature        (B, T, V)
        values_new = values[:, P-1:P+T-1]                           (B, T)
        logprobs_new = log-softmax(logits) gathered at response_ids  (B, T)
        loss = policy_loss + cfg.vf_coeff * value_loss + cfg.entropy_coeff * entropy_loss
        (loss / cfg.grad_accum_steps).backward()
        if step_optimizer:
            grad_norm = clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step() only if grad_norm is finite
            optimizer.zero_grad()

    Args:
        model: policy with value head, as above.
        optimizer: optimizer over ``model.parameters()``.
        minibatch: dict with
            input_ids (B, P+T) int64: left-padded prompts, then responses;
            attention_mask (B, P+T);
            response_ids (B, T) int64; response_mask (B, T);
            logprobs_old, values_old, advantages, returns: (B, T), no gradient;
            prompt_length: the int P.
        cfg: has temperature, clip_ratio, clip_range_value, vf_coeff, entropy_coeff,
            grad_accum_steps, max_grad_norm.
        step_optimizer: true on the last minibatch of an accumulation cycle.

    Returns:
        dict of Python floats: loss/policy, loss/value, loss/entropy (= -H), loss/total,
        stats/policy_clipfrac, stats/value_clipfrac, stats/approx_kl, and stats/grad_norm
        only when it stepped.

    Hints:
        5.1 Slice first, then divide by the temperature: no need to scale prompt logits.
        5.2 logprobs_from_logits in assignment.helpers does the log-softmax and the gather.
        5.3 Call compute_policy_loss, compute_value_loss and compute_entropy_loss by name; the
            entropy uses the same sliced, temperature-scaled logits.
        5.4 Divide by grad_accum_steps before backward, so that accumulated gradients average.
        5.5 Clip, step only on a finite norm, then zero the gradients, in that order.
    """
    # YOUR CODE HERE (exercise 5)
    raise NotImplementedError("Exercise 5 (ppo_minibatch_update) is not implemented yet")


# ---- Part II (bonus): GRPO and Dr. GRPO -------------------------------------------------------


def compute_grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    response_mask: torch.Tensor,
    norm_by_std: bool,
    eps: float,
) -> torch.Tensor:
    """Exercise 6: GRPO's group-relative advantage (Shao et al. 2024), or Dr. GRPO's (Liu et al. 2025).

    Responses with the same group id answer the same prompt. For response i of group g, with
    mean_g and std_g the mean and the sample standard deviation (Bessel's n - 1) of the rewards
    of group g:
        GRPO     (norm_by_std=True):   A_i = (r_i - mean_g) / (std_g + eps)
        Dr. GRPO (norm_by_std=False):  A_i = r_i - mean_g
    A group of one response has std 0 and, since r_i = mean_g, advantage 0 (its reward is its
    own baseline); a group whose rewards are all equal gets 0 too. Every response counts in
    its group, an empty one (no real token) included. A_i fills row i's real tokens; padded
    positions are 0.

    Args:
        rewards: (B,) one score per whole response.
        group_ids: (B,) int64 group of each response (any integers, in any order).
        response_mask: (B, T) 1/True on real tokens.
        norm_by_std: True for GRPO, False for Dr. GRPO.
        eps: added to std_g, so that a group with one distinct reward divides by eps, not 0.

    Returns:
        advantages: (B, T) A_i on row i's real tokens, 0 on padding; no gradient.

    Hints:
        6.1 Mean and std are per group, never over the whole batch.
        6.2 torch.std uses n - 1 by default (what the contract wants), and returns NaN for a
            single value: a group of one must give 0.
        6.3 torch.unique(group_ids, return_inverse=True) numbers the groups 0..G-1; index_add_
            or scatter_add_ then sums per group without a Python loop (a loop is fine too).
        6.4 Nothing here needs gradients: work under torch.no_grad().
    """
    # YOUR CODE HERE (exercise 6)
    raise NotImplementedError("Exercise 6 (compute_grpo_advantages) is not implemented yet")


def aggregate_loss(
    loss_mat: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    max_response_length: int,
) -> torch.Tensor:
    """Exercise 7: a per-token loss to one scalar, in verl's ``loss_agg_mode`` (TRL: ``loss_type``).

    With L_b the number of real tokens of row b and B the number of rows:
        "token-mean":               sum_{b,t} loss_bt / sum_b L_b        (Part I; TRL "bnpo")
        "seq-mean-token-mean":      mean over rows with L_b > 0 of (sum_t loss_bt / L_b)
                                    (GRPO as published; TRL "grpo")
        "seq-mean-token-sum-norm":  sum_{b,t} loss_bt / (B * max_response_length)
                                    (Dr. GRPO; TRL "dr_grpo"): one constant, the generation
                                    budget, never a response's own length
    Any other mode raises ValueError.

    Args:
        loss_mat: (B, T) per-token loss; carries gradient.
        response_mask: (B, T) 1/True on real tokens.
        loss_agg_mode: one of the three modes above.
        max_response_length: the generation budget (an int); only "seq-mean-token-sum-norm" uses it.

    Returns:
        loss: () scalar whose gradient reaches ``loss_mat``.

    Hints:
        7.1 Select padding away before summing (torch.where, or masked_sum: import it from
            assignment.helpers): junk must not leak.
        7.2 In "seq-mean-token-mean", rows with no real token have no mean: leave them out.
        7.3 "seq-mean-token-sum-norm" divides by B * max_response_length for every batch: not by
            each row's length, and not by T, the batch's padded width.
    """
    # YOUR CODE HERE (exercise 7)
    raise NotImplementedError("Exercise 7 (aggregate_loss) is not implemented yet")


def compute_kl(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_estimator: str,
) -> torch.Tensor:
    """Exercise 8: per-token estimators of KL(pi || pi_ref) (Schulman, "Approximating KL divergence").

    The tokens were sampled from pi. With log_r = ref_logprobs - logprobs, per real token:
        "k1":  -log_r                      unbiased, can be negative; Part I's PPO puts it in the reward
        "k2":  0.5 * log_r**2              biased, low variance, never negative (verl's "mse")
        "k3":  exp(log_r) - 1 - log_r      unbiased, never negative (verl's "low_var_kl");
                                           GRPO puts it in the loss
    Padded positions are 0. Any other estimator raises ValueError.

    Args:
        logprobs: (B, T) log-probs of the response tokens under the policy; carries gradient.
        ref_logprobs: (B, T) log-probs of the same tokens under the frozen reference.
        response_mask: (B, T) 1/True on real tokens.
        kl_estimator: "k1", "k2" or "k3".

    Returns:
        kl: (B, T) per-token estimate, 0 on padding; its gradient reaches ``logprobs``.

    Hints:
        8.1 The ratio in k3 is pi_ref / pi, i.e. exp(ref_logprobs - logprobs): with the ratio
            the other way up it estimates KL(pi_ref || pi), a different divergence.
        8.2 Select padding away before exp: junk log-probs there must not give inf or NaN.
        8.3 Upcast bfloat16 inputs to float32 (reduction_dtype).
    """
    # YOUR CODE HERE (exercise 8)
    raise NotImplementedError("Exercise 8 (compute_kl) is not implemented yet")
