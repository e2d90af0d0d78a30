"""The PPO trainer the five exercises plug into: rollout, reward, advantages, update, repeat.

``train(cfg, impl)`` runs a whole training run and returns a ``RunResult``; the CLI
(``assignment.trainer.cli``) and the autograder's learning check (``assignment.trainer.learning_check``) both
call it. ``impl`` is the exercise module (see ``assignment.trainer.impl.load_impl``): the trainer calls
``impl.compute_gae_advantages`` and ``impl.ppo_minibatch_update`` and nothing else of it.

One PPO step (Ouyang et al. 2022; Ziegler et al. 2019; TinyZero/verl):
    1. sample B prompts, generate one response each (assignment.trainer.rollout)
    2. score each response (assignment.trainer.reward) -> final_rewards (B,)
    3. k1 KL penalty per token against the frozen reference -> kl_penalties (B, T)
    4. impl.compute_gae_advantages -> advantages, returns (B, T)
    5. epochs x shuffled minibatches of impl.ppo_minibatch_update (assignment.trainer.ppo)
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import get_scheduler

from assignment.trainer import checkpoint
from assignment.trainer.config import Config, to_yaml
from assignment.trainer.data import Curriculum, load_problems, training_batch
from assignment.trainer.evaluate import EvalResult, evaluate
from assignment.trainer.loading import build_models, load_tokenizer
from assignment.trainer.ppo import KLController, kl_penalties, ppo_update, sequence_kl
from assignment.trainer.reward import score
from assignment.trainer.rollout import collect, render_prompts
from assignment.trainer.runlog import EVALS, METRICS, RunLogger, plot_run, read_jsonl


def record_run(out: Path, command: str | None, resume: bool, seconds: float | None = None) -> None:
    """Append this invocation (command, host, device, library versions) to ``run.json``; with
    ``seconds``, record instead the wall time of the invocation appended last."""
    path = out / "run.json"
    runs = json.loads(path.read_text()) if path.is_file() else []
    if seconds is not None:
        runs[-1]["seconds"] = seconds
        path.write_text(json.dumps(runs, indent=1))
        return
    import platform

    import transformers

    info = {"command": command, "resume": resume, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "host": platform.node(), "torch": torch.__version__, "transformers": transformers.__version__,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"}
    path.write_text(json.dumps(runs + [info], indent=1))


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

    def rewards(self) -> list[float]:
        """The training reward (batch mean) of every step, in order."""
        return [m["rollout/reward_mean"] for m in self.metrics]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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


def optimizer_steps(cfg: Config) -> int:
    """Optimizer steps in the whole run: the scheduler's horizon."""
    per_epoch = cfg.rollout.batch_size // (cfg.ppo.minibatch_size * cfg.ppo.grad_accum_steps)
    return cfg.train.steps * cfg.ppo.epochs * per_epoch


def _log_eval(logger: RunLogger, step: int, result: EvalResult) -> dict[str, float]:
    metrics = result.metrics()
    logger.log(step, metrics, EVALS)
    logger.eval_records(step, result.records)
    tqdm.write(f"[eval step {step}] strict accuracy {result.accuracy:.3f}, format rate {result.format_rate:.3f} "
               f"on {result.n} problems")
    return {"step": step, **metrics}


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

    Raises RunDirError if a fresh run would overwrite one, and FileNotFoundError if
    ``resume`` finds no checkpoint. Exceptions from ``impl`` propagate unchanged.
    """
    threads = torch.get_num_threads()
    if cfg.train.cpu_threads:
        torch.set_num_threads(cfg.train.cpu_threads)
    try:
        return _train(cfg, impl, resume, on_step, command)
    finally:
        torch.set_num_threads(threads)  # the setting is process-wide: give the caller its own back


def _train(cfg: Config, impl: ModuleType, resume: bool, on_step: Callable[[int, dict[str, float]], None] | None,
           command: str | None) -> RunResult:
    started = time.time()
    out = Path(cfg.train.output_dir)
    if not resume and ((out / METRICS).exists() or (out / checkpoint.FILENAME).exists()):
        raise RunDirError(f"{out} already holds a run: continue it with --resume {out}, "
                          "or choose another train.output_dir")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(to_yaml(cfg))
    record_run(out, command, resume)
    device = resolve_device(cfg.train.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # float32 weights, TF32 matmuls
    seed_everything(cfg.train.seed)
    show = cfg.train.progress

    tokenizer = load_tokenizer(cfg.model)
    policy, ref = build_models(cfg.model, tokenizer, cfg.train.seed, device)
    disable_dropout(policy)
    disable_dropout(ref)
    problems = load_problems(cfg.data, cfg.train.seed)
    eval_problems = problems["test"][: cfg.eval.size]

    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.ppo.lr, weight_decay=cfg.ppo.weight_decay)
    scheduler = get_scheduler(cfg.ppo.lr_scheduler, optimizer, num_warmup_steps=cfg.ppo.warmup_steps,
                              num_training_steps=optimizer_steps(cfg))
    kl_ctl = KLController(cfg.kl)
    curriculum = Curriculum(cfg.data)
    start = 0
    if resume:
        state = checkpoint.load(out, device)
        policy.load_state_dict(state["policy"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        kl_ctl.load_state_dict(state["kl"])
        curriculum.load_state_dict(state["curriculum"])
        checkpoint.set_rng_state(state["rng"])
        start = state["step"]
        tqdm.write(f"resuming {out} from step {start}")
    logger = RunLogger(out, cfg, start)

    def run_eval(step: int) -> None:
        if not eval_problems:
            return
        with tqdm(total=len(eval_problems), desc=f"eval (step {step})", leave=False, disable=not show) as bar:
            _log_eval(logger, step, evaluate(policy, tokenizer, eval_problems, cfg, bar))

    def save(step: int) -> None:
        extra = {"kl": kl_ctl.state_dict(), "curriculum": curriculum.state_dict()}
        checkpoint.save(out, step, policy, optimizer, scheduler, extra)

    if start == 0:
        run_eval(0)
    minibatches_per_step = cfg.ppo.epochs * (cfg.rollout.batch_size // cfg.ppo.minibatch_size)
    steps_bar = tqdm(range(start + 1, cfg.train.steps + 1), desc="PPO steps", initial=start,
                     total=cfg.train.steps, disable=not show)
    for step in steps_bar:
        t0 = time.time()
        batch = training_batch(cfg.data, problems["train"], cfg.rollout.batch_size, cfg.train.seed, step,
                               curriculum.level)
        prompts = render_prompts(tokenizer, [p.question for p in batch], cfg.data)
        rollout = collect(policy, ref, tokenizer, prompts, cfg.rollout)
        s = rollout.sample
        texts = tokenizer.batch_decode(s.response_ids, skip_special_tokens=True)
        lengths = s.response_mask.sum(dim=-1)
        scores = [score(text, p.answer, bool(fin), int(n), cfg.reward)
                  for text, p, fin, n in zip(texts, batch, s.finished.tolist(), lengths.tolist())]
        final_rewards = torch.tensor([sc.reward for sc in scores], dtype=torch.float32, device=device)
        penalties = kl_penalties(rollout.logprobs, rollout.ref_logprobs, s.response_mask, kl_ctl.value)
        advantages, returns = impl.compute_gae_advantages(final_rewards, penalties, rollout.values, s.response_mask,
                                                          cfg.ppo.gamma, cfg.ppo.lam)
        t1 = time.time()
        minibatch_source = {
            "input_ids": rollout.input_ids, "attention_mask": rollout.attention_mask,
            "response_ids": s.response_ids, "response_mask": s.response_mask,
            "logprobs_old": rollout.logprobs, "values_old": rollout.values,
            "advantages": advantages, "returns": returns, "prompt_length": rollout.prompt_length,
        }
        generator = torch.Generator().manual_seed(cfg.train.seed * 1_000_003 + step)
        with tqdm(total=minibatches_per_step, desc="update", leave=False, disable=not show) as bar:
            update_metrics = ppo_update(impl, policy, optimizer, scheduler, minibatch_source, cfg, generator, bar)
        seq_kl = float(sequence_kl(rollout.logprobs, rollout.ref_logprobs, s.response_mask).mean())
        metrics = {
            "rollout/reward_mean": float(final_rewards.mean()),
            "rollout/reward_std": float(final_rewards.std()),
            "rollout/correct_rate": float(np.mean([sc.correct for sc in scores])),
            "rollout/format_rate": float(np.mean([sc.formatted for sc in scores])),
            "rollout/reasoning_rate": float(np.mean([sc.reasoning for sc in scores])),
            "rollout/response_length": float(lengths.float().mean()),
            "rollout/truncated_rate": float(1.0 - s.finished.float().mean()),
            "rollout/kl": seq_kl,
            "rollout/kl_coeff": kl_ctl.value,
            "rollout/value_mean": float(rollout.values[s.response_mask].mean()),
            **update_metrics,
            "time/rollout": t1 - t0,
            "time/update": time.time() - t1,
        }
        kl_ctl.update(seq_kl, cfg.rollout.batch_size)
        if cfg.data.task == "synthetic":
            metrics["rollout/max_operand"] = curriculum.level
            curriculum.update(metrics["rollout/correct_rate"])
        logger.log(step, metrics)
        steps_bar.set_postfix(reward=f"{metrics['rollout/reward_mean']:.3f}",
                              correct=f"{metrics['rollout/correct_rate']:.2f}",
                              len=f"{metrics['rollout/response_length']:.0f}")
        if cfg.train.num_samples and cfg.train.sample_every and (step == 1 or step % cfg.train.sample_every == 0):
            samples = [{"question": p.question, "response": text, "reference": p.answer, "reward": sc.reward}
                       for p, text, sc in list(zip(batch, texts, scores))[: cfg.train.num_samples]]
            logger.samples(step, samples)
            for smp in samples:
                tqdm.write(f"[step {step}] Q: {smp['question']!r}\n           A: {smp['response']!r} "
                           f"(reward {smp['reward']:.2f}, reference {smp['reference']})")
        if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.train.steps:
            run_eval(step)
        if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
            save(step)
        if on_step is not None:
            on_step(step, metrics)
    steps_bar.close()

    if start < cfg.train.steps:
        run_eval(cfg.train.steps)
        save(cfg.train.steps)
    logger.close()
    plot_run(out)
    record_run(out, command, resume, seconds=time.time() - started)
    return RunResult(out, read_jsonl(out / METRICS), read_jsonl(out / EVALS), time.time() - started,
                     read_jsonl(out / "samples.jsonl"))
