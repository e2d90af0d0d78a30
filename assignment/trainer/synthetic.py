"""A GSM8K-shaped arithmetic task that the project generates itself: no download anywhere.

Questions read ``What is 3 + 4?`` and reference solutions ``3 + 4 = 7 #### 7``, so the same
reward (``assignment.trainer.reward``) and the same trainer serve both this task and GSM8K. The
tokenizer is built with the ``tokenizers`` library: one token per digit, operator, word and
space, plus ``####`` as a single token, so that a random-init model can discover the answer
format by sampling (three tokens: ``####``, a digit, EOS). It is wrapped as a transformers
``PreTrainedTokenizerFast`` with a pad token, an EOS token and a small chat template, and the
model is ``assignment.model.tiny_llama`` sized to its vocabulary.
"""

from __future__ import annotations

import random

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
WORDS = ["What", "is", "?", "+", "-", "=", "####", " ", "\n"] + [str(d) for d in range(10)]

# One message after another, each opened by its role token; an assistant turn ends with EOS.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}<eos>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The synthetic task's tokenizer: ids are stable (specials first, then ``WORDS``)."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    # Split into single digits, whole words, '####', and single other characters, keeping the
    # spaces as tokens so that Fuse (plain concatenation) decodes back to the original text.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"####|[A-Za-z]+|\d|\s|[^\sA-Za-z\d]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_problems(n: int, max_operand: int, operators: str, seed: int | str) -> list[dict[str, str]]:
    """``n`` GSM8K-format records ``{"question", "answer"}`` with operands in [0, max_operand].

    Deterministic in ``seed``. Differences may be negative, as some GSM8K answers are.
    """
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        op = rng.choice(operators)
        result = a + b if op == "+" else a - b
        records.append({"question": f"What is {a} {op} {b}?", "answer": f"{a} {op} {b} = {result}\n#### {result}"})
    return records
