"""The reward: GSM8K-style answer extraction and a configurable, shaping-aware score.

A response is *well-formed* when it holds a line ``#### <number>`` (GSM8K's own answer
format; the last such marker counts), and *correct* when that number equals the reference.
Numbers are compared as decimals after removing thousands separators and a leading ``$``, so
``#### 1,000``, ``#### $1000`` and ``#### 1000.00`` all match the reference ``1000``.

Why the shaping knobs: with a bonus for *any* well-formed answer, PPO on GSM8K learns to skip
the reasoning: responses shrank from ~160 to ~15 tokens and the format rate rose from 8% to
90% while accuracy stayed near 1% (measured on SmolLM2-135M). ``format_bonus_when`` pays the
bonus only after some reasoning (or only when correct), so the cheapest way to the bonus is
no longer to drop the work. References: the GSM8K paper (Cobbe et al. 2021) for the format;
TinyZero/verl's ``gsm8k.py`` reward (strict ``####`` extraction plus a format score).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from assignment.trainer.config import RewardConfig

# '#### ' then an optional '$', a sign, digits with optional thousands commas and decimals.
_ANSWER = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


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


def extract_answer(text: str) -> str | None:
    """The normalised number after the last ``####`` in ``text``, or None if there is none."""
    matches = _ANSWER.findall(text)
    return normalize_number(matches[-1]) if matches else None


def reasoning_words(text: str) -> int:
    """Number of whitespace-separated words before the last ``####`` (all of them if none)."""
    head = text.rsplit("####", 1)[0] if "####" in text else text
    return len(head.split())


@dataclass(frozen=True)
class Score:
    """The reward of one response and the facts it was computed from."""

    reward: float
    correct: bool
    formatted: bool
    reasoning: bool


def score(response: str, reference: str, finished: bool, num_tokens: int, cfg: RewardConfig) -> Score:
    """Score one response against the reference answer.

    Args:
        response: the decoded response text (special tokens removed).
        reference: the normalised reference answer (``extract_answer`` of the gold solution).
        finished: whether the response ended with EOS (False: cut at max_new_tokens).
        num_tokens: the response's number of real tokens, EOS included.
        cfg: the reward section of the config.
    """
    answer = extract_answer(response)
    formatted = answer is not None
    correct = formatted and answer == reference
    reasoning = reasoning_words(response) >= cfg.min_reasoning_words
    bonus_due = formatted and {"always": True, "reasoning": reasoning, "correct": correct}[cfg.format_bonus_when]
    reward = cfg.correct * correct + cfg.format_bonus * bonus_due + cfg.per_token_reward * num_tokens
    if not finished:
        reward += cfg.truncation_reward
    return Score(float(reward), correct, formatted, reasoning)
