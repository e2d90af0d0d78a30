"""course.controls: a control run's report against the recipe's, recomputed from small synthetic
per-problem files whose figures are worked out by hand below; and the committed control runs'
figures as docs/results.md, docs/training.md and the README state them, recomputed from their
per-problem files, metrics and summaries."""

import json
from pathlib import Path

import pytest
import yaml
from report_runs import joined

from assignment.trainer.ablation import evaluations
from assignment.trainer.runlog import read_jsonl, write_gz
from assignment.trainer.stats import mcnemar_exact
from course.committed import run_config
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


CONTROL_RUNS = {kind: ROOT / "reports" / f"gsm8k_control_{kind}" for kind in ("random", "format")}
RECIPE_RUN = ROOT / "reports" / "gsm8k_qwen_coder"


def answered(records: list[dict]) -> list[bool]:
    return [r["answer"] is not None for r in records]


def correct(records: list[dict]) -> list[bool]:
    return [bool(r["correct"]) for r in records]


def test_the_pages_state_the_committed_controls_figures():
    """docs/results.md's table and prose, training.md's sentence and the README's clause on the
    controls: each figure from the runs' per-problem evaluations (course.controls.figures, exact
    McNemar tests), their summary.json and metrics.jsonl."""
    records = {name: evaluations(folder) for name, folder in (("recipe", RECIPE_RUN), *CONTROL_RUNS.items())}
    f = {name: tuple(controls.figures(r) for r in pair) for name, pair in records.items()}
    summary = {name: json.loads((folder / "summary.json").read_text())
               for name, folder in (("recipe", RECIPE_RUN), *CONTROL_RUNS.items())}
    labels = {"recipe": "right answer (the recipe)", "random": "random coin", "format": "any answer (format)"}
    expected = []
    for name, (before, after) in f.items():
        test = mcnemar_exact(*(correct(r) for r in records[name]))
        expected.append(f"| {labels[name]} | {before.accuracy:.1%} -> {after.accuracy:.1%} | {test.c} / {test.b}, "
                        f"{test.p_value:.2g} | {before.answer_rate:.1%} -> {after.answer_rate:.1%} | "
                        f"{before.accuracy_answered:.1%} -> {after.accuracy_answered:.1%} | "
                        f"{before.length:.0f} -> {after.length:.0f} |")
    for kind in CONTROL_RUNS:
        assert run_config(CONTROL_RUNS[kind])["train.seed"] == 0 and summary[kind]["reward_kind"] == kind
    assert summary["random"]["reward_random_p"] == 0.2
    random_test = mcnemar_exact(*(correct(r) for r in records["random"]))
    random_answered = mcnemar_exact(*(answered(r) for r in records["random"]))
    format_answered = mcnemar_exact(*(answered(r) for r in records["format"]))
    assert random_test.after < random_test.before and format_answered.p_value < 0.01 <= random_answered.p_value
    # After training, control after -> recipe after: problems the recipe has right and the control not, and the reverse.
    ahead = {kind: mcnemar_exact(correct(records[kind][1]), correct(records["recipe"][1])) for kind in CONTROL_RUNS}
    s, fmt = summary["random"], summary["format"]
    expected += [
        f"{random_test.b} problems right before were wrong after, {random_test.c} the reverse",
        f"hardly moved ({random_answered.c} gained, {random_answered.b} lost, p = {random_answered.p_value:.2g})",
        f"stayed at the coin's rate ({s['reward_first10']:.3f} over the first 10 steps, {s['reward_last10']:.3f} over "
        f"the last 10) while its sampled answers' correct rate fell from {s['correct_rate_first10']:.3f} to "
        f"{s['correct_rate_last10']:.3f}",
        f"its KL reached {s['kl_final']:.1f} nats at the last step, near the recipe's {summary['recipe']['kl_final']:.1f}",
        f"answered {f['format'][0].answer_rate:.1%} -> {f['format'][1].answer_rate:.1%} ({format_answered.c} gained, "
        f"{format_answered.b} lost, p = {format_answered.p_value:.2g})",
        f"accuracy fell {100 * (f['format'][0].accuracy - f['format'][1].accuracy):.1f} points",
        f"Its reward was {fmt['reward_first10']:.3f} over the first 10 steps and {fmt['reward_last10']:.3f} over the last 10",
        f"(KL {fmt['kl_final']:.1f} nats at the end)",
        f"{ahead['random'].c} problems against {ahead['random'].b} over the random control (p = {ahead['random'].p_value:.2g}), "
        f"{ahead['format'].c} against {ahead['format'].b} over the format control (p = {ahead['format'].p_value:.2g})",
        f"raises the answered share to {f['format'][1].answer_rate:.1%} while accuracy falls"]
    # The format control's skipped updates: every step from the first skip after its last update, each
    # with the rewards' spread under ppo.min_reward_std.
    metrics = read_jsonl(CONTROL_RUNS["format"] / "metrics.jsonl")
    skipped = [m["step"] for m in metrics if m.get("stats/update_skipped")]
    last_update = max(m["step"] for m in metrics if not m.get("stats/update_skipped"))
    floor = run_config(CONTROL_RUNS["format"])["ppo.min_reward_std"]
    assert all(m["rollout/reward_std"] < floor for m in metrics if m.get("stats/update_skipped"))
    assert len(skipped) == fmt["skipped_updates"] and set(range(last_update + 1, len(metrics) + 1)) <= set(skipped)
    expected.append(f"from step {last_update + 1} on the rewards' spread stayed under `ppo.min_reward_std` and the "
                    f"update was skipped, {len(skipped)} of {len(metrics)} steps in all, so its "
                    f"{f['format'][1].accuracy:.1%} is the model after {len(metrics) - len(skipped)} updates")
    results = joined(ROOT / "docs" / "results.md")
    for text in expected:
        assert text in results, text
    training = (f"gained ({f['recipe'][0].accuracy:.1%} -> {f['recipe'][1].accuracy:.1%}): `random` fell to "
                f"{f['random'][1].accuracy:.1%}, `format` to {f['format'][1].accuracy:.1%} while the share of its "
                f"responses with a readable answer rose to {f['format'][1].answer_rate:.1%}")
    assert training in joined(ROOT / "docs" / "training.md"), training
    readme = f"loses accuracy (to {f['random'][1].accuracy:.1%} and {f['format'][1].accuracy:.1%})"
    assert readme in joined(ROOT / "README.md"), readme


@pytest.mark.parametrize("kind", ["random", "format"])
def test_each_control_config_states_its_run(kind):
    """The comment of configs/gsm8k_control_KIND.yaml gives its committed run's figures as the
    per-problem files give them (and for the format control, the updates its run skipped)."""
    root = Path(__file__).resolve().parents[1]
    run = root / "reports" / f"gsm8k_control_{kind}"
    before, after = (read_jsonl(run / f"eval_{when}.jsonl.gz") for when in ("before", "after"))
    test = mcnemar_exact([r["correct"] for r in before], [r["correct"] for r in after])
    answered = [sum(r["answer"] is not None for r in rows) / len(rows) for rows in (before, after)]
    comment = joined(root / "configs" / f"gsm8k_control_{kind}.yaml")
    assert (f"{test.before / 1319:.1%} -> {test.after / 1319:.1%} ({test.c} improved, {test.b} regressed, "
            f"exact McNemar p = {test.p_value:.1e})") in comment
    assert f"{answered[0]:.1%} -> {answered[1]:.1%}" in comment
    if kind == "format":
        skipped = [m["step"] for m in read_jsonl(run / "metrics.jsonl") if m.get("stats/update_skipped")]
        assert f"from step {min(s for s in skipped if all(t in skipped for t in range(s, 49)))} on every update" in comment
        assert f"({len(skipped)} of 48 in all)" in comment
