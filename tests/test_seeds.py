"""course.seeds: Part II's ablation across seeds and the recipe's spread, on small synthetic report
folders whose figures are worked out by hand, and the committed ablation page against its folders."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from assignment.trainer.runlog import write_gz
from course import seeds

ROOT = Path(__file__).resolve().parents[1]
# Each method's config, as small as the trainer accepts: what a run folder's config.yaml must match.
CONFIGS = {"gsm8k_qwen_coder.yaml": {}, "gsm8k_qwen_coder_grpo.yaml": {"algorithm": "grpo", "rollout": {"group_size": 4}},
           "gsm8k_qwen_coder_dr_grpo.yaml": {"algorithm": "dr_grpo", "rollout": {"group_size": 4}}}
METHOD_CONFIG = {method: config for method, (config, _) in seeds.ABLATION.items()}


def write_run(reports: Path, name: str, config: dict, seed: int, before: list[int], after: list[int],
              lengths: list[int], length_wrong: list[float] | None = None, processes: int = 1) -> Path:
    """A report folder: config.yaml with ``seed``, four problems' evaluations (1 = right; the
    answers' lengths ``lengths``, the same before and after), metrics.jsonl (rollout/length_wrong per
    step where given) and run.json."""
    out = reports / name
    out.mkdir(parents=True)
    (out / "config.yaml").write_text(yaml.safe_dump({**config, "train": {"seed": seed, "output_dir": f"runs/{name}"}}))
    for file, outcomes in (("eval_before.jsonl.gz", before), ("eval_after.jsonl.gz", after)):
        records = [{"question": f"q{i}", "reference": "1", "response": "", "answer": "1" if right else "2",
                    "correct": bool(right), "marker": "boxed", "length": length, "finished": True}
                   for i, (right, length) in enumerate(zip(outcomes, lengths))]
        write_gz("".join(json.dumps(r) + "\n" for r in records).encode(), out / file)
    steps = [{"step": s + 1, "rollout/reward_mean": 0.5, "rollout/kl": 1.0,
              **({} if length_wrong is None else {"rollout/length_wrong": length_wrong[s]})} for s in range(20)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    (out / "run.json").write_text(json.dumps([{"world_size": processes}]))
    return out


@pytest.fixture
def tree(tmp_path):
    """configs/ and reports/ with each method's seed-0 run only."""
    configs, reports = tmp_path / "configs", tmp_path / "reports"
    configs.mkdir()
    for name, config in CONFIGS.items():
        (configs / name).write_text(yaml.safe_dump(config or {"algorithm": "ppo"}))
    for method, (config, folders) in seeds.ABLATION.items():
        write_run(reports, folders[0], CONFIGS[config], 0, [1, 0, 0, 0], [1, 1, 0, 0], [100, 200, 300, 500])
    return configs, reports


def test_with_seed_0_alone_the_page_is_the_tables_and_a_line_naming_the_absent(tree):
    configs, reports = tree
    block = seeds.ablation_block(reports, configs)
    assert block.startswith(seeds.BEGIN) and block.endswith(seeds.END)
    assert "| gsm8k_qwen_coder_grpo (grpo) | 25.0% -> 50.0% (4) | 1 / 0, p = 1 |" in block  # compare_tables' row
    assert "One seed per method so far" in block and "Across seeds" not in block
    assert ("Seeds absent: PPO seeds 3 and 4 (`reports/gsm8k_qwen_coder_seed3`, `reports/gsm8k_qwen_coder_seed4`): "
            "not run yet; GRPO seeds 1 and 2") in block


def test_each_method_across_the_seeds_present(tree):
    configs, reports = tree
    grpo = CONFIGS["gsm8k_qwen_coder_grpo.yaml"]
    # GRPO seed 1: 1 right -> 4 right (+75 points, 3 gained: p = 0.25), wrong answers 200, 300, 500 long before;
    # sampled wrong answers 250 over the first 10 steps, 150 over the last 10.
    write_run(reports, "gsm8k_qwen_coder_grpo_seed1", grpo, 1, [1, 0, 0, 0], [1, 1, 1, 1], [100, 200, 300, 500],
              [250.0] * 10 + [150.0] * 10)
    text = seeds.across_seeds(reports, configs)
    # accuracy after: 50% and 100%; change +25 and +75 points; neither significant on four problems
    # wrong answers' length before: 333 in both runs; after: seed 0's two wrong answers (300, 500), seed 1 has none
    assert "| GRPO | 0, 1 | 75.0% (50.0% to 100.0%) | +50.0 (+25.0 to +75.0) | 0 of 2 | 333 (333 to 333) -> 400 |" in text
    assert "| PPO | 0 | 50.0% (one seed) | +25.0 (one seed) | 0 of 1 | 333 -> 400 |" in text
    assert "| gsm8k_qwen_coder_grpo_seed1 (grpo) | 1 | 250 / 150 | 333 -> n/a |" in text
    assert "| gsm8k_qwen_coder_grpo (grpo) | 0 | not logged (the run predates `rollout/length_wrong`) | 333 -> 400 |" in text
    assert "GRPO seed 2 (`reports/gsm8k_qwen_coder_grpo_seed2`): not run yet" in text and "; GRPO seeds 1" not in text


def test_a_seed_of_another_config_or_unreadable_is_named_not_counted(tree):
    configs, reports = tree
    write_run(reports, "gsm8k_qwen_coder_grpo_seed1", CONFIGS["gsm8k_qwen_coder_grpo.yaml"], 7, [0] * 4, [1] * 4, [9] * 4)
    write_run(reports, "gsm8k_qwen_coder_grpo_seed2", {"algorithm": "grpo", "rollout": {"group_size": 8}}, 2,
              [0] * 4, [1] * 4, [9] * 4)
    write_run(reports, "gsm8k_qwen_coder_dr_grpo_seed1", CONFIGS["gsm8k_qwen_coder_dr_grpo.yaml"], 1, [0] * 4, [1] * 4,
              [9] * 4)
    (reports / "gsm8k_qwen_coder_dr_grpo_seed1" / "eval_after.jsonl.gz").unlink()
    text = seeds.across_seeds(reports, configs)
    assert "GRPO seed 1 (`reports/gsm8k_qwen_coder_grpo_seed1`): not counted: its config is not " \
           "gsm8k_qwen_coder_grpo.yaml with train.seed 1 (train.seed 7)" in text
    assert "(rollout.group_size)" in text and "Dr. GRPO seed 1 (`reports/gsm8k_qwen_coder_dr_grpo_seed1`): unreadable" in text
    assert "Across seeds" not in text  # nothing counted beyond seed 0: no average of runs that do not count


def test_the_recipes_spread_counts_every_run_of_its_config(tmp_path):
    config, reports = tmp_path / "recipe.yaml", tmp_path / "reports"
    config.write_text("ppo:\n  lr: 0.001\n")
    recipe = {"ppo": {"lr": 0.001}}
    write_run(reports, "one_gpu", recipe, 0, [0, 0, 0, 0], [1, 1, 0, 0], [5] * 4)  # +50 points
    write_run(reports, "four_gpus", recipe, 0, [0, 0, 0, 0], [0, 0, 0, 0], [5] * 4, processes=4)  # +0
    write_run(reports, "seed1", recipe, 1, [1, 0, 0, 0], [1, 1, 1, 1], [5] * 4)  # +75
    write_run(reports, "other", {"ppo": {"lr": 0.002}}, 0, [0] * 4, [1] * 4, [5] * 4)  # another config: not counted
    text = seeds.recipe_spread(reports, config, goal=40)
    assert "| one_gpu | 0 | 1 | 0.0% -> 50.0% | +50.0 | 2 / 0, p = 5.0e-01 |" in text
    assert "| four_gpus | 0 | 4 |" in text and "| other |" not in text
    assert ("3 runs of 2 seeds (0, 1; seed 0 more than once, on different numbers of processes): change +41.7 points "
            "on average, from +0.0 to +75.0; 2 of 3 runs reach +40 points (67%).") in text
    assert "Seed 3 (`reports/gsm8k_qwen_coder_seed3`): not run yet.\nSeed 4 (`reports/gsm8k_qwen_coder_seed4`): not run yet." in text
    write_run(reports, "gsm8k_qwen_coder_seed3", {"ppo": {"lr": 0.002}}, 3, [0] * 4, [1] * 4, [5] * 4)  # misnamed
    assert "Seed 3 (`reports/gsm8k_qwen_coder_seed3`): not counted: its config is not recipe.yaml with train.seed 3 " \
           "(ppo.lr)." in seeds.recipe_spread(reports, config, goal=40)


def test_a_page_without_markers_is_refused():
    with pytest.raises(ValueError, match="no generated block"):
        seeds.with_block("# a page\n", seeds.BEGIN + "\n" + seeds.END)


def test_the_committed_ablation_page_holds_what_its_folders_give(capsys):
    """reports/gsm8k_ablation.md's tables are the committed folders' (regenerate: python -m course.seeds ablation),
    and it names each seed it lacks."""
    assert seeds.main(["ablation", "--check"]) == 0, capsys.readouterr().err
    page = seeds.PAGE.read_text()
    for method, (_, folders) in seeds.ABLATION.items():
        for seed, name in folders.items():
            assert (ROOT / "reports" / name).is_dir() or f"`reports/{name}`" in page, name


def test_the_recipes_spread_holds_the_committed_seeds():
    runs, unreadable = seeds.recipe_runs()
    assert not unreadable
    names = {r.folder.name for r in runs}
    assert {"gsm8k_qwen_coder", "gsm8k_qwen_coder_4gpu_seed0", "gsm8k_qwen_coder_4gpu_seed1",
            "gsm8k_qwen_coder_4gpu_seed2"} <= names
    assert not names & {"gsm8k_qwen_coder_16gb", "gsm8k_qwen_coder_grpo", "gsm8k_qwen_coder_run3"}


def test_the_ablation_pages_prose_states_ppos_seeds_and_the_seeds_not_run():
    """The hand-written prose of reports/gsm8k_ablation.md (outside the generated block) and
    docs/results.md: PPO's one-GPU seeds 0, 3 and 4 as the folders give them, and GRPO's and Dr.
    GRPO's seeds 1 and 2 named as not run while their folders are absent."""
    gathered = {method: seeds.gather({seed: seeds.REPORTS / name for seed, name in folders.items()},
                                     ROOT / "configs" / config) for method, (config, folders) in seeds.ABLATION.items()}
    ppo, missing = gathered["ppo"]
    assert [r.seed for r in ppo] == [0, 3, 4] and not missing
    unrun = {method: sorted(missing) for method, (_, missing) in gathered.items() if missing}
    assert unrun == {"grpo": [1, 2], "dr_grpo": [1, 2]}  # once they run, the prose below must say what they show
    seed0 = {method: runs[0] for method, (runs, _) in gathered.items()}
    s3, s4 = ppo[1:]
    assert min(r.gain for r in ppo) > max(seed0["grpo"].gain, seed0["dr_grpo"].gain)
    assert all(r.test.p_value < 0.05 for r in ppo)
    four_gpu = {r.folder.name: r for r in seeds.recipe_runs()[0]}["gsm8k_qwen_coder_4gpu_seed1"]
    page = seeds.PAGE.read_text()
    prose = " ".join((page[:page.index(seeds.BEGIN)] + page[page.index(seeds.END):]).split())
    for text in (f"PPO's seeds 3 and 4 gained {s3.gain:+.1f} and {s4.gain:+.1f} (p = {s3.test.p_value:.1e} and "
                 f"{s4.test.p_value:.1e}): its three one-GPU seeds, {min(r.gain for r in ppo):+.1f} to "
                 f"{max(r.gain for r in ppo):+.1f}, each gained more than GRPO's and Dr. GRPO's one seed",
                 f"(the recipe's seed 1 on 4 GPUs gained {four_gpu.gain:+.1f})",
                 f"its wrong answers got shorter in seeds 3 and 4 too (greedy {s3.wrong_length[0]:.0f} -> "
                 f"{s3.wrong_length[1]:.0f} and {s4.wrong_length[0]:.0f} -> {s4.wrong_length[1]:.0f}; sampled "
                 f"{s3.sampled_wrong[0]:.0f} -> {s3.sampled_wrong[1]:.0f} and {s4.sampled_wrong[0]:.0f} -> "
                 f"{s4.sampled_wrong[1]:.0f} over the first vs last 10 steps)",
                 "GRPO's and Dr. GRPO's seeds 1 and 2 have not run yet",
                 "One seed of GRPO and of Dr. GRPO (their seeds 1 and 2 are not run yet); three of PPO",
                 "`bash benchmarks/gsm8k_seeds_lease.sh start 2`"):
        assert text in prose, text
    assert all(r.wrong_length[1] < r.wrong_length[0] and r.sampled_wrong[1] < r.sampled_wrong[0] for r in (s3, s4))
    results = " ".join((ROOT / "docs" / "results.md").read_text().split())
    for text in ("whose PPO row now holds seeds 0, 3 and 4 (" + ", ".join(f"{r.gain:+.1f}" for r in ppo) + ")",
                 "**Not run yet: GRPO's and Dr. GRPO's seeds 1 and 2**", "`bash benchmarks/gsm8k_seeds_lease.sh start 2`"):
        assert text in results, text
