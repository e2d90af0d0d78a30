"""What the tests of committed GSM8K runs share: a report folder re-scored from its per-problem
evaluations, its config.yaml against the shipped config it claims to have run, and the pages that
quote them read with their wrapped lines joined."""

import json
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from assignment.trainer.config import Config, load_config
from assignment.trainer.runlog import read_jsonl
from assignment.trainer.stats import McNemar, mcnemar_exact

# Where the run was, not what it computed: the device's paths and how the run was split into calls.
# Keys that say where a run's files go, how long a call may run, where the model and data are, or
# whether the card may start it (train.min_gpu_memory_gib: a check before loading): none changes
# what the run computes.
RUN_CONTROL = {"train.output_dir", "train.time_limit_s", "train.final_checkpoint", "model.name", "model.gguf_file",
               "data.local_dir", "train.min_gpu_memory_gib"}


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return out


def rescored(folder: Path) -> tuple[McNemar, dict]:
    """The exact McNemar test of the folder's greedy evaluations before and after (all 1319
    problems, the same questions in the same order), checked against its summary.json; and that
    summary."""
    before, after = read_jsonl(folder / "eval_before.jsonl.gz"), read_jsonl(folder / "eval_after.jsonl.gz")
    assert len(before) == len(after) == 1319 and all(b["question"] == a["question"] for b, a in zip(before, after))
    test = mcnemar_exact([r["correct"] for r in before], [r["correct"] for r in after])
    summary = json.loads((folder / "summary.json").read_text())
    assert (summary["improved"], summary["regressed"], summary["mcnemar_p"]) == (test.c, test.b, test.p_value)
    assert (summary["accuracy_before"], summary["accuracy_after"]) == (test.before / 1319, test.after / 1319)
    return test, summary


def joined(path: Path) -> str:
    """The page with its wrapped lines (and a YAML comment's '#') joined: a figure may sit across a line break."""
    return " ".join(word for word in path.read_text().split() if word != "#")


def changed_keys(folder: Path, config: str, monkeypatch) -> tuple[set[str], dict]:
    """The keys whose value in the folder's config.yaml differs from the shipped ``config``'s (read
    without the device's environment), after checking both have the same keys; and the run's values."""
    for name in ("MODEL_DIR", "MODEL_GGUF", "GSM8K_DIR"):
        monkeypatch.delenv(name, raising=False)
    ran = flat(yaml.safe_load((folder / "config.yaml").read_text()))
    shipped = flat(OmegaConf.to_container(OmegaConf.structured(load_config(config))))
    assert ran.keys() <= shipped.keys(), ran.keys() - shipped.keys()
    # A key added to the schema since the run takes its default, which is what the code before it did.
    defaults = flat(OmegaConf.to_container(OmegaConf.structured(Config)))
    ran = {key: ran.get(key, defaults[key]) for key in shipped}
    return {k for k in ran if ran[k] != shipped[k]}, ran
