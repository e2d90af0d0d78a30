"""What each exercise is graded on: one module per exercise.

Each module holds, for its exercise: the Hypothesis strategies of its inputs, the error scale
of every compared quantity (the derivation of its tolerances, see compare.py), its checks, and
the hints that name known mistakes. A check is a Hypothesis property: for a generated case,
run the reference here and the submission in the worker, and compare. Checks whose id starts
with ``hidden`` run on the secret seed, after every visible check, in a fresh worker.
Points, example counts and ``ulps`` come from grading.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hypothesis import strategies as st

from ..cases import Case, two_real_tokens

HIDDEN_PREFIX = "hidden"


@dataclass(frozen=True)
class Check:
    id: str
    description: str
    strategy: Callable[[dict], st.SearchStrategy]  # context (e.g. the grading model) -> strategy
    compare: Callable[..., list[str]]              # (case, reference, submission, ulps) -> problems
    # Whether a counterexample with rows dropped is still an input this check draws (grade.py drops
    # the rows it does not need); None: its cases have no rows to drop (exercise 5's scenarios).
    fewer_rows: Callable[[Case], bool] | None = two_real_tokens

    @property
    def hidden(self) -> bool:
        return self.id.startswith(HIDDEN_PREFIX)


def fixed(strategy: st.SearchStrategy) -> Callable[[dict], st.SearchStrategy]:
    """A strategy that needs no context."""
    return lambda context: strategy


def all_of(*compares: Callable[..., list[str]]) -> Callable[..., list[str]]:
    """Every problem of every comparison."""
    def compare(case, ref, sub, ulps):
        return [p for c in compares for p in c(case, ref, sub, ulps)]
    return compare


from . import aggregate, entropy, gae, grpo, kl, policy, update, value  # noqa: E402  (they import Check from here)

# Part I (exercises 1-5, the 100 points), then Part II (6-8, bonus; assignment/contract.py).
MODULES = {1: policy, 2: value, 3: entropy, 4: gae, 5: update, 6: grpo, 7: aggregate, 8: kl}
CHECKS: dict[int, tuple[Check, ...]] = {n: m.CHECKS for n, m in MODULES.items()}
CHECK_IDS: dict[int, tuple[str, ...]] = {n: tuple(c.id for c in checks) for n, checks in CHECKS.items()}
