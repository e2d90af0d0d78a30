"""The magnitudes a token-mean gradient sums, which bound its rounding: a float sum of n terms
errs by at most n u times the sum of their magnitudes (Higham, Accuracy and Stability of
Numerical Algorithms, sec. 3.1), never by a multiple of its own size, which cancels. Used by the
tests that compare one gradient computed in two ways (tests/test_trainer.py,
tests/distributed_check.py)."""

from __future__ import annotations

from typing import Any

import torch


def token_gradient_magnitudes(impl, policy: torch.nn.Module, batch: dict[str, Any],
                              update_cfg) -> dict[str, torch.Tensor]:
    """{name: (1/n) sum_t |grad of l_t|} over the n real tokens t of ``batch`` (exercise 5's
    minibatch dict), where l_t is the loss of exercise 5 on token t alone (its response mask
    one-hot at t): exercise 5's loss is the token mean (1/n) sum_t l_t, so its gradient is the
    sum of these terms, of which this is the sum of magnitudes. Each l_t comes from ``impl``'s
    exercise 5 itself, never stepping; ``update_cfg`` is its cfg (grad_accum_steps 1 for the
    gradient of the token mean itself). Leaves no gradient on ``policy``."""
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)  # exercise 5's argument; never stepped
    mask = batch["response_mask"].bool()
    sums = {name: torch.zeros_like(p) for name, p in policy.named_parameters()}
    for b, t in mask.nonzero().tolist():
        # l_t depends on row b alone: exercise 5 on that row (B = 1) is the same loss, B times cheaper
        row = {key: value[b:b + 1] if torch.is_tensor(value) else value for key, value in batch.items()}
        one = torch.zeros_like(mask[b:b + 1])
        one[0, t] = True
        impl.ppo_minibatch_update(policy, optimizer, {**row, "response_mask": one.to(batch["response_mask"].dtype)},
                                  update_cfg, False)
        for name, p in policy.named_parameters():
            if p.grad is not None:
                sums[name] += p.grad.abs()
        optimizer.zero_grad(set_to_none=True)
    return {name: s / int(mask.sum()) for name, s in sums.items()}
