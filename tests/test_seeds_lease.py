"""benchmarks/gsm8k_seeds_lease.sh on the CPU: its plan runs each of the 8 runs once, each a
shipped config that loads, under the report names course.seeds and course.controls read; and its
start/watch cycle, with a stand-in for python that records what it was asked, runs one queue per
GPU from the copy of the tree and brings the reports back in the tar."""

import os
import shlex
import subprocess
import tarfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from assignment.trainer.config import load_config
from course import seeds
from course.committed import changed, flat, shipped_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gsm8k_seeds_lease.sh"
CONTROLS = {"gsm8k_control_random", "gsm8k_control_format"}
# The seeds course.seeds waits for: every ablation seed but the committed seed 0, and the recipe's planned ones.
SEEDS = {name for _, folders in seeds.ABLATION.values() for seed, name in folders.items() if seed} \
    | set(seeds.RECIPE_PLANNED.values())


def lease(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def vars_of(cfg) -> dict:
    """A loaded config as the nested dict config.yaml holds."""
    return OmegaConf.to_container(OmegaConf.structured(cfg))


def planned(gpus: int) -> list[list[tuple[int, str]]]:
    """Per batch: (GPU, command) of each run, from `plan BATCH`."""
    out = []
    for batch in range(1, 9):
        done = lease("plan", str(batch), GPUS=str(gpus))
        if done.returncode:
            assert f"BATCH must be 1 to {batch - 1} on {gpus} GPUs" in done.stderr
            return out
        out.append([(int(line.split(":")[0].removeprefix("GPU ")), line.split(": ", 1)[1])
                    for line in done.stdout.splitlines()])
    raise AssertionError("more batches than runs")


@pytest.mark.parametrize("gpus, batches", [(4, 2), (2, 4)])
def test_the_plan_runs_each_run_once_one_per_gpu(gpus, batches, monkeypatch):
    for name in ("MODEL_DIR", "MODEL_GGUF", "GSM8K_DIR"):
        monkeypatch.delenv(name, raising=False)
    plan = planned(gpus)
    assert len(plan) == batches and all([gpu for gpu, _ in runs] == list(range(gpus)) for runs in plan)
    names = []
    for gpu, command in (item for runs in plan for item in runs):
        train, report = command.split(" && ")
        words = shlex.split(train)
        config, overrides = words[words.index("--config") + 1], [w for w in words if "=" in w]
        name = Path(dict(o.split("=", 1) for o in overrides)["train.output_dir"]).name
        assert shlex.split(report)[-2:] == ["--report-out", f"{Path.home()}/rs/reports/{name}.md"]
        ran = flat(vars_of(load_config(ROOT / config, overrides)))  # loads: the config and its overrides are valid
        assert changed(ran, shipped_config(ROOT / config)) <= {"train.seed"}, name
        expected_seed = int(name.rsplit("seed", 1)[1]) if "seed" in name else 0
        assert ran["train.seed"] == expected_seed and ran["train.time_limit_s"] is None, name
        names.append(name)
    assert sorted(names) == sorted(CONTROLS | SEEDS)  # each once, under the names the generators read


def test_no_gpu_or_a_batch_out_of_range_is_a_message(tmp_path):
    assert "set GPUS" in lease("start", "1", GPUS="0", HOME=str(tmp_path)).stderr
    done = lease("plan", "3", GPUS="4")
    assert done.returncode == 2 and "BATCH must be 1 to 2 on 4 GPUs, got '3'" in done.stderr
    assert lease("nothing").returncode == 2 and not (tmp_path / "ws").exists()


def test_start_and_watch_run_one_queue_per_gpu_and_bring_the_reports_back(tmp_path):
    """A stand-in python records each call; for --report it writes the page, as the trainer would."""
    fake = tmp_path / "python"
    fake.write_text('#!/usr/bin/env bash\necho "$CUDA_VISIBLE_DEVICES $PWD $*" >> "$HOME/calls.txt"\n'
                    'if [ "$3" = "--report" ]; then mkdir -p "$(dirname "$6")"; echo "# report" > "$6"; fi\n')
    fake.chmod(0o755)
    env = dict(HOME=str(tmp_path), GPUS="2", PYTHON=str(fake), OUT=str(tmp_path), POLL_S="0.1", WATCH_S="30")
    started = lease("start", "1", **env)
    assert started.returncode == 0 and "started batch 1 of 4: 2 queues" in started.stdout, started.stderr
    watched = lease("watch", **env)
    assert watched.returncode == 0 and watched.stdout.count(" done") == 2, watched.stdout
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    work = f"{tmp_path}/ws"
    for gpu, name in enumerate(["gsm8k_control_random", "gsm8k_control_format"]):
        assert any(c.startswith(f"{gpu} {work} -m assignment.trainer --config configs/{name}.yaml") for c in calls), calls
        assert any(c.startswith(f"{gpu} {work} -m assignment.trainer --report {tmp_path}/rs/{name}") for c in calls)
    assert (Path(work) / "assignment" / "trainer" / "loop.py").is_file()  # the queues ran from the copy
    with tarfile.open(tmp_path / "results.tar.gz") as tar:
        members = set(tar.getnames())
    assert {"./reports/gsm8k_control_random.md", "./reports/gsm8k_control_format.md", "./gpu0.log"} <= members
    (tmp_path / "rs" / "done1").unlink()  # a queue that has not ended: no second batch over it
    refused = lease("start", "2", **env)
    assert refused.returncode == 2 and "still running" in refused.stderr


def test_slots_put_two_runs_on_one_card_beside_other_queues(tmp_path):
    """SLOTS="2 2 3 3": batch 1's four runs, two on GPU 2 and two on GPU 3, each in a queue of its own."""
    plan = lease("plan", "1", SLOTS="2 2 3 3")
    assert [line.split(":")[0] for line in plan.stdout.splitlines()] == ["GPU 2", "GPU 2", "GPU 3", "GPU 3"]
    assert "gsm8k_qwen_coder_seed4" in plan.stdout.splitlines()[3]
    assert "BATCH must be 1 to 2 on SLOTS='2 2 3 3', got '3'" in lease("plan", "3", SLOTS="2 2 3 3").stderr
    assert "SLOTS must be GPU numbers" in lease("plan", "1", SLOTS="2,3").stderr
    fake = tmp_path / "python"
    fake.write_text('#!/usr/bin/env bash\necho "$CUDA_VISIBLE_DEVICES $*" >> "$HOME/calls.txt"\n')
    fake.chmod(0o755)
    env = dict(HOME=str(tmp_path), SLOTS="1 1", PYTHON=str(fake), OUT=str(tmp_path), POLL_S="0.1", WATCH_S="30")
    assert "2 queues" in lease("start", "1", **env).stdout
    watched = lease("watch", **env)
    assert "queue 0 (CUDA_VISIBLE_DEVICES 1) done" in watched.stdout, watched.stdout
    assert "queue 1 (CUDA_VISIBLE_DEVICES 1) done" in watched.stdout
    runs = [c for c in (tmp_path / "calls.txt").read_text().splitlines() if "-m assignment.trainer" in c]
    assert len(runs) == 4 and {c.split()[0] for c in runs} == {"1"}, runs  # two runs and two reports, on GPU 1


def test_cap_gib_caps_every_run_of_a_batch_and_counts_as_run_control():
    """CAP_GIB=68 (two runs on one card): each run of the batch gets train.max_gpu_memory_gib=68,
    which loads, and the committed-run checks read as run control, not as a changed computation."""
    plan = lease("plan", "2", SLOTS="0 0 1 1", CAP_GIB="68").stdout.splitlines()
    assert [line.split(":")[0] for line in plan] == ["GPU 0", "GPU 0", "GPU 1", "GPU 1"]
    for line in plan:
        words = shlex.split(line.split(": ", 1)[1].split(" && ")[0])
        config, overrides = words[words.index("--config") + 1], [w for w in words if "=" in w]
        assert "train.max_gpu_memory_gib=68" in overrides, line
        ran = flat(vars_of(load_config(ROOT / config, overrides)))
        assert ran["train.max_gpu_memory_gib"] == 68
        assert changed(ran, shipped_config(ROOT / config)) <= {"train.seed"}, line
    assert "max_gpu_memory_gib" not in lease("plan", "2", SLOTS="0 0 1 1").stdout
