"""Greedy evaluation: accuracy and answer rate on held-out problems, one record per problem.

The answer is read exactly as the reward reads it (``reward.answer_format``: ``#### <number>``
and/or ``\\boxed{<number>}``, see ``assignment.trainer.reward``). Each problem's record holds
``question``, ``reference``, ``response``, ``answer`` (the extracted normalised number, or None),
``correct``, and also ``marker`` (which marker held the answer), ``length`` (response tokens,
EOS included) and ``finished`` (ended with EOS). Every summary figure is computed from these
records (``summarize``), so it can be recomputed from the saved files.

``evaluate_batches`` yields the records batch by batch, so the trainer can write each batch as
it finishes and continue an interrupted evaluation where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from transformers import PreTrainedTokenizerBase

from assignment.model import PolicyWithValueHead
from assignment.trainer.config import Config
from assignment.trainer.data import Problem
from assignment.trainer.reward import score
from assignment.trainer.rollout import render_prompts, sample


@dataclass
class EvalResult:
    n: int
    correct: int
    formatted: int  # responses with an answer
    mean_length: float
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n

    @property
    def format_rate(self) -> float:
        return self.formatted / self.n

    def metrics(self) -> dict[str, float]:
        """Namespaced metrics for the run log (``eval/format_rate``: the share with an answer)."""
        return {"eval/accuracy": self.accuracy, "eval/format_rate": self.format_rate,
                "eval/response_length": self.mean_length, "eval/n": self.n, "eval/correct": self.correct}


def summarize(records: list[dict[str, Any]]) -> EvalResult:
    """The evaluation's figures, from its per-problem records alone."""
    n = max(len(records), 1)
    return EvalResult(len(records), sum(bool(r["correct"]) for r in records),
                      sum(r["answer"] is not None for r in records), sum(r["length"] for r in records) / n, records)


def evaluate_batches(policy: PolicyWithValueHead, tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem],
                     cfg: Config) -> Iterator[list[dict[str, Any]]]:
    """Greedy responses to ``problems``, ``eval.batch_size`` at a time: the records of each batch."""
    size = cfg.eval.batch_size
    for start in range(0, len(problems), size):
        chunk = problems[start:start + size]
        prompts = render_prompts(tokenizer, [problem.question for problem in chunk], cfg.data)
        responses = sample(policy, tokenizer, prompts, cfg.rollout, greedy=True)
        lengths = responses.response_mask.sum(dim=-1).tolist()
        texts = tokenizer.batch_decode(responses.response_ids, skip_special_tokens=True)
        records = []
        for problem, text, length, finished in zip(chunk, texts, lengths, responses.finished.tolist()):
            scored = score(text, problem.answer, finished, length, cfg.reward)
            records.append({"question": problem.question, "reference": problem.answer, "response": text,
                            "answer": scored.answer, "correct": scored.correct, "marker": scored.marker,
                            "length": int(length), "finished": bool(finished)})
        yield records
