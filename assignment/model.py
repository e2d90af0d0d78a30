"""The policy the exercises train: any Hugging Face causal LM plus a scalar value head.

trl 1.x no longer ships ``AutoModelForCausalLMWithValueHead``, so this is the small module
that replaces it: a linear head on the last hidden state (the critic) beside the LM head
(the actor), sharing the transformer. ``forward(input_ids, attention_mask)`` returns
``(logits (B, L, V), values (B, L))``, the interface ``ppo_minibatch_update`` relies on.

Position ids are derived from the attention mask, as ``generate`` does: with left-padded
prompts a plain forward would otherwise number the pad tokens and shift every real position,
and the update's log-probs would not match the rollout's.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) positions counting real tokens only: 0, 1, ... from the first real token."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


class PolicyWithValueHead(nn.Module):
    """Causal LM (actor) with a value head (critic) on the last hidden state."""

    def __init__(self, lm: PreTrainedModel):
        super().__init__()
        self.lm = lm
        hidden = lm.config.get_text_config().hidden_size
        # Value head in float32 whatever the LM's dtype: it is tiny and regresses returns.
        self.value_head = nn.Linear(hidden, 1, dtype=torch.float32)
        # Start from V = 0 everywhere, so the first advantages are the raw rewards rather than
        # noise from a random projection of large hidden states.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        # The dtype the logits are returned in (None: the LM's own). float32 for a 16-bit working copy
        # (assignment/trainer/precision.py says why: memory, and float16's loss scale).
        self.logits_dtype: torch.dtype | None = None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                logits_to_keep: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Args: input_ids, attention_mask (B, L). Returns logits (B, L, V), values (B, L).

        ``logits_to_keep`` > 0 (the trainer's rollout, never the update) computes the logits of
        the last ``logits_to_keep`` columns only: (B, logits_to_keep, V).

        The transformer runs without its LM head (``hidden_states``), then the head: the same
        products as the LM's own forward, without transformers' capture of every layer's output
        (hooks reading a ContextVar, which dynamo cannot trace). A sharded LM (FSDP) runs its
        own forward: FSDP gathers the head's weights only there.
        """
        if _is_sharded(self.lm):
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids_from_mask(attention_mask), output_hidden_states=True,
                          use_cache=False, logits_to_keep=logits_to_keep)
            return out.logits, self.values(out.hidden_states[-1])
        hidden, values = self.hidden_states(input_ids, attention_mask)  # (B, L, H), (B, L)
        return self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden), values

    def values(self, hidden: torch.Tensor) -> torch.Tensor:
        """The value head on the last hidden states (B, L, H) -> values (B, L), in float32."""
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The transformer without its LM head: (last hidden states (B, L, H), values (B, L)).
        With ``lm_head`` this is ``forward``, for callers that apply the head in pieces (the
        trainer's scoring forwards, ``assignment.trainer.rollout``)."""
        hidden = self.lm.base_model(input_ids=input_ids, attention_mask=attention_mask,
                                    position_ids=position_ids_from_mask(attention_mask), use_cache=False).last_hidden_state
        return hidden, self.values(hidden)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head: hidden states (..., H) -> logits (..., V), in ``logits_dtype`` if set."""
        logits = self.lm.get_output_embeddings()(hidden)
        return logits if self.logits_dtype is None else logits.to(self.logits_dtype)


def _is_sharded(module: nn.Module) -> bool:
    """True for a module FSDP2 shards (only possible once torch.distributed is initialised: the
    FSDP import is left to the jobs that use it)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def tiny_llama(vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 2, seed: int = 0,
               dtype: torch.dtype = torch.float32, **overrides) -> LlamaForCausalLM:
    """A random-init Llama small enough for CPU tests and grading. Deterministic in ``seed``."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        **overrides,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval()
