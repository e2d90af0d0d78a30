"""assignment/contract.py is the one source of the five names and signatures: everything that
restates them (the handout, the answer key, the generated blanks, the grader's checks and
settings, the corpus) must agree with it."""

import inspect
import re
from pathlib import Path

import pytest

from assignment import contract
from autograder.exercises import CHECKS
from autograder.exercises import update as update_checks

ROOT = Path(__file__).resolve().parent.parent
HANDOUT = (ROOT / "handout.md").read_text()


def test_the_handouts_table_lists_the_contract():
    rows = re.findall(r"^\| (\d) \| `(\w+)\(([^)]*)\)` \| ([^|]+) \|$", HANDOUT, flags=re.M)
    assert [(int(n), name, tuple(p.split(", ")), what.strip()) for n, name, p, what in rows] == \
        [(e.number, e.name, e.params, e.summary) for e in contract.EXERCISES]


def test_the_handouts_sections_name_each_signature():
    headings = re.findall(r"^### Exercise (\d): `([^`]+)`$", HANDOUT, flags=re.M)
    assert headings == [(str(e.number), e.signature()) for e in contract.EXERCISES]


@pytest.mark.parametrize("module", ["solutions.exercises", "assignment.exercises"])
def test_the_answer_key_and_the_blanks_have_the_contracts_signatures(module):
    loaded = __import__(module, fromlist=["_"])
    for e in contract.EXERCISES:
        assert tuple(inspect.signature(getattr(loaded, e.name)).parameters) == e.params


def test_the_grader_checks_exactly_the_contracts_exercises():
    assert sorted(CHECKS) == [e.number for e in contract.EXERCISES]
    for e in contract.EXERCISES[:4]:
        assert e.grad_param in e.tensor_params and "response_mask" in e.tensor_params
    assert set(update_checks.CFG_CHOICES) | {"grad_accum_steps"} == set(contract.UPDATE_CFG_FIELDS)


def test_the_handout_states_the_hidden_points_grading_yaml_gives():
    from autograder import config
    from autograder.exercises import CHECK_IDS

    cfg = config.load(ROOT / "grading.yaml", CHECK_IDS)
    hidden = [sum(c.points for c in cfg.exercises[n].values() if c.visibility != "visible") for n in sorted(cfg.exercises)]
    visible = sum(c.points for ex in cfg.exercises.values() for c in ex.values() if c.visibility == "visible")
    text = " ".join(HANDOUT.split())
    assert f"visible checks ({visible:g} of the 100 points)" in text
    numbers = ", ".join(f"{h:g}" for h in hidden[:-1]) + f" and {hidden[-1]:g}"
    assert f"hidden ones ({sum(hidden):g} points: {numbers} for exercises 1 to 5)" in text
    bonus = [sum(c.points for c in cfg.bonus[n].values() if c.visibility != "visible") for n in sorted(cfg.bonus)]
    numbers = ", ".join(f"{h:g}" for h in bonus[:-1]) + f" and {bonus[-1]:g}"
    assert f"Part II's hidden checks add {sum(bonus):g} bonus points ({numbers} for exercises 6 to 8)" in text
