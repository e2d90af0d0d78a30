"""Grouped-query attention for decoding that reads the KV cache as it is: the rollout sampler's attention.

Shapes: ``B`` rows, ``H`` query heads, ``H_kv`` key/value heads, ``g = H / H_kv`` query heads per
key/value head, ``q`` query tokens, ``L`` key positions (the whole static cache), ``d`` head size.

transformers' "sdpa" attention repeats every key/value head ``g`` times (``repeat_kv``) whenever
an attention mask is given, because PyTorch's SDPA accepts ``enable_gqa`` only on its mask-less
kernels (newer versions, 5.24 for one, group a lone query token as below, but not under
torch.compile, where the sampler decodes). Decoding from a static cache always has a mask (the
cache's empty slots, the prompts' left padding), so each decoding step copies the whole cache
``g`` times. For Qwen2.5-0.5B
(H = 14, H_kv = 2) sampling 256 responses into a 720-slot cache, that copy and the attention
over the copy took 4.8 of the 5.9 s of GPU time of a 400-token rollout, and 1.0 of 2.2 s without
the copy (H100, profiled).

For one query token (every decoding step) the copy is not needed: the ``g`` query heads that
share a key/value head are ``g`` queries against the same keys under the same mask, so the
query (B, H, 1, d) viewed as (B, H_kv, g, d) attends to the cache (B, H_kv, L, d) directly. Same
products and softmax as ``repeat_kv`` followed by SDPA, without the copy. Several query tokens
(the prompt's prefill) go to transformers' own "sdpa" unchanged.

Registered with transformers' ``AttentionInterface`` under ``NAME`` (masks built as for "sdpa");
``use_grouped_decoding(model)`` switches a model to it.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_grouped_decoding"


def grouped_decoding_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                               **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface.

    Args:
        query: (B, H, q, d); key, value: (B, H_kv, L, d).
        attention_mask: None, or a boolean mask broadcastable to (B, 1, q, L) (True: attend); a mask
            per head, a position bias, dropout or several query tokens go to transformers' "sdpa".
    Returns:
        (B, q, H, d) attention output, and None (no attention weights), as transformers' "sdpa".
    """
    B, H, q, d = query.shape
    groups = H // key.shape[1]
    if q != 1 or groups == 1 or dropout or kwargs.get("position_bias") is not None or \
            (attention_mask is not None and attention_mask.shape[1] != 1):  # what the grouping does not carry
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    # Head h uses key/value head h // g (repeat_kv's order): rows of one key/value head are consecutive.
    grouped = query.reshape(B, key.shape[1], groups, d)  # (B, H_kv, g, d)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask,
                                                           scale=scaling)  # (B, H_kv, g, d)
    return out.reshape(B, H, 1, d).transpose(1, 2).contiguous(), None


def use_grouped_decoding(model: PreTrainedModel) -> None:
    """Switch ``model`` (an "sdpa" model; any other is left as it is) to ``grouped_decoding_attention``."""
    if model.config._attn_implementation != "sdpa":
        return
    AttentionInterface.register(NAME, grouped_decoding_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
