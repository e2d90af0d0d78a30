"""course.seeds: Part II's ablation across seeds and the recipe's spread, on small synthetic report
folders whose figures are worked out by hand, and the committed ablation page against its folders."""

import json
import shutil
from math import comb
from pathlib import Path
from statistics import mean, median

import pytest
import yaml
from report_runs import joined, joined_text, rescored

from assignment.trainer.runlog import read_jsonl, write_gz
from course import seeds

ROOT = Path(__file__).resolve().parents[1]
# Each method's config, as small as the trainer accepts: what a run folder's config.yaml must match.
CONFIGS = {"gsm8k_qwen_coder.yaml": {}, "gsm8k_qwen_coder_grpo.yaml": {"algorithm": "grpo", "rollout": {"group_size": 4}},
           "gsm8k_qwen_coder_dr_grpo.yaml": {"algorithm": "dr_grpo", "rollout": {"group_size": 4}}}
METHOD_CONFIG = {method: config for method, (config, _) in seeds.ABLATION.items()}


def write_run(reports: Path, name: str, config: dict, seed: int, before: list[int], after: list[int],
              lengths: list[int], length_wrong: list[float] | None = None, processes: int = 1,
              unanimous: list[float] | None = None, unanswered_after: tuple[int, ...] = ()) -> Path:
    """A report folder: config.yaml with ``seed``, four problems' evaluations (1 = right; the
    answers' lengths ``lengths``, the same before and after; the problems ``unanswered_after`` cut at
    the limit after training with no answer read), metrics.jsonl (20 steps, rollout/kl = the step;
    rollout/length_wrong and rollout/zero_spread_groups per step where given) and run.json."""
    out = reports / name
    out.mkdir(parents=True)
    (out / "config.yaml").write_text(yaml.safe_dump({**config, "train": {"seed": seed, "output_dir": f"runs/{name}"}}))
    for file, outcomes in (("eval_before.jsonl.gz", before), ("eval_after.jsonl.gz", after)):
        cut = unanswered_after if file == "eval_after.jsonl.gz" else ()
        records = [{"question": f"q{i}", "reference": "1", "response": "",
                    "answer": None if i in cut else "1" if right else "2", "correct": bool(right),
                    "marker": "boxed", "length": length, "finished": i not in cut}
                   for i, (right, length) in enumerate(zip(outcomes, lengths))]
        write_gz("".join(json.dumps(r) + "\n" for r in records).encode(), out / file)
    steps = [{"step": s + 1, "rollout/reward_mean": 0.5, "rollout/kl": float(s + 1),
              **({} if length_wrong is None else {"rollout/length_wrong": length_wrong[s]}),
              **({} if unanimous is None else {"rollout/zero_spread_groups": unanimous[s]})} for s in range(20)]
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
    # sampled wrong answers 250 over the first 10 steps, 150 over the last 10; unanimous groups 0.6 then 0.4.
    write_run(reports, "gsm8k_qwen_coder_grpo_seed1", grpo, 1, [1, 0, 0, 0], [1, 1, 1, 1], [100, 200, 300, 500],
              [250.0] * 10 + [150.0] * 10, unanimous=[0.6] * 10 + [0.4] * 10)
    # Dr. GRPO seed 1: problem 3 cut at the limit after training, no answer read: answered 3 of 4, 25% cut
    write_run(reports, "gsm8k_qwen_coder_dr_grpo_seed1", CONFIGS["gsm8k_qwen_coder_dr_grpo.yaml"], 1, [1, 0, 0, 0],
              [1, 1, 0, 0], [100, 200, 300, 500], unanswered_after=(3,))
    text = seeds.across_seeds(reports, configs)
    # accuracy after: 50% and 100%; change +25 and +75 points; neither significant on four problems
    # wrong answers' length before: 333 in both runs; after: seed 0's two wrong answers (300, 500), seed 1 has none
    # KL: rollout/kl is the step number, so the last 10 of 20 steps average 15.5 and the largest is 20
    assert "| GRPO | 0, 1 | 75.0% (50.0% to 100.0%) | +50.0 (+25.0 to +75.0) | 0 of 2 | 333 (333 to 333) -> 400 | " \
           "15.5 (15.5 to 15.5) |" in text
    assert "| PPO | 0 | 50.0% (one seed) | +25.0 (one seed) | 0 of 1 | 333 -> 400 | 15.5 |" in text
    assert "| gsm8k_qwen_coder_grpo_seed1 (grpo) | 1 | 250 / 150 | 333 -> n/a | 100.0% -> 100.0% | 0.0% | 15.5 (20.0) " \
           "| 0.60 / 0.40 |" in text
    assert "| gsm8k_qwen_coder_grpo (grpo) | 0 | not logged (the run predates `rollout/length_wrong`) | 333 -> 400 | " \
           "100.0% -> 100.0% | 0.0% | 15.5 (20.0) | n/a |" in text
    assert "| gsm8k_qwen_coder_dr_grpo_seed1 (dr_grpo) | 1 | not logged (the run predates `rollout/length_wrong`) " \
           "| 333 -> 400 | 100.0% -> 75.0% | 25.0% |" in text
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


def _committed() -> dict[str, list[seeds.SeedRun]]:
    """Each method's committed runs, every planned seed present (the prose below is about all nine)."""
    gathered = {method: seeds.gather({seed: seeds.REPORTS / name for seed, name in folders.items()},
                                     ROOT / "configs" / config) for method, (config, folders) in seeds.ABLATION.items()}
    assert all(not missing for _, missing in gathered.values()), gathered
    return {method: runs for method, (runs, _) in gathered.items()}


def _prose(page: str) -> str:
    """A page's hand-written text, outside the generated block, on one line."""
    if seeds.BEGIN in page:
        page = page[:page.index(seeds.BEGIN)] + page[page.index(seeds.END):]
    return joined_text(page)


def _span(values, spec: str, unit: str = "") -> str:
    """'lowest to highest' of ``values``, as the pages write a range."""
    return f"{format(min(values), spec)}{unit} to {format(max(values), spec)}{unit}"


def test_the_ablation_pages_prose_is_what_its_nine_runs_give():
    """Every figure of reports/gsm8k_ablation.md's hand-written prose, recomputed from the report
    folders: the gains and their order, the unanimous groups, the wrong answers' lengths, KL, the
    gradient norms and the step times, and which seed-0 readings the later seeds overturned."""
    runs = _committed()
    ppo, grpo, dr = runs["ppo"], runs["grpo"], runs["dr_grpo"]
    assert [[r.seed for r in rs] for rs in (ppo, grpo, dr)] == [[0, 3, 4], [0, 1, 2], [0, 1, 2]]
    metrics = {r.folder.name: read_jsonl(r.folder / "metrics.jsonl") for rs in runs.values() for r in rs}
    acc = {m: [100 * r.test.after / r.test.n for r in rs] for m, rs in runs.items()}
    gains = {m: [r.gain for r in rs] for m, rs in runs.items()}
    page = seeds.PAGE.read_text()
    prose = _prose(page)
    expected = [
        f"PPO {mean(gains['ppo']):+.1f} points on average ({min(gains['ppo']):+.1f} to {max(gains['ppo']):+.1f}), "
        f"GRPO {mean(gains['grpo']):+.1f} ({min(gains['grpo']):+.1f} to {max(gains['grpo']):+.1f}), "
        f"Dr. GRPO {mean(gains['dr_grpo']):+.1f} ({min(gains['dr_grpo']):+.1f} to {max(gains['dr_grpo']):+.1f})",
        f"(PPO's lowest {min(acc['ppo']):.1f}%, the others' highest {max(acc['grpo'] + acc['dr_grpo']):.1f}%)",
        f"their ranges overlap (GRPO {_span(acc['grpo'], '.1f', '%')}, Dr. GRPO {_span(acc['dr_grpo'], '.1f', '%')})",
    ]
    assert all(r.test.p_value < 0.05 and r.gain > 0 for rs in runs.values() for r in rs)  # "in all nine runs"
    assert min(acc["ppo"]) > max(acc["grpo"] + acc["dr_grpo"])  # every PPO seed above every other seed
    assert max(acc["dr_grpo"]) > max(acc["grpo"]) and mean(acc["dr_grpo"]) < mean(acc["grpo"])
    assert max(acc["dr_grpo"]) - min(acc["dr_grpo"]) > max(acc["grpo"]) - min(acc["grpo"])  # "its spread wider"
    # exact one-sided Mann-Whitney, PPO's seeds all above the other's: 1 of the C(n + m, n) orderings
    orderings = comb(len(ppo) + len(grpo), len(ppo))
    assert f"p = 1/{orderings} = {1 / orderings:.2f}" in prose
    unanimous = [x for r in grpo + dr for x in r.unanimous]
    expected.append(f"**{100 * min(unanimous):.0f}-{100 * max(unanimous):.0f}% of the groups were unanimous**")
    carried = [256 * (1 - x) for x in unanimous]  # responses in groups with a reward spread
    expected.append(f"about {min(carried):.0f}-{max(carried):.0f} of each step's 256 responses")
    wrong = {m: [r.wrong_length for r in rs] for m, rs in runs.items()}
    assert all(round(before) == 294 for rs in wrong.values() for before, _ in rs)  # the same base model's answers
    expected += [
        f"GRPO's wrong greedy answers went 294 -> {wrong['grpo'][0][1]:.0f}, {wrong['grpo'][1][1]:.0f} and "
        f"{wrong['grpo'][2][1]:.0f} tokens (seeds 0, 1, 2): none grew",
        f"Dr. GRPO's seed 0 grew (294 -> {wrong['dr_grpo'][0][1]:.0f} tokens, answered {100 * dr[0].answered[0]:.1f}% -> "
        f"{100 * dr[0].answered[1]:.1f}%, {100 * dr[0].cut:.1f}% cut",
        f"seeds 1 and 2 shortened them (294 -> {wrong['dr_grpo'][1][1]:.0f} and {wrong['dr_grpo'][2][1]:.0f}), answered "
        f"more ({100 * dr[1].answered[1]:.1f}% and {100 * dr[2].answered[1]:.1f}%) and were cut less "
        f"({100 * dr[1].cut:.1f}% and {100 * dr[2].cut:.1f}%); their sampled wrong answers shortened too "
        f"({dr[1].sampled_wrong[0]:.0f} -> {dr[1].sampled_wrong[1]:.0f} and {dr[2].sampled_wrong[0]:.0f} -> "
        f"{dr[2].sampled_wrong[1]:.0f} over the first vs last 10 steps)",
        f"PPO's shortened in all three (294 -> {wrong['ppo'][0][1]:.0f}, {wrong['ppo'][1][1]:.0f} and "
        f"{wrong['ppo'][2][1]:.0f})",
    ]
    assert all(after < before for m in ("grpo", "ppo") for before, after in wrong[m])
    assert wrong["dr_grpo"][0][1] > 294 > max(wrong["dr_grpo"][1][1], wrong["dr_grpo"][2][1])
    dr_after = [w[1] for w in wrong["dr_grpo"]]
    means = [mean(w[1] for w in wrong[m]) for m in runs]
    expected.append(f"one method's seeds spread over {round(max(dr_after)) - round(min(dr_after))} tokens (Dr. GRPO: "
                    f"{min(dr_after):.0f} to {max(dr_after):.0f}), more than any difference between the methods' "
                    f"means ({min(means):.0f} to {max(means):.0f})")
    kl = {m: [r.kl[0] for r in rs] for m, rs in runs.items()}
    expected.append(f"PPO ended at {_span(kl['ppo'], '.1f')} nats, GRPO at {_span(kl['grpo'], '.1f')}, Dr. GRPO at "
                    f"{_span(kl['dr_grpo'], '.1f')}")
    over = {m: [r.seed for r in rs if r.kl[0] > 30] for m, rs in runs.items()}
    assert not over["ppo"] and 0 in over["dr_grpo"] and 0 not in over["grpo"]  # "Seed 0 alone had Dr. GRPO over"
    expected.append(f"GRPO passed 30 in seeds {over['grpo'][0]} and {over['grpo'][1]}, Dr. GRPO in seeds "
                    f"{over['dr_grpo'][0]} and {over['dr_grpo'][1]}, PPO in none")
    expected.append(f"its seed 4's highest step reached {ppo[2].kl[1]:.1f}")
    norms = {m: [mean(x["stats/grad_norm"] for x in metrics[r.folder.name]) for r in rs] for m, rs in runs.items()}
    expected.append(f"PPO {_span(norms['ppo'], '.2f')} (every step clipped; the value loss's gradient included), GRPO "
                    f"{_span(norms['grpo'], '.2f')}, Dr. GRPO {_span(norms['dr_grpo'], '.2f')}")
    assert all(x["stats/grad_norm"] > 1 for r in ppo for x in metrics[r.folder.name])
    clipped = [sum(x["stats/grad_norm"] > 1 for x in metrics[r.folder.name]) for r in grpo]
    expected.append(f"the GRPO runs' hardly were ({clipped[0]}, {clipped[1]} and {clipped[2]} steps of 48)")
    assert not any(x["stats/grad_norm"] > 1 for r in dr for x in metrics[r.folder.name])
    shared = ppo[1:] + grpo[1:] + dr[1:]  # the later seeds: two runs to a card
    rollout, update = ([median(x[key] for x in metrics[r.folder.name]) for r in shared] for key in ("time/rollout", "time/update"))
    expected.append(f"Two runs to a card kept the rollout's time ({min(rollout):.1f}-{max(rollout):.1f} s")
    expected.append(f"doubled the update's ({min(update):.1f}-{max(update):.1f} s)")
    for text in expected:
        assert text in prose, text
    assert "not run yet" not in prose


def test_docs_and_the_handout_state_what_the_seeds_support():
    """docs/results.md and handout.md section 8 state Part II's GSM8K comparison over the three seeds
    a method: the gains, the order, and the length and KL readings that did not hold."""
    runs = _committed()
    gains = {m: [r.gain for r in rs] for m, rs in runs.items()}
    acc = {m: [100 * r.test.after / r.test.n for r in rs] for m, rs in runs.items()}
    wrong = {m: [r.wrong_length[1] for r in rs] for m, rs in runs.items()}
    kl = {m: [r.kl[0] for r in rs] for m, rs in runs.items()}
    rows = [f"| {name} | {', '.join(str(r.seed) for r in runs[m])} | {mean(acc[m]):.1f}% ({_span(acc[m], '.1f', '%')}) | "
            f"{mean(gains[m]):+.1f} ({min(gains[m]):+.1f} to {max(gains[m]):+.1f}) | "
            f"{', '.join(f'{w:.0f}' for w in wrong[m])} | {', '.join(f'{k:.1f}' for k in kl[m])} |"
            for m, name in (("ppo", "PPO"), ("grpo", "GRPO"), ("dr_grpo", "Dr. GRPO"))]
    handout = (ROOT / "handout.md").read_text()
    for row in rows:
        assert row in handout, row
    results = _prose((ROOT / "docs" / "results.md").read_text())
    text = (f"PPO {mean(gains['ppo']):+.1f} points on average, GRPO {mean(gains['grpo']):+.1f}, Dr. GRPO "
            f"{mean(gains['dr_grpo']):+.1f}")
    assert text in results and text in _prose(handout), text
    assert min(acc["ppo"]) > max(acc["grpo"] + acc["dr_grpo"])
    for page in (results, _prose(handout)):
        assert "every PPO seed ended above every GRPO and Dr. GRPO seed" in page
    later = {m: [f"{g:+.1f}" for g in gains[m][1:]] for m in ("grpo", "dr_grpo")}
    for text in (f"({min(acc['ppo']):.1f}% its lowest, {max(acc['grpo'] + acc['dr_grpo']):.1f}% their highest)",
                 f"GRPO against Dr. GRPO is not settled ({_span(acc['grpo'], '.1f', '%')} against "
                 f"{_span(acc['dr_grpo'], '.1f', '%')})",
                 f"Dr. GRPO's wrong answers grew in seed 0 (294 -> {wrong['dr_grpo'][0]:.0f} tokens) and shortened in "
                 f"the others ({wrong['dr_grpo'][1]:.0f} and {wrong['dr_grpo'][2]:.0f})",
                 f"GRPO {later['grpo'][0]} and {later['grpo'][1]}, Dr. GRPO {later['dr_grpo'][0]} and {later['dr_grpo'][1]}"):
        assert text in results, text
    assert "Not run yet" not in results
    unanimous = [x for m in ("grpo", "dr_grpo") for r in runs[m] for x in r.unanimous]
    assert f"{100 * min(unanimous):.0f}-{100 * max(unanimous):.0f}% of the groups were unanimous" in _prose(handout)
    assert max(acc["dr_grpo"]) > max(acc["grpo"]) and "Dr. GRPO's best seed beat every GRPO seed" in _prose(handout)
    headers = {method: joined(ROOT / "configs" / config) for method, (config, _) in seeds.ABLATION.items()}
    for method, name in (("grpo", "GRPO"), ("dr_grpo", "Dr. GRPO")):  # each config's header comment
        header = headers[method]
        one, two = runs[method][1:]
        assert (f"Seeds 1 and 2 (train.seed): {100 * one.test.after / one.test.n:.1f}% and "
                f"{100 * two.test.after / two.test.n:.1f}% ({one.gain:+.1f} and {two.gain:+.1f})") in header, name
        assert f"over the three seeds {mean(gains[method]):+.1f} points on average" in header.lower(), name
        assert f"KL {one.kl[0]:.1f} and {two.kl[0]:.1f} nats" in header, name
    lengths = [json.loads((r.folder / "summary.json").read_text())["response_length_after"] for r in runs["dr_grpo"][1:]]
    assert f"answers 282 -> {lengths[0]:.0f} and {lengths[1]:.0f} tokens" in headers["dr_grpo"]
    assert max(gains["grpo"]) < min(gains["ppo"]) and "below each of PPO's three seeds" in headers["grpo"]


@pytest.mark.parametrize("name", [name for _, folders in seeds.ABLATION.values() for name in folders.values()])
def test_each_ablation_run_is_whole_and_rescores_from_its_own_files(name):
    """Every run the ablation counts: greedy outcomes on all 1319 problems that give its summary's
    accuracies and McNemar test, 48 logged steps, and a finished run on one process."""
    folder = seeds.REPORTS / name
    test, summary = rescored(folder)
    assert test.n == 1319 and summary["steps"] == len(read_jsonl(folder / "metrics.jsonl")) == 48
    runs = json.loads((folder / "run.json").read_text())
    assert runs[-1]["status"] == "finished" and {r.get("world_size", 1) for r in runs} == {1}


def test_performance_part_10_states_the_shared_cards_as_measured():
    """reports/performance.md Part 10: memory and seconds of the runs that shared a card, batch 1
    uncapped and batch 2 under CAP_GIB=68, from their summaries and the lease's nvidia-smi readings."""
    runs = _committed()
    batch2 = runs["grpo"][1:] + runs["dr_grpo"][1:]
    summary = {r.folder.name: json.loads((r.folder / "summary.json").read_text()) for r in batch2}
    batch1 = {name: json.loads((seeds.REPORTS / name / "summary.json").read_text()) for name in
              ("gsm8k_control_random", "gsm8k_control_format", "gsm8k_qwen_coder_seed3", "gsm8k_qwen_coder_seed4")}
    reserved = {k: [s["peak_reserved_gib"] for s in v.values()] for k, v in (("1", batch1), ("2", summary))}
    allocated = [s["peak_memory_gib_step"] for s in [*batch1.values(), *summary.values()]]
    smi = [int(line.split(", ")[1].split()[0]) for line in
           (seeds.REPORTS / "performance" / "gsm8k_seeds_lease_2" / "nvidia-smi.txt").read_text().splitlines()
           if line[:2] in ("0,", "1,")]
    seconds = [s["gpu_seconds"] for s in summary.values()]
    # GRPO's two seeds shared GPU 0, Dr. GRPO's GPU 1 (SLOTS="0 0 1 1")
    per_card = [sum(summary[r.folder.name]["peak_reserved_gib"] for r in runs[m][1:]) for m in ("grpo", "dr_grpo")]
    part = _prose((seeds.REPORTS / "performance.md").read_text().split("## Part 10")[1].split("\n## ")[0])
    for text in (f"| {_span(allocated, '.1f')} GiB | {_span(reserved['1'], '.1f')} GiB |".replace(" to ", "-"),
                 f"| {_span(reserved['2'], '.1f')} GiB | {max(smi):,} of 143,771 MiB |".replace(" to ", "-"),
                 f"a run reserved at most {max(reserved['2']):.0f} GiB",
                 f"a card's two runs at most {max(per_card):.0f} GiB of 140",
                 f"{max(smi) / 1024:.0f} GiB at nvidia-smi's highest",
                 f"A shared run took {min(seconds):,.0f}-{max(seconds):,.0f} s"):
        assert text in part, text
