"""What the tests of committed GSM8K runs share: a report folder re-scored from its per-problem
evaluations, its config.yaml against the shipped config it claims to have run, and the pages that
quote them read with their wrapped lines joined."""

import json
from pathlib import Path

from assignment.trainer.runlog import read_jsonl
from assignment.trainer.stats import McNemar, mcnemar_exact
from course.committed import RUN_CONTROL, run_config, shipped_config

__all__ = ["RUN_CONTROL", "changed_keys", "joined", "joined_text", "rescored"]


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
    return joined_text(path.read_text())


def joined_text(text: str) -> str:
    """``joined`` of a text already read (a part of a page)."""
    return " ".join(word for word in text.split() if word != "#")


def changed_keys(folder: Path, config: str, monkeypatch) -> tuple[set[str], dict]:
    """The keys whose value in the folder's config.yaml differs from the shipped ``config``'s (read
    without the device's environment; a key added to the schema since the run takes its default,
    which is what the code before it did); and the run's values."""
    for name in ("MODEL_DIR", "MODEL_GGUF", "GSM8K_DIR"):
        monkeypatch.delenv(name, raising=False)
    ran, shipped = run_config(folder), shipped_config(Path(config))
    return {k for k in ran if ran[k] != shipped[k]}, ran
