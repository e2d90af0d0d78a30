"""Given helpers for the PPO exercises. Fully implemented, tested, never graded.

Shapes: ``B`` batch size, ``T`` padded response length, ``V`` vocabulary size.

``response_mask`` (B, T) is 1/True on real response tokens and 0/False on padding. All
reductions here run in float32 or wider, even for bfloat16 inputs (the contract, handout.md section 4), and they
ignore whatever sits at padded positions, even NaN or inf: padding is selected away with
``torch.where`` instead of multiplied by zero, because ``inf * 0`` is NaN.
"""

from __future__ import annotations

import torch


def reduction_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype to reduce in: ``dtype`` itself if it is float32 or wider, else float32."""
    return torch.promote_types(dtype, torch.float32)


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over real tokens.

    Args:
        x: (B, T) values; padded positions may hold anything.
        mask: (B, T) response mask, bool or 0/1.
    Returns:
        () scalar in ``reduction_dtype(x.dtype)``.
    """
    x = x.to(reduction_dtype(x.dtype))
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean: the sum over all real tokens of the batch divided by their number.

    Not a mean of per-row means: a long response weighs more than a short one.

    Args:
        x: (B, T) values; padded positions may hold anything.
        mask: (B, T) response mask, bool or 0/1, with at least one real token.
    Returns:
        () scalar in ``reduction_dtype(x.dtype)``.
    """
    return masked_sum(x, mask) / mask.bool().sum()


def masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Variance over real tokens with Bessel's correction (divides by n - 1).

    Args:
        x: (B, T) values.
        mask: (B, T) response mask with at least two real tokens.
    Returns:
        () scalar in ``reduction_dtype(x.dtype)``.
    """
    mean = masked_mean(x, mask)
    n = mask.bool().sum()
    return masked_sum((x.to(mean.dtype) - mean) ** 2, mask) / (n - 1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Whiten over real tokens: ``(x - mean) / sqrt(var + eps)``, Bessel-corrected ``var``.

    Args:
        x: (B, T) values.
        mask: (B, T) response mask with at least two real tokens.
        eps: added to the variance so that a constant batch does not divide by zero.
    Returns:
        (B, T) in ``reduction_dtype(x.dtype)``; padded positions hold unspecified values.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    return (x.to(mean.dtype) - mean) * torch.rsqrt(var + eps)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of each label under the softmax of its logits.

    Args:
        logits: (B, T, V) unnormalised scores, already aligned so that ``logits[:, t]``
            predicts ``labels[:, t]``.
        labels: (B, T) token ids, int64.
    Returns:
        (B, T) log-probs in ``reduction_dtype(logits.dtype)``.
    """
    logits = logits.to(reduction_dtype(logits.dtype))
    picked = logits.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)  # (B, T)
    return picked - torch.logsumexp(logits, dim=-1)
