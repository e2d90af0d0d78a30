"""The layout of a PPO batch: left-padded prompts, then right-padded responses.

Shapes: ``B`` rows (one response each), ``P`` padded prompt length, ``T`` padded response
length, ``V`` vocabulary size.

    column:  0 ... P-1 | P ... P+T-1
    holds:   prompt    | response
             (left-padded, so every prompt ends at column P-1; right-padded responses)

A causal LM's output at column ``i`` predicts the token at ``i + 1``, so the outputs for the
``T`` response tokens sit at columns ``P-1 ... P+T-2``: ``response_slice`` (handout, section 5).

A batch is a dict: ``input_ids`` and ``attention_mask`` (B, P+T); ``response_ids``,
``response_mask``, ``logprobs_old``, ``values_old``, ``advantages``, ``returns`` (B, T); and the
int ``prompt_length`` ``P`` (the contract, handout.md section 4, exercise 5). ``minibatches`` cuts one into shuffled
minibatches and ``trim_padding`` drops the columns a minibatch does not need.

This module imports only torch (and the standard library's typing): the grader imports it too.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch


def response_slice(x: torch.Tensor, prompt_length: int, response_length: int) -> torch.Tensor:
    """The outputs that belong to the response tokens: columns ``[P-1 : P+T-1]``.

    Args:
        x: (B, P+T, ...) per-column model outputs, e.g. logits (B, P+T, V) or values (B, P+T).
        prompt_length: ``P``, at least 1.
        response_length: ``T``.
    Returns:
        (B, T, ...) a view of ``x``: ``[:, t]`` is the output that predicted response token ``t``.
    """
    P, T = prompt_length, response_length
    return x[:, P - 1:P + T - 1]


def trim_padding(batch: dict[str, Any]) -> dict[str, Any]:
    """Drop the prompt columns that are padding in every row and the response columns past the
    longest response: less compute, identical results (positions come from the mask).

    ``batch`` holds (b, P+T) ``input_ids`` / ``attention_mask``, (b, T) response tensors and
    the int ``prompt_length``; the result has the same keys with a smaller P and T.
    """
    P = batch["prompt_length"]
    prompt_mask = batch["attention_mask"][:, :P]
    first = int((prompt_mask.sum(dim=0) > 0).nonzero().min()) if P > 0 else 0
    T = max(int(batch["response_mask"].sum(dim=-1).max()), 1)
    # Every other (b, T) tensor is a response tensor; per-row (b,) tensors pass unchanged.
    out = {k: (v[:, :T] if torch.is_tensor(v) and v.dim() == 2 else v) for k, v in batch.items()}
    for k in ("input_ids", "attention_mask"):
        out[k] = batch[k][:, first:P + T]
    out["prompt_length"] = P - first
    return out


def minibatches(batch: dict[str, Any], minibatch_size: int, generator: torch.Generator,
                length_groups: int = 0) -> Iterator[dict[str, Any]]:
    """One epoch of shuffled minibatches of ``batch`` (rows are responses), padding trimmed.

    With ``length_groups`` (rows per optimizer step, a multiple of ``minibatch_size``), each run
    of that many shuffled rows is put in order of response length before it is cut: the same
    rows reach each optimizer step, in minibatches of similar lengths (less padding).
    """
    B = batch["input_ids"].shape[0]
    order = torch.randperm(B, generator=generator)
    if length_groups:
        lengths = batch["response_mask"].sum(dim=-1).cpu()[order]  # (B,) in shuffled order
        order = torch.cat([group[torch.argsort(group_lengths, stable=True)]
                           for group, group_lengths in zip(order.split(length_groups), lengths.split(length_groups))])
    for start in range(0, B, minibatch_size):
        rows = order[start:start + minibatch_size].to(batch["input_ids"].device)
        yield trim_padding({k: (v[rows] if torch.is_tensor(v) else v) for k, v in batch.items()})
