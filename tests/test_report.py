"""The run report and its folder: every section is filled from a real (tiny) run's files, and
every headline figure of summary.json is recomputed here from the per-problem files alone."""

import gzip
import json
import math
import shutil
from pathlib import Path

import pytest

from assignment.trainer import cli
from assignment.trainer.config import load_config
from assignment.trainer.impl import load_impl
from assignment.trainer.loop import train
from assignment.trainer.report import _invocation_line, _wall_time, eval_pair
from assignment.trainer.reward import extract_answer
from assignment.trainer.runlog import eval_records_path, read_jsonl, write_gz

REFERENCE = Path(__file__).resolve().parents[1] / "solutions" / "exercises.py"
RECORD_FIELDS = {"question", "reference", "response", "answer", "correct"}


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """A tiny run (2 steps, 6 test problems in batches of 4) and its report with 12 s of staging."""
    tmp = tmp_path_factory.mktemp("report")
    cfg = load_config(None, ["model.hidden_size=32", "rollout.batch_size=8", "ppo.minibatch_size=4", "eval.size=6",
                             "eval.batch_size=4", "train.steps=2", "train.progress=false", "train.tensorboard=false",
                             "train.cpu_threads=1", f"train.output_dir={tmp / 'run'}"])
    train(cfg, load_impl(str(REFERENCE)), command="ppo-train tiny")
    out = tmp / "reports" / "tiny.md"
    assert cli.main(["--report", str(tmp / "run"), "--report-out", str(out), "--staging-seconds", "12"]) == 0
    return tmp / "run", out


def test_report_of_a_tiny_run(reported):
    run, out = reported
    text = out.read_text()
    assert "`ppo-train tiny`" in text and "wall time" in text and "staging 12 s" in text
    assert "| rollout/reward_mean |" in text and "![reward curve](tiny.png)" in text
    assert (out.parent / "tiny.png").stat().st_size > 1000
    assert "exact McNemar p = 1" in text and "| before | 0 | 6 |" in text and "| after | 2 | 6 |" in text
    assert "### Improved (wrong -> right)" in text and "### Unchanged, wrong" in text and "What is" in text


def test_report_folder_holds_the_files_behind_every_figure(reported):
    run, out = reported
    bundle = out.parent / "tiny"
    assert sorted(p.name for p in bundle.iterdir()) == ["config.yaml", "eval_after.jsonl.gz", "eval_before.jsonl.gz",
                                                        "metrics.jsonl", "run.json", "summary.json"]
    summary = json.loads((bundle / "summary.json").read_text())
    for key in ("card", "n", "accuracy_before", "accuracy_after", "mcnemar_p", "reward_first10", "reward_last10",
                "gpu_seconds", "response_length_before", "response_length_after", "kl_final", "kl_budget"):
        assert key in summary, key
    assert summary["gpu_seconds"] == pytest.approx(summary["seconds"]["wall"] + 12)


def test_the_per_problem_files_are_the_runs_records_compressed_the_same_each_time(reported, tmp_path):
    """eval_before/after.jsonl.gz hold the run's eval_samples/step_N.jsonl byte for byte, and a
    second report of the same run writes the same compressed bytes (no timestamp in the header):
    a committed report folder does not change when it is regenerated."""
    run, out = reported
    bundle = out.parent / "tiny"
    steps = json.loads((bundle / "summary.json").read_text())["eval_steps"]
    for name, step in zip(("eval_before.jsonl.gz", "eval_after.jsonl.gz"), steps):
        assert gzip.decompress((bundle / name).read_bytes()) == eval_records_path(run, step).read_bytes()
        header = (bundle / name).read_bytes()[:10]
        assert header[4:8] == bytes(4) and header[9] == 255  # no timestamp, no system: see runlog.write_gz
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "eval_before.jsonl").write_text("{}\n")  # an older version's plain file, in the way
    assert cli.main(["--report", str(run), "--report-out", str(tmp_path / "tiny.md")]) == 0
    for name in ("eval_before.jsonl.gz", "eval_after.jsonl.gz"):
        assert (tmp_path / "tiny" / name).read_bytes() == (bundle / name).read_bytes()
    assert not (tmp_path / "tiny" / "eval_before.jsonl").exists()


def test_summary_is_recomputable_from_the_per_problem_files(reported):
    """Accuracies, McNemar's p and the training rewards, from eval_*.jsonl and metrics.jsonl alone."""
    bundle = reported[1].parent / "tiny"
    summary = json.loads((bundle / "summary.json").read_text())
    before, after = read_jsonl(bundle / "eval_before.jsonl.gz"), read_jsonl(bundle / "eval_after.jsonl.gz")
    assert len(before) == len(after) == summary["n"] == summary["n_planned"] == 6
    for old, new in zip(before, after):
        assert RECORD_FIELDS <= set(old) and RECORD_FIELDS <= set(new) and old["question"] == new["question"]
        for record in (old, new):  # the answer is the reward's extraction, and correct means equal to the reference
            assert record["answer"] == extract_answer(record["response"], summary["answer_format"])
            assert record["correct"] == (record["answer"] == record["reference"])
    assert summary["accuracy_before"] == sum(r["correct"] for r in before) / 6
    assert summary["accuracy_after"] == sum(r["correct"] for r in after) / 6
    b = sum(o["correct"] and not n["correct"] for o, n in zip(before, after))
    c = sum(n["correct"] and not o["correct"] for o, n in zip(before, after))
    tail = sum(math.comb(b + c, i) for i in range(min(b, c) + 1))
    assert summary["mcnemar_p"] == min(1.0, 2 * tail / 2 ** (b + c)) and (summary["regressed"], summary["improved"]) == (b, c)
    rewards = [m["rollout/reward_mean"] for m in read_jsonl(bundle / "metrics.jsonl")]
    assert summary["reward_first10"] == pytest.approx(sum(rewards[:10]) / len(rewards[:10]))
    assert summary["response_length_after"] == pytest.approx(sum(r["length"] for r in after) / 6)
    assert summary["finished_rate_after"] == sum(r["finished"] for r in after) / 6


def test_killed_invocations_are_named_and_summed_as_far_as_known():
    base = {"command": "ppo-train x", "resume": False, "device": "H200", "torch": "2.11", "transformers": "5.17",
            "started": "now"}
    old_kill = dict(base)  # written before run.json was kept current: no time at all
    new_kill = {**base, "seconds": 300.0, "train_seconds": 250.0, "eval_seconds": 40.0, "status": "running"}
    done = {**base, "resume": True, "seconds": 100.0, "train_seconds": 60.0, "eval_seconds": 30.0, "status": "finished"}
    assert "no end time recorded" in _invocation_line(old_kill) and "nan" not in _invocation_line(old_kill)
    assert "killed: at least 300 s" in _invocation_line(new_kill)
    assert "wall time 100 s, finished (60 s train, 30 s eval)" in _invocation_line(done)
    times = _wall_time([old_kill, new_kill, done], staging_seconds=None)
    assert (times["wall"], times["training"], times["evaluation"], times["other"]) == (400.0, 310.0, 70.0, 20.0)
    assert times["invocations_without_time"] == 1 and times["staging"] is None


def test_an_unfinished_final_evaluation_is_paired_on_the_problems_it_reached(reported, tmp_path):
    """A run stopped inside its last evaluation, never resumed: its records file holds the first
    problems only; the report compares those problems before and after, and says so."""
    run = tmp_path / "run"
    shutil.copytree(reported[0], run)
    evals = read_jsonl(run / "eval.jsonl")
    (run / "eval.jsonl").write_text(json.dumps(evals[0]) + "\n")  # the last evaluation never finished
    after_file = run / "eval_samples" / f"step_{evals[-1]['step']}.jsonl"
    after_file.write_text("".join(line + "\n" for line in after_file.read_text().splitlines()[:4]))
    first_file = eval_records_path(run, evals[0]["step"])
    lines = first_file.read_text().splitlines(keepends=True)
    first_file.write_text(lines[0] + "\n" + "".join(lines[1:]))  # a blank line: the cut counts records, not lines
    out = tmp_path / "partial.md"
    assert cli.main(["--report", str(run), "--report-out", str(out)]) == 0
    summary = json.loads((tmp_path / "partial" / "summary.json").read_text())
    before = read_jsonl(tmp_path / "partial" / "eval_before.jsonl.gz")
    after = read_jsonl(tmp_path / "partial" / "eval_after.jsonl.gz")
    assert (summary["n"], summary["n_planned"]) == (4, 6) and len(before) == len(after) == 4
    assert [r["question"] for r in before] == [r["question"] for r in after]
    assert gzip.decompress((tmp_path / "partial" / "eval_before_all.jsonl.gz").read_bytes()) == first_file.read_bytes()
    assert read_jsonl(tmp_path / "partial" / "eval_before_all.jsonl.gz")[:4] == before
    assert summary["accuracy_before"] == sum(r["correct"] for r in before) / 4
    assert "the first 4 of 6 test problems" in out.read_text()
    after_file.write_text("")  # an evaluation opened and killed before its first batch: nothing to pair
    with pytest.raises(FileNotFoundError, match="no evaluation after step"):
        eval_pair(run)


def test_the_reward_curve_marks_each_curriculum_level_change(tmp_path):
    """A dashed line on both panels at every step whose operand range differs from the step
    before (the first step on the wider range), labelled on the reward panel; none without a
    curriculum. Checked on the Axes' artists, not on pixels."""
    import matplotlib.pyplot as plt

    from assignment.trainer.runlog import METRICS, draw_run, level_changes, plot_run

    levels = [1, 1, 2, 2, 2, 3, 4, 4]
    metrics = [{"step": step, "rollout/reward_mean": 0.1 * step, "rollout/max_operand": level}
               for step, level in enumerate(levels, start=1)]
    (tmp_path / METRICS).write_text("".join(json.dumps(m) + "\n" for m in metrics))
    logged = read_jsonl(tmp_path / METRICS)
    assert level_changes(logged) == [(3, 2), (6, 3), (7, 4)]
    fig = draw_run(logged, [{"step": 0, "eval/accuracy": 0.0, "eval/format_rate": 0.0}])
    for ax in fig.axes:
        marks = [line for line in ax.get_lines() if line.get_gid() == "curriculum"]
        assert [list(line.get_xdata()) for line in marks] == [[3, 3], [6, 6], [7, 7]]
        assert all(line.get_linestyle() == "--" for line in marks)
    assert [t.get_text().strip() for t in fig.axes[0].texts] == ["operands 0-2", "operands 0-3", "operands 0-4"]
    plt.close(fig)
    no_curriculum = draw_run([{k: v for k, v in m.items() if k != "rollout/max_operand"} for m in metrics], [])
    assert not any(line.get_gid() == "curriculum" for ax in no_curriculum.axes for line in ax.get_lines())
    plt.close(no_curriculum)
    assert plot_run(tmp_path).is_file()


def test_metric_ranges_recomputes_the_handouts_figures(tmp_path):
    """course/metric_ranges.py, which the handout's section 6 table is computed with: percentiles
    over the steps, the value at step 1, the share below 0, the critic ratio only where
    gamma = lam = 1, and the reward around each curriculum change."""
    from course.metric_ranges import CRITIC_RATIO, ranges, report, with_derived

    metrics = [{"step": s, "stats/approx_kl": kl, "loss/value": 0.02, "rollout/reward_std": 0.2,
                "rollout/reward_mean": r, "rollout/max_operand": level}
               for s, kl, r, level in [(1, 0.05, 0.1, 1), (2, -0.01, 0.3, 1), (3, 0.02, 0.2, 2), (4, 0.03, 0.4, 2)]]
    r = ranges(metrics, "stats/approx_kl")
    assert r["step1"] == 0.05 and r["median"] == pytest.approx(0.025) and r["below0"] == 0.25
    assert r["p10"] == pytest.approx(-0.01 + 0.3 * 0.03) and r["above1e-2"] == 0.75  # numpy's linear percentiles
    assert ranges(metrics, "stats/grad_norm") is None
    for lam, has_ratio in ((1.0, True), (0.95, False)):
        (tmp_path / "config.yaml").write_text(f"ppo:\n  gamma: 1.0\n  lam: {lam}\n")
        derived = with_derived(metrics, tmp_path)
        assert all((CRITIC_RATIO in m) == has_ratio for m in derived)
    (tmp_path / "config.yaml").write_text("ppo:\n  gamma: 1.0\n  lam: 1.0\n")
    assert with_derived(metrics, tmp_path)[0][CRITIC_RATIO] == pytest.approx(0.02 / (0.5 * 0.2 ** 2))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    text = "\n".join(report("tiny", tmp_path))
    assert "| stats/approx_kl | 0.025 |" in text and "- step 3, operands 0-2: reward 0.200 -> 0.300" in text


def _ablation_folder(root: Path, name: str, algorithm: str, after: list[int], after_lengths: list[int],
                     after_finished: list[bool]) -> Path:
    """A report folder by hand: 12 steps of metrics and 4 problems evaluated before and after."""
    folder = root / name
    folder.mkdir()
    (folder / "config.yaml").write_text(f"algorithm: {algorithm}\n")
    metrics = [{"step": s, "rollout/reward_mean": s / 100, "rollout/response_length": 200 + s,
                "rollout/kl": float(s)} for s in range(1, 13)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))

    def records(correct, lengths, finished):
        return "".join(json.dumps({"question": f"q{i}", "correct": bool(c), "length": n, "finished": f}) + "\n"
                       for i, (c, n, f) in enumerate(zip(correct, lengths, finished))).encode()

    write_gz(records([1, 0, 0, 0], [10, 20, 30, 40], [True] * 4), folder / "eval_before.jsonl.gz")
    write_gz(records(after, after_lengths, after_finished), folder / "eval_after.jsonl.gz")
    return folder


def test_compare_tables_pair_each_run_with_its_start_and_with_every_other_run(tmp_path):
    from assignment.trainer.ablation import compare_tables

    a = _ablation_folder(tmp_path, "a", "grpo", [1, 1, 0, 0], [10, 12, 50, 60], [True, True, False, True])
    b = _ablation_folder(tmp_path, "b", "dr_grpo", [0, 1, 1, 0], [15, 25, 35, 45], [True] * 4)
    rows = compare_tables([a, b]).splitlines()
    # a: 1 -> 2 of 4 right (problem 1 improved, none regressed: p = 1); rewards over steps 1-10 and
    # 3-12: 0.055 and 0.075; lengths 205.5 / 207.5 sampled, 25 -> 33 greedy; 1 of 4 cut; KL 7.5 (12).
    assert "| a (grpo) | 25.0% -> 50.0% (4) | 1 / 0, p = 1 | 0.055 / 0.075 | 206 / 208 | 25 -> 33 | 25.0% | 7.5 (12.0) |" in rows
    # b: problem 0 regressed, 1 and 2 improved.
    assert "| b (dr_grpo) | 25.0% -> 50.0% (4) | 2 / 1, p = 1 | 0.055 / 0.075 | 206 / 208 | 25 -> 30 | 0.0% | 7.5 (12.0) |" in rows
    # After training a solves problem 0 that b misses, b solves problem 2 that a misses.
    assert "| a (grpo) | b (dr_grpo) | 1 | 1 | 1 |" in rows
    # Length by outcome: a's right answers 10 (1) -> (10 + 12) / 2 (2); wrong 30 (3) -> (50 + 60) / 2 (2).
    assert "| a (grpo) | 10 (1) -> 11 (2) | 30 (3) -> 55 (2) |" in rows
    assert "| b (dr_grpo) | 10 (1) -> 30 (2) | 30 (3) -> 30 (2) |" in rows


def test_compare_tables_refuse_to_pair_runs_on_different_problems(tmp_path):
    from assignment.trainer.ablation import compare_tables

    a = _ablation_folder(tmp_path, "a", "grpo", [1, 1, 0, 0], [10] * 4, [True] * 4)
    b = _ablation_folder(tmp_path, "b", "grpo", [1, 1, 0, 0], [10] * 4, [True] * 4)
    for name in ("eval_before.jsonl.gz", "eval_after.jsonl.gz"):
        moved = [{**r, "question": "other" if r["question"] == "q3" else r["question"]} for r in read_jsonl(b / name)]
        write_gz("".join(json.dumps(r) + "\n" for r in moved).encode(), b / name)
    assert "| a (grpo) | b (grpo) | not the same problems | | |" in compare_tables([a, b]).splitlines()


def test_compare_reads_an_older_versions_plain_files_and_names_a_broken_one(tmp_path, capsys):
    """Report folders written before the per-problem files were compressed still compare; a
    truncated, mislabelled or empty file gets one line naming it, not a traceback."""
    from assignment.trainer.ablation import compare_tables

    a = _ablation_folder(tmp_path, "a", "grpo", [1, 1, 0, 0], [10] * 4, [True] * 4)
    b = _ablation_folder(tmp_path, "b", "grpo", [0, 1, 1, 0], [10] * 4, [True] * 4)
    expected = compare_tables([a, b])
    for name in ("eval_before", "eval_after"):  # b as an older version wrote it: plain JSONL
        (b / f"{name}.jsonl").write_bytes(gzip.decompress((b / f"{name}.jsonl.gz").read_bytes()))
        (b / f"{name}.jsonl.gz").unlink()
    assert compare_tables([a, b]) == expected
    broken = a / "eval_after.jsonl.gz"
    whole = broken.read_bytes()
    for damaged in (whole[:len(whole) // 2], gzip.decompress(whole), b""):  # truncated, not gzip, empty
        broken.write_bytes(damaged)
        assert cli.main(["--compare", str(a), str(b), "--compare-out", str(tmp_path / "c.png")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("ppo-train: ") and str(broken) in err and len(err.splitlines()) == 1, err


def test_a_data_parallel_run_names_its_processes(reported, tmp_path):
    """run.json records the trainer's own command, not the ``accelerate launch`` around it: the
    report says how many processes ran, and whose card the memory figure is (process 0 logs)."""
    run = tmp_path / "run"
    shutil.copytree(reported[0], run)
    runs = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps([{**r, "world_size": 4} for r in runs]))
    out = tmp_path / "dp.md"
    assert cli.main(["--report", str(run), "--report-out", str(out)]) == 0
    text = out.read_text()
    device = runs[0]["device"]
    assert f"**Card: 4 data-parallel processes, one {device} each.**" in text
    assert f"`: 4 data-parallel processes, one {device} each, torch" in text
    assert "| peak GPU memory (torch allocator, process 0), training step / evaluation |" in text
    summary = json.loads((tmp_path / "dp" / "summary.json").read_text())
    assert (summary["card"], summary["world_size"]) == (device, 4)
    single = reported[1].read_text()
    assert f"**Card: {device}.**" in single and "process 0" not in single
    # A run.json from before world_size was recorded: one process.
    (run / "run.json").write_text(json.dumps([{k: v for k, v in r.items() if k != "world_size"} for r in runs]))
    assert cli.main(["--report", str(run), "--report-out", str(out)]) == 0
    assert f"**Card: {device}.**" in out.read_text()
    assert json.loads((tmp_path / "dp" / "summary.json").read_text())["world_size"] == 1


def test_a_run_evaluated_by_its_sampler_copy_says_so(reported, tmp_path):
    """eval.model=sampler: the report names the copy that decoded the evaluations and that they
    compare only with each other; a run evaluated by its own weights carries no such line."""
    from omegaconf import OmegaConf

    run = tmp_path / "run"
    shutil.copytree(reported[0], run)
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.eval.model, cfg.rollout.generation_dtype = "sampler", "float16"
    OmegaConf.save(cfg, run / "config.yaml")
    out = tmp_path / "sampler.md"
    assert cli.main(["--report", str(run), "--report-out", str(out)]) == 0
    assert "Decoded by the run's float16 copy of the policy (`eval.model=sampler`), before and after alike" in out.read_text()
    summary = json.loads((tmp_path / "sampler" / "summary.json").read_text())
    assert (summary["eval_model"], summary["eval_dtype"]) == ("sampler", "float16")
    own = json.loads((reported[1].parent / "tiny" / "summary.json").read_text())
    assert (own["eval_model"], own["eval_dtype"]) == (None, "float32") and "eval.model=sampler" not in reported[1].read_text()


def _write_outcomes(path: Path, records: list[dict], correct: list[bool]) -> list[dict]:
    """``records`` (the same problems) with the given outcomes, written to ``path``; returned."""
    records = [{**r, "correct": c} for r, c in zip(records, correct)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def test_an_evaluation_between_the_first_and_last_is_tabled_paired_and_kept(reported, tmp_path, capsys):
    """A run with ``eval.every`` evaluates during training too: the report tables each such
    evaluation between before and after, pairs it with both (exact McNemar), and its folder keeps
    the records as eval_step_N.jsonl.gz. The outcomes are set here, so every figure is known:
    step 0 -> 1: 4 improved, 0 regressed, p = 2 / 2**4 = 0.125; step 1 -> 2: 0 improved,
    3 regressed, p = 2 / 2**3 = 0.25."""
    run = tmp_path / "run"
    shutil.copytree(reported[0], run)
    samples = run / "eval_samples"
    evals = read_jsonl(run / "eval.jsonl")
    records = read_jsonl(samples / "step_0.jsonl")
    _write_outcomes(samples / "step_0.jsonl", records, [False, False, False, False, True, True])
    middle = _write_outcomes(samples / "step_1.jsonl", records, [True] * 6)
    _write_outcomes(samples / "step_2.jsonl", read_jsonl(samples / "step_2.jsonl"), [True, False, True, False, True, False])
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [evals[0], {**evals[0], "step": 1}, *evals[1:]]))
    out = tmp_path / "long.md"
    assert cli.main(["--report", str(run), "--report-out", str(out)]) == 0
    bundle = tmp_path / "long"
    assert read_jsonl(bundle / "eval_step_1.jsonl.gz") == middle
    [between] = json.loads((bundle / "summary.json").read_text())["evals_between"]
    assert (between["step"], between["accuracy"]) == (1, 1.0)
    assert between["from_before"] == {"improved": 4, "regressed": 0, "mcnemar_p": 0.125}
    assert between["to_after"] == {"improved": 0, "regressed": 3, "mcnemar_p": 0.25}
    text = out.read_text()
    assert "| during | 1 | 6 | 1.0000 |" in text
    assert ("Step 1, paired the same way: from step 0, 4 improved, 0 regressed, p = 0.125; "
            "to step 2, 0 improved, 3 regressed, p = 0.25.") in text
    # The last evaluation stopped after 3 problems: the one in between is paired on those 3 too.
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [evals[0], {**evals[0], "step": 1}]))
    after_file = samples / "step_2.jsonl"
    after_file.write_text("".join(line + "\n" for line in after_file.read_text().splitlines()[:3]))
    assert cli.main(["--report", str(run), "--report-out", str(tmp_path / "cut.md")]) == 0
    [between] = json.loads((tmp_path / "cut" / "summary.json").read_text())["evals_between"]
    assert between["from_before"] == {"improved": 3, "regressed": 0, "mcnemar_p": 0.25}
    assert read_jsonl(tmp_path / "cut" / "eval_step_1.jsonl.gz") == middle[:3]
    # A middle evaluation of other problems, or of fewer, cannot be paired: said in one line.
    capsys.readouterr()
    _write_outcomes(samples / "step_1.jsonl", [{**records[0], "question": "another"}, *records[1:]], [True] * 6)
    assert cli.main(["--report", str(run), "--report-out", str(tmp_path / "other.md")]) == 2
    assert "the evaluations at steps 0 and 1 are not the same problems" in capsys.readouterr().err
    _write_outcomes(samples / "step_1.jsonl", records[:2], [True] * 2)
    assert cli.main(["--report", str(run), "--report-out", str(tmp_path / "other.md")]) == 2
    assert "the evaluation at step 1 holds 2 problems, fewer than the 3 the report pairs" in capsys.readouterr().err
    assert not (tmp_path / "other.md").exists()
