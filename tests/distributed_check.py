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
    accumulated: {"once", "every", "never"}: the full weights after one optimizer step of two
        accumulated minibatches (one row each, per process), its gradients reduced once per step
        (the trainer's ``gradient_sync``), after every minibatch (as before it), and never (a
        mutation that skips the reducing minibatch's sync: each process steps alone);
    reduced_before_step: {"once", "every", "never"}: for the minibatch that does not step, whether
        its backward reduced the gradients (several processes only);
    (one process only:) accumulated_magnitudes: {name: sum over the 2 processes and their 2
        minibatches of |that minibatch's gradient|}, the magnitudes the reduction sums;
    steps: {"default", "process"}: for each optimizer step of 2 epochs of 8 rows (minibatch 2 x
        accum 2, global), the global rows it saw (input_ids rows), with the calls and the
        grad_accum_steps each process's exercise 5 saw, by default (each process's 2 rows of a
        step as 1 call) and with ppo.process_minibatch_size=1 (as 2 calls of 1 row);
    leftover: after an update stopped early inside an accumulation cycle, whether a gradient
        computed next equals its recomputation bit for bit on every process ("clean"), and the
        same with ``drop_local_gradients`` skipped ("mutant_clean"), and the stopping minibatch.

    python tests/distributed_check.py OUT

Launched with ``configs/accelerate/fsdp.yaml``, the update trains the policy sharded by FSDP2 and
the evaluation generates from a sharded policy.
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import torch

from assignment.trainer.config import load_config
from assignment.trainer.data import load_problems
from assignment.trainer.distributed import Distributed, sharded_eval_batches, whole_rollout
from assignment.trainer.evaluate import evaluate_batches
from assignment.trainer.impl import load_impl
from assignment.trainer.loading import build_models, load_tokenizer
from assignment.trainer import ppo
from assignment.trainer.batch import minibatches
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
    n = ids.shape[0]
    attention = torch.cat([torch.ones(n, P, dtype=torch.long), mask.long()], dim=1)  # (n, P+T)
    full = torch.cat([ids[:, :P], torch.where(mask, ids[:, P:], 0)], dim=1)
    with torch.no_grad():
        logprobs, values = response_forward(policy, full, attention, P, 1.0, n)
        ref_logprobs, _ = response_forward(ReferenceForward(ref), full, attention, P, 1.0, n)
    width = int(mask[rows].sum(dim=-1).max())
    sample = Sample(full[rows, :P], attention[rows, :P], full[rows, P:P + width], mask[rows, :width],
                    torch.zeros(n, dtype=torch.bool)[rows])
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

    accumulation_checks(dist, impl, tokenizer, ref, ids, rewards, result)

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


class RecordingImpl:
    """``impl`` whose exercise 5 records each call: its rows (as tuples of input ids), the
    grad_accum_steps it divides by and whether it steps."""

    def __init__(self, impl):
        self.impl, self.calls = impl, []

    def ppo_minibatch_update(self, model, optimizer, minibatch, cfg, step_optimizer):
        rows = frozenset(tuple(row) for row in minibatch["input_ids"].tolist())
        self.calls.append((rows, cfg.grad_accum_steps, step_optimizer))
        return self.impl.ppo_minibatch_update(model, optimizer, minibatch, cfg, step_optimizer)

    def steps(self) -> list[tuple[frozenset, int, set[int]]]:
        """Per optimizer step: its rows, how many calls it took and the grad_accum_steps they saw."""
        steps, rows, calls, accums = [], set(), 0, set()
        for call_rows, accum, stepped in self.calls:
            rows, calls, accums = rows | call_rows, calls + 1, accums | {accum}
            if stepped:
                steps.append((frozenset(rows), calls, accums))
                rows, calls, accums = set(), 0, set()
        return steps


class ReductionProbe:
    """``impl`` whose exercise 5 records, after each call that does not step, whether that call
    reduced the gradients over the processes: under DDP they are then the same on every process,
    under FSDP2 they reach the sharded parameters' ``.grad`` (None until a reduce-scatter)."""

    def __init__(self, impl, dist: Distributed):
        self.impl, self.dist, self.reduced = impl, dist, []

    def ppo_minibatch_update(self, model, optimizer, minibatch, cfg, step_optimizer):
        metrics = self.impl.ppo_minibatch_update(model, optimizer, minibatch, cfg, step_optimizer)
        if not step_optimizer and self.dist.active:  # a stepping call zeroes the gradients it stepped on
            grads = [p.grad for p in model.parameters()]
            if self.dist.fsdp:
                self.reduced.append(all(self.dist.gather_objects([all(g is not None for g in grads)])))
            else:
                mine = torch.cat([g.flatten() for g in grads])
                self.reduced.append(all(torch.equal(mine, theirs) for theirs in self.dist.gather_objects([mine])))
        return metrics


def accumulation_checks(dist: Distributed, impl, tokenizer, ref, ids: torch.Tensor, rewards: torch.Tensor,
                        result: dict) -> None:
    """The ``accumulated``, ``reduced_before_step``, ``accumulated_magnitudes``, ``steps`` and ``leftover`` entries of the
    module docstring. B rows, minibatch 2 x accum 2 global: each process runs 2 minibatches of 1 row
    (``one_row``; by default each process would run its 2 rows of a step as 1 call, and there would
    be no accumulation to check)."""
    overrides = ["model.hidden_size=32", f"rollout.batch_size={B}", "ppo.minibatch_size=2", "ppo.grad_accum_steps=2",
                 "ppo.epochs=1", "ppo.target_kl=null", "train.output_dir=unused"]
    one_row = ["ppo.process_minibatch_size=1"]
    cfg = load_config(None, overrides + one_row)

    def fresh(rows: slice, n_ids: torch.Tensor = ids, n_rewards: torch.Tensor = rewards):
        """A fresh policy, its update batch of ``rows`` (every response T long, a fixed advantage per row)."""
        policy_copy = build_models(cfg.model, tokenizer, 0, torch.device("cpu"))[0]
        n = n_ids.shape[0]
        part = rollout_rows(policy_copy, ref, n_ids, torch.ones(n, T, dtype=torch.bool), rows)
        with torch.no_grad():
            adv = (n_rewards - n_rewards.mean())[rows, None].expand(-1, T).contiguous()
        return policy_copy, part.update_batch(adv, part.values)

    def update(cfg, rows: slice, the_impl=impl, n_ids: torch.Tensor = ids, n_rewards: torch.Tensor = rewards):
        """A fresh policy after ``ppo_update`` on ``rows``, as the trainer splits them; its model, optimizer, metrics."""
        policy_copy, batch = fresh(rows, n_ids, n_rewards)
        model = dist.wrap(policy_copy)
        optimizer = torch.optim.SGD(policy_copy.parameters(), lr=LR)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        size, accum = ppo.process_minibatches(cfg.ppo, dist.world_size)
        metrics = ppo_update(the_impl, model, optimizer, scheduler, batch, cfg, torch.Generator().manual_seed(1),
                             minibatch_size=size, agree=dist.mean if dist.active else None, grad_accum_steps=accum)
        return policy_copy, model, optimizer, metrics

    # One optimizer step of two accumulated minibatches: reduced once (the trainer), after every
    # minibatch (as before), never (a mutation).
    sync = ppo.gradient_sync
    rules = {"once": sync, "every": lambda model, _: sync(model, True), "never": lambda model, _: sync(model, False)}
    result["accumulated"], result["reduced_before_step"] = {}, {}
    for name, rule in rules.items():
        probe = ReductionProbe(impl, dist)
        with mock.patch.object(ppo, "gradient_sync", rule):
            policy_copy = update(cfg, dist.shard(B), probe)[0]
        result["accumulated"][name] = {k: v.detach().clone() for k, v in dist.model_state(policy_copy).items()}
        result["reduced_before_step"][name] = probe.reduced
    if not dist.active:  # each process's minibatches, each on its own: their gradients' magnitudes
        update_cfg = UpdateConfig.from_config(cfg)
        sums = {}
        for rank in range(2):
            policy_copy, batch = fresh(slice(rank * B // 2, (rank + 1) * B // 2))
            optimizer = torch.optim.SGD(policy_copy.parameters(), lr=LR)  # never stepped
            for minibatch in minibatches(batch, 1, torch.Generator().manual_seed(1)):
                optimizer.zero_grad(set_to_none=True)
                impl.ppo_minibatch_update(policy_copy, optimizer, minibatch, update_cfg, False)
                for k, param in policy_copy.named_parameters():
                    sums[k] = sums.get(k, 0) + param.grad.abs()
        result["accumulated_magnitudes"] = sums

    # The optimizer steps' rows, without and with ppo.process_minibatch_size: 8 rows, 2 epochs.
    n = 2 * B
    generator = torch.Generator().manual_seed(2)
    ids8 = torch.randint(3, len(tokenizer), (n, P + T), generator=generator)
    rewards8 = torch.rand(n, generator=generator)
    result["steps"] = {}
    for name, extra in (("default", []), ("process", ["ppo.process_minibatch_size=1"])):
        cfg8 = load_config(None, overrides + [f"rollout.batch_size={n}", "ppo.epochs=2", *extra])
        recording = RecordingImpl(impl)
        update(cfg8, dist.shard(n), recording, ids8, rewards8)
        result["steps"][name] = dist.gather_objects([recording.steps()])  # one list per process

    # An early stop inside an accumulation cycle leaves no gradient behind for the next step.
    stop_cfg = load_config(None, overrides + one_row + ["ppo.epochs=2", "ppo.target_kl=1e-9"])
    result["leftover"] = {}
    for name, drop in (("clean", ppo.drop_local_gradients), ("mutant_clean", lambda model: None)):
        with mock.patch.object(ppo, "drop_local_gradients", drop):
            policy_copy, model, optimizer, metrics = update(stop_cfg, dist.shard(B))
        _, batch = fresh(dist.shard(B))
        update_cfg = UpdateConfig.from_config(load_config(None, overrides + ["ppo.grad_accum_steps=1"]))
        grads = []
        for _ in range(2):  # the same gradient twice, reduced over the processes
            impl.ppo_minibatch_update(model, optimizer, batch, update_cfg, False)
            # this process's own values (its shards under FSDP)
            grads.append([p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad.clone()
                          for p in policy_copy.parameters()])
            optimizer.zero_grad(set_to_none=True)
        equal = all(torch.equal(a, b) for a, b in zip(*grads))
        result["leftover"][name] = all(dist.gather_objects([equal]))
        result["leftover"]["stopped_at"] = metrics.get("stats/early_stop_minibatch")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
