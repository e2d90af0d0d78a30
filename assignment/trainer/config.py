"""Typed configuration of the PPO trainer: one source of defaults, YAML on top, dotlist last.

The dataclasses below are the only place a default lives; each field says what it means. A
config file in ``configs/`` overrides some of them (and says why), and ``key=value`` overrides
from the command line go last (OmegaConf dotlist syntax). The defaults are the CPU synthetic
task (``configs/cpu_synthetic.yaml``): a tiny random Llama that learns two-operand sums in a
couple of minutes with no download, which is also what the autograder's learning check trains.

``load_config`` returns frozen dataclasses: the config is never mutated after loading
(as in CleanRL and nanoGPT). Unknown keys are refused with the closest valid key (difflib), and bad values
with a message that names the field.

References: CleanRL's documented dataclass args; nanoGPT's commented config overrides.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A config problem the user can fix; the CLI prints the message without a traceback."""


@dataclass(frozen=True)
class ModelConfig:
    # "synthetic" builds assignment.model.tiny_llama over the synthetic tokenizer; anything else
    # is a Hugging Face hub id or a local folder for AutoModelForCausalLM.from_pretrained.
    name: str = "synthetic"
    # A GGUF file inside the folder ``name`` (transformers dequantizes it; needs the gguf package).
    gguf_file: Optional[str] = None
    # Tokenizer source when it differs from the model (None: the model's own; "synthetic": the
    # synthetic task's).
    tokenizer: Optional[str] = None
    # Build the LM from ``name``'s config.json alone (a folder or hub id), with random weights
    # drawn by transformers' own initialisation from train.seed: a real model's shape without its
    # weights, for measuring what training it takes (configs/fsdp_qwen7b_shape.yaml). No learning
    # claim can rest on it.
    random_init: bool = False
    # float32 | bfloat16 | float16. The value head always stays float32 (assignment/model.py).
    dtype: str = "float32"
    # Trade compute for memory in the update's forward/backward.
    gradient_checkpointing: bool = False
    # null: the policy trains in model.dtype. bfloat16 | float16 (with model.dtype float32): 16-bit
    # training with float32 master weights (assignment/trainer/precision.py): a 16-bit copy of the
    # policy runs the rollout's scoring forwards and exercise 5's forwards and backwards, on the tensor
    # cores' 16-bit rate; the optimizer steps the float32 weights and keeps its state for them.
    # float16 (T4, V100: no bfloat16) with dynamic loss scaling. One process only (no DDP or FSDP).
    # Evaluation still decodes with the float32 weights.
    train_dtype: Optional[str] = None
    # The frozen reference's dtype (null: model.dtype). bfloat16 halves its memory (1 GB less for a
    # 0.5B model); its log-probs, and so the k1 penalty, then carry bfloat16 rounding
    # (measured for the Qwen recipe: a spread of ~0.3 nats per response). float16 on cards without
    # bfloat16 (T4, V100).
    reference_dtype: Optional[str] = None
    # CUDA only: compile each decoder layer's attention, MLP and norms of the policy and of the
    # reference (torch.compile, dynamic shapes; assignment.trainer.loading.compile_layers), for the
    # update's and the scoring forwards. Small minibatches wait for the host in eager mode: a
    # minibatch of 2 rows of Qwen2.5-0.5B took 166 ms of CPU time for ~40 ms of GPU time (H100).
    # Evaluation and sampling from the policy itself stay eager. Not under FSDP.
    compile: bool = False
    # What model.compile compiles as one function: "part" (each decoder layer's attention, MLP and
    # norms: 4 compiled calls a layer) or "layer" (the whole decoder layer: 1 call, fewer guards and
    # wrappers for the host to run). Measured on an H200 in bfloat16 (4-step benchmarks, one each):
    # the 24 GB profile's update 8.86 s by layer against 8.54 by part, the 16 GB one's 13.69 against
    # 16.76. "part" is what every shipped run was made with.
    compile_scope: str = "part"
    # Release the frozen reference's and the sampler's GPU memory after each rollout and give it
    # back before the next (assignment.trainer.offload): the update, where the step's peak lies,
    # runs without them (for Qwen2.5-0.5B in bfloat16, 1.2 GB each). The same numbers either way;
    # costs a copy of the reference from host memory each step. Not under FSDP.
    offload_frozen: bool = False
    # Size of the synthetic model (ignored for real models). 128 rather than 64: the wider
    # random features tell the operands apart sooner (measured: 40% vs 27% accuracy at 400 steps).
    hidden_size: int = 128
    num_layers: int = 2


@dataclass(frozen=True)
class DataConfig:
    # "synthetic" (generated arithmetic, see assignment/trainer/synthetic.py) or "gsm8k".
    task: str = "synthetic"
    # GSM8K from the hub: dataset id and config name...
    hub_id: str = "openai/gsm8k"
    hub_config: str = "main"
    # ...or from a folder holding OpenAI's train.jsonl / test.jsonl (takes precedence when set).
    local_dir: Optional[str] = None
    # Use at most this many training problems (None: all).
    max_train: Optional[int] = None
    # System message for chat templates (None: the template's own default).
    system_prompt: Optional[str] = None
    # The user message; {question} is replaced by the problem text (other braces stay as they
    # are, so a template may ask for \boxed{} without escaping).
    prompt_template: str = "{question}"
    # Synthetic task: operands are drawn from [0, max_operand], operators from ``operators``.
    # Training problems are generated afresh every step; the test set is a fixed sample.
    max_operand: int = 4
    operators: str = "+"
    synthetic_test_size: int = 200
    # Curriculum (synthetic task only; ignored for GSM8K): training operands start in
    # [0, curriculum_start] and the range widens by one each time the rollout correct rate,
    # averaged over the last ``curriculum_window`` steps, reaches ``curriculum_threshold``
    # (None: no curriculum). Why: without it the random-init policy collapses onto the most
    # frequent sum (always '4': 22% accuracy) before it learns to read the operands; on a few
    # problems it learns to read them, then widens. 0.6 rather than 0.8 because sampled
    # (temperature 1) correctness lags greedy and a high bar stalls the widening.
    curriculum_start: Optional[int] = 1
    curriculum_threshold: float = 0.6
    curriculum_window: int = 5


@dataclass(frozen=True)
class RewardConfig:
    # Where the answer is read (assignment/trainer/reward.py): last_of_both, the last
    # '#### <number>' or '\boxed{<number>}' of the response; strict, '#### <number>' only.
    # Greedy evaluation reads answers the same way.
    answer_format: str = "last_of_both"
    # Reward of a response whose answer equals the reference answer.
    correct: float = 1.0
    # Bonus for a well-formed answer, paid only under ``format_bonus_when``.
    format_bonus: float = 0.1
    # always: any well-formed answer (the measured pitfall on GSM8K: PPO learns to skip the
    #   reasoning and answer '#### 5' at once); reasoning: only after >= min_reasoning_words
    #   words of work before the answer; correct: only when the answer is right.
    format_bonus_when: str = "always"
    min_reasoning_words: int = 0
    # Added when the response hits max_new_tokens without an EOS (negative discourages rambling).
    truncation_reward: float = 0.0
    # Per response token, added to the reward (negative: a length penalty; 0 disables).
    per_token_reward: float = 0.0
    # What the ``correct`` term pays for (assignment/trainer/reward.py): correct, a right answer
    # (the task). The two controls, to tell what training on the task taught from what any
    # training would: random, a coin of probability ``random_p`` per response, drawn from
    # (train.seed, the step, the response's index in the batch) alone, so it says nothing about
    # the response; format, any response with an answer (answer_format), whatever its value. Only
    # that term changes: the other terms above pay as configured under every kind, so a control
    # run differs from its base run in that one term. Greedy evaluation always scores the true
    # answer, whatever the kind.
    kind: str = "correct"
    # The random control's probability of paying ``correct``. 0.2: about the base model's own
    # sampled correct rate under the GSM8K recipe (0.19-0.23 over the first 10 steps of each
    # measured Qwen run, 0.14-0.20 at step 1), so the control pays about as often as the task did
    # at the start.
    random_p: float = 0.2


@dataclass(frozen=True)
class RolloutConfig:
    # Responses sampled per PPO step: one per prompt for PPO, group_size per prompt for GRPO.
    batch_size: int = 64
    # Responses per prompt (GRPO and Dr. GRPO: the group whose mean reward is the baseline,
    # exercise 6; batch_size / group_size prompts per step). PPO samples one: it must be 1 there.
    group_size: int = 1
    # Prompts longer than this (in tokens) are truncated on the left.
    max_prompt_tokens: int = 256
    # The synthetic answer needs three tokens ('####', a digit, EOS); a short budget leaves
    # less room for junk tokens that blur the credit assignment.
    max_new_tokens: int = 4
    # Sampling temperature; the update divides logits by the same value (the contract, handout.md section 4, exercise 5).
    temperature: float = 1.0
    # Nucleus and top-k sampling (1.0 / 0 disable them).
    top_p: float = 1.0
    top_k: int = 0
    # Forward passes over the rollout run in chunks of this many sequences (memory bound).
    forward_batch_size: int = 64
    # The scoring forwards (logprobs_old, the reference's log-probs) apply the LM head to at most
    # this many response tokens at a time, so that no (rows x tokens x vocabulary) logits tensor
    # outlives one chunk: ~3 x logits_chunk_tokens x V x 4 bytes at once (2048 tokens of Qwen's
    # 151,936: 3.7 GB). null: the LM head runs on each chunk of forward_batch_size rows whole.
    logits_chunk_tokens: Optional[int] = None
    # KV cache of the rollout's ``generate``: null, transformers' default dynamic cache; "static",
    # a preallocated cache (GenerationConfig.cache_implementation). Off by default. Evaluation
    # always decodes eagerly with the dynamic cache (assignment/trainer/evaluate.py says why).
    cache_implementation: Optional[str] = None
    # With the static cache on CUDA: let transformers compile the decoding step (torch.compile,
    # CUDA graphs). Prompts are then left-padded to max_prompt_tokens for generation, so that the
    # cache has one shape per batch size: rollouts compile once per run, not once per step.
    # Nothing compiles on CPU.
    compile: bool = False
    # "bfloat16" (or "float16"): sample the training responses from a copy of the policy's LM
    # with its weights in that dtype, refreshed from the policy before every rollout (verl and
    # OpenRLHF sample from a separate low-precision engine too). logprobs_old still come from the
    # policy's own forward, so the first minibatch's ratio stays exactly 1; the sampler differs
    # from that policy by the rounding of its weights. null: sample from the policy itself.
    # Evaluation always uses the policy.
    generation_dtype: Optional[str] = None


@dataclass(frozen=True)
class PPOConfig:
    # 2 epochs of 2 minibatches: on CPU the update dominates a step, and more reuse did not
    # learn faster per second (4 epochs: 67.5% vs 64.5% accuracy at 400 steps, 1.6x the time).
    epochs: int = 2
    minibatch_size: int = 32
    # adamw: torch's AdamW, float32 state (8 bytes a parameter). adamw_8bit: bitsandbytes'
    # AdamW8bit (the `lowmem` extra), block-wise 8-bit state (2 bytes a parameter), with the
    # embeddings kept at 32-bit state as transformers' Trainer keeps them (adamw_bnb_8bit).
    optimizer: str = "adamw"
    # Minibatches per optimizer step; (batch_size / minibatch_size) must be a multiple of it.
    grad_accum_steps: int = 1
    # Rows of each exercise-5 call on each process. null: calls of minibatch_size rows, as on one
    # GPU (grad_accum_steps / N of them per optimizer step on N processes), or, when N does not
    # divide grad_accum_steps, grad_accum_steps calls of minibatch_size / N rows. A launch-time
    # choice that keeps the optimizer steps: each still takes the same minibatch_size x
    # grad_accum_steps shuffled responses, 1/N of them from each of N processes; each process cuts
    # its share into calls of this many rows and exercise 5 divides by that many calls (its
    # cfg.grad_accum_steps). E.g. 4 processes, minibatch 16 x accum 4: by default each process's
    # 16 rows of a step as 1 call of 16; set 4 for 4 calls of 4 (a quarter of the activations).
    # What changes: each call's token mean covers that many rows (tokens of longer responses weigh
    # as in one minibatch of that size), a call needs the memory of that many rows, and the early
    # stop (target_kl) is checked after each call. Must divide minibatch_size x grad_accum_steps / N.
    process_minibatch_size: Optional[int] = None
    clip_ratio: float = 0.2
    clip_range_value: float = 0.2
    vf_coeff: float = 0.5
    # The synthetic policy starts uniform and collapses within ~20 steps without a bonus.
    entropy_coeff: float = 0.02
    max_grad_norm: float = 1.0
    # gamma = lam = 1 (Monte Carlo returns) for a single terminal reward, as verl's GSM8K
    # examples: the critic starts at zero and knows nothing, so bootstrapping from it only adds
    # bias. Measured on Qwen2.5-Coder-0.5B: a run with lam 0.95 (and a format bonus) lost
    # accuracy (25.0% -> 16.2% in 36 steps), one with lam 1.0 (no bonus, lr 2e-6) gained.
    gamma: float = 1.0
    lam: float = 1.0
    # For the tiny random-init model: at 400 steps, 5e-4 reaches 75% / 92% / 49% greedy accuracy
    # on seeds 0 / 1 / 2 with these defaults (the CPU demo, at temperature 0.8 with gradient
    # accumulation: 69.5% / 78% / 57%, reports/cpu_synthetic_metrics/). In an earlier trainer's sweep 5e-4
    # reached 91% / 97% / 47%, 1e-3 65% / 27% / 22%, and 2e-3 collapsed onto one answer. Real
    # models want ~1e-6 (see configs/).
    lr: float = 5e-4
    # The value head's own learning rate (null: ppo.lr). The head is a zero-initialised linear
    # layer on the LM's last hidden state: at a real model's lr it learns slowly (measured on
    # Qwen2.5-Coder-0.5B at 2e-6: its mean took the whole 48-step run to reach the mean reward,
    # and over the last 10 steps the value loss was 92% of 0.5 var(reward); configs/gsm8k_qwen_coder.yaml).
    value_head_lr: Optional[float] = None
    weight_decay: float = 0.0
    # Any name transformers.get_scheduler knows: constant, constant_with_warmup, linear, cosine, ...
    lr_scheduler: str = "constant_with_warmup"
    warmup_steps: int = 0
    # Early stop of a PPO step's update (the Stable-Baselines3 / CleanRL convention): once a
    # minibatch reports approx_kl > 1.5 * target_kl, the remaining minibatches and epochs of
    # this step are skipped and an unfinished accumulation cycle is discarded (null: never).
    target_kl: Optional[float] = None
    # Skip the whole update of a step whose final rewards have a sample std below this (0: never).
    # Whitening turns one rewarded sample in 64 into advantages of ~8 on its tokens (see
    # ppo.guard_advantages), and a batch with no reward spread into whitened noise.
    min_reward_std: float = 0.0
    # Clip the whitened advantages to [-advantage_clip, advantage_clip] (null: no clip).
    advantage_clip: Optional[float] = None
    # Cut each optimizer step's rows (the same shuffled minibatch_size x grad_accum_steps rows)
    # into minibatches in order of response length, so that each minibatch pads to a length
    # close to its own rows'. Each minibatch's gradient is then weighted by its share of the
    # optimizer step's real tokens, so that the step follows the token mean over all its rows,
    # whatever the grouping (off: each minibatch's token mean counts 1 / grad_accum_steps, as the
    # contract's exercise 5 divides it). Under DDP, over each process's rows, whose gradients DDP
    # averages as without grouping. PPO only, and not under FSDP. Measured on the Qwen config
    # (H100): the update's columns 30% padding without it, 16% with; its time 6.25 -> 5.23 s.
    length_grouping: bool = False


@dataclass(frozen=True)
class KLConfig:
    # Initial coefficient of the k1 penalty kl_coeff * (logprobs_old - ref_logprobs) per token.
    coeff: float = 0.0
    # Ziegler et al. (2019) adaptive controller: steer the mean per-sequence KL to the reference
    # (``rollout/kl``, nats) towards ``target``. After each step the coefficient is multiplied by
    # 1 + clip(kl / target - 1, -0.2, 0.2) * batch_size / horizon (as TRL and OpenRLHF), so one
    # step moves it by at most 0.2 * batch_size / horizon: pick the horizon for the run's length.
    adaptive: bool = False
    # The KL budget (nats/sequence): what the adaptive controller steers towards; with a fixed
    # coefficient, what the run's report checks the last steps' KL against.
    target: float = 6.0
    horizon: int = 10000


@dataclass(frozen=True)
class EvalConfig:
    # Greedy accuracy (the reward's answer extraction) on the first ``size`` test problems:
    # before training, every ``every`` PPO steps (0: never in between) and at the end. Each
    # batch's records are written as it finishes, so an evaluation cut by train.time_limit_s
    # continues on --resume where it stopped.
    size: int = 200
    every: int = 0
    batch_size: int = 64
    # null: decode with the policy's own weights (float32 in every config here). "sampler": with
    # rollout.generation_dtype's 16-bit copy, refreshed from the policy first (eager, dynamic cache
    # as always): on a card whose float32 rate is low (T4, V100: 1/8 of float16's) the float32
    # evaluations are a large share of a run. Its accuracies differ from float32 decoding by the
    # copy's rounding, so a run's evaluations before and after are comparable with each other, not
    # with float32-evaluated runs.
    model: Optional[str] = None


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 400
    seed: int = 0
    # cpu | cuda | cuda:N | auto (cuda when available).
    device: str = "auto"
    # Cap on the GPU memory torch's allocator may hold, GiB (null: the whole card), through
    # torch.cuda.set_per_process_memory_fraction: on a larger card, a run fails where it would fail
    # on a card of this size (the CUDA context, ~0.5 GiB, comes on top). Recorded in run.json.
    max_gpu_memory_gib: Optional[float] = None
    # The GPU memory this config needs, GiB (null: not stated): a card with less stops at start,
    # before the model loads, with a message naming the profile that fits it
    # (assignment/trainer/cards.py). A config with max_gpu_memory_gib needs that much instead.
    min_gpu_memory_gib: Optional[float] = None
    # Run directory: metrics, TensorBoard, checkpoints, effective config, reward curve.
    output_dir: str = "runs/cpu_synthetic"
    # Save a checkpoint every this many steps (0: only at the end); only the latest is kept.
    checkpoint_every: int = 0
    # Save one after the last step (false: none there, a periodic one due there included). It holds
    # the float32 weights and the AdamW state: 7.5 GB and about a minute at the end of each run of
    # the Qwen recipe on an H100. Without it, a finished run cannot be continued past its end with
    # --resume (a periodic checkpoint, if any, resumes exactly from its own step and redoes the
    # later ones), a crash in the final evaluation loses the training since the last checkpoint,
    # and the trained weights are not kept. A stop by time_limit_s saves one all the same.
    final_checkpoint: bool = True
    # Stop cleanly once this many seconds have passed since the trainer started (model loading
    # included): after the PPO step or evaluation batch that crosses it, save a checkpoint, print
    # how to resume, and return with status "time_limit" (the CLI exits 0). Null: no limit. For
    # device calls with a hard limit: leave room for one step or eval batch and a checkpoint.
    time_limit_s: Optional[float] = None
    # Print and log this many sample generations every ``sample_every`` steps.
    sample_every: int = 25
    num_samples: int = 2
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "ppo-llm-course"
    # Show tqdm progress bars.
    progress: bool = True
    # Print one line of the main metrics every this many PPO steps, and one per evaluation batch
    # (0: never): for logs without a terminal, where progress bars are noise.
    log_every: int = 0
    # torch CPU threads during the run (None: torch's default, one per core). A tiny model
    # runs fastest on one thread: more threads only add synchronisation, and on a busy
    # machine they spin (measured: the learning check takes 64 s on 1 thread, >8 min on 2
    # while other jobs ran).
    cpu_threads: Optional[int] = None


ALGORITHMS = ("ppo", "grpo", "dr_grpo")
REWARD_KINDS = ("correct", "random", "format")
ALGORITHM_NAMES = {"ppo": "PPO", "grpo": "GRPO", "dr_grpo": "Dr. GRPO"}  # as people write them
OPTIMIZERS = ("adamw", "adamw_8bit")


@dataclass(frozen=True)
class Config:
    # ppo: Part I (critic, GAE, k1 KL in the reward). grpo / dr_grpo: Part II (group baseline of
    # exercise 6, no critic, exercise 7's aggregation, k3 KL of exercise 8 in the loss at
    # kl.coeff); see assignment/trainer/grpo.py and handout.md section 8.
    algorithm: str = "ppo"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    kl: KLConfig = field(default_factory=KLConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def _valid_keys(node: Any = None, prefix: str = "") -> list[str]:
    """Every dotted key of the config tree, e.g. ``ppo.lr``."""
    node = Config() if node is None else node
    keys = []
    for f in dataclasses.fields(node):
        keys.append(prefix + f.name)
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            keys.extend(_valid_keys(value, prefix + f.name + "."))
    return keys


def _check_keys(tree: Any, source: str, prefix: str = "") -> None:
    """Refuse a key the schema lacks, naming the closest valid one."""
    if not isinstance(tree, (dict, DictConfig)):
        return
    valid = _valid_keys()
    for key in tree.keys():
        dotted = prefix + str(key)
        if dotted not in valid:
            close = difflib.get_close_matches(dotted, valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown config key '{dotted}' in {source}{hint}")
        _check_keys(tree[key], source, dotted + ".")


def _validate(cfg: Config) -> None:
    """Refuse values the trainer cannot run with, naming the field."""
    problems = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            problems.append(message)

    rollout, ppo, data = cfg.rollout, cfg.ppo, cfg.data
    need(not cfg.model.random_init or (cfg.model.name != "synthetic" and cfg.model.gguf_file is None),
         "model.random_init builds model.name's config.json with random weights: not for synthetic or a GGUF file")
    need(cfg.model.dtype in ("float32", "bfloat16", "float16"), f"model.dtype must be float32, bfloat16 or float16, got '{cfg.model.dtype}'")
    need(cfg.model.compile_scope in ("part", "layer"),
         f"model.compile_scope must be part or layer, got '{cfg.model.compile_scope}'")
    need(cfg.model.train_dtype in (None, "bfloat16", "float16"),
         f"model.train_dtype must be null, bfloat16 or float16, got '{cfg.model.train_dtype}'")
    need(cfg.model.train_dtype is None or cfg.model.dtype == "float32",
         f"model.train_dtype keeps float32 master weights: it needs model.dtype=float32, got '{cfg.model.dtype}'")
    need(data.task in ("synthetic", "gsm8k"), f"data.task must be 'synthetic' or 'gsm8k', got '{data.task}'")
    need("{question}" in data.prompt_template, "data.prompt_template must contain '{question}'")
    need(data.max_operand >= 1, "data.max_operand must be >= 1")
    need(data.curriculum_start is None or 0 <= data.curriculum_start <= data.max_operand,
         "data.curriculum_start must be null or in [0, data.max_operand]")
    need(0 < data.curriculum_threshold <= 1 and data.curriculum_window >= 1,
         "data.curriculum_threshold must be in (0, 1] and data.curriculum_window >= 1")
    need(bool(data.operators) and set(data.operators) <= set("+-"), "data.operators may only hold '+' and '-'")
    need(cfg.reward.format_bonus_when in ("always", "reasoning", "correct"),
         f"reward.format_bonus_when must be always, reasoning or correct, got '{cfg.reward.format_bonus_when}'")
    need(cfg.reward.min_reasoning_words >= 0, "reward.min_reasoning_words must be >= 0")
    need(cfg.reward.answer_format in ("last_of_both", "strict"),
         f"reward.answer_format must be last_of_both or strict, got '{cfg.reward.answer_format}'")
    need(cfg.reward.kind in REWARD_KINDS,
         f"reward.kind must be one of {', '.join(REWARD_KINDS)}, got '{cfg.reward.kind}'")
    need(0 <= cfg.reward.random_p <= 1, f"reward.random_p must be in [0, 1], got {cfg.reward.random_p}")
    # A bonus paid only for a right answer would hand a control the very signal it removes.
    need(cfg.reward.kind == "correct" or cfg.reward.format_bonus == 0 or cfg.reward.format_bonus_when != "correct",
         f"reward.kind {cfg.reward.kind} is a control: reward.format_bonus_when=correct would pay for the right "
         "answer; use always or reasoning, or reward.format_bonus=0")
    need(rollout.cache_implementation in (None, "dynamic", "static"),
         f"rollout.cache_implementation must be null, dynamic or static, got '{rollout.cache_implementation}'")
    need(not rollout.compile or rollout.cache_implementation == "static",
         "rollout.compile needs rollout.cache_implementation=static (transformers compiles only a static cache)")
    need(rollout.generation_dtype in (None, "bfloat16", "float16") and rollout.generation_dtype != cfg.model.dtype,
         f"rollout.generation_dtype must be null, or bfloat16 or float16 other than model.dtype, "
         f"got '{rollout.generation_dtype}'")
    need(cfg.algorithm in ALGORITHMS, f"algorithm must be ppo, grpo or dr_grpo, got '{cfg.algorithm}'")
    if cfg.algorithm == "ppo":
        need(rollout.group_size == 1, f"rollout.group_size must be 1 for algorithm ppo (one response per prompt), "
                                      f"got {rollout.group_size}")
    else:
        # a group of one is its own baseline: advantage 0, nothing to learn from
        need(rollout.group_size >= 2, f"rollout.group_size must be >= 2 for algorithm {cfg.algorithm}, "
                                      f"got {rollout.group_size}")
        need(rollout.group_size >= 1 and rollout.batch_size % rollout.group_size == 0,
             f"rollout.group_size ({rollout.group_size}) must divide rollout.batch_size ({rollout.batch_size})")
    need(rollout.batch_size >= 2, "rollout.batch_size must be >= 2 (advantages are whitened over the batch)")
    need(rollout.max_new_tokens >= 1 and rollout.max_prompt_tokens >= 1, "rollout.max_new_tokens and rollout.max_prompt_tokens must be >= 1")
    need(rollout.temperature > 0, f"rollout.temperature must be > 0, got {rollout.temperature}")
    need(0 < rollout.top_p <= 1, f"rollout.top_p must be in (0, 1], got {rollout.top_p}")
    need(rollout.top_k >= 0, f"rollout.top_k must be >= 0, got {rollout.top_k}")
    need(rollout.forward_batch_size >= 1, "rollout.forward_batch_size must be >= 1")
    need(rollout.logits_chunk_tokens is None or rollout.logits_chunk_tokens >= 1,
         "rollout.logits_chunk_tokens must be null or >= 1")
    need(cfg.model.reference_dtype in (None, "float32", "bfloat16", "float16"),
         f"model.reference_dtype must be null, float32, bfloat16 or float16, got '{cfg.model.reference_dtype}'")
    need(ppo.optimizer in OPTIMIZERS, f"ppo.optimizer must be {' or '.join(OPTIMIZERS)}, got '{ppo.optimizer}'")
    need(cfg.train.max_gpu_memory_gib is None or cfg.train.max_gpu_memory_gib > 0,
         "train.max_gpu_memory_gib must be null or > 0")
    need(cfg.train.min_gpu_memory_gib is None or cfg.train.min_gpu_memory_gib > 0,
         "train.min_gpu_memory_gib must be null or > 0")
    need(ppo.epochs >= 1, "ppo.epochs must be >= 1")
    need(ppo.minibatch_size >= 1 and rollout.batch_size % ppo.minibatch_size == 0,
         f"ppo.minibatch_size ({ppo.minibatch_size}) must divide rollout.batch_size ({rollout.batch_size})")
    need(ppo.grad_accum_steps >= 1 and ppo.minibatch_size >= 1 and (rollout.batch_size // ppo.minibatch_size) % ppo.grad_accum_steps == 0,
         f"ppo.grad_accum_steps ({ppo.grad_accum_steps}) must divide the number of minibatches per epoch "
         f"(rollout.batch_size / ppo.minibatch_size = {rollout.batch_size // max(ppo.minibatch_size, 1)})")
    step_rows = ppo.minibatch_size * ppo.grad_accum_steps
    need(ppo.process_minibatch_size is None or (ppo.process_minibatch_size >= 1 and step_rows % ppo.process_minibatch_size == 0),
         f"ppo.process_minibatch_size ({ppo.process_minibatch_size}) must be null or divide the rows of an optimizer "
         f"step (ppo.minibatch_size x ppo.grad_accum_steps = {step_rows})")
    need(ppo.lr > 0, f"ppo.lr must be > 0, got {ppo.lr}")
    need(ppo.value_head_lr is None or ppo.value_head_lr > 0, f"ppo.value_head_lr must be > 0 or null, got {ppo.value_head_lr}")
    need(ppo.clip_ratio > 0 and ppo.clip_range_value > 0, "ppo.clip_ratio and ppo.clip_range_value must be > 0")
    need(ppo.max_grad_norm > 0, "ppo.max_grad_norm must be > 0")
    need(0 <= ppo.gamma <= 1 and 0 <= ppo.lam <= 1, "ppo.gamma and ppo.lam must be in [0, 1]")
    need(ppo.vf_coeff >= 0 and ppo.weight_decay >= 0 and ppo.warmup_steps >= 0, "ppo.vf_coeff, ppo.weight_decay and ppo.warmup_steps must be >= 0")
    need(ppo.target_kl is None or ppo.target_kl > 0, "ppo.target_kl must be null or > 0")
    need(ppo.min_reward_std >= 0, "ppo.min_reward_std must be >= 0")
    need(ppo.advantage_clip is None or ppo.advantage_clip > 0, "ppo.advantage_clip must be null or > 0")
    # GRPO's and Dr. GRPO's losses are not token means over a minibatch: a token-share weight would be wrong for them.
    need(not ppo.length_grouping or cfg.algorithm == "ppo", "ppo.length_grouping is for algorithm ppo only")
    need(cfg.kl.coeff >= 0, f"kl.coeff must be >= 0, got {cfg.kl.coeff}")
    need(cfg.kl.target > 0 and cfg.kl.horizon > 0, "kl.target and kl.horizon must be > 0")
    # The controller multiplies the coefficient: from 0 it would stay 0 for ever.
    need(not cfg.kl.adaptive or cfg.kl.coeff > 0, "kl.adaptive needs kl.coeff > 0 (the controller scales it)")
    need(cfg.eval.size >= 0 and cfg.eval.every >= 0 and cfg.eval.batch_size >= 1, "eval.size and eval.every must be >= 0, eval.batch_size >= 1")
    need(cfg.eval.model in (None, "sampler"), f"eval.model must be null or sampler, got '{cfg.eval.model}'")
    need(cfg.eval.model is None or rollout.generation_dtype is not None,
         "eval.model=sampler decodes with rollout.generation_dtype's copy: set rollout.generation_dtype")
    need(cfg.train.steps >= 1, "train.steps must be >= 1")
    need(cfg.train.cpu_threads is None or cfg.train.cpu_threads >= 1, "train.cpu_threads must be null or >= 1")
    need(cfg.train.time_limit_s is None or cfg.train.time_limit_s >= 0, "train.time_limit_s must be null or >= 0")
    need(min(cfg.train.checkpoint_every, cfg.train.sample_every, cfg.train.num_samples, cfg.train.log_every) >= 0,
         "train.checkpoint_every, train.sample_every, train.num_samples and train.log_every must be >= 0")
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the YAML file at ``path`` (after the file its ``base`` key names, if any), then
    ``key=value`` overrides; validated.

    Raises ConfigError for a missing file, an unknown key (naming the closest valid one), a
    value of the wrong type, or a value out of range.
    """
    merged = OmegaConf.structured(Config)
    layers = [] if path is None else _file_layers(Path(path), ())
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
    try:
        layers.append((OmegaConf.from_dotlist(list(overrides)), "the command-line overrides"))
    except OmegaConfBaseException as err:
        raise ConfigError(f"bad override: {err}") from None
    for layer, source in layers:
        _check_keys(layer, source)
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as err:
            raise ConfigError(f"bad value in {source}: {_short(err)}") from None
    try:
        cfg = OmegaConf.to_object(merged)  # resolves ${oc.env:...} interpolations
    except OmegaConfBaseException as err:
        raise ConfigError(f"cannot resolve the config: {_short(err)}") from None
    _validate(cfg)
    return cfg


def _file_layers(path: Path, seen: tuple[Path, ...]) -> list[tuple[DictConfig, str]]:
    """The layers of a config file: those of the file its top-level ``base`` key names (a path
    relative to it, merged first), then its own. A profile (configs/gsm8k_qwen_coder_16gb.yaml)
    says only what it changes in the recipe it names, so the two cannot drift apart."""
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if path.resolve() in seen:
        raise ConfigError(f"{path} is its own base: " + " -> ".join(str(p) for p in (*seen, path.resolve())))
    try:
        layer = OmegaConf.load(path)
    except Exception as err:  # YAML syntax errors come in several exception types
        raise ConfigError(f"cannot parse {path}: {err}") from None
    if not isinstance(layer, DictConfig):
        raise ConfigError(f"{path} must hold a mapping of config sections")
    base = layer.pop("base", None)
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"{path}: base must be the path of another config file, got {base!r}")
    below = [] if base is None else _file_layers(path.parent / base, (*seen, path.resolve()))
    return below + [(layer, str(path))]


def _short(err: Exception) -> str:
    """OmegaConf's message without its multi-line 'full_key/object_type' trailer."""
    return str(err).split("\n")[0] + _key_of(err)


def _key_of(err: Exception) -> str:
    key = getattr(err, "full_key", None)
    return f" (key '{key}')" if key else ""


def to_yaml(cfg: Config) -> str:
    """The effective config, as saved beside a run and loadable by ``load_config``."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


