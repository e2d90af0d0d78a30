"""The reward controls (reward.kind random | format): what each pays for, that the other reward
terms are the same under every kind, that the random coin moves no random generator, and that a
control run is still evaluated on the true answers."""

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from assignment.trainer import cli
from assignment.trainer.config import ConfigError, RewardConfig, load_config
from assignment.trainer.impl import load_impl
from assignment.trainer.loop import train
from assignment.trainer.reward import control_draw, extract_answer, score
from assignment.trainer.runlog import read_jsonl

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("response, reference, expected", [
    ("so \\boxed{4}", "4", 1.0), ("so \\boxed{5}", "4", 1.0), ("#### 17", "4", 1.0),  # any readable answer
    ("the answer is 4", "4", 0.0), ("\\boxed{\\frac{1}{2}}", "4", 0.0),  # none: no pay, even when right in words
])
def test_the_format_control_pays_any_readable_answer_whatever_its_value(response, reference, expected):
    scored = score(response, reference, True, 5, RewardConfig(kind="format", format_bonus=0.0))
    assert scored.reward == expected
    assert scored.correct == (scored.answer == reference)  # the true outcome, not what was paid


def test_the_random_control_pays_its_coin_whatever_the_response():
    cfg = RewardConfig(kind="random", random_p=0.3, format_bonus=0.0)
    for draw, paid in ((0.0, 1.0), (0.2999, 1.0), (0.3, 0.0), (0.9, 0.0)):
        rewards = {score(text, "4", True, 5, cfg, draw).reward for text in ("#### 4", "#### 5", "no answer", "")}
        assert rewards == {paid}, (draw, rewards)
    with pytest.raises(ValueError, match="control_draw"):
        score("#### 4", "4", True, 5, cfg)  # a random reward without its coin is a bug, not a 0


@pytest.mark.parametrize("kind", ["correct", "random", "format"])
def test_every_other_reward_term_pays_the_same_under_every_kind(kind):
    """Everything else equal: the format bonus, truncation and per-token terms do not depend on the kind."""
    shaping = dict(format_bonus=0.2, format_bonus_when="reasoning", min_reasoning_words=2, truncation_reward=-0.5,
                   per_token_reward=-0.01)
    for text, finished, tokens in (("two words #### 5", False, 30), ("#### 4", True, 3), ("nothing", True, 7)):
        for draw in (0.1, 0.9):
            control = score(text, "4", finished, tokens, RewardConfig(kind=kind, **shaping), draw)
            base = score(text, "4", finished, tokens, RewardConfig(**shaping))
            term = {"correct": control.correct, "format": control.formatted, "random": draw < 0.2}[kind]
            assert control.reward - float(term) == pytest.approx(base.reward - float(base.correct))
            assert (control.correct, control.formatted, control.answer) == (base.correct, base.formatted, base.answer)


def test_the_coin_is_a_fixed_uniform_function_of_seed_step_and_index():
    draws = [control_draw(0, step, index) for step in range(1, 41) for index in range(256)]
    assert all(0.0 <= d < 1.0 for d in draws) and draws == [control_draw(0, s, i) for s in range(1, 41) for i in range(256)]
    assert len(set(draws)) == len(draws)  # 10240 distinct 64-bit fractions
    # As many heads as Binomial(10240, 0.2) gives, within 5 standard deviations (a fixed hash: this
    # either holds for these triples or not, the bound says what a fair coin would do).
    heads = sum(d < 0.2 for d in draws)
    assert abs(heads - 0.2 * len(draws)) <= 5 * math.sqrt(len(draws) * 0.2 * 0.8), heads
    assert control_draw(1, 1, 0) != control_draw(0, 1, 0) != control_draw(0, 2, 0) != control_draw(0, 1, 1)


def test_drawing_the_coin_moves_no_random_generator():
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    states = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone()
    [control_draw(7, step, i) for step in range(5) for i in range(64)]
    assert random.getstate() == states[0] and (np.random.get_state()[1] == states[1]).all()
    assert torch.equal(torch.get_rng_state(), states[2])


@pytest.mark.parametrize("override, message", [
    ("reward.kind=coin", "reward.kind must be one of correct, random, format, got 'coin'"),
    ("reward.random_p=1.5", r"reward.random_p must be in \[0, 1\]"),
])
def test_a_bad_kind_or_probability_is_a_config_error_naming_the_choices(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_a_control_refuses_a_bonus_paid_only_for_the_right_answer():
    with pytest.raises(ConfigError, match="format_bonus_when=correct would pay for the right answer"):
        load_config(None, ["reward.kind=random", "reward.format_bonus=0.1", "reward.format_bonus_when=correct"])
    load_config(None, ["reward.kind=random", "reward.format_bonus=0", "reward.format_bonus_when=correct"])  # no bonus: fine


def test_the_cli_names_the_choices_without_a_traceback(capsys):
    assert cli.main(["--config", "configs/cpu_synthetic.yaml", "reward.kind=coin"]) == 2
    err = capsys.readouterr().err
    assert "reward.kind must be one of correct, random, format" in err and "Traceback" not in err


def test_the_control_configs_are_the_recipe_but_for_the_reward_kind_and_the_output(monkeypatch):
    monkeypatch.setenv("MODEL_DIR", "/models")
    recipe = load_config(ROOT / "configs" / "gsm8k_qwen_coder.yaml")
    assert recipe.reward.kind == "correct"
    for kind in ("random", "format"):
        control = load_config(ROOT / "configs" / f"gsm8k_control_{kind}.yaml")
        assert control.reward.kind == kind and control.train.output_dir == f"runs/gsm8k_control_{kind}"
        for section in ("model", "data", "rollout", "ppo", "kl", "eval"):
            assert getattr(control, section) == getattr(recipe, section), section
        assert {**vars(control.train), "output_dir": None} == {**vars(recipe.train), "output_dir": None}
        assert {**vars(control.reward), "kind": None} == {**vars(recipe.reward), "kind": None}
    assert load_config(ROOT / "configs" / "gsm8k_control_random.yaml").reward.random_p == 0.2


def test_a_random_control_run_samples_as_the_task_run_does_and_is_evaluated_on_the_truth(tmp_path):
    """Two steps of the CPU task under the task's reward and under the random control: the first
    step's responses are the same (the coin moved no generator), its rewards are the coins, the
    sampled correct rate is the truth under both, and the greedy evaluation scores true answers."""
    impl = load_impl(str(ROOT / "solutions" / "exercises.py"))
    common = ["model.hidden_size=32", "rollout.batch_size=8", "ppo.minibatch_size=4", "ppo.epochs=1",
              "rollout.max_new_tokens=4", "eval.size=8", "train.steps=2", "train.progress=false", "train.sample_every=1",
              "train.num_samples=8", "train.tensorboard=false", "train.cpu_threads=1", "reward.format_bonus=0",
              "train.seed=5"]
    runs = {}
    for kind in ("correct", "random"):
        cfg = load_config(None, [*common, f"reward.kind={kind}", "reward.random_p=0.5",
                                 f"train.output_dir={tmp_path / kind}"])
        runs[kind] = train(cfg, impl)
    first = {kind: [s for s in result.samples if s["step"] == 1] for kind, result in runs.items()}
    assert [s["response"] for s in first["random"]] == [s["response"] for s in first["correct"]]
    assert [s["reward"] for s in first["random"]] == [float(control_draw(5, 1, i) < 0.5) for i in range(8)]
    truth = [float(extract_answer(s["response"]) == s["reference"]) for s in first["correct"]]
    assert [s["reward"] for s in first["correct"]] == truth  # the task's reward is the truth here
    assert runs["random"].metrics[0]["rollout/correct_rate"] == runs["correct"].metrics[0]["rollout/correct_rate"]
    for kind, result in runs.items():
        records = read_jsonl(result.output_dir / "eval_samples" / "step_2.jsonl")
        assert all(r["correct"] == (r["answer"] == r["reference"]) for r in records)
        assert result.evals[-1]["eval/correct"] == sum(r["correct"] for r in records)
        assert [r["reward_kind"] for r in json.loads((result.output_dir / "run.json").read_text())] == [kind]
    out = tmp_path / "random_report.md"
    assert cli.main(["--report", str(runs["random"].output_dir), "--report-out", str(out)]) == 0
    summary = json.loads((tmp_path / "random_report" / "summary.json").read_text())
    assert (summary["reward_kind"], summary["reward_random_p"]) == ("random", 0.5)
    assert "**Reward control: `reward.kind=random`.** The training reward paid for a coin of probability 0.5" in out.read_text()
