"""One data-parallel step's pieces, run by ``tests/test_distributed.py`` twice: as one plain process,
and under ``accelerate launch --num_processes 2`` (gloo on CPU). The main process writes what the
test compares to ``OUT`` (a torch file):

    advantages: (B, T) exercise 4 on the gathered rollout (``whole_rollout``), from rows whose
        response lengths differ between the processes (each pads only to its own T_r);
    grad_norm: that minibatch's gradient norm, as exercise 5 returns it (a float, under FSDP too);
    weights: the policy's parameters after one PPO minibatch on the same global batch (B rows of
        equal length, so per-process token means average to the global one), through DDP or FSDP;
    weights_half: (one process only) the same update from the first half of the rows alone, what
        a run without gradient averaging would give: the test's proof that it can fail;
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
from assignment.trainer.ppo import kl_penalties, ppo_update
from assignment.trainer.rollout import Rollout, Sample, reference_forward, response_forward

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
        ref_logprobs, _ = response_forward(reference_forward(ref), full, attention, P, 1.0, B)
    width = int(mask[rows].sum(dim=-1).max())
    sample = Sample(full[rows, :P], attention[rows, :P], full[rows, P:P + width], mask[rows, :width],
                    torch.zeros(B, dtype=torch.bool)[rows])
    return Rollout(sample, full[rows, :P + width], attention[rows, :P + width], logprobs[rows, :width],
                   ref_logprobs[rows, :width], values[rows, :width])


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
    def update(rows: slice, minibatch_size: int) -> tuple[dict[str, torch.Tensor], float]:
        """The weights after the update, and its gradient norm (exercise 5's, before clipping)."""
        policy_copy = build_models(cfg.model, tokenizer, 0, torch.device("cpu"))[0]
        part = rollout_rows(policy_copy, ref, ids, torch.ones(B, T, dtype=torch.bool), rows)
        with torch.no_grad():  # a fixed advantage per row: the reward, centred over the global batch
            adv = (rewards - rewards.mean())[rows, None].expand(-1, T).contiguous()
        model = dist.wrap(policy_copy)  # DDP in a job of several processes, the policy itself in one
        optimizer = torch.optim.SGD(policy_copy.parameters(), lr=LR)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        metrics = ppo_update(impl, model, optimizer, scheduler, part.update_batch(adv, part.values), cfg,
                   torch.Generator().manual_seed(1), minibatch_size=minibatch_size,
                   agree=dist.mean if dist.active else None)
        # the full weights (FSDP gathers its shards; on the main process alone, which saves them)
        weights = {name: weight.detach().clone() for name, weight in dist.model_state(policy_copy).items()}
        return weights, metrics["stats/grad_norm"]

    result["weights"], result["grad_norm"] = update(dist.shard(B), B // dist.world_size)
    if not dist.active:
        result["weights_half"] = update(slice(0, B // 2), B // 2)[0]
    result["weights_before"] = {name: p.detach().clone() for name, p in policy.named_parameters()}

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
