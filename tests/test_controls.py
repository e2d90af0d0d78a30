"""course.controls: a control run's report against the recipe's, recomputed from small synthetic
per-problem files whose figures are worked out by hand below."""

import json
from pathlib import Path

import pytest
import yaml

from assignment.trainer.runlog import write_gz
from course import controls

QUESTIONS = [f"q{i}" for i in range(6)]


def record(question: str, answer: str | None, reference: str, length: int) -> dict:
    return {"question": question, "reference": reference, "response": "...", "answer": answer,
            "correct": answer == reference, "marker": None if answer is None else "boxed", "length": length,
            "finished": True}


def folder(root: Path, name: str, before: list, after: list, reward: dict, seed: int = 0) -> Path:
    """A report folder: config.yaml and the two evaluations. ``before``/``after``: per problem
    (answer, length), the reference answer being '1' everywhere."""
    out = root / name
    out.mkdir()
    (out / "config.yaml").write_text(yaml.safe_dump({"reward": reward, "train": {"seed": seed, "output_dir": f"runs/{name}"}}))
    for file, rows in (("eval_before.jsonl.gz", before), ("eval_after.jsonl.gz", after)):
        lines = [json.dumps(record(q, answer, "1", length)) for q, (answer, length) in zip(QUESTIONS, rows)]
        write_gz(("\n".join(lines) + "\n").encode(), out / file)
    (root / f"{name}.md").write_text(f"# {name}\n\nthe report\n")
    return out


# Both runs start from the same six outcomes: right on q0, q1; wrong but answered on q2, q3; no answer on q4, q5.
BEFORE = [("1", 100), ("1", 120), ("2", 300), ("3", 200), (None, 400), (None, 400)]
RECIPE_AFTER = [("1", 90), ("1", 110), ("1", 150), ("1", 130), ("1", 170), (None, 400)]  # 3 gained, 0 lost
CONTROL_AFTER = [("1", 90), ("7", 50), ("2", 60), ("3", 70), ("5", 80), ("6", 90)]  # 1 lost; every problem answered


@pytest.fixture
def runs(tmp_path):
    recipe = folder(tmp_path, "recipe", BEFORE, RECIPE_AFTER, {"kind": "correct"})
    control = folder(tmp_path, "control", BEFORE, CONTROL_AFTER, {"kind": "format"})
    return control, recipe


def test_the_figures_of_each_run_before_and_after(runs):
    text = controls.comparison(*runs)
    assert "`reward.kind=format`, the recipe's run on `reward.kind=correct`" in text
    assert "differ in nothing else but where the runs' files went" in text
    for row in ("| greedy accuracy | 33.3% (2) | 83.3% (5) | 33.3% (2) | 16.7% (1) |",
                "| answered (a readable final answer) | 66.7% (4) | 83.3% (5) | 66.7% (4) | 100.0% (6) |",
                "| accuracy among the answered | 50.0% | 100.0% | 50.0% | 16.7% |",
                "| mean response length (tokens) | 253 | 175 | 253 | 73 |",  # 1520/6, 1050/6, 440/6
                "| mean length of wrong answers | 325 | 400 | 325 | 70 |",  # 1300/4; q5 alone; 350/5
                "| mean length of right answers | 110 | 130 | 110 | 90 |"):
        assert row in text, row


def test_the_paired_tests_count_each_problem_once_per_pair(runs):
    text = controls.comparison(*runs)
    # 3 gained, 0 lost: p = 2 / 2**3; 0 gained, 1 lost: p = 1; control after -> recipe after: 4 / 0, p = 2 / 2**4.
    for row in ("| correct | recipe, before -> after | 3 / 0 | 0.25 |", "| correct | control, before -> after | 0 / 1 | 1 |",
                "| correct | control after -> recipe after | 4 / 0 | 0.12 |",
                "| correct | control before -> recipe before | 0 / 0 | 1 |",
                "| answered | recipe, before -> after | 1 / 0 | 1 |", "| answered | control, before -> after | 2 / 0 | 0.5 |",
                "| answered | control after -> recipe after | 0 / 1 | 1 |"):
        assert row in text, row
    assert "recipe +50.0 points, control -16.7" in text


def test_a_config_that_differs_beyond_the_reward_kind_is_named(tmp_path):
    recipe = folder(tmp_path, "recipe", BEFORE, RECIPE_AFTER, {"kind": "correct"})
    control = folder(tmp_path, "control", BEFORE, CONTROL_AFTER, {"kind": "random", "random_p": 0.3}, seed=1)
    assert "**Their configs also differ in train.seed: not a clean control.**" in controls.comparison(control, recipe)


def test_unpaired_problems_are_refused(tmp_path, capsys):
    recipe = folder(tmp_path, "recipe", BEFORE, RECIPE_AFTER, {"kind": "correct"})
    control = folder(tmp_path, "control", BEFORE, CONTROL_AFTER, {"kind": "format"})
    rows = [json.dumps(record(f"other{i}", "1", "1", 5)) for i in range(6)]
    write_gz(("\n".join(rows) + "\n").encode(), control / "eval_after.jsonl.gz")
    assert controls.main([str(control.with_suffix(".md")), "--recipe", str(recipe)]) == 2
    assert "not the same problems in the same order" in capsys.readouterr().err


def test_the_cli_writes_the_section_once_and_checks_it(runs, capsys):
    control, recipe = runs
    page = control.with_suffix(".md")
    args = [str(page), "--recipe", str(recipe)]
    assert controls.main([*args, "--check"]) == 1  # no section yet
    assert controls.main(args) == 0
    written = page.read_text()
    assert written.startswith("# control\n\nthe report\n\n" + controls.BEGIN) and written.count(controls.BEGIN) == 1
    assert controls.main(args) == 0 and page.read_text() == written  # replaced in place, not appended again
    assert controls.main([*args, "--check"]) == 0
    page.write_text(written.replace("| 83.3% (5) |", "| 90.0% (5) |", 1))  # an edit by hand
    assert controls.main([*args, "--check"]) == 1
    assert "stale" in capsys.readouterr().err


def test_a_missing_folder_is_a_message_not_a_traceback(tmp_path, capsys):
    (tmp_path / "nothing.md").write_text("# nothing\n")
    assert controls.main([str(tmp_path / "nothing.md"), "--recipe", str(tmp_path / "recipe")]) == 2
    assert "course.controls:" in capsys.readouterr().err


ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted((ROOT / "reports").glob("gsm8k_control_*.md"))


@pytest.mark.parametrize("page", COMMITTED or [pytest.param(None, marks=pytest.mark.skip(reason="no control run is committed yet"))])
def test_each_committed_control_page_holds_its_current_clean_comparison(page):
    """Once a control run is committed, its page's comparison is what its files and the shipped
    recipe run's give, and the two configs differ only in the reward's kind."""
    recipe = ROOT / "reports" / "gsm8k_qwen_coder"
    assert controls.main([str(page), "--recipe", str(recipe), "--check"]) == 0
    assert "not a clean control" not in controls.comparison(page.with_suffix(""), recipe)
