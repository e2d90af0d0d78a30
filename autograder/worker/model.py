"""The model exercise 5 is graded on, built alike by the grader (for the reference) and by the
worker (for the submission): a tiny Llama with a value head, in float64 throughout.

transformers' LlamaRMSNorm computes in float32 whatever the model's dtype (it upcasts bfloat16),
so a float64 model would round every gradient to float32 at each norm, in the reference's backward
as in the submission's, and the two would differ by float32 roundings that no part of the
submission made (exercise 5's error scales, autograder/exercises/update.py, count the
submission's own). The norms here compute in their input's dtype.
"""

from __future__ import annotations

from types import MethodType

import torch


def build(spec: dict, dtype: str) -> torch.nn.Module:
    """``PolicyWithValueHead(tiny_llama(**spec))`` in ``dtype`` ("float64"), its norms in that dtype."""
    from assignment.model import PolicyWithValueHead, tiny_llama  # transformers: only when needed

    model = PolicyWithValueHead(tiny_llama(**spec)).to(getattr(torch, dtype))
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = MethodType(_rms_norm, module)
    return model


def _rms_norm(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm.forward without its cast to float32: (..., H) -> (..., H)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))
