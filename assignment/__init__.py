"""The student-facing package, in three parts:

- you edit ``exercises.py``: the five graded blanks, and the only file you submit;
- you use ``helpers.py`` (masked reductions, log-probs) and ``model.py`` (the policy with its
  value head): given code, already tested, never graded;
- you run ``trainer/``: the PPO trainer your five functions plug into
  (``ppo-train`` or ``python -m assignment.trainer``). You never need to edit it.
"""

# The five graded exercises, in the order the handout teaches them (CONTRACT.md).
# The autograder, the stub generator and the handout all read this one tuple.
EXERCISES = (
    "compute_policy_loss",
    "compute_value_loss",
    "compute_entropy_loss",
    "compute_gae_advantages",
    "ppo_minibatch_update",
)
