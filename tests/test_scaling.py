"""benchmarks/scaling.py: the scaling report's records, their check and their efficiencies; the
launches run on CPU (gloo) with the tiny synthetic model, where the numbers mean nothing."""

import json
import statistics
from pathlib import Path

import pytest

from assignment.trainer.impl import load_module
from assignment.trainer.runlog import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
scaling = load_module(ROOT / "benchmarks" / "scaling.py")
REPORT = ROOT / "reports" / "multi_gpu" / "scaling.json"
TINY = ["model.hidden_size=32", "rollout.batch_size=8", "ppo.minibatch_size=4", "train.cpu_threads=1",
        "train.tensorboard=false"]


def record(launch="single", gpus=1, card="NVIDIA H100 80GB HBM3", tokens_per_second=100.0, **changes):
    return {"launch": launch, "gpus": gpus, "card": card, "seconds_per_step": 10.0,
            "tokens_per_second": tokens_per_second, "peak_memory_gib": 35.6, "command": "python -m assignment.trainer",
            **changes}


@pytest.mark.slow
def test_the_script_measures_one_process_and_ddp_on_two_and_writes_checked_records(tmp_path):
    out, runs = tmp_path / "scaling.json", tmp_path / "runs"
    assert scaling.main(["--config", str(ROOT / "configs" / "cpu_synthetic.yaml"), "--launches", "single", "ddp:2",
                         "--steps", "6", "--runs-dir", str(runs), "--out", str(out), *TINY]) == 0
    records = scaling.read(out)  # the form check passes
    assert [(r["launch"], r["gpus"], r["card"], r["peak_memory_gib"]) for r in records] == [
        ("single", 1, "cpu", None), ("ddp", 2, "cpu", None)]
    ddp = records[1]["command"]
    assert "NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1" in ddp
    assert "accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 2" in ddp
    # The medians of steps 2-6 of the run's own metrics; tokens are the whole batch's real ones.
    metrics = read_jsonl(runs / "ddp_2" / "metrics.jsonl")[1:]
    assert len(metrics) == 5 and read_jsonl(runs / "ddp_2" / "metrics.jsonl")[0]["step"] == 1
    seconds = [m["time/rollout"] + m["time/update"] for m in metrics]
    assert records[1]["seconds_per_step"] == statistics.median(seconds)
    assert records[1]["tokens_per_second"] == statistics.median(
        m["rollout/response_length"] * 8 / s for m, s in zip(metrics, seconds))
    [(launch, gpus, card, efficiency)] = scaling.efficiencies(records)
    assert (launch, gpus, card) == ("ddp", 2, "cpu")
    assert efficiency == records[1]["tokens_per_second"] / (2 * records[0]["tokens_per_second"])
    assert not (runs / "ddp_2" / "checkpoint.pt").exists()  # train.final_checkpoint=false


def test_efficiency_is_tokens_per_second_against_n_single_gpus_of_the_same_card():
    records = [record(), record("ddp", 2, tokens_per_second=180.0), record("ddp", 4, tokens_per_second=300.0),
               record(card="NVIDIA H200", tokens_per_second=120.0), record("fsdp", 2, card="NVIDIA H200",
                                                                            tokens_per_second=120.0)]
    scaling.check(records)
    assert scaling.efficiencies(records) == [("ddp", 2, "NVIDIA H100 80GB HBM3", 0.9),
                                             ("ddp", 4, "NVIDIA H100 80GB HBM3", 0.75),
                                             ("fsdp", 2, "NVIDIA H200", 0.5)]


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("command"), "must have exactly the keys"),
    (lambda r: r.update(seconds=1.0), "must have exactly the keys"),
    (lambda r: r.update(launch="tp"), "launch must be one of"),
    (lambda r: r.update(gpus=1), "gpus must be 1 for single and an integer >= 2"),
    (lambda r: r.update(gpus=2.0), "gpus must be 1 for single and an integer >= 2"),
    (lambda r: r.update(card=""), "card must be the nvidia-smi name"),
    (lambda r: r.update(seconds_per_step=0), "seconds_per_step must be a number > 0"),
    (lambda r: r.update(tokens_per_second="fast"), "tokens_per_second must be a number > 0"),
    (lambda r: r.update(peak_memory_gib=None), r"null only on card cpu"),
    (lambda r: r.update(command=" "), "command must be the command that ran"),
    (lambda r: r.update(card="NVIDIA A100"), "has no single-GPU record of the same card"),
])
def test_a_malformed_record_is_refused_with_its_reason(change, message):
    records = [record(), record("ddp", 2)]
    change(records[1])
    with pytest.raises(scaling.ScalingError, match=message):
        scaling.check(records)


def test_a_file_that_is_not_a_list_of_unique_records_is_refused(tmp_path, capsys):
    with pytest.raises(scaling.ScalingError, match="non-empty JSON list"):
        scaling.check({"launch": "single"})
    with pytest.raises(scaling.ScalingError, match="a second record of the same launch"):
        scaling.check([record(), record(), record("ddp", 2)])
    bad = tmp_path / "scaling.json"
    bad.write_text("[{")
    assert scaling.main(["--check", str(bad)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_medians_leave_the_first_step_out_and_need_five_more():
    steps = [{"time/rollout": 50.0, "time/update": 50.0, "rollout/response_length": 10.0,
              "memory/peak_memory_gib": 40.0}]  # the first step: compiling, left out
    steps += [{"time/rollout": 1.0, "time/update": float(s), "rollout/response_length": 10.0,
               "memory/peak_memory_gib": 30.0 + s} for s in (1, 2, 3, 4, 9)]
    assert scaling.summarize(steps, 4) == {"seconds_per_step": 4.0, "tokens_per_second": 10.0,
                                           "peak_memory_gib": 39.0}
    with pytest.raises(scaling.ScalingError, match="the first and 5 more"):
        scaling.summarize(steps[:5], 4)


def test_launches_are_named_single_ddp_n_or_fsdp_n(capsys):
    assert [scaling.parse_launch(t) for t in ("single", "ddp:2", "fsdp:4")] == [("single", 1), ("ddp", 2), ("fsdp", 4)]
    for text in ("single:2", "ddp", "ddp:1", "tp:2"):
        with pytest.raises(scaling.ScalingError, match="must be single, ddp:N or fsdp:N"):
            scaling.parse_launch(text)
    assert scaling.main(["--config", "c.yaml", "--out", "o.json", "--launches", "ddp:x"]) == 2
    assert "launch 'ddp:x'" in capsys.readouterr().err


def test_merging_replaces_a_launch_measured_again():
    old = [record(), record("ddp", 2, tokens_per_second=150.0)]
    merged = scaling.merge(old, [record("ddp", 2, tokens_per_second=180.0), record("fsdp", 2)])
    assert [(r["launch"], r["gpus"], r["tokens_per_second"]) for r in merged] == [
        ("single", 1, 100.0), ("ddp", 2, 180.0), ("fsdp", 2, 100.0)]
    assert old[1]["tokens_per_second"] == 150.0  # the old list is left as it was


@pytest.mark.skipif(not REPORT.exists(), reason="reports/multi_gpu/scaling.json is not measured yet")
def test_the_committed_scaling_report_has_every_launch_on_one_card():
    records = scaling.read(REPORT)
    assert len({r["card"] for r in records}) == 1, "all measured on one machine"
    assert {(r["launch"], r["gpus"]) for r in records} >= {("single", 1), ("ddp", 2), ("ddp", 4), ("fsdp", 2), ("fsdp", 4)}
    for launch, gpus, card, efficiency in scaling.efficiencies(records):
        print(f"{launch} on {gpus} x {card}: efficiency {efficiency:.3f}")
    assert json.loads(REPORT.read_text()) == records


def test_the_markdown_table_is_the_files_figures():
    records = [record(), record("ddp", 2, tokens_per_second=180.0, seconds_per_step=1.25), record("fsdp", 4, peak_memory_gib=7.25)]
    text = scaling.table(records)
    assert text.splitlines()[2:] == ["| single | NVIDIA H100 80GB HBM3 | 1 | 10.00 | 100 | 1.00 | 1.000 | 35.6 |",
                                     "| ddp | NVIDIA H100 80GB HBM3 | 2 | 1.25 | 180 | 1.80 | 0.900 | 35.6 |",
                                     "| fsdp | NVIDIA H100 80GB HBM3 | 4 | 10.00 | 100 | 1.00 | 0.250 | 7.2 |"]


@pytest.mark.skipif(not REPORT.exists(), reason="reports/multi_gpu/scaling.json is not measured yet")
def test_the_multi_gpu_page_and_the_results_page_carry_the_committed_files_table():
    table = scaling.table(scaling.merge([], scaling.read(REPORT)))
    for page in (REPORT.parents[1] / "multi_gpu.md", ROOT / "docs" / "results.md"):
        assert table in page.read_text(), f"{page.name}: python benchmarks/scaling.py --markdown {REPORT.relative_to(ROOT)}"


LEASE = REPORT.parent / "h200_lease1"
SECOND = REPORT.parent / "h200_lease2"  # the current code again: DDP only (the lease ended in FSDP 2)
LAUNCH_LABELS = (("single_1", "single"), ("ddp_2", "DDP 2"), ("ddp_4", "DDP 4"), ("fsdp_2", "FSDP 2"),
                 ("fsdp_4", "FSDP 4"))


def launch_rows(lease: Path, labels) -> list[str]:
    """The page's per-launch rows: medians of rollout s, update s and response length over the
    steps after the first, from each launch's metrics.jsonl."""
    median, rows = statistics.median, []
    for folder, label in labels:
        steps = read_jsonl(lease / "launches" / folder / "metrics.jsonl")[1:]
        rollout, update = median(m["time/rollout"] for m in steps), median(m["time/update"] for m in steps)
        rows.append(f"| {label} | {rollout:.2f} | {update:.2f} | {median(m['rollout/response_length'] for m in steps):.0f} |")
    return rows


@pytest.mark.skipif(not LEASE.is_dir(), reason="the first lease's files are not committed")
def test_the_multi_gpu_pages_other_tables_and_the_7b_figures_are_the_files():
    """reports/multi_gpu.md's per-launch and per-process tables and its 7B figures, recomputed
    from the trainer's metrics.jsonl and benchmarks/ppo_step.py's JSON (medians of the steps after
    the first)."""
    page = (REPORT.parents[1] / "multi_gpu.md").read_text()
    median = statistics.median
    first_table = page[:page.index("| launch (second lease) |")] if SECOND.is_dir() else page
    for row in launch_rows(LEASE, LAUNCH_LABELS):
        assert row in first_table, row
    for rows, label in ((256, "256 (one GPU)"), (128, "128 (a process of DDP 2)"), (64, "64 (a process of DDP 4)")):
        steps = json.loads((LEASE / "per_process" / f"pp{rows}.json").read_text())["steps"][1:]
        m = {key: median(s[key] for s in steps) for key in ("generate_s", "policy_forward_s", "reference_forward_s",
                                                             "rest_s", "rollout_s", "update_s")}
        assert (f"| {label} | {m['generate_s']:.2f} | {m['policy_forward_s']:.2f} + {m['reference_forward_s']:.2f} | "
                f"{m['rest_s']:.2f} | {m['update_s']:.2f} | {m['rollout_s'] + m['update_s']:.2f} |") in page, label
    steps = read_jsonl(LEASE / "fsdp_7b" / "metrics.jsonl")[1:]
    assert f"**{median(m['time/rollout'] + m['time/update'] for m in steps):.2f} s**" in page
    assert f"**{max(m['memory/peak_memory_gib'] for m in steps):.1f} GiB**" in page
    assert f"reserved {max(m['memory/peak_reserved_gib'] for m in steps):.1f} GiB" in page


@pytest.mark.skipif(not SECOND.is_dir(), reason="the second lease's files are not committed")
def test_the_second_lease_tables_and_figures_are_its_files():
    """The current code measured again: its scaling table, per-launch medians and the figures the
    page and docs/results.md draw from them, against the first lease's (all three launches that
    finished; the cut-off FSDP 2 launch has no record)."""
    page = (REPORT.parents[1] / "multi_gpu.md").read_text()
    records = scaling.read(SECOND / "scaling.json")
    assert [(r["launch"], r["gpus"]) for r in records] == [("single", 1), ("ddp", 2), ("ddp", 4)]
    assert scaling.table(records) in page
    table = page[page.index("| launch (second lease) |"):].split("\n\n")[0]
    for row in launch_rows(SECOND, LAUNCH_LABELS[:3]):
        assert row in table, row
    measured = len(read_jsonl(SECOND / "launches" / "fsdp_2" / "metrics.jsonl")) - 1
    assert f"({measured} of its 6 measured steps done: no record)" in page
    (e2, e4), (b2, b4) = ([e for launch, _, _, e in scaling.efficiencies(measured) if launch == "ddp"]
                          for measured in (records, scaling.read(REPORT)))  # DDP on 2, then on 4
    text, results = " ".join(page.split()), " ".join((ROOT / "docs" / "results.md").read_text().split())
    assert f"({e2:.3f} against {b2:.3f} on 2 GPUs, {e4:.3f} against {b4:.3f} on 4)" in text
    assert f"by {0.90 - e2:.3f} and {0.75 - e4:.3f} here" in text
    assert f"DDP reaches {e2:.3f} and {e4:.3f}, still short of 0.90 and 0.75 (by {0.90 - e2:.3f} and {0.75 - e4:.3f}" in results
    updates = [statistics.median(m["time/update"] for m in read_jsonl(lease / "launches" / folder / "metrics.jsonl")[1:])
               for lease in (SECOND, LEASE) for folder, _ in LAUNCH_LABELS[:3]]
    gains = [old - new for new, old in zip(updates[:3], updates[3:])]
    assert "by " + ", ".join(f"{g:.2f}" for g in gains[:2]) + f" and {gains[2]:.2f} s" in text


FOURTH = REPORT.parent / "h100_lease4"  # the code before (0679bdf): DDP 2 only (single failed at start)


def test_the_fourth_leases_before_record_is_its_files():
    """The code before's DDP 2 launch, the one record of that code on a card: the page quotes its
    record and its per-launch medians."""
    [record] = json.loads((FOURTH / "scaling_before.json").read_text())  # read() wants a single record beside it
    assert (record["launch"], record["gpus"], record["card"]) == ("ddp", 2, "NVIDIA H100 80GB HBM3")
    steps = read_jsonl(FOURTH / "launches" / "before_ddp_2" / "metrics.jsonl")[1:]
    assert len(steps) >= 5  # the "medians over at least 5 steps after the first"
    rollout, update = (statistics.median(m[key] for m in steps) for key in ("time/rollout", "time/update"))
    assert statistics.median(m["time/rollout"] + m["time/update"] for m in steps) == record["seconds_per_step"]
    text = " ".join((REPORT.parents[1] / "multi_gpu.md").read_text().split())
    assert (f"medians of {rollout:.2f} s rollout and {update:.2f} s update, {record['seconds_per_step']:.2f} s a step "
            f"(the median of their sums over steps 2-{len(steps) + 1};" in text
            and f"{record['tokens_per_second']:.0f} real response tokens/s and {record['peak_memory_gib']:.1f} GiB" in text)
    assert (FOURTH / "launches" / "before_ddp_4_cut.log").is_file() and "before_ddp_4_cut.log" in text
