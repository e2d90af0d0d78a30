"""Problems to train and evaluate on: GSM8K (hub or local jsonl) or the synthetic task.

Both come as GSM8K records ``{"question", "answer"}`` where the answer ends with
``#### <number>``; ``Problem`` keeps the question and the normalised reference number.
A local folder holds OpenAI's original ``train.jsonl`` and ``test.jsonl``, read line by line
with the standard library (no ``datasets``, no cache folder): a malformed line is reported by
file and line number. The hub is read with ``datasets``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from assignment.trainer.config import DataConfig
from assignment.trainer.reward import extract_answer
from assignment.trainer.synthetic import make_problems

SPLITS = ("train", "test")


class DataError(ValueError):
    """A data problem the user can fix; the CLI prints the message without a traceback."""


@dataclass(frozen=True)
class Problem:
    question: str
    # The normalised reference answer: the number of the gold solution's '#### <number>' line.
    answer: str


def read_jsonl_records(path: Path) -> list[dict]:
    """Every non-blank line of ``path``, checked to be a GSM8K record.

    Raises DataError naming the file and the 1-based line number of the first bad line.
    """
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    records = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{number}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("question", "answer")):
                raise DataError(f"{path}:{number}: expected an object with string fields 'question' and 'answer'")
            if reference_answer(record["answer"]) is None:
                raise DataError(f"{path}:{number}: the answer has no '#### <number>' line")
            records.append(record)
    if not records:
        raise DataError(f"{path}: no records")
    return records


def check_jsonl(path: Path) -> int:
    """Check that every non-blank line of ``path`` is a GSM8K record; return their number."""
    return len(read_jsonl_records(path))


def reference_answer(solution: str) -> str | None:
    """The gold answer of a GSM8K solution: its '#### <number>' line (never a boxed number)."""
    return extract_answer(solution, "strict")


def _to_problems(records) -> list[Problem]:
    return [Problem(r["question"], reference_answer(r["answer"])) for r in records]


def load_gsm8k(cfg: DataConfig) -> dict[str, list[Problem]]:
    """GSM8K's train and test problems, from ``cfg.local_dir`` when set, else from the hub."""
    if cfg.local_dir:
        return {split: _to_problems(read_jsonl_records(Path(cfg.local_dir) / f"{split}.jsonl")) for split in SPLITS}
    import datasets  # slow to import; only hub runs need it

    try:
        ds = datasets.load_dataset(cfg.hub_id, cfg.hub_config)
    except Exception as err:  # network, auth and missing-dataset errors have many types
        raise DataError(f"cannot load {cfg.hub_id} ({cfg.hub_config}) from the hub: {err}; "
                        "set data.local_dir to a folder with train.jsonl and test.jsonl") from None
    return {split: _to_problems(ds[split]) for split in SPLITS}


def load_problems(cfg: DataConfig, seed: int) -> dict[str, list[Problem]]:
    """``{"train": [...], "test": [...]}`` for the configured task, train capped at ``max_train``.

    The synthetic task has no fixed training set (``training_batch`` generates it); its test
    set is drawn with operands up to ``max_operand``, the full task, whatever the curriculum.
    """
    if cfg.task == "synthetic":
        test = make_problems(cfg.synthetic_test_size, cfg.max_operand, cfg.operators, f"test-{seed}")
        return {"train": [], "test": _to_problems(test)}
    splits = load_gsm8k(cfg)
    if cfg.max_train is not None:
        splits["train"] = splits["train"][: cfg.max_train]
    return splits


def training_batch(cfg: DataConfig, train: list[Problem], batch_size: int, seed: int, step: int,
                   max_operand: int) -> list[Problem]:
    """The problems of PPO step ``step``: a function of its arguments only, so that a resumed
    run draws the same ones. Synthetic problems are generated with operands up to
    ``max_operand`` (the curriculum's level); GSM8K ones are drawn from ``train``."""
    key = f"{seed}-{step}"
    if cfg.task == "synthetic":
        return _to_problems(make_problems(batch_size, max_operand, cfg.operators, key))
    rng = random.Random(key)
    return rng.sample(train, batch_size) if batch_size <= len(train) else rng.choices(train, k=batch_size)


class Curriculum:
    """The synthetic task's operand range: from ``curriculum_start`` up to ``max_operand``,
    one step wider each time the correct rate, averaged over the last ``curriculum_window``
    PPO steps, reaches ``curriculum_threshold``. Without a curriculum it stays at ``max_operand``."""

    def __init__(self, cfg: DataConfig):
        self.cfg = cfg
        self.level = cfg.max_operand if cfg.curriculum_start is None else cfg.curriculum_start
        self.recent: list[float] = []

    def update(self, correct_rate: float) -> None:
        """Record a step's rollout correct rate; widen the range when it is high enough."""
        if self.level >= self.cfg.max_operand:
            return
        self.recent = (self.recent + [correct_rate])[-self.cfg.curriculum_window:]
        if len(self.recent) == self.cfg.curriculum_window and sum(self.recent) / len(self.recent) >= self.cfg.curriculum_threshold:
            self.level += 1
            self.recent = []

    def state_dict(self) -> dict:
        return {"level": self.level, "recent": list(self.recent)}

    def load_state_dict(self, state: dict) -> None:
        self.level, self.recent = state["level"], list(state["recent"])
