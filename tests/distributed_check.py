"""One data-parallel step's pieces, run by ``tests/test_distributed.py`` twice: as one plain process,
and under ``accelerate launch --num_processes 2`` (gloo on CPU). The main process writes what the
test compares to ``OUT`` (a torch file):

    advantages: (B, T) exercise 4 on the gathered rollout (``whole_rollout``), from rows whose
        response lengths differ between the processes (each pads only to its own T_r);
    grad_norm: that minibatch's gradient norm, as exercise 5 returns it (a float, under FSDP too);
    weights: the policy's parameters after one PPO minibatch on the same global batch (B rows of
        equal length, so per-process token means average to the global one), through DDP or FSDP;
    (one process only, what the test checks the two against:)
    grads: the gradients that update stepped on;
    grads_halves: the gradients each process of two computes, {name: (2, ...)}: the same update
        run on the first and on the second half of the rows alone, with the same minibatch size;
    weights_averaged: the SGD step on the average of grads_halves, what the two processes'
        all-reduce and step compute;
    magnitudes: {name: S}, the sum over the batch's real tokens of the magnitude of each token's
        gradient, divided by their number: the magnitudes the gradient sums (see the test);
    records: evaluation records of 7 problems in batches of 3 (uneven splits), gathered in order.

    python tests/distributed_check.py OUT

Launched with ``configs/accelerate/fsdp.yaml``, the update trains the policy sharded by FSDP2 and
the evaluation generates from a sharded policy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from assignment.trainer.config import load_config
from assignment.trainer.data import load_problems
from assignment.trainer.distributed import Distributed, sharded_eval_batches, whole_rollout
from assignment.trainer.evaluate import evaluate_batches
from assignment.trainer.impl import load_impl
from assignment.trainer.loading import build_models, load_tokenizer
from assignment.trainer.ppo import UpdateConfig, kl_penalties, ppo_update
from assignment.trainer.rollout import ReferenceForward, Rollout, Sample, response_forward
from token_gradients import token_gradient_magnitudes  # tests/, the folder of this script

ROOT = Path(__file__).resolve().parents[1]
B, P, T = 4, 3, 5  # global rows, prompt columns, response columns
LR = 0.1  # SGD, so that a weight difference is lr x a gradient difference (Adam's first step is ~lr x sign(g))


def rollout_rows(policy, ref, ids: torch.Tensor, mask: torch.Tensor, rows: slice) -> Rollout:
    """The rollout of ``rows`` of a fixed batch, cut to those rows' own longest response, as a
    process of a data-parallel job holds it. Computed on the whole batch and sliced, so that the
    gathered tensors are bit-for-bit the single process's (the test is of the gathering)."""
    attention = torch.cat([torch.ones(B, P, dtype=torch.long), mask.long()], dim=1)  # (B, P+T)
    full = torch.cat([ids[:, :P], torch.where(mask, ids[:, P:], 0)], dim=1)
    with torch.no_grad():
        logprobs, values = response_forward(policy, full, attention, P, 1.0, B)
        ref_logprobs, _ = response_forward(ReferenceForward(ref), full, attention, P, 1.0, B)
    width = int(mask[rows].sum(dim=-1).max())
    sample = Sample(full[rows, :P], attention[rows, :P], full[rows, P:P + width], mask[rows, :width],
                    torch.zeros(B, dtype=torch.bool)[rows])
    return Rollout(sample, full[rows, :P + width], attention[rows, :P + width], logprobs[rows, :width],
                   ref_logprobs[rows, :width], values[rows, :width])


class KeepGradSGD(torch.optim.SGD):
    """SGD over named parameters that keeps a copy of each gradient it steps on, by name."""

    def __init__(self, named_parameters, lr: float):
        named = list(named_parameters)
        self.names = {id(p): name for name, p in named}
        self.grads: dict[str, torch.Tensor] = {}
        super().__init__([p for _, p in named], lr=lr)

    def step(self, closure=None):
        self.grads = {self.names[id(p)]: p.grad.detach().clone() for group in self.param_groups
                      for p in group["params"] if p.grad is not None}
        return super().step(closure)


def sgd_step(policy: torch.nn.Module, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``policy``'s weights after one step of the same SGD on the gradients ``grads`` (exercise 5
    clips by a factor of exactly 1 here: the test asserts the norm is below ppo.max_grad_norm)."""
    for name, p in policy.named_parameters():
        p.grad = grads.get(name)
    torch.optim.SGD(policy.parameters(), lr=LR).step()
    return {name: p.detach().clone() for name, p in policy.state_dict().items()}


def main(out: Path) -> None:
    dist = Distributed()
    cfg = load_config(None, ["model.hidden_size=32", f"rollout.batch_size={B}", f"ppo.minibatch_size={B}",
                             "ppo.epochs=1", "ppo.target_kl=null", "eval.batch_size=3", "train.output_dir=unused"])
    impl = load_impl(str(ROOT / "solutions" / "exercises.py"))
    tokenizer = load_tokenizer(cfg.model)
    policy, ref = build_models(cfg.model, tokenizer, 0, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(tokenizer), (B, P + T), generator=generator)
    rewards = torch.rand(B, generator=generator)
    result = {}

    # Exercise 4 on the gathered batch: the second half's responses are shorter (3 of 5 columns).
    lengths = torch.tensor([5, 4, 3, 2])
    mask = torch.arange(T)[None] < lengths[:, None]  # (B, T)
    mine = rollout_rows(policy, ref, ids, mask, dist.shard(B))
    whole = whole_rollout(dist, mine, tokenizer.pad_token_id)
    penalties = kl_penalties(whole.logprobs, whole.ref_logprobs, whole.sample.response_mask, 0.1)
    advantages, _ = impl.compute_gae_advantages(rewards, penalties, whole.values, whole.sample.response_mask, 1.0, 0.95)
    result["advantages"], result["mask"] = advantages, whole.sample.response_mask

    # One PPO minibatch of the global batch, every response of length T, through DDP.
    def update(rows: slice, minibatch_size: int) -> tuple[dict[str, torch.Tensor], float, dict[str, torch.Tensor]]:
        """The weights after the update, its gradient norm (exercise 5's, before clipping) and the
        gradients the optimizer stepped on (this process's own, before any averaging)."""
        policy_copy, part, adv = update_inputs(rows)
        model = dist.wrap(policy_copy)  # DDP in a job of several processes, the policy itself in one
        optimizer = KeepGradSGD(policy_copy.named_parameters(), lr=LR)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        metrics = ppo_update(impl, model, optimizer, scheduler, part.update_batch(adv, part.values), cfg,
                   torch.Generator().manual_seed(1), minibatch_size=minibatch_size,
                   agree=dist.mean if dist.active else None)
        # the full weights (FSDP gathers its shards; on the main process alone, which saves them)
        weights = {name: weight.detach().clone() for name, weight in dist.model_state(policy_copy).items()}
        return weights, metrics["stats/grad_norm"], optimizer.grads

    def update_inputs(rows: slice):
        """A fresh copy of the policy, its rollout of ``rows`` and their advantages."""
        policy_copy = build_models(cfg.model, tokenizer, 0, torch.device("cpu"))[0]
        part = rollout_rows(policy_copy, ref, ids, torch.ones(B, T, dtype=torch.bool), rows)
        with torch.no_grad():  # a fixed advantage per row: the reward, centred over the global batch
            adv = (rewards - rewards.mean())[rows, None].expand(-1, T).contiguous()
        return policy_copy, part, adv

    result["weights"], result["grad_norm"], grads = update(dist.shard(B), B // dist.world_size)
    if not dist.active:
        result["grads"] = grads
        halves = [update(rows, B // 2)[2] for rows in (slice(0, B // 2), slice(B // 2, B))]
        result["grads_halves"] = {name: torch.stack([h[name] for h in halves]) for name in halves[0]}
        # What DDP's all-reduce hands each process: the sum of the two gradients, divided by 2.
        result["weights_averaged"] = sgd_step(build_models(cfg.model, tokenizer, 0, torch.device("cpu"))[0],
                                              {name: (a + b) / 2 for name, (a, b) in result["grads_halves"].items()})
        policy_all, part_all, adv_all = update_inputs(slice(0, B))
        result["magnitudes"] = token_gradient_magnitudes(impl, policy_all, part_all.update_batch(adv_all, part_all.values),
                                                         UpdateConfig.from_config(cfg))
    result["lr"] = LR

    # Evaluation: 7 problems in batches of 3, each batch split over the processes.
    # Under FSDP from a sharded copy of the same weights: generation itself is then a collective.
    problems = load_problems(cfg.data, 0)["test"][:7]
    evaluated = dist.wrap(build_models(cfg.model, tokenizer, 0, torch.device("cpu"))[0]) if dist.fsdp else policy
    result["records"] = [r for batch in sharded_eval_batches(dist, evaluate_batches, evaluated, tokenizer, problems, cfg)
                         for r in batch]
    result["world_size"] = dist.world_size
    if dist.is_main:
        torch.save(result, out)
    dist.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
