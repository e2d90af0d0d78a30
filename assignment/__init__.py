"""The student-facing package:

- you edit ``exercises.py``: the five graded blanks, and the only file you submit;
- you use ``helpers.py`` (masked reductions, log-probs) and ``model.py`` (the policy with its
  value head): given code, already tested, never graded;
- ``contract.py`` lists the five functions, their parameters and outputs (the handout,
  section 4, says what each computes);
- you run ``trainer/``: the PPO trainer your five functions plug into
  (``ppo-train`` or ``python -m assignment.trainer``). You never need to edit it.
"""

from assignment.contract import NAMES as EXERCISES  # the five graded names, in the handout's order

__all__ = ["EXERCISES"]
