"""Data-parallel training through accelerate: N processes, one job, one global batch.

``accelerate launch --num_processes N -m assignment.trainer --config ...`` starts N copies of
the trainer; accelerate's ``PartialState`` reads the launcher's environment and joins them into
one process group (gloo on CPU, NCCL on GPUs). A plain ``ppo-train`` is a job of one process:
every method here is then the identity and the trainer runs exactly as it always did (no
process group, no DDP wrapper).

What each process does with the config's *global* batch of ``B`` responses (``N`` processes,
``b = B / N`` rows each, ``T_r`` the padded response length on process ``r``, ``T = max T_r``):
    - generates and scores its own ``b`` rows of the step's problems (``shard``);
    - gathers the small (b, T_r) rollout tensors into the whole batch (B, T), padded to the
      longest response (``gather_rows``), so that exercise 4 whitens over the whole batch, the
      guard, the KL controller and the curriculum see the whole batch, and every process takes
      the same branch;
    - takes its own rows back for the update (``own_rows``), cut into exercise-5 calls of
      ``ppo.minibatch_size`` rows where N divides ``ppo.grad_accum_steps``, else of
      ``ppo.minibatch_size / N`` (or of ``ppo.process_minibatch_size``: ``ppo.process_minibatches``):
      each optimizer step sees ``ppo.minibatch_size x ppo.grad_accum_steps`` responses, as one
      process does. DDP averages the gradients of the N per-process losses, and each loss is a
      token mean over its own rows: the global token mean only when every process holds as many
      real tokens (as in verl and TRL). The gradients are reduced once per optimizer step
      (``ppo.gradient_sync``), not after every minibatch;
    - agrees with the others on every decision taken from a local figure: the early stop
      (approx_kl averaged over processes, ``mean``), the time limit (``any``).
Only the main process writes files (run directory, logs, checkpoints, plots) and prints.

FSDP (``accelerate launch --config_file configs/accelerate/fsdp.yaml``, FSDP2 only): the same
data-parallel job, but the policy's weights, gradients and AdamW state are sharded over the
processes (``torch.distributed.fsdp.fully_shard``), and every call of the policy is a collective
that all processes must make together. So under FSDP:
    - rollouts generate with ``synced_gpus`` (``rollout.generate``), and a sampler copy is
      refreshed from the full weights (``rollout.refresh_copy``), on every process; the log-prob
      forwards run on equal shards in equal chunks, so their number of calls matches;
    - evaluation pads every process's share of a batch to the same size, dropping the padding's
      records (``sharded_eval_batches``);
    - exercise 5 is unchanged: ``clip_grad_norm_`` over sharded parameters returns a replicated
      DTensor, whose ``.item()`` and ``torch.isfinite`` are the whole model's norm (tested);
    - a checkpoint holds the full state dicts of the policy and the optimizer (``model_state``,
      ``optimizer_state``), loaded back into the shards on resume (``load_state``); the optimizer's
      is keyed by parameter name, so the resume needs the same launch (FSDP, as many processes).
Tested on CPU (gloo, 2 processes); run on 2 and 4 H200s, DDP and FSDP2 (the course
repository's multi-GPU report).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
import torch
from accelerate import PartialState
from accelerate.utils import DistributedType, parse_flag_from_env, broadcast_object_list, gather, gather_object, pad_across_processes
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.fsdp import fully_shard

from assignment.trainer import checkpoint
from assignment.trainer.config import Config, ConfigError
from assignment.trainer.ppo import process_minibatches
from assignment.trainer.rollout import Rollout, Sample

R = TypeVar("R")


# accelerate's autocast would change the log-probs the PPO ratio compares (DDP and FSDP alike).
MIXED_PRECISION_ERROR = ("accelerate's mixed_precision must be 'no': the trainer sets its own dtypes "
                         "(model.dtype, rollout.generation_dtype)")


def resolve_device(name: str) -> torch.device:
    """``train.device`` of a process alone: "auto" is CUDA where there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class WorldSizeError(ValueError):
    """A run resumed by another job than it was started with: another number of processes, or
    with FSDP against without."""


class Distributed:
    """This process's place in the job (accelerate's ``PartialState``); one process: identity."""

    def __init__(self) -> None:
        # accelerate joins processes on CPU (gloo) only when asked for the CPU: without CUDA, ask.
        self.state = PartialState(cpu=not torch.cuda.is_available() or parse_flag_from_env("ACCELERATE_USE_CPU"))
        self.world_size, self.rank = self.state.num_processes, self.state.process_index
        self.is_main = self.state.is_main_process
        # accelerate's environment for a launch with distributed_type FSDP (PartialState itself says
        # MULTI_CPU on CPU): the trainer shards the policy itself (``wrap``)
        self.fsdp = self.active and parse_flag_from_env("ACCELERATE_USE_FSDP")
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched != self.world_size:  # the processes would each train alone, into one folder
            raise RuntimeError(f"launched as {launched} processes but accelerate sees {self.world_size}: "
                               "start the trainer with `accelerate launch`")

    @property
    def active(self) -> bool:
        return self.world_size > 1

    # --- checks and setup ----------------------------------------------------------------

    def check(self, cfg: Config) -> None:
        """Raise ConfigError unless the global batch and minibatch split evenly over the processes
        (the number of minibatches per epoch, hence ``grad_accum_steps``, is then unchanged), and
        ``ppo.process_minibatch_size`` divides each process's share of an optimizer step."""
        n, batch, minibatch = self.world_size, cfg.rollout.batch_size, cfg.ppo.minibatch_size
        if batch % n or minibatch % n:
            raise ConfigError(f"rollout.batch_size ({batch}) and ppo.minibatch_size ({minibatch}) are global and "
                              f"must be divisible by the number of processes ({n})")
        process_minibatches(cfg.ppo, n)
        # DDP and FSDP reduce the gradients of the parameters that run the backward: the 16-bit
        # copy's, which assignment.trainer.precision frees as they arrive.
        if self.active and cfg.model.train_dtype is not None:
            raise ConfigError("model.train_dtype runs on one process only: set model.train_dtype=null under "
                              "accelerate launch")
        # Its gradient weights are hooks on the parameters, untested on FSDP's sharded ones.
        if self.fsdp and cfg.ppo.length_grouping:
            raise ConfigError("ppo.length_grouping is not supported under FSDP: set ppo.length_grouping=false")
        # Both act on the parameters FSDP replaces by shards: untested there.
        if self.fsdp and (cfg.model.compile or cfg.model.offload_frozen or cfg.ppo.optimizer != "adamw"):
            raise ConfigError("model.compile, model.offload_frozen and ppo.optimizer=adamw_8bit are not supported "
                              "under FSDP: set model.compile=false model.offload_frozen=false ppo.optimizer=adamw")

    def device(self, name: str) -> torch.device:
        """The device of this process: accelerate's (cuda:LOCAL_RANK, or cpu under --cpu) in a job of
        several processes, whose config may only say "auto" or that device's type."""
        if not self.active:
            return resolve_device(name)
        if name == "auto":
            # accelerate says cpu:0, which torch.load cannot map a checkpoint to: plain cpu
            return torch.device("cpu") if self.state.device.type == "cpu" else self.state.device
        if torch.device(name).type != self.state.device.type or ":" in name:
            raise ConfigError(f"train.device={name} under accelerate launch: use auto (this process runs on "
                              f"{self.state.device})")
        return torch.device(name)

    def wrap(self, policy: torch.nn.Module) -> torch.nn.Module:
        """The model the update trains: ``policy`` itself, or in a job of several processes its DDP
        wrapper (accelerate's ``prepare_model``), which averages gradients in ``backward``, or under
        FSDP ``policy`` sharded in place (``shard_policy``). Call it before building the optimizer:
        FSDP replaces the parameters."""
        if not self.active:
            return policy
        if self.fsdp:
            return shard_policy(policy)
        from accelerate import Accelerator

        accelerator = Accelerator()
        if accelerator.distributed_type not in (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU):
            raise ConfigError(f"the trainer runs data-parallel (DDP or FSDP2) only, not {accelerator.distributed_type}: "
                              "see handout.md section 1")
        if accelerator.mixed_precision != "no":
            raise ConfigError(MIXED_PRECISION_ERROR)
        return accelerator.prepare_model(policy)

    # --- splitting and gathering ---------------------------------------------------------

    def shard(self, n: int) -> slice:
        """This process's rows of ``n``: contiguous, in rank order, sizes differing by at most one."""
        start = self.rank * n // self.world_size
        return slice(start, (self.rank + 1) * n // self.world_size)

    def gather_rows(self, x: torch.Tensor, pad_first: bool = False, pad_value: int | float = 0) -> torch.Tensor:
        """(b, ...) on each process -> (B, ...) on every process, in rank order; dim 1 padded to the
        longest across processes (at its start with ``pad_first``: left-padded prompts)."""
        if not self.active:
            return x
        is_bool = x.dtype == torch.bool  # gloo has no all_gather for bool
        y = x.to(torch.uint8) if is_bool else x
        if y.dim() > 1:
            y = pad_across_processes(y, dim=1, pad_index=pad_value, pad_first=pad_first)
        y = gather(y.contiguous())
        return y.bool() if is_bool else y

    def gather_objects(self, items: list[R]) -> list[R]:
        """Each process's list -> their concatenation in rank order, on every process."""
        return list(items) if not self.active else gather_object(list(items))

    def own_rows(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """This process's rows of a gathered (B, T) tensor, cut back to its own ``width`` <= T columns."""
        return x[self.shard(x.shape[0]), :width]

    def mean(self, value: float) -> float:
        """The mean of a per-process figure over the processes (the same on all)."""
        if not self.active:
            return value
        return float(gather(torch.tensor([float(value)], dtype=torch.float64, device=self.state.device)).mean())

    def any(self, flag: bool) -> bool:
        """True on every process when it is true on one: a decision all of them take together."""
        return flag if not self.active else self.mean(float(flag)) > 0

    def mean_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Each metric averaged over the processes (keys must agree: they come from the same code)."""
        if not self.active or not metrics:
            return metrics
        keys = sorted(metrics)
        values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=self.state.device)
        means = gather(values[None]).mean(dim=0)
        return {k: float(v) for k, v in zip(keys, means.tolist())}

    def on_main(self, fn: Callable[[], R]) -> R:
        """Run ``fn`` on the main process only (file system work) and hand every process its result,
        or raise its exception on every process, so that none is left waiting."""
        if not self.active:
            return fn()
        box: list[Any] = [None]
        if self.is_main:
            try:
                box[0] = ("ok", fn())
            except Exception as err:  # re-raised below, on every process
                box[0] = ("error", err)
        broadcast_object_list(box)
        kind, value = box[0]
        if kind == "error":
            raise value
        return value

    def barrier(self) -> None:
        if self.active:
            self.state.wait_for_everyone()

    # --- checkpoints ---------------------------------------------------------------------

    def model_state(self, policy: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The policy's full state dict, as a checkpoint holds it. Under FSDP every process must call
        it (the shards are gathered, onto the CPU of the main process alone: the others get an
        empty dict); elsewhere the plain ``state_dict`` (DDP keeps it equal on every process)."""
        if not self.fsdp:
            return policy.state_dict()
        return get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def optimizer_state(self, policy: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's full state dict, as ``model_state`` (under FSDP keyed by parameter name)."""
        if not self.fsdp:
            return optimizer.state_dict()
        return get_optimizer_state_dict(policy, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_state(self, policy: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load a checkpoint's full state dicts (``model_state``, ``optimizer_state``) into the policy and its optimizer:
        under FSDP each process keeps its own shards of them (every process must call it)."""
        if not self.fsdp:
            policy.load_state_dict(state["policy"])
            optimizer.load_state_dict(state["optimizer"])
            return
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(policy, state["policy"], options=options)
        set_optimizer_state_dict(policy, optimizer, state["optimizer"], options=options)

    def checkpoint_extra(self) -> dict[str, Any]:
        """What a checkpoint records of the job: its size and whether FSDP wrote it (its optimizer
        state is then keyed by parameter name), and (several processes) each one's RNG state, so
        that every process draws after a resume what it would have drawn."""
        extra: dict[str, Any] = {"world_size": self.world_size, "fsdp": self.fsdp}
        if self.active:
            extra["rng_ranks"] = gather_object([checkpoint.rng_state()])
        return extra

    def restore_rng(self, state: dict[str, Any]) -> None:
        """Check the checkpoint's job (size, FSDP or not) against this one, then set this process's
        RNG state."""
        saved = state.get("world_size", 1)
        if saved != self.world_size:
            raise WorldSizeError(f"the checkpoint was written by {saved} process(es), this job has {self.world_size}: "
                                 f"resume with the same number (accelerate launch --num_processes {saved}); "
                                 "the RNG streams and the batch split depend on it")
        if state.get("fsdp", False) != self.fsdp:
            raise WorldSizeError(f"the checkpoint was written {'with' if state.get('fsdp') else 'without'} FSDP: "
                                 "resume with the accelerate config it was started with")
        checkpoint.set_rng_state(state["rng_ranks"][self.rank] if self.active else state["rng"])


def process_seed(seed: int, rank: int) -> int:
    """The RNG seed of process ``rank`` of a job run with ``train.seed`` = ``seed``: ``seed`` itself on
    process 0 (a one-process run draws as it always did), and on the others a draw of numpy's
    SeedSequence of (seed, rank), so that no two (seed, rank) pairs share a stream: ``seed + rank``
    made seed 1's process 0 sample as seed 0's process 1."""
    return seed if rank == 0 else int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def shard_policy(policy: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: shard ``policy`` (a ``PolicyWithValueHead``) in place over the processes, and return it.

    Each decoder layer is a unit of its own (the LM's ``_no_split_modules``: accelerate's
    TRANSFORMER_BASED_WRAP), then the LM (embeddings, final norm, LM head: ``generate`` calls
    ``policy.lm`` alone), then the root (the value head). The frozen reference model is not
    sharded: it stays a full copy on every process (weights only, no gradients or AdamW state).
    """
    if os.environ.get("FSDP_VERSION", "1") != "2":
        raise ConfigError("the trainer runs FSDP2 only: fsdp_version: 2 (configs/accelerate/fsdp.yaml)")
    if os.environ.get("ACCELERATE_MIXED_PRECISION", "no") != "no":
        raise ConfigError(MIXED_PRECISION_ERROR)
    layer_classes = set(getattr(policy.lm, "_no_split_modules", None) or ())
    for module in policy.lm.modules():
        if type(module).__name__ in layer_classes:
            fully_shard(module)
    fully_shard(policy.lm)
    fully_shard(policy)
    # FSDP2 makes the first module called the root of the lazy initialisation; a first call of
    # policy.lm (generate, in the evaluation before step 1) would make the LM root and the policy's
    # own forward fail later. One token through the policy, on every process, settles it.
    with torch.no_grad():
        one = torch.ones(1, 1, dtype=torch.long, device=next(policy.parameters()).device)
        policy(one, one)
    policy.reshard()  # the root keeps its weights gathered after a forward: the optimizer must get the shards
    return policy


def sharded_eval_batches(dist: Distributed, evaluate_batches: Callable[..., Any], policy: torch.nn.Module,
                         tokenizer: Any, problems: Sequence[Any], cfg: Config):
    """``evaluate_batches`` with each batch of ``eval.batch_size`` problems split over the processes:
    yields the whole batch's records, in problem order, on every process."""
    if not dist.active:
        yield from evaluate_batches(policy, tokenizer, problems, cfg)
        return
    size = cfg.eval.batch_size
    for start in range(0, len(problems), size):
        chunk = problems[start:start + size]
        mine = chunk[dist.shard(len(chunk))]  # at most one batch: len(mine) <= size
        # FSDP: every process must generate, as many rows: pad with the batch's first problem
        padding = -(-len(chunk) // dist.world_size) - len(mine) if dist.fsdp else 0
        records = [record for batch in evaluate_batches(policy, tokenizer, mine + chunk[:1] * padding, cfg)
                   for record in batch]
        yield dist.gather_objects(records[:len(mine)])


def whole_rollout(dist: Distributed, rollout: Rollout, pad_token_id: int) -> Rollout:
    """Every process's rollout gathered into the whole batch's (B rows, in rank order): prompts
    left-padded to the longest prompt P, responses right-padded to the longest response T. The
    same object on every process; ``rollout`` itself in a job of one process."""
    if not dist.active:
        return rollout
    s = rollout.sample
    prompt_ids = dist.gather_rows(s.prompt_ids, pad_first=True, pad_value=pad_token_id)  # (B, P)
    prompt_mask = dist.gather_rows(s.prompt_mask, pad_first=True)  # (B, P)
    response_ids = dist.gather_rows(s.response_ids, pad_value=pad_token_id)  # (B, T)
    response_mask = dist.gather_rows(s.response_mask)  # (B, T) bool
    sampled = None if s.sampler_logprobs is None else dist.gather_rows(s.sampler_logprobs)  # (B, T)
    whole = Sample(prompt_ids, prompt_mask, response_ids, response_mask, dist.gather_rows(s.finished), sampled)
    return Rollout(whole, torch.cat([prompt_ids, response_ids], dim=1),  # (B, P+T)
                   torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1),
                   dist.gather_rows(rollout.logprobs), dist.gather_rows(rollout.ref_logprobs),
                   dist.gather_rows(rollout.values))


class NullLogger:
    """The run logger of a process that is not the main one: writes nothing."""

    def log(self, *args: Any, **kwargs: Any) -> None: ...
    def samples(self, *args: Any, **kwargs: Any) -> None: ...
    def eval_records(self, *args: Any, **kwargs: Any) -> None: ...
    def close(self) -> None: ...


class NullProgress:
    """``runlog.Progress`` of a process that is not the main one: run.json is the main one's."""

    def add(self, *args: Any, **kwargs: Any) -> None: ...
    def finish(self, *args: Any, **kwargs: Any) -> None: ...
    def record(self, *args: Any, **kwargs: Any) -> None: ...
