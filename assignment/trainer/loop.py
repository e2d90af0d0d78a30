"""The PPO trainer the five exercises plug into: rollout, reward, advantages, update, repeat.

``train(cfg, impl)`` runs a whole training run and returns a ``RunResult``; the CLI (``cli``)
and the autograder's learning check (``learning_check``) both call it. ``impl`` is the exercise
module (see ``impl.load_impl``): the trainer calls ``impl.compute_gae_advantages`` and
``impl.ppo_minibatch_update`` and nothing else of it.

``ppo_step`` is one PPO step, top to bottom (Ouyang et al. 2022; Ziegler et al. 2019;
TinyZero/verl; laid out in one block as in CleanRL's ``ppo.py``):
    1. sample B prompts, generate one response each (``rollout``)
    2. score each response (``reward``) -> final_rewards (B,)
    3. k1 KL penalty per token against the frozen reference -> kl_penalties (B, T)
    4. impl.compute_gae_advantages -> advantages, returns (B, T); the trainer's guard clips them
       or skips the update when the rewards carry no signal (``ppo.guard_advantages``)
    5. epochs x shuffled minibatches of impl.ppo_minibatch_update (``ppo.ppo_update``), stopped
       early when approx_kl passes the ``ppo.target_kl`` bound

With ``algorithm: grpo | dr_grpo`` (Part II, ``grpo``): step 1 samples ``rollout.group_size``
responses per prompt, steps 3-4 are exercise 6's group advantages (no KL in the reward, no
critic), and step 5 runs the same exercise 5 with GRPO's loss swapped in around each call.

Around it: ``setup_run`` builds what the steps share (a ``Run``), and ``run_steps`` is the
schedule: an evaluation before the first step; samples, checkpoints and evaluations between
steps when they are due; the last checkpoint and evaluation after the last step. With
``train.time_limit_s``, the run stops cleanly after the step or evaluation batch that crosses the
limit (``TimeUp``), saves a checkpoint and returns with status "time_limit"; ``--resume``
continues it exactly, an interrupted evaluation included.

Under ``accelerate launch --num_processes N`` the same code runs data-parallel: each process
generates its share of the batch, the rollout is gathered for exercise 4 and the metrics, and
the update trains a DDP wrapper, or under FSDP the sharded policy (``assignment.trainer.distributed``
says what is gathered and what FSDP changes).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase, get_scheduler

from assignment.model import PolicyWithValueHead
from assignment.trainer import checkpoint, grpo
from assignment.trainer.cards import check_card
from assignment.trainer.config import ALGORITHM_NAMES, Config, ConfigError, PPOConfig, RewardConfig, to_yaml
from assignment.trainer.distributed import (Distributed, NullLogger, NullProgress, process_seed,
                                           sharded_eval_batches, whole_rollout)
from assignment.trainer.data import Curriculum, Problem, load_problems, training_batch
from assignment.trainer.evaluate import evaluate_batches, summarize
from assignment.trainer.impl import ImplError
from assignment.trainer.loading import DTYPES, build_models, compile_layers, load_tokenizer
from assignment.trainer.offload import FrozenParking
from assignment.trainer.precision import MixedPrecision, cudnn_attention_safe
from assignment.trainer.ppo import (FIRST_CLIPFRAC_CAUSES, FIRST_KL_CAUSES, KLController, early_stop_bound,
                                    first_clipfrac_tolerance, first_kl_tolerance,
                                   guard_advantages, kl_penalties, ppo_update, process_minibatches, sampler_mismatch,
                                   sequence_kl)
from assignment.trainer.reward import Score, control_draw, score
from assignment.trainer.rollout import Rollout, Sample, collect, generation_copy, refresh_copy, render_prompts
from assignment.trainer.runlog import (EVAL_RECORDS, EVALS, METRICS, SAMPLES, Progress, RunLogger, eval_records_path,
                                       plot_run, read_jsonl)

FINISHED, TIME_LIMIT = "finished", "time_limit"


class RunDirError(FileExistsError):
    """Starting a fresh run in a directory that already holds one."""


@dataclass
class RunResult:
    """What a training run produced."""

    output_dir: Path
    # One dict per PPO step (the whole run, also across a resume): step, rollout/*, loss/*, stats/*, time/*.
    metrics: list[dict[str, float]]
    # One dict per evaluation: step (0 = before training), eval/accuracy, eval/format_rate, ...
    evals: list[dict[str, float]]
    seconds: float
    samples: list[dict[str, Any]] = field(default_factory=list)
    # "finished", or "time_limit": stopped by train.time_limit_s after ``step``; continue with --resume.
    status: str = FINISHED
    step: int = 0  # the last finished PPO step

    def rewards(self) -> list[float]:
        """The training reward (batch mean) of every step, in order."""
        return [m["rollout/reward_mean"] for m in self.metrics]


class TimeUp(Exception):
    """train.time_limit_s has passed; ``step`` is the last finished PPO step."""

    def __init__(self, step: int):
        super().__init__(f"time limit reached after step {step}")
        self.step = step


@dataclass(frozen=True)
class Deadline:
    """When the run must stop (``time.time()`` seconds), or None for never."""

    at: float | None = None

    @classmethod
    def after(cls, seconds: float | None, start: float) -> "Deadline":
        return cls(None if seconds is None else start + seconds)

    def passed(self) -> bool:
        return self.at is not None and time.time() >= self.at


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def disable_dropout(model: torch.nn.Module) -> None:
    """Zero every dropout: rollout (eval mode) and update (train mode) must compute the same
    log-probs, or the first PPO ratio is not 1 (TRL does the same)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    config = getattr(getattr(model, "lm", model), "config", None)
    for name in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop"):
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak, and a new count of cache flushes, for ``peak_memory`` (CUDA only; nothing elsewhere)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.reset_accumulated_memory_stats(device)


def peak_memory(device: torch.device, prefix: str) -> dict[str, float]:
    """``{prefix}peak_memory_gib``: the most memory torch's allocator held on ``device`` since the
    last ``reset_peak_memory`` (tensors, not the allocator's cache), and ``{prefix}peak_reserved_gib``,
    the most it reserved from the card (tensors and cache: what train.max_gpu_memory_gib caps),
    and ``{prefix}alloc_retries``, how often an allocation found the card (or the cap) full and the
    allocator freed its whole cache to retry: each retry synchronizes the card and returns memory
    that the next allocations map again, so a phase that retries often runs near its cap, slowly.
    Empty off CUDA."""
    if device.type != "cuda":
        return {}
    return {f"{prefix}peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            f"{prefix}peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
            f"{prefix}alloc_retries": float(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))}


def step_peaks(rollout: dict[str, float], update: dict[str, float]) -> dict[str, float]:
    """A PPO step's memory metrics from the peaks of its two phases (``peak_memory`` of each, with
    prefixes ``memory/rollout_`` and ``memory/update_``): both, and the step's own peaks."""
    return {**rollout, **update, **{f"memory/{kind}": max(rollout[f"memory/rollout_{kind}"], update[f"memory/update_{kind}"])
                                    for kind in ("peak_memory_gib", "peak_reserved_gib") if rollout}}


def optimizer_steps(cfg: Config) -> int:
    """Optimizer steps in the whole run: the scheduler's horizon."""
    per_epoch = cfg.rollout.batch_size // (cfg.ppo.minibatch_size * cfg.ppo.grad_accum_steps)
    return cfg.train.steps * cfg.ppo.epochs * per_epoch


def minibatches_per_step(cfg: Config, world_size: int = 1) -> int:
    """Calls of ``ppo_minibatch_update`` in one PPO step, on each of ``world_size`` processes: the
    update's progress bar."""
    return cfg.ppo.epochs * (cfg.rollout.batch_size // world_size // process_minibatches(cfg.ppo, world_size)[0])


# --- setting up a run ------------------------------------------------------------------------

@dataclass
class Run:
    """What the PPO steps of one run share: models, data, optimization and the small states."""

    out: Path  # the run directory
    device: torch.device
    tokenizer: PreTrainedTokenizerBase
    policy: PolicyWithValueHead
    ref: PreTrainedModel  # the frozen reference model, the KL anchor
    problems: dict[str, list[Problem]]  # "train" (empty for the synthetic task) and "test"
    optimizer: torch.optim.Optimizer
    scheduler: Any  # a transformers LR scheduler, stepped after every optimizer step
    kl_ctl: KLController
    curriculum: Curriculum
    logger: RunLogger
    start_step: int  # 0, or the step of the checkpoint that a resumed run continues from
    progress: Progress  # this invocation's times in run.json
    deadline: Deadline
    saved_step: int | None = None  # the step of the checkpoint on disk (None: none yet)
    sampler: PreTrainedModel | None = None  # rollout.generation_dtype's copy of policy.lm (None: policy.lm samples)
    dist: Distributed | None = None  # the job's processes (None: this one alone)
    model: torch.nn.Module | None = None  # what the update trains: policy, or its DDP wrapper (None: policy)
    first_kl_warned: bool = False  # the approx_kl_first warning is printed once per invocation
    first_clipfrac_warned: bool = False  # and the policy_clipfrac_first one
    parking: FrozenParking | None = None  # model.offload_frozen: ref and sampler off the GPU outside rollouts
    precision: MixedPrecision | None = None  # model.train_dtype: the 16-bit working copy around policy (None: off)

    @property
    def scorer(self) -> PolicyWithValueHead:
        """The policy that runs the rollout's forwards and exercise 5's: the 16-bit working copy
        under model.train_dtype, else the policy itself."""
        return self.policy if self.precision is None else self.precision.working


def open_run_dir(cfg: Config, resume: bool) -> Path:
    """Create the run directory and record the effective config in it.

    Raises RunDirError if a fresh run would overwrite one. A fresh run drops the evaluation logs
    of an attempt killed before its first checkpoint, so that none of them counts as its own.
    """
    out = Path(cfg.train.output_dir)
    if not resume and ((out / METRICS).exists() or (out / checkpoint.FILENAME).exists()):
        raise RunDirError(f"{out} already holds a run: continue it with --resume {out}, "
                          "or choose another train.output_dir")
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        for name in (EVALS, SAMPLES):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / EVAL_RECORDS, ignore_errors=True)
    (out / "config.yaml").write_text(to_yaml(cfg))
    return out


def setup_run(cfg: Config, out: Path, resume: bool, progress: Progress, deadline: Deadline,
              dist: Distributed | None = None) -> Run:
    """Seed, then build the models, data, optimizer, scheduler and small states of a run; when
    resuming, load them and every RNG state from the checkpoint in ``out``."""
    dist = dist or Distributed()
    dist.check(cfg)
    device = dist.device(cfg.train.device)
    problem = check_card(cfg, device)
    if problem is not None:
        raise ConfigError(problem)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # float32 weights, TF32 matmuls
        if not cudnn_attention_safe(cfg.model.dtype, cfg.model.train_dtype):
            torch.backends.cuda.enable_cudnn_sdp(False)  # its 16-bit backward gives NaN (cudnn_attention_safe)
    progress.record(reward_kind=cfg.reward.kind, **cap_gpu_memory(device, cfg.train.max_gpu_memory_gib))
    seed_everything(cfg.train.seed)
    tokenizer = load_tokenizer(cfg.model)
    policy, ref = build_models(cfg.model, tokenizer, cfg.train.seed, device)
    disable_dropout(policy)
    disable_dropout(ref)
    problems = load_problems(cfg.data, cfg.train.seed)
    # The copies' weights are refreshed from the policy's; taken here, before FSDP shards policy.lm
    # and before compile_layers (a copy of a compiled layer would call the original's forward).
    sampler = generation_copy(policy.lm, DTYPES[cfg.rollout.generation_dtype]) if cfg.rollout.generation_dtype else None
    precision = MixedPrecision(policy, DTYPES[cfg.model.train_dtype]) if cfg.model.train_dtype else None
    if cfg.model.compile and device.type == "cuda":  # the sampler is transformers' to compile
        compile_layers(policy.lm if precision is None else precision.working.lm, scope=cfg.model.compile_scope)  # what runs the forwards
        compile_layers(ref, scope=cfg.model.compile_scope)
    # before the optimizer: FSDP replaces the parameters by their shards (model.train_dtype: one process)
    model = dist.wrap(policy) if precision is None else precision
    optimizer = build_optimizer(policy, cfg.ppo)
    if precision is not None:
        precision.attach(optimizer)
    scheduler = get_scheduler(cfg.ppo.lr_scheduler, optimizer, num_warmup_steps=cfg.ppo.warmup_steps,
                              num_training_steps=optimizer_steps(cfg))
    kl_ctl, curriculum = KLController(cfg.kl), Curriculum(cfg.data)
    if dist.rank:  # the same weights everywhere (seeded above), but each process samples its own responses
        seed_everything(process_seed(cfg.train.seed, dist.rank))
    start_step = restore(out, policy, optimizer, scheduler, kl_ctl, curriculum, dist, precision) if resume else 0
    logger = RunLogger(out, cfg, start_step) if dist.is_main else NullLogger()
    return Run(out, device, tokenizer, policy, ref, problems, optimizer, scheduler, kl_ctl, curriculum,
               logger, start_step, progress, deadline, start_step if resume else None, sampler, dist, model,
               parking=FrozenParking(ref, sampler) if cfg.model.offload_frozen else None, precision=precision)


def cap_gpu_memory(device: torch.device, gib: float | None) -> dict[str, float]:
    """Limit torch's allocator on ``device`` to ``gib`` GiB (train.max_gpu_memory_gib): past it an
    allocation fails with an out-of-memory error, as on a card of that size. Returns what run.json
    records: the card's memory and the cap. Raises ConfigError for a cap above the card."""
    if device.type != "cuda":
        return {}
    total = torch.cuda.get_device_properties(device).total_memory / 2**30
    if gib is None:
        return {"gpu_memory_gib": total}
    if gib > total:
        raise ConfigError(f"train.max_gpu_memory_gib={gib:g} is more than this card has ({total:.1f} GiB)")
    # Under a cap, fragmentation is what runs out first: the 24 GB profile failed at 17.9 GiB
    # allocated with 1.3 GiB reserved but unusable (H100, measured); with expandable segments the
    # allocator grows segments in place instead of keeping blocks of every size, and it ran.
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    torch.cuda.set_per_process_memory_fraction(gib / total, torch.cuda._utils._get_device_index(device, optional=True))
    return {"gpu_memory_gib": total, "max_gpu_memory_gib": gib}


def build_optimizer(policy: PolicyWithValueHead, ppo: PPOConfig) -> torch.optim.Optimizer:
    """The optimizer exercise 5 steps (ppo.optimizer): torch's AdamW, or bitsandbytes' AdamW8bit,
    whose 8-bit block-wise state takes 2 bytes a parameter instead of 8. As transformers' Trainer
    does for it (adamw_bnb_8bit), embedding weights keep 32-bit state, which Dettmers et al. (2022,
    "8-bit Optimizers via Block-wise Quantization") found needed for stable training of embeddings
    (their stable embedding layer keeps 32-bit state too)."""
    groups = optimizer_groups(policy, ppo)
    if ppo.optimizer == "adamw":
        # On a GPU, the fused kernel: one pass over weights, gradients and state instead of the
        # foreach implementation's several (0.06 s per optimizer step of the 0.5B recipe on an
        # H200, 4 a PPO step, paid whole by every data-parallel process), as nanoGPT does.
        # Not for FSDP's sharded (DTensor) parameters, nor on CPU, where the tests keep torch's default.
        params = [param for group in groups for param in group["params"]]
        fused = all(param.is_cuda and type(param.data) is torch.Tensor for param in params)
        # None, not False: torch reads an explicit False as "the per-tensor loop", slower than foreach
        return torch.optim.AdamW(groups, lr=ppo.lr, weight_decay=ppo.weight_decay, fused=fused or None)
    try:
        import bitsandbytes
    except ImportError:
        raise ConfigError("ppo.optimizer=adamw_8bit (the small-card profiles) needs bitsandbytes, the `lowmem` "
                          "extra: pip install -e '.[train,lowmem]' (or pip install bitsandbytes), or set "
                          "ppo.optimizer=adamw") from None
    manager = bitsandbytes.optim.GlobalOptimManager.get_instance()
    for module in policy.modules():
        if isinstance(module, torch.nn.Embedding):
            manager.register_module_override(module, "weight", {"optim_bits": 32})
    return bitsandbytes.optim.AdamW8bit(groups, lr=ppo.lr, weight_decay=ppo.weight_decay)


def optimizer_groups(policy: PolicyWithValueHead, ppo: PPOConfig) -> list[dict[str, Any]]:
    """The policy's parameters as AdamW's groups: one at ``ppo.lr``, or, with
    ``ppo.value_head_lr``, the value head in a group of its own at that rate (the scheduler
    scales both alike)."""
    if ppo.value_head_lr is None:
        return [{"params": list(policy.parameters())}]
    head = list(policy.value_head.parameters())
    in_head = {id(param) for param in head}
    return [{"params": [param for param in policy.parameters() if id(param) not in in_head]},
            {"params": head, "lr": ppo.value_head_lr}]


def restore(out: Path, policy: PolicyWithValueHead, optimizer: torch.optim.Optimizer,
            scheduler: Any, kl_ctl: KLController, curriculum: Curriculum, dist: Distributed,
            precision: MixedPrecision | None = None) -> int:
    """Load the checkpoint in ``out`` into these objects and set every RNG state from it, so that
    the run continues as if never stopped; return the checkpoint's step."""
    state = checkpoint.load(out)
    dist.restore_rng(state)  # this process's own RNG state; raises WorldSizeError for another job
    dist.load_state(policy, optimizer, state)  # into this process's shards under FSDP
    scheduler.load_state_dict(state["scheduler"])
    kl_ctl.load_state_dict(state["kl"])
    curriculum.load_state_dict(state["curriculum"])
    if precision is not None:
        precision.refresh()  # the working copy from the loaded masters
        if precision.scaler is not None and "loss_scale" in state:
            precision.scaler.load_state_dict(state["loss_scale"])
    tqdm.write(f"resuming {out} from step {state['step']}")
    return state["step"]


def save(run: Run, step: int) -> None:
    """Checkpoint ``run`` as of ``step``: what ``restore`` loads."""
    extra = {"kl": run.kl_ctl.state_dict(), "curriculum": run.curriculum.state_dict(), **run.dist.checkpoint_extra()}
    if run.precision is not None and run.precision.scaler is not None:
        extra["loss_scale"] = run.precision.scaler.state_dict()
    # Every process takes part in gathering the full states (FSDP); the main one writes them.
    policy_state, optimizer_state = run.dist.model_state(run.policy), run.dist.optimizer_state(run.policy, run.optimizer)
    run.dist.on_main(lambda: checkpoint.save(run.out, step, policy_state, optimizer_state, run.scheduler, extra))
    run.saved_step = step


# --- one PPO step ----------------------------------------------------------------------------

def ppo_step(run: Run, cfg: Config, impl: ModuleType, step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """PPO step ``step``: the five steps of the module docstring, in order; then the KL
    coefficient and the curriculum adapt to the batch. Returns the step's metrics (rollout/*,
    loss/*, stats/*, time/*) and its first ``train.num_samples`` responses (for samples.jsonl).
    """
    started = time.time()
    collect_garbage()  # here, in every process at once, and timed with the rollout
    reset_peak_memory(run.device)
    # 1. Sample B prompts (a function of seed and step: a resumed run draws the same) and generate.
    #    GRPO: B / G prompts, each G = rollout.group_size times in a row (group_size is 1 for PPO).
    group_size = cfg.rollout.group_size
    problems = training_batch(cfg.data, run.problems["train"], cfg.rollout.batch_size // group_size, cfg.train.seed,
                              step, run.curriculum.level)
    problems = [problem for problem in problems for _ in range(group_size)]
    share = run.dist.shard(len(problems))  # this process's share of the global batch: its rows' places in it
    problems = problems[share]
    prompts = render_prompts(run.tokenizer, [problem.question for problem in problems], cfg.data)
    if run.parking is not None:
        run.parking.unpark()
    if run.sampler is not None:
        refresh_copy(run.sampler, run.policy.lm)  # the weights of the last update (or of the checkpoint)
    rollout = collect(run.scorer, run.ref, run.tokenizer, prompts, cfg.rollout, run.sampler)
    if run.parking is not None:  # neither is needed again before the next rollout
        run.parking.park()
    response_mask = rollout.sample.response_mask  # (B, T)
    # 2. Score each whole response -> final_rewards (B,).
    texts = run.tokenizer.batch_decode(rollout.sample.response_ids, skip_special_tokens=True)
    draws = [control_draw(cfg.train.seed, step, index) for index in range(share.start, share.stop)]
    scores = score_responses(texts, problems, rollout.sample, cfg.reward, draws)
    final_rewards = torch.tensor([scored.reward for scored in scores], dtype=torch.float32, device=run.device)
    # Data-parallel: from here to the update, the whole batch (every process's rows, the same everywhere).
    mine, rollout = rollout, whole_rollout(run.dist, rollout, run.tokenizer.pad_token_id)
    response_mask, final_rewards = rollout.sample.response_mask, run.dist.gather_rows(final_rewards)
    texts, scores, problems = (run.dist.gather_objects(items) for items in (texts, scores, problems))
    if cfg.algorithm == "ppo":
        # 3. Per-token k1 KL penalty against the frozen reference -> (B, T).
        penalties = kl_penalties(rollout.logprobs, rollout.ref_logprobs, response_mask, run.kl_ctl.value)
        # 4. Advantages and returns (exercise 4) -> (B, T) each.
        advantages, returns = impl.compute_gae_advantages(final_rewards, penalties, rollout.values, response_mask,
                                                          cfg.ppo.gamma, cfg.ppo.lam)
    else:
        # 3-4. GRPO: no KL in the reward (it is in the loss), group advantages of exercise 6, no returns.
        advantages = grpo.advantages(impl, final_rewards, response_mask, cfg)
        returns = torch.zeros_like(advantages)
    # The guard: clip, or skip the update.
    advantages, guard_metrics, skip = guard_advantages(final_rewards, advantages, response_mask, cfg.ppo)
    rollout_done, rollout_memory = time.time(), peak_memory(run.device, "memory/rollout_")
    reset_peak_memory(run.device)
    # 5. Epochs x shuffled minibatches of exercise 5 (none if the guard said skip), on this process's rows.
    width = mine.sample.response_mask.shape[1]
    batch = mine.update_batch(run.dist.own_rows(advantages, width), run.dist.own_rows(returns, width))
    if cfg.algorithm != "ppo":
        batch = grpo.update_batch(batch, mine.ref_logprobs)
    update_metrics = update(run, cfg, impl, step, batch, skip)
    real, sampled = response_mask.bool(), rollout.sample.sampler_logprobs
    sampler_gap = None if sampled is None else (sampled - rollout.logprobs)[real]  # (N,) the 16-bit bound's measure
    warn_first_kl(run, step, update_metrics, rollout.logprobs[real], sampler_gap)
    warn_first_clipfrac(run, step, update_metrics, cfg.ppo.clip_ratio)
    metrics = {**rollout_metrics(rollout, final_rewards, scores, run.kl_ctl.value), **guard_metrics,
               **update_metrics, "time/rollout": rollout_done - started, "time/update": time.time() - rollout_done,
               **step_peaks(rollout_memory, peak_memory(run.device, "memory/update_"))}
    # After the batch: steer the KL coefficient; widen the synthetic operands once they are learned.
    if cfg.algorithm != "ppo":
        metrics.pop("rollout/value_mean")  # no critic: the value head is never trained
        metrics["rollout/zero_spread_groups"] = grpo.zero_spread_groups(final_rewards, group_size)
    run.kl_ctl.update(metrics["rollout/kl"], cfg.rollout.batch_size)
    if cfg.data.task == "synthetic":
        metrics["rollout/max_operand"] = run.curriculum.level
        run.curriculum.update(metrics["rollout/correct_rate"])
    samples = [{"question": problem.question, "response": text, "reference": problem.answer,
                "reward": scored.reward} for problem, text, scored in zip(problems, texts, scores)]
    return metrics, samples[: cfg.train.num_samples]


def update(run: Run, cfg: Config, impl: ModuleType, step: int, batch: dict[str, Any], skip: str | None) -> dict[str, float]:
    """Step 5 on ``batch``, shuffled by a generator of this step's own; nothing when ``skip``
    gives a reason. Says why an update was skipped or stopped early."""
    if skip is not None:
        tqdm.write(f"[step {step}] update skipped: {skip}")
        return {}
    generator = torch.Generator().manual_seed(cfg.train.seed * 1_000_003 + step)
    around = None
    if cfg.algorithm != "ppo":  # GRPO's loss around exercise 5 (assignment/trainer/grpo.py)
        def around(minibatch):
            return grpo.policy_loss_swap(impl, minibatch, cfg, run.kl_ctl.value)
    dist = run.dist
    calls = minibatches_per_step(cfg, dist.world_size)
    size, accum = process_minibatches(cfg.ppo, dist.world_size)
    with tqdm(total=calls, desc="update", leave=False, disable=not cfg.train.progress) as bar:
        metrics = ppo_update(impl, run.model, run.optimizer, run.scheduler, batch, cfg, generator, bar, around,
                             size, dist.mean if dist.active else None, accum)
    metrics = dist.mean_metrics(metrics)  # each process's means over its own minibatches, averaged
    if metrics.get("stats/skipped_steps") and run.precision.non_finite:
        names = run.precision.non_finite
        tqdm.write(f"[step {step}] {int(metrics['stats/skipped_steps'])} optimizer step(s) skipped: gradients not finite "
                   f"({len(names)} parameters, the first {', '.join(names[:3])}); loss scale now "
                   f"{metrics.get('stats/loss_scale', 1.0):g}")
        run.precision.non_finite = []
    if metrics["stats/early_stop"]:
        tqdm.write(f"[step {step}] update stopped early after minibatch {int(metrics['stats/minibatches'])} of "
                   f"{calls}: approx_kl {metrics['stats/early_stop_approx_kl']:.4f} > "
                   f"1.5 * ppo.target_kl = {early_stop_bound(cfg.ppo):.4f}")
    return metrics


def warn_first_kl(run: Run, step: int, metrics: dict[str, float], logprobs: torch.Tensor,
                  sampler_gap: torch.Tensor | None = None) -> None:
    """Print a warning, once, on the first step whose first minibatch's approx_kl is not 0 within
    float rounding (ppo.first_kl_tolerance): there the ratio must be exactly 1, and a step mean
    cannot show it. ``logprobs`` (N,): the rollout's log-probs on real tokens; ``sampler_gap`` (N,):
    the sampler's own log-probs minus those (the rounding of a 16-bit policy)."""
    first_kl = metrics.get("stats/approx_kl_first")
    if first_kl is None or logprobs.numel() == 0:
        return
    tolerance = first_kl_tolerance(run.scorer, float(logprobs.abs().max()), sampler_gap)
    metrics["stats/first_kl_tolerance"] = tolerance  # logged with every step, warned or not
    if not run.first_kl_warned and not abs(first_kl) <= tolerance:  # NaN warns too
        run.first_kl_warned = True
        tqdm.write(f"[step {step}] WARNING: stats/approx_kl_first = {first_kl:.3g}, not 0 within float rounding "
                   f"(|approx_kl_first| <= {tolerance:.1e}): {FIRST_KL_CAUSES}")


def warn_first_clipfrac(run: Run, step: int, metrics: dict[str, float], clip_ratio: float) -> None:
    """Print a warning, once, on the first step whose first minibatch clipped more tokens than
    rounding explains (ppo.first_clipfrac_tolerance: none in float32) while its approx_kl is 0 within
    float rounding (``stats/first_kl_tolerance``, which warn_first_kl logs first): at ratio 1 nothing
    is clipped, and with the log-probs aligned (warn_first_kl's evidence) the clip test is what
    counts. A first minibatch whose approx_kl is off too is warn_first_kl's."""
    clipfrac, first_kl = metrics.get("stats/policy_clipfrac_first"), metrics.get("stats/approx_kl_first")
    tolerance = metrics.get("stats/first_kl_tolerance")
    if run.first_clipfrac_warned or not clipfrac or first_kl is None or tolerance is None:
        return
    allowed = first_clipfrac_tolerance(run.scorer, tolerance, clip_ratio)
    if abs(first_kl) <= tolerance and clipfrac > allowed:
        run.first_clipfrac_warned = True
        rounding = f" (16-bit rounding explains at most {allowed:.1e})" if allowed else ""
        tqdm.write(f"[step {step}] WARNING: stats/policy_clipfrac_first = {clipfrac:.3g}, not 0{rounding}: "
                   f"{FIRST_CLIPFRAC_CAUSES}")


def score_responses(texts: list[str], problems: list[Problem], responses: Sample, cfg: RewardConfig,
                    draws: list[float]) -> list[Score]:
    """The reward of each decoded response against its problem's reference answer; ``draws``: each
    response's ``reward.control_draw`` (read by the random control alone)."""
    lengths = responses.response_mask.sum(dim=-1).tolist()  # (B,) real tokens, EOS included
    return [score(text, problem.answer, bool(finished), int(length), cfg, draw)
            for text, problem, finished, length, draw in zip(texts, problems, responses.finished.tolist(), lengths, draws)]


def rollout_metrics(rollout: Rollout, final_rewards: torch.Tensor, scores: list[Score],
                    kl_coeff: float) -> dict[str, float]:
    """The rollout/* metrics of one batch; ``kl_coeff`` is the coefficient its penalties used."""
    responses = rollout.sample
    lengths = responses.response_mask.sum(dim=-1).float()  # (B,)
    correct = torch.tensor([scored.correct for scored in scores], dtype=torch.bool, device=lengths.device)
    # By outcome: the length bias GRPO's per-response normalisation is blamed for shows in the
    # length of wrong answers (handout.md section 8). Absent from a step with no answer of a kind.
    by_outcome = {f"rollout/length_{name}": float(lengths[which].mean())
                  for name, which in (("correct", correct), ("wrong", ~correct)) if bool(which.any())}
    return {
        "rollout/reward_mean": float(final_rewards.mean()),
        "rollout/reward_std": float(final_rewards.std()),
        "rollout/correct_rate": float(np.mean([scored.correct for scored in scores])),
        "rollout/format_rate": float(np.mean([scored.formatted for scored in scores])),
        "rollout/reasoning_rate": float(np.mean([scored.reasoning for scored in scores])),
        "rollout/response_length": float(lengths.mean()),
        **by_outcome,
        "rollout/truncated_rate": float(1.0 - responses.finished.float().mean()),
        "rollout/kl": float(sequence_kl(rollout.logprobs, rollout.ref_logprobs, responses.response_mask).mean()),
        "rollout/kl_coeff": kl_coeff,
        "rollout/value_mean": float(rollout.values[responses.response_mask].mean()),
        **({} if responses.sampler_logprobs is None else
           sampler_mismatch(responses.sampler_logprobs, rollout.logprobs, responses.response_mask)),
    }


# --- the schedule around the steps -----------------------------------------------------------

def eval_due(cfg: Config, step: int) -> bool:
    """An evaluation follows ``step``: before training, every ``eval.every`` steps, and at the end."""
    return step in (0, cfg.train.steps) or bool(cfg.eval.every and step % cfg.eval.every == 0)


def run_eval(run: Run, cfg: Config, step: int) -> None:
    """Greedy evaluation on the first ``eval.size`` test problems after ``step``: each batch's
    records are appended to ``eval_samples/step_N.jsonl`` as it finishes, an evaluation that an
    earlier invocation left unfinished continues after its last batch, and the summary goes to
    ``eval.jsonl`` once every problem has its record. Raises TimeUp(step) between batches
    when the time limit has passed."""
    problems = run.problems["test"][: cfg.eval.size]
    # The main process reads the run directory (it alone writes it) and tells the others.
    if not problems or run.dist.on_main(lambda: any(e["step"] == step for e in read_jsonl(run.out / EVALS))):
        return
    records = run.dist.on_main(lambda: read_jsonl(eval_records_path(run.out, step)))
    with tqdm(total=len(problems), initial=len(records), desc=f"eval (step {step})", leave=False,
              disable=not cfg.train.progress) as bar:
        started = time.time()
        reset_peak_memory(run.device)
        decode = evaluate_batches
        if cfg.eval.model == "sampler":  # the 16-bit copy, with the policy's current weights
            if run.parking is not None:
                run.parking.unpark()
            refresh_copy(run.sampler, run.policy.lm)
            decode = functools.partial(evaluate_batches, sampler=run.sampler)
        for batch in sharded_eval_batches(run.dist, decode, run.policy, run.tokenizer, problems[len(records):], cfg):
            run.logger.eval_records(step, batch)
            records += batch
            bar.update(len(batch))
            run.progress.add("eval", time.time() - started)
            if cfg.train.log_every:
                tqdm.write(f"[eval step {step}] {len(records)}/{len(problems)} problems, {time.time() - started:.1f} s")
            started = time.time()
            if len(records) < len(problems) and run.dist.any(run.deadline.passed()):
                raise TimeUp(step)
    result = summarize(records)
    # the peak of this invocation's batches (a resumed evaluation's earlier batches ran elsewhere)
    run.logger.log(step, {**result.metrics(), **peak_memory(run.device, "eval/")}, EVALS)
    tqdm.write(f"[eval step {step}] accuracy {result.accuracy:.3f}, answer rate {result.format_rate:.3f}, "
               f"response length {result.mean_length:.0f} on {result.n} problems")


def log_samples(run: Run, step: int, samples: list[dict[str, Any]]) -> None:
    run.logger.samples(step, samples)
    for sample in samples:
        tqdm.write(f"[step {step}] Q: {sample['question']!r}\n           A: {sample['response']!r} "
                   f"(reward {sample['reward']:.2f}, reference {sample['reference']})")


def between_steps(run: Run, cfg: Config, step: int, samples: list[dict[str, Any]]) -> None:
    """After step ``step``: samples, a checkpoint and an evaluation, each when it is due; the
    last step saves (unless ``train.final_checkpoint`` is false), then evaluates. Saving first
    means that an evaluation which crashes (out of memory, say) or is stopped by the time limit
    costs no training: ``--resume`` continues with the evaluation."""
    if cfg.train.num_samples and cfg.train.sample_every and (step == 1 or step % cfg.train.sample_every == 0):
        log_samples(run, step, samples)
    if step == cfg.train.steps:
        if cfg.train.final_checkpoint:
            save(run, step)
    elif cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
        save(run, step)
    if eval_due(cfg, step):
        run_eval(run, cfg, step)


def step_line(step: int, metrics: dict[str, float]) -> str:
    """One line of a step's main metrics, for logs without a terminal."""
    fields = [("reward", "rollout/reward_mean", ".3f"), ("correct", "rollout/correct_rate", ".3f"),
              ("len", "rollout/response_length", ".0f"), ("kl", "rollout/kl", ".2f"), ("kl_coeff", "rollout/kl_coeff", ".4f"),
              ("sampler_kl", "rollout/sampler_kl", ".1e"), ("far", "rollout/sampler_far_share", ".1e"),
              ("approx_kl", "stats/approx_kl", ".4f"), ("approx_kl_first", "stats/approx_kl_first", ".1e"),
              ("clipfrac", "stats/policy_clipfrac", ".3f"),
              ("minibatches", "stats/minibatches", ".0f"), ("rollout_s", "time/rollout", ".1f"), ("update_s", "time/update", ".1f")]
    return f"[step {step}] " + " ".join(f"{name} {metrics[key]:{spec}}" for name, key, spec in fields if key in metrics)


_collecting_at_step_start = False  # inside collection_at_step_start


@contextlib.contextmanager
def collection_at_step_start() -> Any:
    """Inside the block, Python's cyclic garbage collector runs only where ``collect_garbage``
    is called, at the start of each step. Left to itself it pauses a process whenever its
    allocation counts say so; data-parallel, every process then waits at the next collective for
    the one that paused, so each process's pauses cost all of them (torchtitan disables it and
    collects on a schedule for the same reason). What exists on the way in (the models, the data,
    the libraries: ~4e5 objects, 0.4 s a full collection on a slow CPU) is frozen at once, never
    scanned by those collections. Restored on the way out."""
    global _collecting_at_step_start
    enabled, frozen_before = gc.isenabled(), gc.get_freeze_count()
    gc.disable()
    gc.freeze()
    _collecting_at_step_start = True
    try:
        yield
    finally:
        _collecting_at_step_start = False
        if not frozen_before:  # a host process that froze objects itself keeps them (and ours) frozen
            gc.unfreeze()
        if enabled:
            gc.enable()


def collect_garbage() -> None:
    """Inside ``collection_at_step_start``: a full collection, then what survives it (models,
    compiled graphs, data: what lives for the run) is frozen, so that the next collection scans
    only what the next step made. Outside it (the collector runs by itself): nothing."""
    if not _collecting_at_step_start:
        return
    gc.collect()
    gc.freeze()


def run_steps(run: Run, cfg: Config, impl: ModuleType, on_step: Callable[[int, dict[str, float]], None] | None) -> None:
    """The schedule: the evaluation due at the start (before training, or one an earlier
    invocation left unfinished), then PPO steps with what is due between them. Raises TimeUp
    after the step that crosses the time limit."""
    if eval_due(cfg, run.start_step):
        run_eval(run, cfg, run.start_step)
    with collection_at_step_start():
        steps = tqdm(range(run.start_step + 1, cfg.train.steps + 1), desc=f"{ALGORITHM_NAMES[cfg.algorithm]} steps",
                     initial=run.start_step, total=cfg.train.steps, disable=not cfg.train.progress)
        for step in steps:
            started = time.time()
            metrics, samples = ppo_step(run, cfg, impl, step)
            run.logger.log(step, metrics)
            run.progress.add("train", time.time() - started, step)
            steps.set_postfix(reward=f"{metrics['rollout/reward_mean']:.3f}", correct=f"{metrics['rollout/correct_rate']:.2f}",
                              len=f"{metrics['rollout/response_length']:.0f}", kl=f"{metrics['rollout/kl']:.1f}")
            if cfg.train.log_every and step % cfg.train.log_every == 0:
                tqdm.write(step_line(step, metrics))
            between_steps(run, cfg, step, samples)
            if on_step is not None:
                on_step(step, metrics)
            if step < cfg.train.steps and run.dist.any(run.deadline.passed()):
                raise TimeUp(step)
        steps.close()


def train(cfg: Config, impl: ModuleType, resume: bool = False,
          on_step: Callable[[int, dict[str, float]], None] | None = None, command: str | None = None) -> RunResult:
    """Train with PPO as ``cfg`` says, using the exercises of ``impl``.

    Args:
        cfg: the loaded config (``assignment.trainer.config.load_config``).
        impl: the exercise module; only ``compute_gae_advantages`` and ``ppo_minibatch_update``
            are called on it.
        resume: continue from the checkpoint in ``cfg.train.output_dir`` instead of starting.
        on_step: called after every PPO step (after its checkpoint) with (step, metrics).
        command: the command line, recorded in ``run.json`` for the report.

    Returns the run's result; its ``status`` is "time_limit" when ``train.time_limit_s`` stopped
    it (a checkpoint is saved: continue with ``resume=True``). Raises RunDirError if a fresh
    run would overwrite one, and FileNotFoundError if ``resume`` finds no checkpoint.
    Exceptions from ``impl`` propagate unchanged.
    """
    threads = torch.get_num_threads()
    if cfg.train.cpu_threads:
        torch.set_num_threads(cfg.train.cpu_threads)
    dist = Distributed()
    try:
        if dist.is_main:
            return _train(cfg, impl, resume, on_step, command, dist)
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):  # one job prints once
            return _train(cfg, impl, resume, on_step, command, dist)
    finally:
        torch.set_num_threads(threads)  # the setting is process-wide: give the caller its own back


def _train(cfg: Config, impl: ModuleType, resume: bool, on_step: Callable[[int, dict[str, float]], None] | None,
           command: str | None, dist: Distributed) -> RunResult:
    """Set up, run the schedule until it ends or the time limit stops it (then checkpoint), record
    how the invocation ended, draw the reward curve of a finished run, return the result."""
    started = time.time()
    if cfg.algorithm != "ppo" and grpo.missing(impl):
        raise ImplError(f"algorithm {cfg.algorithm} needs Part II's exercises; the submission does not define "
                        f"{', '.join(grpo.missing(impl))}")
    if resume and not cfg.train.final_checkpoint and not (Path(cfg.train.output_dir) / checkpoint.FILENAME).is_file():
        raise FileNotFoundError(f"no checkpoint to resume from in {cfg.train.output_dir}: the run has "
                                "train.final_checkpoint=false, which saves none after the last step (and without "
                                "train.checkpoint_every none before it); start a new run in another train.output_dir")
    out = dist.on_main(lambda: open_run_dir(cfg, resume))
    progress = Progress(out, command, resume, dist.world_size) if dist.is_main else NullProgress()
    run = setup_run(cfg, out, resume, progress, Deadline.after(cfg.train.time_limit_s, started), dist)
    status, last_step = FINISHED, cfg.train.steps
    try:
        run_steps(run, cfg, impl, on_step)
    except TimeUp as stop:
        status, last_step = TIME_LIMIT, stop.step
        if run.saved_step != stop.step:
            save(run, stop.step)
        tqdm.write(f"time limit of {cfg.train.time_limit_s:g} s reached after step {stop.step} of {cfg.train.steps}: "
                   f"checkpoint saved")
    run.logger.close()
    progress.finish(status)
    if status == FINISHED and dist.is_main:
        try:
            plot_run(out)
        except ImportError as err:  # matplotlib is optional where the run happens; --report draws it later
            tqdm.write(f"no reward curve: {err}")
    dist.barrier()  # every file written before any process reads them
    return RunResult(out, read_jsonl(out / METRICS), read_jsonl(out / EVALS), time.time() - started,
                     read_jsonl(out / SAMPLES), status, last_step)
