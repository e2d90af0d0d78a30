"""The reward: GSM8K-style answer extraction and a configurable, shaping-aware score.

The *answer* of a response is the number of its last answer marker (``reward.answer_format``):

- ``last_of_both`` (the default): ``#### <number>`` (GSM8K's own format) or ``\\boxed{<number>}``
  (LaTeX, what chat models trained on math write: Qwen2.5-Coder-0.5B-Instruct boxes 87-90% of
  its GSM8K answers and ignores an instruction to write '####'), whichever comes last in the
  text. Measured on the first 512 test problems, greedy: 25.8% correct with this extraction,
  0.2% with ``strict``.
- ``strict``: ``#### <number>`` only (TinyZero/verl's ``gsm8k.py``).

A marker counts only when it holds a plain number: ``\\boxed{\\frac{1}{2}}`` (nested braces),
``\\boxed{18\\%}`` or ``#### seventy`` are no answer, and an earlier well-formed marker then
counts. Numbers are compared as decimals after removing thousands separators and a leading
``$`` (also ``\\$`` inside ``\\boxed{}``), so ``#### 1,000``, ``\\boxed{$1000}`` and
``#### 1000.00`` all match the reference ``1000``. A response is *well-formed* (``formatted``)
when it has an answer, and *correct* when that answer equals the reference.

Why the shaping knobs: with a bonus for *any* well-formed answer, PPO on GSM8K learns to skip
the reasoning: responses shrank from ~160 to ~15 tokens and the format rate rose from 8% to
90% while accuracy stayed near 1% (measured on SmolLM2-135M). ``format_bonus_when`` pays the
bonus only after some reasoning (or only when correct), so the cheapest way to the bonus is
no longer to drop the work.

The controls (``reward.kind``): ``correct`` pays ``reward.correct`` for a right answer (the task);
``random`` pays it with probability ``reward.random_p``, by a coin drawn from the run's seed, the
step and the response's index in the batch (``control_draw``), and ``format`` for any answer found,
whatever its value. A run under a control that ends as far from its start as the task's run did
shows that training, not the answer key, moved it. Only the ``correct`` term changes: the format
bonus, the truncation reward and the per-token reward pay as configured under every kind, so a
control differs from its base run in that term alone (the GSM8K recipe sets all three to 0: there
the random control's reward says nothing of the response, and the format control's is 1 exactly
when an answer is found). ``Score.correct`` is the true outcome under every kind.

References: the GSM8K paper (Cobbe et al. 2021) for the format;
TinyZero/verl's ``gsm8k.py`` reward (strict ``####`` extraction plus a format score); Qwen2.5-Math's
``\\boxed{}`` chain-of-thought prompt.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from assignment.trainer.config import RewardConfig

ANSWER_FORMATS = ("last_of_both", "strict")

_NUMBER = r"-?[0-9][0-9,]*(?:\.[0-9]+)?"
# '####' then an optional '$', a sign, digits with optional thousands commas and decimals.
_HASHES = re.compile(r"####\s*\$?\s*(" + _NUMBER + ")")
# '\boxed{' then a plain number (an optional '$' or '\$'), spaces allowed, then '}': no nested braces.
_BOXED = re.compile(r"\\boxed\s*\{\s*(?:\\?\$)?\s*(" + _NUMBER + r")\s*\.?\s*\}")


def normalize_number(text: str) -> str | None:
    """Canonical form of a number string: no commas, '$' or spaces, no trailing zeros.

    ``"1,000"`` -> ``"1000"``, ``"-3.50"`` -> ``"-3.5"``, ``"$7"`` -> ``"7"``, ``"abc"`` -> None.
    """
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


@dataclass(frozen=True)
class Answer:
    """The answer found in a response: the normalised number, which marker held it, and where
    the marker starts in the text."""

    value: str
    marker: str  # "####" or "boxed"
    start: int


def find_answer(text: str, answer_format: str = "last_of_both") -> Answer | None:
    """The last well-formed answer marker of ``text`` under ``answer_format``, or None."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got '{answer_format}'")
    patterns = [("####", _HASHES)] + ([("boxed", _BOXED)] if answer_format == "last_of_both" else [])
    found = [(match.start(), marker, match.group(1)) for marker, pattern in patterns for match in pattern.finditer(text)]
    for start, marker, number in sorted(found, reverse=True):
        value = normalize_number(number)
        if value is not None:
            return Answer(value, marker, start)
    return None


def extract_answer(text: str, answer_format: str = "last_of_both") -> str | None:
    """The normalised number of the last well-formed answer marker in ``text``, or None."""
    answer = find_answer(text, answer_format)
    return answer.value if answer else None


def reasoning_words(text: str, answer_format: str = "last_of_both") -> int:
    """Number of whitespace-separated words before the answer marker (all of them if none)."""
    answer = find_answer(text, answer_format)
    return len((text[:answer.start] if answer else text).split())


def control_draw(seed: int, step: int, index: int) -> float:
    """A number in [0, 1), uniform over (seed, step, index) triples and fixed by them alone: the
    random control's coin for response ``index`` (its place in the whole batch of PPO step
    ``step``) of the run seeded ``seed``. A hash, not a generator's stream: drawing it moves none
    of Python's, numpy's or torch's generators, so the run samples the responses it would sample
    under any other kind, and every process and a resumed run draw the same coin."""
    digest = hashlib.blake2b(f"{seed}/{step}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2 ** 64


@dataclass(frozen=True)
class Score:
    """The reward of one response and the facts it was computed from."""

    reward: float
    correct: bool
    formatted: bool  # an answer was found
    reasoning: bool
    answer: str | None = None  # the normalised answer (None: no well-formed marker)
    marker: str | None = None  # "####", "boxed" or None


def score(response: str, reference: str, finished: bool, num_tokens: int, cfg: RewardConfig,
          draw: float | None = None) -> Score:
    """Score one response against the reference answer.

    Args:
        response: the decoded response text (special tokens removed).
        reference: the normalised reference answer (``extract_answer`` of the gold solution).
        finished: whether the response ended with EOS (False: cut at max_new_tokens).
        num_tokens: the response's number of real tokens, EOS included.
        cfg: the reward section of the config.
        draw: the response's ``control_draw``; needed by ``reward.kind`` random only (the coin
            pays when ``draw < cfg.random_p``).
    """
    answer = find_answer(response, cfg.answer_format)
    formatted = answer is not None
    correct = formatted and answer.value == reference
    reasoning = len((response[:answer.start] if answer else response).split()) >= cfg.min_reasoning_words
    bonus_due = formatted and {"always": True, "reasoning": reasoning, "correct": correct}[cfg.format_bonus_when]
    reward = (cfg.correct * paid(cfg, correct, formatted, draw) + cfg.format_bonus * bonus_due
              + cfg.per_token_reward * num_tokens)
    if not finished:
        reward += cfg.truncation_reward
    return Score(float(reward), correct, formatted, reasoning, answer.value if answer else None,
                 answer.marker if answer else None)


def paid(cfg: RewardConfig, correct: bool, formatted: bool, draw: float | None) -> bool:
    """Whether the ``correct`` term pays, under ``cfg.kind`` (the module docstring)."""
    if cfg.kind == "correct":
        return correct
    if cfg.kind == "format":
        return formatted
    if cfg.kind == "random":
        if draw is None:
            raise ValueError("reward.kind random needs the response's control_draw(seed, step, index)")
        return draw < cfg.random_p
    raise ValueError(f"reward.kind must be correct, random or format, got '{cfg.kind}'")
