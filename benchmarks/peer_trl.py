"""The peer, side by side: TRL's GRPOTrainer on this project's model, prompts and reward.

Runs ``trl.GRPOTrainer`` for ``--generations`` generation batches on what a PPO config names
(the model as ``ppo-train`` loads it, the training problems rendered with the config's prompt
template, ``assignment.trainer.reward.score`` as the reward), with the same sample budget as one
PPO step of that config: ``rollout.batch_size`` completions of at most ``rollout.max_new_tokens``
tokens per generation batch, cut into optimizer steps of ``ppo.minibatch_size *
ppo.grad_accum_steps`` completions (one epoch), lr ``ppo.lr``. GRPO needs groups, so the batch is
``batch_size / --group-size`` prompts x ``--group-size`` completions where PPO has one per prompt.

What it prints and writes (``--out``, JSON): seconds per generation batch (the first apart: it
loads kernels and warms the allocator), real completion tokens per second, the peak GPU memory
of torch's allocator, and the mean reward of every batch; with ``--ppo-metrics RUN/metrics.jsonl``
it adds the PPO run's reward over the same number of samples (its first N steps) beside TRL's.

    python benchmarks/peer_trl.py --config configs/gsm8k_qwen_coder.yaml --generations 8 --out peer.json

TRL settings left at its defaults, and recorded in the output: the loss (``loss_type``), reward
scaling per group, generation by ``model.generate`` with the dynamic cache under bf16 autocast.
Needs the ``peer`` extra (``pip install -e '.[peer]'``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assignment.trainer.config import Config, load_config  # noqa: E402
from assignment.trainer.data import load_problems  # noqa: E402
from assignment.trainer.loading import load_lm, load_tokenizer  # noqa: E402
from assignment.trainer.reward import score  # noqa: E402
from assignment.trainer.rollout import eos_token_ids  # noqa: E402


class BatchLog:
    """What the reward function sees of each generation batch: when, how many tokens, the rewards.

    TRL calls the reward function once per generation batch, after generating it, so the gaps
    between calls are the seconds per batch (generation, scoring and its optimizer steps)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.tokens: list[int] = []
        self.rewards: list[float] = []


def reward_function(cfg: Config, eos_ids: set[int], log: BatchLog):
    """A TRL reward function scoring each completion as ``ppo-train`` does (answer format, reward)."""

    def reward(prompts: list, completions: list, completion_ids: list[list[int]], answer: list[str],
               **_: Any) -> list[float]:
        rewards = []
        for completion, ids, reference in zip(completions, completion_ids, answer):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            finished = bool(ids) and ids[-1] in eos_ids
            rewards.append(score(text, reference, finished, len(ids), cfg.reward).reward)
        log.times.append(time.perf_counter())
        log.tokens.append(sum(len(ids) for ids in completion_ids))
        log.rewards.append(sum(rewards) / len(rewards))
        return rewards

    reward.__name__ = "gsm8k_reward"  # TRL names its reward metrics after the function
    return reward


def trl_args(cfg: Config, group_size: int, generations: int, out_dir: str, cpu: bool):
    """The GRPOConfig matching the PPO config's sample budget (module docstring)."""
    from trl import GRPOConfig

    micro = cfg.ppo.minibatch_size
    per_generation = cfg.rollout.batch_size // micro  # micro-batches of one generation batch
    optimizer_steps = per_generation // cfg.ppo.grad_accum_steps
    return GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=micro, gradient_accumulation_steps=cfg.ppo.grad_accum_steps,
        steps_per_generation=per_generation, num_generations=group_size, num_iterations=cfg.ppo.epochs,
        max_completion_length=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k, learning_rate=cfg.ppo.lr,
        lr_scheduler_type=cfg.ppo.lr_scheduler, warmup_steps=cfg.ppo.warmup_steps, max_grad_norm=cfg.ppo.max_grad_norm,
        beta=cfg.kl.coeff, gradient_checkpointing=cfg.model.gradient_checkpointing,
        max_steps=generations * optimizer_steps * cfg.ppo.epochs, bf16=not cpu, use_cpu=cpu, logging_steps=1,
        save_strategy="no", report_to="none", seed=cfg.train.seed, disable_tqdm=True)


def run(cfg: Config, group_size: int, generations: int, cpu: bool) -> dict[str, Any]:
    """Train TRL's GRPO for ``generations`` generation batches; the figures of the module docstring."""
    import trl.trainer.grpo_trainer as grpo_module
    from datasets import Dataset
    from trl import GRPOTrainer

    if cfg.rollout.batch_size % group_size:
        raise SystemExit(f"rollout.batch_size {cfg.rollout.batch_size} is not a multiple of --group-size {group_size}")
    tokenizer = load_tokenizer(cfg.model)
    # TRL loads its policy and reference by path; a GGUF file would load marked as quantized, which
    # transformers' Trainer refuses to train. Hand it the trainer's own loader (flags cleared).
    grpo_module.create_model_from_path = lambda *args, **kwargs: load_lm(cfg.model, tokenizer, cfg.train.seed)
    problems = load_problems(cfg.data, cfg.train.seed)["train"]
    dataset = Dataset.from_list([{"prompt": [{"role": "user",
                                              "content": cfg.data.prompt_template.replace("{question}", p.question)}],
                                  "answer": p.answer} for p in problems])
    eos_ids: set[int] = set()  # filled from the loaded model below, before the first call
    log = BatchLog()
    with tempfile.TemporaryDirectory() as out_dir:
        args = trl_args(cfg, group_size, generations, out_dir, cpu)
        trainer = GRPOTrainer(model=cfg.model.name, reward_funcs=reward_function(cfg, eos_ids, log), args=args,
                              train_dataset=dataset, processing_class=tokenizer)
        eos_ids.update(eos_token_ids(trainer.model, tokenizer))
        if torch.cuda.is_available() and not cpu:
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        trainer.train()
        ended = time.perf_counter()
    # Batch k spans from the reward call of batch k-1 to that of batch k (its optimizer steps run
    # after its reward call, so each span is generation + scoring + the previous batch's update);
    # the last batch's update runs until train() returns.
    marks = [started, *log.times[1:], ended]
    seconds = [b - a for a, b in zip(marks, marks[1:])]
    steady = seconds[1:] or seconds
    return {"trl": _version("trl"), "transformers": _version("transformers"), "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() and not cpu else "cpu",
            "loss_type": args.loss_type, "scale_rewards": args.scale_rewards, "beta": args.beta,
            "completions_per_batch": args.generation_batch_size, "group_size": group_size,
            "optimizer_steps_per_batch": args.generation_batch_size // (args.per_device_train_batch_size *
                                                                         args.gradient_accumulation_steps),
            "seconds_per_batch": seconds, "median_seconds_per_batch_after_first": statistics.median(steady),
            "tokens_per_batch": log.tokens,
            "tokens_per_second_after_first": sum(log.tokens[1:] or log.tokens) / sum(steady),
            "reward_per_batch": log.rewards,
            "peak_memory_gib": (torch.cuda.max_memory_allocated() / 2**30
                                if torch.cuda.is_available() and not cpu else None)}


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def ppo_rewards(path: Path, steps: int) -> list[float]:
    """The PPO run's batch-mean reward of its first ``steps`` steps (same completions per step)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row["rollout/reward_mean"] for row in rows[:steps]]


def table(result: dict[str, Any], ppo: list[float] | None) -> str:
    """The figures as Markdown rows."""
    rewards = result["reward_per_batch"]
    rows = [f"| seconds per batch of {result['completions_per_batch']} completions (median after the first) | "
            f"{result['median_seconds_per_batch_after_first']:.1f} |",
            f"| real completion tokens per second (after the first batch) | {result['tokens_per_second_after_first']:.0f} |",
            f"| peak GPU memory (torch allocator) | "
            + (f"{result['peak_memory_gib']:.1f} GiB |" if result["peak_memory_gib"] is not None else "n/a |"),
            f"| mean reward over its {len(rewards)} batches | {sum(rewards) / len(rewards):.3f} |"]
    if ppo:
        rows.append(f"| PPO (this trainer), mean reward over its first {len(ppo)} steps | {sum(ppo) / len(ppo):.3f} |")
    return "\n".join(["| figure | TRL GRPOTrainer |", "|---|---|", *rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "gsm8k_qwen_coder.yaml")
    parser.add_argument("--group-size", type=int, default=4, help="completions per prompt (GRPO's group)")
    parser.add_argument("--generations", type=int, default=8, help="generation batches to train on")
    parser.add_argument("--ppo-metrics", type=Path, help="a PPO run's metrics.jsonl, for the reward beside TRL's")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (a smoke test)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args(argv)
    try:
        import trl  # noqa: F401
    except ImportError:
        raise SystemExit("benchmarks/peer_trl.py needs TRL: pip install -e '.[peer]'") from None
    cfg = load_config(args.config, args.overrides)
    result = run(cfg, args.group_size, args.generations, args.cpu)
    ppo = ppo_rewards(args.ppo_metrics, args.generations) if args.ppo_metrics else None
    result["ppo_reward_per_step"] = ppo
    text = table(result, ppo)
    print(f"TRL {result['trl']} GRPOTrainer on {result['device']}, loss_type {result['loss_type']}, "
          f"{result['completions_per_batch']} completions per batch ({result['group_size']} per prompt)\n{text}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
