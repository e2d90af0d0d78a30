"""The exercises as data: names, signatures and outputs, in the order the handout teaches.

Part I is the five PPO exercises, graded out of 100 points. Part II (exercises 6-8: GRPO's group
advantage, the loss aggregation modes, the KL estimators) is optional and graded as bonus
points beside them; ``Exercise.part`` says which part an exercise belongs to.

This is the single source of what the autograder reads from a submission. The stub generator,
the grader's checks, its worker (the reference "oracle" of exercise 5), the test corpus and
the handout's tables all derive from it or are tested against it. The semantics (what each
function must compute) are stated in handout.md, section 4, "The contract" (Part I), and
section 8 (Part II).

Shapes: ``B`` responses, ``T`` padded response length, ``P`` padded prompt length, ``V``
vocabulary size.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exercise:
    """One graded function of the exercise module."""

    number: int
    name: str
    # Parameter names, in signature order.
    params: tuple[str, ...]
    # The tensor parameters among them (the rest are Python scalars or objects).
    tensor_params: tuple[str, ...]
    # Names of the returned values, in order (a single name: one tensor, not a tuple).
    outputs: tuple[str, ...]
    # Outputs of shape (B, T); the others are scalars of shape ().
    per_token_outputs: tuple[str, ...]
    # The input whose gradient the contract speaks about: it must reach ``outputs[0]`` (exercises
    # 1-3, 7, 8) or must not reach any output (exercises 4, 6). None for exercise 5.
    grad_param: str | None
    # One line for the handout's table.
    summary: str
    # 1: Part I, the 100 points; 2: Part II, bonus points graded apart.
    part: int = 1

    @property
    def scalar_params(self) -> tuple[str, ...]:
        return tuple(p for p in self.params if p not in self.tensor_params)

    def signature(self) -> str:
        """``name(a, b, c)``, as the handout's table writes it."""
        return f"{self.name}({', '.join(self.params)})"


EXERCISES: tuple[Exercise, ...] = (
    Exercise(1, "compute_policy_loss",
             ("logprobs_new", "logprobs_old", "advantages", "response_mask", "clip_ratio"),
             ("logprobs_new", "logprobs_old", "advantages", "response_mask"),
             ("loss", "clip_frac", "approx_kl"), (), "logprobs_new",
             "the clipped surrogate objective that trains the actor"),
    Exercise(2, "compute_value_loss",
             ("values_new", "values_old", "returns", "response_mask", "clip_range_value"),
             ("values_new", "values_old", "returns", "response_mask"),
             ("loss", "clip_frac"), (), "values_new",
             "the clipped regression that trains the critic"),
    Exercise(3, "compute_entropy_loss",
             ("logits", "response_mask"), ("logits", "response_mask"),
             ("loss",), (), "logits",
             "the exploration bonus"),
    Exercise(4, "compute_gae_advantages",
             ("final_rewards", "kl_penalties", "values", "response_mask", "gamma", "lam"),
             ("final_rewards", "kl_penalties", "values", "response_mask"),
             ("advantages", "returns"), ("advantages", "returns"), "values",
             "per-token advantages and returns from one reward per response"),
    Exercise(5, "ppo_minibatch_update",
             ("model", "optimizer", "minibatch", "cfg", "step_optimizer"), (),
             ("metrics",), (), None,
             "one minibatch: forward, slice, losses, backward, optimizer step"),
    # Part II (bonus): GRPO and Dr. GRPO (handout.md, section 8).
    Exercise(6, "compute_grpo_advantages",
             ("rewards", "group_ids", "response_mask", "norm_by_std", "eps"),
             ("rewards", "group_ids", "response_mask"),
             ("advantages",), ("advantages",), "rewards",
             "GRPO's group-relative advantage (Dr. GRPO: without the std)", part=2),
    Exercise(7, "aggregate_loss",
             ("loss_mat", "response_mask", "loss_agg_mode", "max_response_length"),
             ("loss_mat", "response_mask"),
             ("loss",), (), "loss_mat",
             "a per-token loss to one scalar: token-mean, GRPO's or Dr. GRPO's mode", part=2),
    Exercise(8, "compute_kl",
             ("logprobs", "ref_logprobs", "response_mask", "kl_estimator"),
             ("logprobs", "ref_logprobs", "response_mask"),
             ("kl",), ("kl",), "logprobs",
             "the per-token KL estimators k1, k2, k3 against the reference", part=2),
)

NAMES: tuple[str, ...] = tuple(e.name for e in EXERCISES)
BY_NAME: dict[str, Exercise] = {e.name: e for e in EXERCISES}
PART_I: tuple[Exercise, ...] = tuple(e for e in EXERCISES if e.part == 1)
PART_II: tuple[Exercise, ...] = tuple(e for e in EXERCISES if e.part == 2)
PART_I_NAMES: tuple[str, ...] = tuple(e.name for e in PART_I)
PART_II_NAMES: tuple[str, ...] = tuple(e.name for e in PART_II)


def exercise(number: int) -> Exercise:
    """Exercise ``number`` (1-8)."""
    return EXERCISES[number - 1]


def is_bonus(number: int) -> bool:
    """True for Part II's exercises, graded as bonus points beside Part I's 100."""
    return number > 0 and exercise(number).part == 2


# Exercise 7's modes (verl's ``loss_agg_mode`` names) and exercise 8's estimators.
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")


# Exercise 5: what the minibatch dict holds, what cfg provides, and the metrics it returns.
MINIBATCH_TENSORS = ("input_ids", "attention_mask", "response_ids", "response_mask", "logprobs_old",
                     "values_old", "advantages", "returns")
UPDATE_CFG_FIELDS = ("temperature", "clip_ratio", "clip_range_value", "vf_coeff", "entropy_coeff",
                     "grad_accum_steps", "max_grad_norm")
METRIC_KEYS = ("loss/policy", "loss/value", "loss/entropy", "loss/total", "stats/policy_clipfrac",
               "stats/value_clipfrac", "stats/approx_kl")
STEP_METRIC_KEYS = METRIC_KEYS + ("stats/grad_norm",)
