"""Greedy evaluation: accuracy and answer rate on held-out problems, one record per problem.

The answer is read exactly as the reward reads it (``reward.answer_format``: ``#### <number>``
and/or ``\\boxed{<number>}``, see ``assignment.trainer.reward``). Each problem's record holds
``question``, ``reference``, ``response``, ``answer`` (the extracted normalised number, or None),
``correct``, and also ``marker`` (which marker held the answer), ``length`` (response tokens,
EOS included) and ``finished`` (ended with EOS). ``correct`` is the true outcome whatever
``reward.kind`` the run trained on: a control run is evaluated on the task. Every summary figure
is computed from these records (``summarize``), so it can be recomputed from the saved files.

``evaluate_batches`` yields the records batch by batch, so the trainer can write each batch as
it finishes and continue an interrupted evaluation where it stopped.

Evaluation decodes eagerly with the dynamic cache, whatever ``rollout.cache_implementation`` and
``rollout.compile`` say (``eval_rollout_config``). Through the rollout's compiled path, greedy
evaluation of the float32 policy at one batch of 1319 took 117-125 s on an H200 and dynamo
reported "hit config.recompile_limit (8)" on ``self.layer_idx``; eager decoding in 2 batches of
660 takes 76 s there (81 s in batches of 440 on an H100). Why it recompiles, as far as measured
(a probe on an H200: a random-init Qwen2 of 24 layers): the compiled
forward is traced per dtype and batch size, and the float32 policy and the bfloat16 sampler run
the same code objects at different batch sizes; with gradient checkpointing on (the Qwen config),
the hook it installs on the embeddings (transformers' ``make_inputs_require_grads``) breaks the
graph into pieces that each recompile: 12 recompilations in the first rollout after a float32
evaluation, against 1 without checkpointing. The limit itself, per layer, was seen on the real
model only. Two evaluations a run do not repay compilation, and the float32 policy decoded
eagerly is what every earlier run's accuracy was measured with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from assignment.model import PolicyWithValueHead
from assignment.trainer.config import Config, RolloutConfig
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


def eval_rollout_config(cfg: Config) -> RolloutConfig:
    """The rollout settings evaluation decodes with: the run's, with the dynamic cache and no
    compilation (see the module docstring). Greedy decoding ignores the sampling fields."""
    return dataclasses.replace(cfg.rollout, cache_implementation=None, compile=False)


def evaluate_batches(policy: PolicyWithValueHead, tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem],
                     cfg: Config, sampler: PreTrainedModel | None = None) -> Iterator[list[dict[str, Any]]]:
    """Greedy responses to ``problems``, ``eval.batch_size`` at a time: the records of each batch.
    Decoded by ``sampler`` (eval.model=sampler: the 16-bit copy) if given, else by the policy."""
    size, decoding = cfg.eval.batch_size, eval_rollout_config(cfg)
    # The records keep the true outcome whatever reward.kind trained the run (a control's coin has no
    # step here); no record holds the reward.
    task = dataclasses.replace(cfg.reward, kind="correct")
    for start in range(0, len(problems), size):
        chunk = problems[start:start + size]
        prompts = render_prompts(tokenizer, [problem.question for problem in chunk], cfg.data)
        responses = sample(policy, tokenizer, prompts, decoding, greedy=True, sampler=sampler)
        lengths = responses.response_mask.sum(dim=-1).tolist()
        texts = tokenizer.batch_decode(responses.response_ids, skip_special_tokens=True)
        records = []
        for problem, text, length, finished in zip(chunk, texts, lengths, responses.finished.tolist()):
            scored = score(text, problem.answer, finished, length, task)
            records.append({"question": problem.question, "reference": problem.answer, "response": text,
                            "answer": scored.answer, "correct": scored.correct, "marker": scored.marker,
                            "length": int(length), "finished": bool(finished)})
        yield records
