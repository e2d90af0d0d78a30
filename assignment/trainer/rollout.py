"""Rollout: render prompts, sample responses, and record what the PPO update needs.

Shapes: ``B`` responses, ``P`` padded prompt length, ``T`` padded response length, ``V``
vocabulary size. Prompts are left-padded to ``P`` so that every prompt's last token sits at
column ``P-1``; responses follow, right-padded to ``T`` (``assignment.trainer.batch``).

``logprobs_old`` and ``values`` come from a forward pass of the *same* ``PolicyWithValueHead``
on the full (prompt + response) sequence, cut by ``batch.response_slice`` (``[P-1 : P+T-1]``)
and divided by the sampling temperature, exactly as ``ppo_minibatch_update`` slices them
(the contract, handout.md section 4, exercise 5). So at the first minibatch of the first epoch the PPO ratio is exactly 1 (up
to float rounding), which the generation scores would not guarantee. As in TRL and verl, ``logprobs_old`` is the full
tempered softmax, without the top-k / top-p truncation that sampling applied.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation import LogitsProcessor, LogitsProcessorList
from transformers.generation import utils as generation_utils

from assignment.trainer.config import DataConfig, RolloutConfig
from assignment.helpers import logprobs_from_logits
from assignment.model import PolicyWithValueHead, position_ids_from_mask
from assignment.trainer.attention import use_grouped_decoding
from assignment.trainer.batch import response_slice, trim_padding
from assignment.trainer.loading import eager_layers


def render_prompts(tokenizer: PreTrainedTokenizerBase, questions: Sequence[str], cfg: DataConfig) -> list[str]:
    """Each question as the model's chat prompt, or as plain text if it has no chat template.

    ``{question}`` in ``cfg.prompt_template`` is replaced by the question; any other brace is
    kept as written (``str.format`` would read the ``{}`` of ``\\boxed{}`` as a field).
    """
    contents = [cfg.prompt_template.replace("{question}", q) for q in questions]
    if tokenizer.chat_template is None:
        return contents
    system = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    return [tokenizer.apply_chat_template(system + [{"role": "user", "content": c}], tokenize=False,
                                          add_generation_prompt=True) for c in contents]


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], max_tokens: int,
                   device: torch.device, fixed_length: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded token ids and attention mask, both (B, P); long prompts lose their start.
    P is the longest prompt's length, or ``max_tokens`` with ``fixed_length``."""
    # A rendered chat template already holds its special tokens (BOS included).
    add_special = tokenizer.chat_template is None
    tokenizer.truncation_side = "left"
    enc = tokenizer(list(prompts), return_tensors="pt", padding="max_length" if fixed_length else True,
                    truncation=True, max_length=max_tokens, add_special_tokens=add_special, padding_side="left")
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def is_sharded(module: torch.nn.Module) -> bool:
    """True for a module that FSDP2 shards over the processes (``Distributed.wrap`` under FSDP):
    each process holds a slice of its weights, and every call of it is a collective."""
    return isinstance(module, FSDPModule)


def eos_token_ids(lm: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every id that ends a response: the generation config's EOS id(s) and the tokenizer's."""
    ids = lm.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))


def response_mask_from_ids(response_ids: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """(B, T) bool mask of real tokens: everything up to and including the first EOS.

    A row without EOS (cut at max_new_tokens) is real throughout. Tokens after the first EOS
    are padding even when they are EOS too, as they are when the pad token is the EOS token.
    """
    is_eos = torch.isin(response_ids, torch.tensor(list(eos_ids), device=response_ids.device))  # (B, T)
    eos_before = torch.cumsum(is_eos.long(), dim=-1) - is_eos.long()  # EOS tokens strictly before t
    return eos_before == 0


class SampledLogprobs(LogitsProcessor):
    """Records, while ``generate`` decodes, the sampler's own log-probability of each token it
    samples: ``log_softmax(logits / temperature)`` at that token, from the logits of the decoding
    step itself (its KV cache, its dtype, its compiled kernels), as ``logprobs_old`` defines it (the
    full tempered softmax, before any top-k / top-p cut), as verl's rollout log-probs are.

    transformers runs processors passed to ``generate`` before its own temperature and top-k / top-p
    warpers, so each call sees the step's raw logits (B, V) in float32, and ``input_ids`` whose last
    column is the token sampled at the previous step: each call picks that token's log-prob from the
    previous call's log-softmax. The last sampled token has no call after it: ``logprobs`` picks it
    from the last log-softmax kept. Memory: the last step's (B, V) float32 log-softmax, and while a
    step computes the next, two or three such tensors (148 MiB each at B = 256 and Qwen's 151,936
    tokens). Its time per rollout was not measured apart (generation took 2.42 s of the recipe's
    rollout on an H200 with it, 2.26 s without it on another H200)."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.last: torch.Tensor | None = None  # (B, V) log-softmax of the last step's logits
        self.picked: list[torch.Tensor] = []  # (B,) per decoding step but the last

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.last is not None:
            self.picked.append(self.last.gather(-1, input_ids[:, -1:])[:, 0])
        self.last = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def logprobs(self, response_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) the log-probs of ``response_ids`` (B, T) as sampled; padding holds unspecified
        finite values. A decoding loop that ran a step past T (transformers' deferred stop check)
        left one more: cut."""
        T = response_ids.shape[1]
        picked = self.picked[:T]
        if len(picked) == T - 1:
            picked.append(self.last.gather(-1, response_ids[:, T - 1:])[:, 0])
        if len(picked) != T:
            raise RuntimeError(f"recorded {len(self.picked)} decoding steps for {T} response tokens")
        return torch.stack(picked, dim=1) if picked else response_ids.new_zeros(response_ids.shape, dtype=torch.float32)


@torch.no_grad()
def generate(lm: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, cfg: RolloutConfig,
             pad_token_id: int, eos_ids: Sequence[int], greedy: bool = False,
             record: SampledLogprobs | None = None) -> torch.Tensor:
    """Sample (or greedily decode) responses; returns response ids (B, T), T <= max_new_tokens.
    ``record`` receives the sampled tokens' log-probs as the sampler computed them."""
    # A fresh GenerationConfig: a model's own defaults (Qwen ships top_k=20, repetition_penalty
    # 1.05, ...) would otherwise silently change the sampling distribution the ratio assumes.
    # Generation stops when every row has ended with an EOS id (or at max_new_tokens).
    sampling = {} if greedy else {"temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k}
    # transformers compiles the decoding step of a static cache on CUDA unless told not to: only
    # when rollout.compile asks (CPU runs never compile).
    compiled = cfg.compile and lm.device.type == "cuda"
    cache = {"cache_implementation": "static", "disable_compile": not compiled} if cfg.cache_implementation == "static" else {}
    gen_cfg = GenerationConfig(do_sample=not greedy, max_new_tokens=cfg.max_new_tokens,
                               pad_token_id=pad_token_id, eos_token_id=list(eos_ids), **sampling, **cache)
    # A sharded LM all-gathers its weights in every decoding step: a process whose rows have all
    # ended must keep stepping (synced_gpus) until every process's have, or the others wait forever.
    synced = is_sharded(lm)
    # Decoding with a growing cache would recompile model.compile's layers at every length.
    with nullcontext() if synced else deferred_stop_check(prompt_ids.device), eager_layers(lm):
        out = lm.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=gen_cfg,
                          synced_gpus=synced, logits_processor=LogitsProcessorList([record] if record else []))
    return out[:, prompt_ids.shape[1]:]


@contextmanager
def deferred_stop_check(device: torch.device) -> Iterator[None]:
    """Inside the block, ``generate`` on CUDA reads its stop flag one decoding step late.

    After every step transformers' decoding loop asks whether every row has ended, and reading
    that answer makes the host wait for the GPU, so the next step cannot be queued meanwhile.
    transformers has the remedy, ``DeferredStopCheck``: the flag is copied asynchronously and read
    one step later, and the one extra step at the end is removed from the output. It turns it on
    for Apple's mps only ("we should enable it for cuda if we observe perf gains"); this lets its
    own check answer for CUDA as it does for mps. Measured (256 responses of 400 tokens,
    compiled bfloat16 decoding, H100): 2.37 s instead of 2.96 s. A transformers without it is
    unaffected.
    """
    checker = getattr(generation_utils, "DeferredStopCheck", None)
    original = getattr(checker, "__dict__", {}).get("is_supported")  # the staticmethod itself, restored as it was
    if device.type != "cuda" or not isinstance(original, staticmethod):  # absent, or not as this code knows it
        yield
        return

    def is_supported(device: torch.device, *args: Any, **kwargs: Any) -> bool:
        return original.__func__(torch.device("mps") if device.type == "cuda" else device, *args, **kwargs)

    checker.is_supported = staticmethod(is_supported)
    try:
        yield
    finally:
        checker.is_supported = original


def response_forward(forward: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor | None]],
                     input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
                     temperature: float, chunk: int, logits_chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tempered log-probs of the response tokens (B, T) and values (B, T) (None if no value head);
    padded positions hold unspecified values.

    ``forward(input_ids, attention_mask, logits_to_keep)`` returns ``(logits (b, logits_to_keep, V)
    for the last columns, values (b, P+T) or None)``, as ``PolicyWithValueHead`` and
    ``ReferenceForward`` do. It runs on chunks of ``chunk`` rows so that the logits fit in
    memory. Rows go into chunks by response length and each chunk is cut to its own columns, as
    the update's minibatches are (``trim_padding``), and the LM head runs on the response's
    columns only (prompts are ~27% of the real tokens of 256 Qwen rollouts and need no logits).
    Positions come from the mask, so a row's log-probs do not depend on its chunk beyond float
    rounding.

    With ``logits_chunk`` (rollout.logits_chunk_tokens), a ``forward`` that can (``head_apart``)
    runs its transformer on the rows and its LM head on at most ``logits_chunk`` response tokens
    at a time (``chunked_logprobs``): the logits of a chunk of rows never exist at once, so row
    chunks can be large (fewer, larger forwards) on a small card.
    """
    P = prompt_length
    B, T = input_ids.shape[0], input_ids.shape[1] - P
    response_mask = attention_mask[:, P:]
    order = torch.argsort(response_mask.sum(dim=-1), stable=True)  # (B,) rows of similar length share a chunk
    apart = head_apart(forward) if logits_chunk else None
    logprobs = values = None
    for start in range(0, B, chunk):
        rows = order[start:start + chunk]
        part = trim_padding({"input_ids": input_ids[rows], "attention_mask": attention_mask[rows],
                             "response_mask": response_mask[rows], "prompt_length": P})
        ids, p = part["input_ids"], part["prompt_length"]
        t = ids.shape[1] - p
        if apart is not None:
            body, head = apart
            hidden, vals = body(ids, part["attention_mask"])  # (b, p+t, H), (b, p+t) or None
            chunk_logprobs = chunked_logprobs(head, response_slice(hidden, p, t), ids[:, p:], temperature, logits_chunk)
        else:
            # The last t + 1 columns' logits are those of columns p-1 ... p+t-1: the response slice
            # [p-1 : p+t-1] is all of them but the last.
            logits, vals = forward(ids, part["attention_mask"], t + 1)
            logits = logits[:, :-1]  # (b, t, V)
            if temperature != 1.0:  # x / 1.0 is x exactly: no copy of the logits for nothing
                logits = logits / temperature
            chunk_logprobs = logprobs_from_logits(logits, ids[:, p:])  # (b, t)
        if logprobs is None:
            logprobs = chunk_logprobs.new_zeros(B, T)
            values = None if vals is None else torch.zeros(B, T, dtype=torch.float32, device=ids.device)
        logprobs[rows, :t] = chunk_logprobs
        if vals is not None:
            values[rows, :t] = response_slice(vals, p, t).float()
    return logprobs, values


def chunked_logprobs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, labels: torch.Tensor,
                     temperature: float, chunk: int) -> torch.Tensor:
    """``logprobs_from_logits(head(hidden) / temperature, labels)``, ``chunk`` tokens at a time.

    Args:
        head: the LM head, hidden states (n, H) -> logits (n, V).
        hidden: (b, t, H) the hidden states that predict ``labels``.
        labels: (b, t) token ids.
    Returns:
        (b, t) log-probs in float32 (or wider): each token's value is computed as the unchunked
        path computes it, from the same hidden state by the same head, so the two differ by the
        rounding of matrix products of other shapes only.
    """
    b, t, H = hidden.shape
    flat, ids = hidden.reshape(b * t, H), labels.reshape(b * t, 1)
    out = []
    for start in range(0, b * t, chunk):
        logits = head(flat[start:start + chunk])[:, None]  # (n, 1, V): one token per row
        if temperature != 1.0:
            logits = logits / temperature
        out.append(logprobs_from_logits(logits, ids[start:start + chunk])[:, 0])
    return torch.cat(out).reshape(b, t) if out else hidden.new_zeros(b, t, dtype=torch.float32)


def head_apart(forward: Any) -> tuple[Callable, Callable] | None:
    """``(body, head)`` for a ``forward`` whose LM head can run apart from its transformer:
    ``body(input_ids, attention_mask)`` -> (last hidden states (b, L, H), values (b, L) or None)
    and ``head(hidden)`` -> logits. None where it cannot: a sharded policy (FSDP gathers the head's
    weights only inside the LM's own forward), or a model whose logits are more than its head's
    product (Gemma's soft-capping, Cohere's logit scale)."""
    lm = forward.lm if isinstance(forward, PolicyWithValueHead) else getattr(forward, "ref", None)
    if lm is None or is_sharded(forward) or is_sharded(lm):
        return None
    config = lm.config.get_text_config()
    if getattr(config, "final_logit_softcapping", None) is not None or getattr(config, "logit_scale", None) is not None:
        return None
    if isinstance(forward, PolicyWithValueHead):
        return forward.hidden_states, forward.lm_head
    return forward.hidden_states, lm.get_output_embeddings()


class ReferenceForward:
    """The reference LM as a ``forward`` for ``response_forward``, positions as in the policy;
    ``hidden_states`` runs it without its head (``head_apart``)."""

    def __init__(self, ref: PreTrainedModel):
        self.ref = ref

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, logits_to_keep: int = 0) -> tuple[torch.Tensor, None]:
        out = self.ref(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False,
                       logits_to_keep=logits_to_keep)
        return out.logits, None

    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = self.ref.base_model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                                  use_cache=False)
        return out.last_hidden_state, None


@contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """Eval mode inside the block: generation keeps its KV cache (gradient checkpointing turns
    it off in train mode) and no-grad forwards skip checkpointing. Dropout is disabled by the
    trainer, so both modes compute the same log-probs."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


@dataclass
class Sample:
    """Responses to a batch of prompts, before any scoring."""

    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P)
    response_ids: torch.Tensor  # (B, T) right-padded with the pad token
    response_mask: torch.Tensor  # (B, T) bool, up to and including the first EOS
    finished: torch.Tensor  # (B,) bool, the response ended with EOS
    # (B, T) the sampler's own tempered log-probs of the response tokens (SampledLogprobs); None when greedy
    sampler_logprobs: torch.Tensor | None = None


@torch.no_grad()
def sample(policy: PolicyWithValueHead, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
           cfg: RolloutConfig, greedy: bool = False, sampler: PreTrainedModel | None = None) -> Sample:
    """One response per prompt, sampled as ``cfg`` says (or greedy, for evaluation), by
    ``sampler`` (a copy of the policy's LM, ``generation_copy``) or else by the policy's LM."""
    device = next(policy.parameters()).device
    # Compiled decoding wants one cache shape per run: prompts of one fixed length. (Done on CPU
    # too, where nothing compiles, so that CPU tests run this path.)
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts, cfg.max_prompt_tokens, device, fixed_length=cfg.compile)
    eos_ids = eos_token_ids(policy.lm, tokenizer)
    record = None if greedy else SampledLogprobs(cfg.temperature)
    with eval_mode(policy):
        response_ids = generate(policy.lm if sampler is None else sampler, prompt_ids, prompt_mask, cfg,
                                tokenizer.pad_token_id, eos_ids, greedy, record)
    if cfg.compile:  # drop the all-padding columns that only fixed the shape: the update need not pay for them
        longest = int(prompt_mask.sum(dim=-1).max())
        prompt_ids, prompt_mask = prompt_ids[:, -longest:], prompt_mask[:, -longest:]
    mask = response_mask_from_ids(response_ids, eos_ids)
    finished = (torch.isin(response_ids, torch.tensor(eos_ids, device=device)) & mask).any(dim=-1)
    response_ids = torch.where(mask, response_ids, tokenizer.pad_token_id)
    return Sample(prompt_ids, prompt_mask, response_ids, mask, finished, None if record is None else record.logprobs(response_ids))


@dataclass
class Rollout:
    """One batch of sampled responses and everything the update reads from it."""

    sample: Sample
    input_ids: torch.Tensor  # (B, P+T) prompt then response
    attention_mask: torch.Tensor  # (B, P+T)
    logprobs: torch.Tensor  # (B, T) tempered log-probs under the policy at rollout time
    ref_logprobs: torch.Tensor  # (B, T) tempered log-probs under the frozen reference
    values: torch.Tensor  # (B, T) V(s_t) at rollout time

    @property
    def prompt_length(self) -> int:
        return self.sample.prompt_ids.shape[1]

    def update_batch(self, advantages: torch.Tensor, returns: torch.Tensor) -> dict[str, Any]:
        """The whole rollout as the batch the update cuts into minibatches (the contract, handout.md section 4, exercise 5),
        with the (B, T) ``advantages`` and ``returns`` computed from it."""
        return {
            "input_ids": self.input_ids, "attention_mask": self.attention_mask,
            "response_ids": self.sample.response_ids, "response_mask": self.sample.response_mask,
            "logprobs_old": self.logprobs, "values_old": self.values,
            "advantages": advantages, "returns": returns, "prompt_length": self.prompt_length,
        }


def generation_copy(lm: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """A frozen copy of ``lm`` in ``dtype`` to sample from (rollout.generation_dtype); keep it
    current with ``refresh_copy``."""
    import copy

    sampler = copy.deepcopy(lm)
    # transformers keeps a compiled forward of the model it compiled for (rollout.compile); a
    # copy would call lm's through it (float32 queries against its own bfloat16 cache, measured)
    sampler.__dict__.pop("_compiled_call", None)
    # Gradient checkpointing hooks the input embeddings (enable_input_require_grads); the copy
    # never trains, and the hook splits its compiled decoding step (7 compiled regions per step
    # instead of 1, profiled on an H100), though no slower for it.
    if hasattr(sampler, "_require_grads_hook"):
        sampler.disable_input_require_grads()
    use_grouped_decoding(sampler)  # decoding attends to the KV cache without copying it per head group
    # Parameters only: Module.to would round the buffers too, and RoPE's inv_freq in bfloat16
    # shifts the rotary phase by ~0.5 rad at position 300 (from_pretrained keeps it float32).
    for param in sampler.parameters():
        param.data = param.data.to(dtype)
    # eval mode: no dropout, and gradient checkpointing (which a copy inherits) stays off
    return sampler.eval().requires_grad_(False)


@torch.no_grad()
def refresh_copy(sampler: PreTrainedModel, lm: PreTrainedModel) -> None:
    """Copy ``lm``'s weights into ``sampler``, cast to its dtype (tied weights are one parameter
    in both, so they are copied once). A sharded ``lm`` (FSDP) gives its full weights, gathered
    from every process: all of them must call this together."""
    if is_sharded(lm):
        sampler.load_state_dict(get_model_state_dict(lm, options=StateDictOptions(full_state_dict=True)))
        return
    for target, source in zip(sampler.parameters(), lm.parameters(), strict=True):
        target.copy_(source)


@torch.no_grad()
def collect(policy: PolicyWithValueHead, ref: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
            prompts: Sequence[str], cfg: RolloutConfig, sampler: PreTrainedModel | None = None) -> Rollout:
    """Sample one response per prompt (by ``sampler`` if given, see ``sample``) and score it
    under the policy (with values) and the reference."""
    responses = sample(policy, tokenizer, prompts, cfg, sampler=sampler)
    P = responses.prompt_ids.shape[1]
    input_ids = torch.cat([responses.prompt_ids, responses.response_ids], dim=1)  # (B, P+T)
    response_mask = responses.response_mask.to(responses.prompt_mask.dtype)
    attention_mask = torch.cat([responses.prompt_mask, response_mask], dim=1)  # (B, P+T)
    with eval_mode(policy):
        logprobs, values = response_forward(policy, input_ids, attention_mask, P, cfg.temperature,
                                            cfg.forward_batch_size, cfg.logits_chunk_tokens)
    ref_logprobs, _ = response_forward(ReferenceForward(ref), input_ids, attention_mask, P, cfg.temperature,
                                       cfg.forward_batch_size, cfg.logits_chunk_tokens)
    return Rollout(responses, input_ids, attention_mask, logprobs, ref_logprobs, values)
