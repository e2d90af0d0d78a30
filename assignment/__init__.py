"""The student-facing package: the exercise module (``exercises.py``) and what it builds on.

Students edit exactly one file, ``assignment/exercises.py``. Everything else here is given.
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
