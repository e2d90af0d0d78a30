"""Greedy evaluation: strict accuracy and format rate on held-out problems.

Strict means the answer must sit on a ``#### <number>`` line (GSM8K's format, the same
extraction as the reward); a right number elsewhere in the text does not count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from transformers import PreTrainedTokenizerBase

from assignment.trainer.config import Config
from assignment.trainer.data import Problem
from assignment.model import PolicyWithValueHead
from assignment.trainer.reward import score
from assignment.trainer.rollout import render_prompts, sample


@dataclass
class EvalResult:
    n: int
    correct: int
    formatted: int
    mean_length: float
    # One record per problem: question, response, reference, correct, formatted.
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n

    @property
    def format_rate(self) -> float:
        return self.formatted / self.n

    def metrics(self) -> dict[str, float]:
        """Namespaced metrics for the run log."""
        return {"eval/accuracy": self.accuracy, "eval/format_rate": self.format_rate,
                "eval/response_length": self.mean_length, "eval/n": self.n, "eval/correct": self.correct}


def evaluate(policy: PolicyWithValueHead, tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem],
             cfg: Config, progress: Any = None) -> EvalResult:
    """Greedy responses to ``problems``, scored with the config's reward extraction."""
    records, total_length = [], 0
    size = cfg.eval.batch_size
    for start in range(0, len(problems), size):
        chunk = problems[start:start + size]
        prompts = render_prompts(tokenizer, [problem.question for problem in chunk], cfg.data)
        responses = sample(policy, tokenizer, prompts, cfg.rollout, greedy=True)
        lengths = responses.response_mask.sum(dim=-1).tolist()
        texts = tokenizer.batch_decode(responses.response_ids, skip_special_tokens=True)
        for problem, text, length, finished in zip(chunk, texts, lengths, responses.finished.tolist()):
            scored = score(text, problem.answer, finished, length, cfg.reward)
            records.append({"question": problem.question, "response": text, "reference": problem.answer,
                            "correct": scored.correct, "formatted": scored.formatted})
            total_length += length
        if progress is not None:
            progress.update(len(chunk))
    n = max(len(records), 1)
    return EvalResult(len(records), sum(r["correct"] for r in records), sum(r["formatted"] for r in records),
                      total_length / n, records)
