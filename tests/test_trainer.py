"""The trainer around the exercises: rollout masks, slice alignment, the update loop with its
early stop and advantage guard, runs, resume (after a kill and after the time limit), the
evaluation records, the CLI's clear errors, and GGUF quantization flags."""

import copy
import itertools
import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import AttentionInterface, GenerationConfig, get_scheduler

from assignment.trainer import cli
from assignment.trainer.config import ConfigError, DataConfig, load_config
from assignment.trainer.impl import ImplError, load_impl, load_module
from assignment.trainer.loading import build_models, clear_quantization_flags, load_tokenizer
from assignment.model import PolicyWithValueHead, tiny_llama
from assignment.trainer.batch import minibatches, response_slice, trim_padding
from assignment.trainer.ppo import KLController, UpdateConfig, first_kl_tolerance, guard_advantages, ppo_update
from assignment.trainer.rollout import (ReferenceForward, collect, generate, generation_copy, head_apart, refresh_copy, render_prompts,
                                       response_forward, response_mask_from_ids, sample)
from assignment.helpers import logprobs_from_logits
from assignment.trainer import attention, loading, loop
from assignment.trainer import rollout as rollout_module
from assignment.trainer.loop import FINISHED, TIME_LIMIT, RunDirError, train
from assignment.trainer.runlog import read_jsonl

REFERENCE = Path(__file__).resolve().parents[1] / "solutions" / "exercises.py"
SOLUTION = load_impl(str(REFERENCE))
TINY = ["model.hidden_size=32", "rollout.batch_size=8", "ppo.minibatch_size=4", "ppo.epochs=2",
        "rollout.max_new_tokens=4", "eval.size=8", "train.steps=3", "train.progress=false",
        "train.sample_every=2", "train.tensorboard=false",
        "train.cpu_threads=1"]  # fastest for a tiny model, and immune to a busy machine (config.py)


GSM8K_SAMPLE = Path(__file__).resolve().parent / "data" / "gsm8k"


def tiny_cfg(tmp_path, *extra):
    return load_config(None, [*TINY, f"train.output_dir={tmp_path / 'run'}", *extra])


# --- response mask ----------------------------------------------------------------------

def test_mask_covers_up_to_and_including_the_first_eos_when_pad_is_eos():
    eos = 2  # pad == eos: generate pads finished rows with EOS too
    ids = torch.tensor([[5, 6, 2, 2, 2], [2, 2, 2, 2, 2], [5, 6, 7, 8, 9], [5, 2, 6, 2, 2]])
    mask = response_mask_from_ids(ids, [eos])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]


def test_mask_with_several_eos_ids():
    ids = torch.tensor([[5, 9, 0, 0], [5, 6, 7, 8]])  # 9 is a second end-of-turn id, 0 the pad
    assert response_mask_from_ids(ids, [7, 9]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]


# --- rollout and update -----------------------------------------------------------------

@pytest.fixture(scope="module")
def rollout_setup():
    cfg = load_config(None, TINY + ["rollout.temperature=0.7", "rollout.max_new_tokens=6"])
    tok = load_tokenizer(cfg.model)
    policy, ref = build_models(cfg.model, tok, seed=0, device=torch.device("cpu"))
    torch.manual_seed(0)
    questions = [f"What is {a} + {b}?" for a, b in [(1, 2), (3, 4), (0, 0), (4, 4), (2, 1), (1, 1), (3, 0), (4, 2)]]
    rollout = collect(policy, ref, tok, render_prompts(tok, questions, cfg.data), cfg.rollout)
    return cfg, tok, policy, rollout


def minibatch_of(rollout, rows):
    zeros = torch.zeros_like(rollout.logprobs)
    full = rollout.update_batch(advantages=zeros + 1.0, returns=zeros)
    return {k: (v[rows] if torch.is_tensor(v) else v) for k, v in full.items()}


def test_rollout_shapes_and_left_padding(rollout_setup):
    cfg, tok, policy, rollout = rollout_setup
    B, T = rollout.sample.response_ids.shape
    P = rollout.prompt_length
    assert rollout.input_ids.shape == (B, P + T) and rollout.logprobs.shape == rollout.values.shape == (B, T)
    assert bool(rollout.sample.prompt_mask[:, -1].all())  # left padding: every prompt ends at column P-1
    assert bool((rollout.sample.response_ids[~rollout.sample.response_mask] == tok.pad_token_id).all())
    assert rollout.ref_logprobs.shape == (B, T) and torch.allclose(rollout.ref_logprobs, rollout.logprobs)


def test_slice_alignment_ratio_is_one_at_the_first_minibatch(rollout_setup):
    """The update's [P-1 : P+T-1] slice of a fresh forward reproduces the rollout's log-probs,
    so the first PPO ratio is exactly 1 and nothing is clipped."""
    cfg, tok, policy, rollout = rollout_setup
    mb = trim_padding(minibatch_of(rollout, torch.arange(4)))
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)
    metrics = SOLUTION.ppo_minibatch_update(policy, opt, mb, UpdateConfig.from_config(cfg), step_optimizer=False)
    opt.zero_grad()
    # "Exactly 1" up to float rounding: the rollout computed logprobs_old from batches of other
    # shapes (chunks by length), so the sums of the forward may run in another order; approx_kl,
    # a token mean of the differences, is bounded by ppo.first_kl_tolerance (derived there from
    # the lengths of those sums). Measured: exactly 0 on an AMD EPYC, vector and scalar kernels.
    # A ratio within rounding of 1 is far inside [0.8, 1.2]: the clip fraction is exactly 0.
    real = mb["response_mask"].bool()
    tolerance = first_kl_tolerance(policy, float(mb["logprobs_old"][real].abs().max()))
    assert abs(metrics["stats/approx_kl"]) <= tolerance and metrics["stats/policy_clipfrac"] == 0.0
    # The check can fail: slicing one position late gives an approx_kl outside it (measured 13x).
    P, T = mb["prompt_length"], mb["response_ids"].shape[1]
    with torch.no_grad():
        logits, _ = policy(mb["input_ids"], mb["attention_mask"])
    late = torch.log_softmax(logits[:, P:P + T].float() / cfg.rollout.temperature, -1)
    late = late.gather(-1, mb["response_ids"].unsqueeze(-1)).squeeze(-1)
    assert abs(float((mb["logprobs_old"] - late)[real].mean())) > tolerance


def test_trim_padding_keeps_the_log_probs(rollout_setup):
    cfg, tok, policy, rollout = rollout_setup
    full = minibatch_of(rollout, torch.arange(8))
    trimmed = trim_padding(full)
    assert trimmed["input_ids"].shape[1] <= full["input_ids"].shape[1]
    P, T = trimmed["prompt_length"], trimmed["response_ids"].shape[1]
    with torch.no_grad():
        logits, _ = policy(trimmed["input_ids"], trimmed["attention_mask"])
    lp = torch.log_softmax(response_slice(logits, P, T) / cfg.rollout.temperature, -1)
    lp = lp.gather(-1, trimmed["response_ids"].unsqueeze(-1)).squeeze(-1)
    m = trimmed["response_mask"]
    # The rollout's log-probs came from batches of other shapes: equal within ppo.first_kl_tolerance
    # per token (measured: at most 0.0016 of it on an AMD EPYC, vector and scalar kernels).
    tolerance = first_kl_tolerance(policy, float(trimmed["logprobs_old"][m].abs().max()))
    assert float((lp[m] - trimmed["logprobs_old"][m]).abs().max()) <= tolerance


def test_response_slice_is_the_columns_that_predict_the_response():
    P, T = 3, 2
    x = torch.arange(2 * (P + T)).reshape(2, P + T)  # (B, P+T): row b holds 5b + column
    assert response_slice(x, P, T).tolist() == [[2, 3], [7, 8]]  # columns P-1 .. P+T-2
    logits = torch.randn(2, P + T, 7)
    assert response_slice(logits, P, T).shape == (2, T, 7) and torch.equal(response_slice(logits, P, T), logits[:, 2:4])


def test_the_batch_module_imports_only_torch():
    """The grader imports assignment.trainer.batch: importing it (and the packages above it)
    must not pull in transformers, omegaconf or the rest of the trainer."""
    import ast

    import assignment.trainer.batch as batch_module

    for path in (batch_module.__file__, Path(batch_module.__file__).with_name("__init__.py")):
        tree = ast.parse(Path(path).read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert imported <= {"__future__", "typing", "torch"}, (path, imported)


def test_the_reward_window_imports_without_the_trainer():
    """The autograder imports runlog.REWARD_WINDOW: no omegaconf, torch or transformers with it."""
    import subprocess

    code = ("import sys, assignment.trainer.runlog as runlog; "
            "print(runlog.REWARD_WINDOW, sorted({'omegaconf', 'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["10", "[]"]


def test_minibatches_cover_every_row_once_per_epoch(rollout_setup):
    cfg, tok, policy, rollout = rollout_setup
    batch = minibatch_of(rollout, torch.arange(8))
    batch["row"] = torch.arange(8)
    seen = [mb["row"] for mb in minibatches(batch, 4, torch.Generator().manual_seed(0))]
    assert [len(r) for r in seen] == [4, 4] and sorted(torch.cat(seen).tolist()) == list(range(8))


def test_ppo_update_steps_the_optimizer_once_per_accumulation_cycle(rollout_setup, monkeypatch):
    cfg, tok, policy, rollout = rollout_setup
    cfg = load_config(None, TINY + ["ppo.minibatch_size=2", "ppo.grad_accum_steps=2", "ppo.epochs=3"])
    flags = []

    class Spy:
        compute_gae_advantages = SOLUTION.compute_gae_advantages

        @staticmethod
        def ppo_minibatch_update(model, optimizer, minibatch, update_cfg, step_optimizer):
            flags.append(step_optimizer)
            assert update_cfg.grad_accum_steps == 2 and update_cfg.temperature == cfg.rollout.temperature
            return {"loss/total": 0.0}

    opt = torch.optim.SGD(policy.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    metrics = ppo_update(Spy, policy, opt, sched, minibatch_of(rollout, torch.arange(8)), cfg,
                         torch.Generator().manual_seed(0))
    assert flags == [False, True] * 6  # 3 epochs x 4 minibatches, a step every second one
    assert sched.last_epoch == 6 and metrics["loss/total"] == 0.0


def float64_policy(seed=0):
    """A tiny float64 policy (its value head too): two ways of summing the same terms differ
    by rounding only (float32's inside transformers' RMSNorm, which upcasts to float32)."""
    lm = tiny_llama(vocab_size=40, hidden_size=16, num_layers=1, seed=seed, dtype=torch.float64)
    policy = PolicyWithValueHead(lm).double()
    torch.manual_seed(seed)
    torch.nn.init.normal_(policy.value_head.weight, std=0.1)  # nonzero values, so the value loss has a gradient
    return policy


def handmade_batch(policy, lengths, P=3, temperature=1.0, seed=0):
    """A minibatch dict (the contract's) of len(lengths) rows with those response lengths,
    logprobs_old and values_old from the policy itself (ratio 1), random advantages and returns."""
    gen = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    response_mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    input_ids = torch.randint(1, 40, (B, P + T), generator=gen)
    attention_mask = torch.cat([torch.ones(B, P, dtype=torch.long), response_mask.long()], dim=1)
    with torch.no_grad():
        logits, values = policy(input_ids, attention_mask)
    logprobs = torch.log_softmax(response_slice(logits, P, T) / temperature, -1)
    logprobs = logprobs.gather(-1, input_ids[:, P:, None]).squeeze(-1)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_ids": input_ids[:, P:],
            "response_mask": response_mask, "logprobs_old": logprobs, "values_old": response_slice(values, P, T),
            "advantages": torch.randn(B, T, generator=gen, dtype=torch.float64),
            "returns": torch.randn(B, T, generator=gen, dtype=torch.float64), "prompt_length": P}


def test_length_grouping_keeps_each_optimizer_steps_rows_and_orders_them_by_length():
    batch = handmade_batch(float64_policy(), [1, 4, 3, 2, 4, 1, 2, 3])
    batch["row"] = torch.arange(8)
    plain = [mb["row"].tolist() for mb in minibatches(batch, 2, torch.Generator().manual_seed(0))]
    grouped = list(minibatches(batch, 2, torch.Generator().manual_seed(0), length_groups=4))
    rows = [mb["row"].tolist() for mb in grouped]
    # the same 4 rows reach each optimizer step (2 minibatches of 2), ordered by response length
    for cycle in (0, 2):
        assert sorted(rows[cycle] + rows[cycle + 1]) == sorted(plain[cycle] + plain[cycle + 1])
        lengths = torch.cat([mb["response_mask"].sum(-1) for mb in grouped[cycle:cycle + 2]]).tolist()
        assert lengths == sorted(lengths)
    assert rows != plain  # the grouping changed the minibatches


def test_length_grouped_cycles_step_on_the_token_mean_of_all_their_rows(monkeypatch):
    """With ppo.length_grouping an optimizer step over 4 minibatches of 2 rows moves the weights
    exactly as one minibatch of all 8 rows would: the gradient of their token mean. Without the
    token-share weights the same grouping steps elsewhere (the test can fail)."""
    from token_gradients import token_gradient_magnitudes

    lengths = [1, 7, 2, 7, 3, 6, 1, 5]

    def config(minibatch_size, accum, grouping):
        return load_config(None, TINY + ["rollout.batch_size=8", f"ppo.minibatch_size={minibatch_size}",
                                         f"ppo.grad_accum_steps={accum}", "ppo.epochs=1", "ppo.max_grad_norm=1e9",
                                         "ppo.vf_coeff=0.5", "ppo.entropy_coeff=0.01", "rollout.temperature=1.0",
                                         f"ppo.length_grouping={grouping}"])

    def gradient(minibatch_size, accum, grouping, weights=True):
        policy = float64_policy()
        batch = handmade_batch(policy, lengths)
        cfg = config(minibatch_size, accum, grouping)
        if not weights:
            monkeypatch.setattr("assignment.trainer.ppo.token_share_weights", lambda epoch, accum: [1.0] * len(epoch))
        grads = {}

        class Recording(torch.optim.SGD):  # what an optimizer step would apply
            def step(self, closure=None):
                grads.update({name: p.grad.clone() for name, p in policy.named_parameters()})

        opt = Recording(policy.parameters(), lr=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        ppo_update(SOLUTION, policy, opt, sched, batch, cfg, torch.Generator().manual_seed(0))
        monkeypatch.undo()
        return torch.cat([g.flatten() for g in grads.values()])

    whole = gradient(8, 1, False)
    grouped = gradient(2, 4, True)
    # Both compute the same gradient g = (1/n) sum_t grad l_t of the token mean over the n = 32
    # real tokens, grouped and scaled otherwise (the weight multiplies a gradient at the
    # parameters, not the loss). A float sum errs by a multiple of the magnitudes it sums, never
    # of its own size (the advantages have both signs: the tokens' gradients cancel), so the
    # bound is elementwise in S = (1/n) sum_t |grad l_t|, each token's gradient from exercise 5
    # with a one-hot mask. The weights are float64 (their roundings, 2^-53, are 2^-29 of u and
    # do not count), but transformers' RMSNorm computes in float32 (u = 2^-24) whatever the
    # model's dtype: forward, the cast, the square, the mean over the hidden size H = 16, the
    # epsilon, rsqrt (2 roundings) and the product, at most H + 8 roundings; backward through it
    # the sum over H of products and at most 8 more. A token's gradient passes through the
    # model's 3 norms, so it carries K <= 3 * 2 * (16 + 8) = 144 roundings, each at most u of its
    # magnitude (its terms taken no larger than S: the chain count assumes no cancellation inside
    # one token's gradient; across tokens it is in S). Each side is within K u S of g:
    #     |grouped - whole| <= 2 K u S   elementwise.
    # (Measured on an AMD EPYC: at most 0.045 of it with its AVX-512 and AVX2 kernels, 0.035 with
    # the scalar ones; the bound it replaces, 64 u max|g|, was relative to the largest gradient,
    # where an element's own |g| would have needed 47,000 u.)
    policy = float64_policy()
    magnitudes = token_gradient_magnitudes(SOLUTION, policy, handmade_batch(policy, lengths),
                                           UpdateConfig.from_config(config(8, 1, False)))
    bound = 2 * 144 * 2.0**-24 * torch.cat([s.flatten() for s in magnitudes.values()])

    def worst(other):  # the largest ratio of difference to bound (0 where S = 0: both are 0 there)
        return float(((other - whole).abs() / bound)[bound > 0].max())

    assert bool(((grouped - whole).abs() <= bound).all()), worst(grouped)
    # Without the token-share weights the same grouping steps elsewhere, far outside the bound.
    assert worst(gradient(2, 4, True, weights=False)) > 100


def test_length_grouping_is_for_ppo_only():
    with pytest.raises(ConfigError, match="length_grouping"):
        load_config(None, ["algorithm=grpo", "rollout.group_size=2", "ppo.length_grouping=true"])


class ScriptedKL:
    """An impl whose minibatch update backpropagates a real loss and steps as the contract says,
    but reports the approx_kl values of a script, one per call."""

    compute_gae_advantages = SOLUTION.compute_gae_advantages

    def __init__(self, approx_kls):
        self.approx_kls, self.flags, self.steps = list(approx_kls), [], 0

    def ppo_minibatch_update(self, model, optimizer, minibatch, update_cfg, step_optimizer):
        self.flags.append(step_optimizer)
        loss = model.value_head.weight.sum() + model.value_head.bias.sum()
        (loss / update_cfg.grad_accum_steps).backward()
        if step_optimizer:
            optimizer.step()
            optimizer.zero_grad()
            self.steps += 1
        return {"loss/total": loss.item(), "stats/approx_kl": self.approx_kls[len(self.flags) - 1]}


@pytest.mark.parametrize("approx_kls, ran, optimizer_steps", [
    ([0.0, 0.01, 0.02, 0.0, 0.05] + [0.0] * 7, 5, 2),  # stops on a minibatch inside a cycle: discarded
    ([0.0, 0.04] + [0.0] * 10, 2, 1),  # stops on a minibatch that stepped
    ([0.0, 0.03] * 6, 12, 6),  # 0.03 is not above 1.5 * 0.02: never stops
])
def test_target_kl_stops_the_update_and_leaves_no_gradient(rollout_setup, approx_kls, ran, optimizer_steps):
    cfg, tok, policy, rollout = rollout_setup
    cfg = load_config(None, TINY + ["ppo.minibatch_size=2", "ppo.grad_accum_steps=2", "ppo.epochs=3", "ppo.target_kl=0.02"])
    impl = ScriptedKL(approx_kls)
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    metrics = ppo_update(impl, policy, opt, sched, minibatch_of(rollout, torch.arange(8)), cfg,
                         torch.Generator().manual_seed(0))
    assert len(impl.flags) == ran and impl.steps == optimizer_steps and sched.last_epoch == optimizer_steps
    assert all(p.grad is None for p in policy.parameters())  # nothing carried into the next PPO step
    assert metrics["stats/minibatches"] == ran and metrics["stats/early_stop"] == float(ran < 12)
    assert metrics["stats/approx_kl_first"] == approx_kls[0]  # the first call's own value, not a mean
    assert "stats/policy_clipfrac_first" not in metrics  # the impl reported no clip fraction
    if ran < 12:
        assert metrics["stats/early_stop_minibatch"] == ran - 1 and metrics["stats/early_stop_approx_kl"] > 0.03


def first_kl_tolerances(monkeypatch) -> list[float]:
    """The list that ``train`` then fills, step by step, with how far from 0 the first minibatch's
    approx_kl may be from float rounding alone: ppo.first_kl_tolerance of the step's rollout (its
    largest |log p|), the bound above which the loop itself warns. The rollout and the update
    compute log p with the same weights on the same tokens, but in batches of other shapes, so
    sums may run in another order; that function derives the bound from the lengths of those
    sums. (It replaces a constant of 2e-4 that assumed the logits stay below 0.5.)"""
    tolerances = []
    warn = loop.warn_first_kl

    def recording(run, step, metrics, logprobs, sampler_gap=None):
        tolerances.append(first_kl_tolerance(run.scorer, float(logprobs.abs().max()), sampler_gap))
        return warn(run, step, metrics, logprobs, sampler_gap)

    monkeypatch.setattr(loop, "warn_first_kl", recording)
    return tolerances


class WrongTemperature:
    """A plausible bug: the update forgets to divide the logits by the rollout temperature."""

    compute_gae_advantages = SOLUTION.compute_gae_advantages

    @staticmethod
    def ppo_minibatch_update(model, optimizer, minibatch, update_cfg, step_optimizer):
        update_cfg = dataclasses.replace(update_cfg, temperature=1.0)
        return SOLUTION.ppo_minibatch_update(model, optimizer, minibatch, update_cfg, step_optimizer)


def test_the_first_minibatch_stats_are_zero_and_catch_a_misaligned_update(tmp_path, monkeypatch):
    """Every PPO step logs its first minibatch's approx_kl and clip fraction on their own: before
    its optimizer step the ratio is exactly 1, so they read 0 however far the later minibatches
    (and so the step means) have moved. A temperature bug shows at once."""
    tolerances = first_kl_tolerances(monkeypatch)
    result = train(tiny_cfg(tmp_path / "right", "rollout.temperature=0.5"), SOLUTION)
    first_kls = [m["stats/approx_kl_first"] for m in result.metrics]
    # Measured: exactly 0 on an AMD EPYC, vector and scalar kernels.
    assert all(abs(kl) <= tol for kl, tol in zip(first_kls, tolerances, strict=True)), (first_kls, tolerances)
    assert all(m["stats/policy_clipfrac_first"] == 0.0 for m in result.metrics)
    # The step mean is not that check: it includes minibatches after an optimizer step (measured 19x-58x).
    assert any(abs(m["stats/approx_kl"]) > 10 * tol for m, tol in zip(result.metrics, tolerances))
    logged = read_jsonl(result.output_dir / "metrics.jsonl")
    assert [m["stats/approx_kl_first"] for m in logged] == first_kls
    tolerances.clear()
    broken = train(tiny_cfg(tmp_path / "broken", "rollout.temperature=0.5"), WrongTemperature)
    # measured 46x-99x
    assert all(abs(m["stats/approx_kl_first"]) > 10 * tol for m, tol in zip(broken.metrics, tolerances, strict=True))


def test_a_bfloat16_sampler_is_refreshed_every_step_and_keeps_the_first_ratio_at_1(tmp_path, monkeypatch):
    """rollout.generation_dtype: responses come from a bfloat16 copy of the policy, refreshed
    before every rollout, but logprobs_old from the float32 policy's own forward, so the first
    minibatch still reads 0."""
    events = []

    def refresh_spy(sampler, lm):
        events.append("refresh")
        refresh_copy(sampler, lm)

    def generate_spy(lm, *args, **kwargs):
        events.append(next(lm.parameters()).dtype)  # who sampled
        return generate(lm, *args, **kwargs)

    monkeypatch.setattr(loop, "refresh_copy", refresh_spy)
    monkeypatch.setattr(rollout_module, "generate", generate_spy)
    tolerances = first_kl_tolerances(monkeypatch)
    result = train(tiny_cfg(tmp_path, "rollout.generation_dtype=bfloat16", "eval.every=0"), SOLUTION)
    # the greedy evaluations (before and after) use the float32 policy; every rollout the fresh copy
    assert events == [torch.float32] + ["refresh", torch.bfloat16] * 3 + [torch.float32]
    assert all(abs(m["stats/approx_kl_first"]) <= tol for m, tol in zip(result.metrics, tolerances, strict=True))


def test_offloading_the_frozen_models_changes_no_number(tmp_path, monkeypatch):
    """model.offload_frozen: the reference and the bfloat16 sampler hold no weights during the
    update (their parameters empty, the same objects) and all of them before each rollout; the
    run's metrics and evaluations are bit for bit those of the same run without it."""
    seen = []
    original = loop.update

    def update_spy(run, *args, **kwargs):
        seen.append(sum(p.numel() for model in (run.ref, run.sampler) for p in model.parameters()))
        return original(run, *args, **kwargs)

    monkeypatch.setattr(loop, "update", update_spy)
    extra = ("rollout.generation_dtype=bfloat16", "model.reference_dtype=bfloat16", "train.steps=3")
    plain = train(tiny_cfg(tmp_path / "a", *extra), SOLUTION)
    assert len(seen) == 3 and all(n > 0 for n in seen)
    seen.clear()
    offloaded = train(tiny_cfg(tmp_path / "b", *extra, "model.offload_frozen=true"), SOLUTION)
    assert seen == [0, 0, 0]
    for a, b in zip(plain.metrics, offloaded.metrics, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == \
            {k: v for k, v in b.items() if not k.startswith("time/")}
    assert plain.evals == offloaded.evals


def test_parking_keeps_the_parameters_and_gives_back_the_reference_exactly():
    from assignment.trainer.offload import FrozenParking

    ref, sampler = tiny_llama(seed=1), tiny_llama(seed=2)
    before = {n: p.detach().clone() for n, p in ref.named_parameters()}
    params = list(ref.parameters()) + list(sampler.parameters())
    parking = FrozenParking(ref, sampler)
    parking.park()
    parking.park()  # idempotent: the host copy is the weights', not the empty storage's
    assert all(p.numel() == 0 for p in params)
    parking.unpark()
    parking.unpark()
    assert list(ref.parameters()) + list(sampler.parameters()) == params  # the same objects
    assert all(torch.equal(p, before[n]) for n, p in ref.named_parameters())
    assert [p.shape for p in sampler.parameters()] == [p.shape for p in tiny_llama(seed=2).parameters()]


def test_the_small_card_settings_train_and_resume_exactly(tmp_path, monkeypatch):
    """ppo.optimizer=adamw_8bit (bitsandbytes), a bfloat16 reference and chunked scoring logits
    (the 16 GB profile's settings): a run killed after step 2 and resumed gives the uninterrupted
    run, step for step. The model is wide enough (hidden 64) that its matrices get 8-bit state
    (bitsandbytes keeps tensors under 4096 elements at 32 bits), and the embeddings keep 32-bit
    state, as build_optimizer asks."""
    small_card = ("model.hidden_size=64", "ppo.optimizer=adamw_8bit", "model.reference_dtype=bfloat16",
                  "rollout.logits_chunk_tokens=5", "train.steps=3")
    tolerances = first_kl_tolerances(monkeypatch)
    straight = train(tiny_cfg(tmp_path / "a", *small_card), SOLUTION)

    class Killed(Exception):
        pass

    def kill_at_3(step, metrics):
        if step == 3:
            raise Killed

    cfg = tiny_cfg(tmp_path / "b", *small_card, "train.checkpoint_every=2")
    with pytest.raises(Killed):
        train(cfg, SOLUTION, on_step=kill_at_3)
    resumed = train(cfg, SOLUTION, resume=True)
    assert [(a["rollout/reward_mean"], a["rollout/kl"], a["loss/total"]) for a in straight.metrics] == \
        [(b["rollout/reward_mean"], b["rollout/kl"], b["loss/total"]) for b in resumed.metrics]
    assert all(abs(m["stats/approx_kl_first"]) <= tol for m, tol in zip(straight.metrics, tolerances[:3], strict=True))
    policy, ref = build_models(cfg.model, load_tokenizer(cfg.model), 0, torch.device("cpu"))
    assert {p.dtype for p in ref.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    # One step of the optimizer: 8-bit state for an MLP matrix, 32-bit for the embeddings.
    optimizer = loop.build_optimizer(policy, cfg.ppo)
    sum(p.sum() for p in policy.parameters()).backward()
    optimizer.step()
    state = optimizer.state
    assert state[policy.lm.model.layers[0].mlp.up_proj.weight]["state1"].dtype == torch.uint8
    assert state[policy.lm.model.embed_tokens.weight]["state1"].dtype == torch.float32


def test_the_8bit_optimizer_without_bitsandbytes_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import fails as if not installed
    policy = PolicyWithValueHead(tiny_llama(vocab_size=40, hidden_size=16, num_layers=1))
    with pytest.raises(ConfigError, match="needs bitsandbytes.*lowmem"):
        loop.build_optimizer(policy, load_config(None, ["ppo.optimizer=adamw_8bit"]).ppo)


def test_the_memory_cap_is_a_fraction_of_the_card(monkeypatch):
    """train.max_gpu_memory_gib becomes torch's per-process memory fraction of the card; a cap above
    the card is refused; off CUDA there is nothing to cap."""
    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: type("P", (), {"total_memory": 80 * 2**30}))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda fraction, device: calls.append(fraction))
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", lambda settings: calls.append(settings))
    cuda = torch.device("cuda:0")
    assert loop.cap_gpu_memory(cuda, 20.0) == {"gpu_memory_gib": 80.0, "max_gpu_memory_gib": 20.0}
    assert calls == ["expandable_segments:True", 0.25]
    assert loop.cap_gpu_memory(cuda, None) == {"gpu_memory_gib": 80.0} and len(calls) == 2
    with pytest.raises(ConfigError, match="more than this card has"):
        loop.cap_gpu_memory(cuda, 96.0)
    assert loop.cap_gpu_memory(torch.device("cpu"), 20.0) == {}


def test_the_value_head_can_learn_at_its_own_rate(tmp_path):
    """ppo.value_head_lr puts the head in an AdamW group of its own; the scheduler's warmup
    scales both groups alike, and every parameter is in exactly one group."""
    cfg = tiny_cfg(tmp_path, "ppo.value_head_lr=0.01", "ppo.warmup_steps=2")
    tok = load_tokenizer(cfg.model)
    policy, _ = build_models(cfg.model, tok, seed=0, device=torch.device("cpu"))
    groups = loop.optimizer_groups(policy, cfg.ppo)
    assert [p for g in groups for p in g["params"]] != [] and len(groups) == 2
    assert sorted(id(p) for g in groups for p in g["params"]) == sorted(id(p) for p in policy.parameters())
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in policy.value_head.parameters()}
    optimizer = torch.optim.AdamW(groups, lr=cfg.ppo.lr)
    scheduler = get_scheduler(cfg.ppo.lr_scheduler, optimizer, num_warmup_steps=2, num_training_steps=10)
    optimizer.step()
    scheduler.step()
    assert scheduler.get_last_lr() == pytest.approx([cfg.ppo.lr / 2, 0.01 / 2])  # half way through the warmup
    single = loop.optimizer_groups(policy, tiny_cfg(tmp_path).ppo)
    assert len(single) == 1 and len(single[0]["params"]) == len(list(policy.parameters()))


def test_evaluation_decodes_eagerly_whatever_the_rollout_compiles(tmp_path, monkeypatch):
    """Greedy evaluation never uses the rollout's static cache or compiled decoding (their graphs
    are traced for the sampler's dtype and batch shape; evaluate.py says why), while the rollouts
    keep them; evaluation's prompts are then padded to the longest, not to max_prompt_tokens."""
    calls = []

    def generate_spy(lm, prompt_ids, prompt_mask, cfg, pad_token_id, eos_ids, greedy=False, record=None):
        calls.append((greedy, cfg.cache_implementation, cfg.compile, prompt_ids.shape[1]))
        return generate(lm, prompt_ids, prompt_mask, cfg, pad_token_id, eos_ids, greedy, record)

    monkeypatch.setattr(rollout_module, "generate", generate_spy)
    cfg = tiny_cfg(tmp_path, "rollout.cache_implementation=static", "rollout.compile=true", "train.steps=1")
    train(cfg, SOLUTION)
    evals = [c for c in calls if c[0]]
    rollouts = [c for c in calls if not c[0]]
    assert evals and all(c[1:3] == (None, False) and c[3] < cfg.rollout.max_prompt_tokens for c in evals), evals
    assert rollouts and all(c[1:] == ("static", True, cfg.rollout.max_prompt_tokens) for c in rollouts), rollouts


def test_the_generation_copy_is_frozen_and_refreshed_in_its_dtype():
    lm = tiny_llama(vocab_size=30, hidden_size=16, num_layers=1, seed=0)
    lm._compiled_call = lm.__call__  # as transformers leaves it after compiled decoding
    sampler = generation_copy(lm, torch.bfloat16)
    assert "_compiled_call" not in vars(sampler)  # the copy compiles its own forward
    # the weights change dtype, the buffers (RoPE's inv_freq) keep theirs
    assert [b.dtype for b in sampler.buffers()] == [b.dtype for b in lm.buffers()] and any(True for _ in lm.buffers())
    assert not sampler.training and all(p.dtype == torch.bfloat16 and not p.requires_grad for p in sampler.parameters())
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(0.25)  # an update
    refresh_copy(sampler, lm)
    for copied, weight in zip(sampler.parameters(), lm.parameters(), strict=True):
        assert torch.equal(copied, weight.to(torch.bfloat16))
    assert all(p.dtype == torch.float32 and p.requires_grad for p in lm.parameters())


def test_the_generation_copy_samples_without_checkpointing_hooks_and_with_grouped_attention():
    lm = tiny_llama(vocab_size=30, hidden_size=16, num_layers=1, seed=0)
    (getattr(lm, "activation_checkpointing_enable", None) or lm.gradient_checkpointing_enable)()
    assert lm.get_input_embeddings()._forward_hooks  # what checkpointing leaves on the policy's LM
    sampler = generation_copy(lm, torch.bfloat16)
    assert not sampler.get_input_embeddings()._forward_hooks and lm.get_input_embeddings()._forward_hooks
    assert sampler.config._attn_implementation == attention.NAME and lm.config._attn_implementation == "sdpa"


def test_grouped_decoding_attention_decodes_what_sdpa_decodes(monkeypatch, request):
    """Two query heads per key/value head (4 and 2): decoding with the grouped attention gives
    sdpa's tokens and logits, from the dynamic and the static cache, with left-padded prompts;
    and it did attend with the grouped query (B, H_kv, g, d), not with a repeated cache."""
    lm = tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, seed=0, dtype=torch.float64)
    grouped = copy.deepcopy(lm)
    attention.use_grouped_decoding(grouped)
    ids = torch.randint(1, 64, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = mask[1, :1] = 0
    sdpa = torch.nn.functional.scaled_dot_product_attention
    queries = []
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, *args, **kwargs: queries.append(tuple(q.shape)) or sdpa(q, *args, **kwargs))
    steps = []  # query lengths the model's attention function saw (transformers may group a lone query itself)

    def spy(module, query, *args, **kwargs):
        steps.append(query.shape[2])
        return attention.grouped_decoding_attention(module, query, *args, **kwargs)

    AttentionInterface.register(attention.NAME, spy)  # global: the original is registered back below
    request.addfinalizer(lambda: AttentionInterface.register(attention.NAME, attention.grouped_decoding_attention))
    for cache in ({}, {"cache_implementation": "static"}):
        config = GenerationConfig(do_sample=False, max_new_tokens=8, pad_token_id=0, eos_token_id=[63],
                                  output_logits=True, return_dict_in_generate=True, **cache)
        plain = lm.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        queries.clear()
        steps.clear()
        mine = grouped.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        decoded = mine.sequences.shape[1] - ids.shape[1] - 1  # tokens after the prefill's
        assert decoded > 0 and steps.count(1) == 2 * decoded  # every decoding step, both layers, went through it
        assert (3, 2, 2, 8) in queries  # (B, H_kv, g, d): the decoding steps' grouped query
        # The same products and softmax, batched otherwise. The weights are float64 but
        # transformers' RMSNorm rounds to float32, so the bound is first_kl_tolerance's for this
        # model in float32: the same weights on batches of other shapes (measured: equal).
        largest = max(float(step.abs().max()) for step in plain.logits)
        tolerance = first_kl_tolerance(PolicyWithValueHead(copy.deepcopy(lm).float()), largest)
        assert max(float((a - b).abs().max()) for a, b in zip(plain.logits, mine.logits)) <= tolerance
        # The same tokens, because sdpa's two largest logits lie more than 2 * tolerance apart at
        # every step (measured 8.8x tolerance): no move within it can swap them.
        margin = min(float((top[:, 0] - top[:, 1]).min()) for top in (step.topk(2, -1).values for step in plain.logits))
        assert margin > 2 * tolerance, (margin, tolerance)
        assert torch.equal(plain.sequences, mine.sequences)


def test_the_scoring_forward_by_length_gives_the_whole_batch_forward():
    """response_forward puts rows into chunks by response length, trims each chunk and runs the
    LM head on the response columns only: the log-probs and values of one plain forward of the
    whole (B, P+T) batch, within the rounding of batches of other shapes (first_kl_tolerance)."""
    policy = PolicyWithValueHead(tiny_llama(vocab_size=40, hidden_size=16, num_layers=2, seed=1))
    torch.nn.init.normal_(policy.value_head.weight, std=0.5, generator=torch.Generator().manual_seed(1))  # the same every run
    P, T, temperature = 5, 6, 0.7
    prompt_lengths, response_lengths = [5, 2, 3, 5, 1, 4, 2], [6, 1, 3, 6, 2, 1, 4]
    gen = torch.Generator().manual_seed(0)
    prompt_mask = torch.arange(P)[None, :] >= P - torch.tensor(prompt_lengths)[:, None]
    response_mask = torch.arange(T)[None, :] < torch.tensor(response_lengths)[:, None]
    mask = torch.cat([prompt_mask, response_mask], dim=1).long()
    ids = torch.where(mask.bool(), torch.randint(1, 40, mask.shape, generator=gen), 0)
    with torch.no_grad():
        logits, values = policy(ids, mask)
    expected = logprobs_from_logits(response_slice(logits, P, T) / temperature, ids[:, P:])
    expected_values = response_slice(values, P, T)
    tolerance = first_kl_tolerance(policy, float(max(expected[response_mask].abs().max(),
                                                     expected_values[response_mask].abs().max())))
    # rollout.logits_chunk_tokens: the LM head apart from the transformer, on 1, 4 or all tokens at once
    for chunk, logits_chunk in itertools.product((1, 3, 7), (None, 1, 4, 1000)):
        with torch.no_grad():
            logprobs, got_values = response_forward(policy, ids, mask, P, temperature, chunk, logits_chunk)
            ref_logprobs, none = response_forward(ReferenceForward(policy.lm), ids, mask, P, temperature, chunk, logits_chunk)
        assert float((logprobs - expected)[response_mask].abs().max()) <= tolerance
        assert float((ref_logprobs - expected)[response_mask].abs().max()) <= tolerance and none is None
        assert float((got_values - expected_values)[response_mask].abs().max()) <= tolerance
    assert float(expected_values[response_mask].abs().min()) > 0  # the values are compared, not zeros


@pytest.mark.parametrize("scope, graphs, per_layer", [("part", 3, 4), ("layer", 1, 1)])
def test_the_compiled_layers_give_the_eager_forward_and_gradients(scope, graphs, per_layer):
    """model.compile (loading.compile_layers): each decoder layer (scope "layer") or its attention,
    MLP and norms ("part") compiled, gradient checkpointing around them. What this project's code
    decides is what dynamo captures: dynamo's own "eager" backend runs the captured graphs with the
    original ops and autograd, so the policy's logits, values and gradients are the eager ones bit
    for bit. The captured graphs are one per kind of compiled function (3 parts, or 1 layer), for 2
    layers as for 4 and for every length: nothing recompiles per layer or per length, and nothing
    breaks the graphs. eager_layers takes the compiled forwards out and puts them back. (Inductor's
    kernels round differently; their numerics are PyTorch's to test.)"""
    from torch._dynamo.utils import counters

    for layers in (2, 4):
        torch._dynamo.reset()
        counters.clear()
        lm = tiny_llama(vocab_size=40, hidden_size=16, num_layers=layers).train()
        (getattr(lm, "activation_checkpointing_enable", None) or lm.gradient_checkpointing_enable)()
        eager, compiled = PolicyWithValueHead(lm), PolicyWithValueHead(copy.deepcopy(lm))
        compiled.load_state_dict(eager.state_dict())
        loading.compile_layers(compiled.lm, backend="eager", scope=scope)
        for length in (7, 9, 12):
            ids = torch.randint(1, 40, (3, length), generator=torch.Generator().manual_seed(length))
            mask = torch.ones_like(ids)
            mask[0, :2] = 0
            results = []
            for policy in (eager, compiled):
                policy.zero_grad()
                logits, values = policy(ids, mask)
                (logits.logsumexp(-1).mean() + values.mean()).backward()
                results.append([logits.detach(), values.detach(), *(p.grad for p in policy.parameters())])
            assert all(torch.equal(a, b) for a, b in zip(*results))
        assert counters["stats"]["unique_graphs"] == graphs and not counters["graph_break"]
        parts = loading.compiled_parts(compiled.lm, scope)
        assert len(parts) == per_layer * layers and all("forward" in vars(part) for part in parts)
        with loading.eager_layers(compiled.lm):
            assert not any("forward" in vars(part) for part in parts)
        assert all("forward" in vars(part) for part in parts)


def test_the_head_runs_apart_only_where_the_logits_are_its_product():
    """head_apart: a plain LM head runs apart from the transformer; soft-capped or scaled logits
    (Gemma, Cohere) keep the whole forward, as does anything that is not a policy or a reference."""
    policy = PolicyWithValueHead(tiny_llama(vocab_size=40, hidden_size=16, num_layers=1))
    assert head_apart(policy) == (policy.hidden_states, policy.lm_head)
    assert head_apart(ReferenceForward(policy.lm))[1] is policy.lm.get_output_embeddings()
    policy.lm.config.final_logit_softcapping = 30.0
    assert head_apart(policy) is None and head_apart(ReferenceForward(policy.lm)) is None
    assert head_apart(lambda ids, mask, keep: None) is None


def greedy_margin(policy, responses) -> tuple[float, float]:
    """(m, tolerance) for greedy ``responses`` of ``policy``: m is the smallest gap between the two
    largest logits at the positions that chose a real response token, from one forward of the
    whole sequences; tolerance is ppo.first_kl_tolerance of these logits, how far another batch
    shape (another cache, padding, a compiled step) may move them. Where m > 2 * tolerance, no such
    move can swap the two largest, so every way of decoding chooses the same tokens."""
    ids = torch.cat([responses.prompt_ids, responses.response_ids], dim=1)
    mask = torch.cat([responses.prompt_mask, responses.response_mask.to(responses.prompt_mask.dtype)], dim=1)
    with torch.no_grad():
        logits, _ = policy(ids, mask)
    P, T = responses.prompt_ids.shape[1], responses.response_ids.shape[1]
    chosen = response_slice(logits, P, T)[responses.response_mask.bool()]  # (N, V)
    top = chosen.topk(2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).min()), first_kl_tolerance(policy, float(chosen.abs().max()))


def test_fixed_length_prompts_for_compiled_decoding_change_no_response(rollout_setup):
    """rollout.compile pads prompts to max_prompt_tokens for generation (one cache shape) and
    cuts the extra columns after it: the same prompts and responses as without."""
    cfg, tok, policy, _ = rollout_setup
    prompts = render_prompts(tok, ["What is 1 + 2?", "What is 12 + 30?", "What is 4 + 4 + 4?"], cfg.data)
    plain = sample(policy, tok, prompts, cfg.rollout, greedy=True)
    fixed = sample(policy, tok, prompts, dataclasses.replace(cfg.rollout, cache_implementation="static", compile=True),
                   greedy=True)
    assert plain.prompt_ids.shape[1] < cfg.rollout.max_prompt_tokens
    assert torch.equal(fixed.prompt_ids, plain.prompt_ids) and torch.equal(fixed.prompt_mask, plain.prompt_mask)
    margin, tolerance = greedy_margin(policy, plain)
    assert margin > 2 * tolerance, (margin, tolerance)  # measured 86x tolerance: the tokens cannot differ
    assert torch.equal(fixed.response_ids, plain.response_ids)


def test_guard_skips_batches_without_reward_spread_and_clips():
    mask = torch.ones(64, 5, dtype=torch.bool)
    ppo = load_config(None, ["ppo.min_reward_std=0.15", "ppo.advantage_clip=4"]).ppo
    for rewarded, skipped in ((0, True), (1, True), (2, False), (16, False)):
        final = torch.zeros(64)
        final[:rewarded] = 1.0
        raw = final[:, None].expand(64, 5)  # gamma = lam = 1, values 0, no KL: every token gets its reward
        whitened = SOLUTION.compute_gae_advantages(final, torch.zeros(64, 5), torch.zeros(64, 5), mask, 1.0, 1.0)[0]
        if rewarded:
            # Every sum here is exact in any order (0/1 rewards; squared deviations are multiples
            # of 2^-12 below 2^9: 21 bits), so the two sides differ only by a few roundings of
            # values up to 8 (~1e-6) and the whitening's eps (1e-8 / (2 var) <= 3.3e-7 relative).
            assert torch.allclose(whitened, (raw - raw.mean()) / raw.std(), atol=1e-4)
        advantages, metrics, skip = guard_advantages(final, whitened, mask, ppo)
        assert (skip is not None) == skipped and metrics["stats/update_skipped"] == float(skipped), rewarded
        assert float(advantages.abs().max()) <= 4.0
    # One rewarded response in 64: whitening alone gives it ~7.9 on every token.
    one = torch.zeros(64)
    one[0] = 1.0
    whitened = SOLUTION.compute_gae_advantages(one, torch.zeros(64, 5), torch.zeros(64, 5), mask, 1.0, 1.0)[0]
    assert 7.8 < float(whitened[0, 0]) < 8.0
    assert guard_advantages(one, whitened, mask, ppo)[1]["stats/advantage_clipfrac"] == pytest.approx(1 / 64)
    unguarded = load_config(None).ppo  # the defaults guard nothing: the synthetic task as measured
    assert guard_advantages(torch.zeros(64), whitened, mask, unguarded)[2] is None
    assert torch.equal(guard_advantages(one, whitened, mask, unguarded)[0], whitened)


def test_a_run_whose_updates_are_all_skipped_leaves_the_policy_as_it_was(tmp_path):
    result = train(tiny_cfg(tmp_path, "ppo.min_reward_std=100", "train.steps=2"), SOLUTION)
    assert [m["stats/update_skipped"] for m in result.metrics] == [1.0, 1.0]
    assert not any(k.startswith("loss/") for m in result.metrics for k in m)
    cfg = tiny_cfg(tmp_path)
    fresh, _ = build_models(cfg.model, load_tokenizer(cfg.model), seed=0, device=torch.device("cpu"))
    saved = torch.load(result.output_dir / "checkpoint.pt", weights_only=False)["policy"]
    assert all(torch.equal(saved[k], v) for k, v in fresh.state_dict().items())


def test_kl_controller_fixed_and_adaptive():
    fixed = KLController(load_config(None, ["kl.coeff=0.1"]).kl)
    fixed.update(100.0, 64)
    assert fixed.value == 0.1
    ctl = KLController(load_config(None, ["kl.coeff=0.1", "kl.adaptive=true", "kl.target=1", "kl.horizon=100"]).kl)
    ctl.update(100.0, 50)  # far above target: the error is clipped to +0.2
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 50 / 100))
    ctl.update(0.5, 50)  # below target: the coefficient shrinks
    assert ctl.value < 0.1 * 1.1


# --- whole runs ---------------------------------------------------------------------------

def test_a_short_run_writes_everything(tmp_path):
    result = train(tiny_cfg(tmp_path, "train.tensorboard=true"), SOLUTION)
    out = result.output_dir
    for name in ("config.yaml", "run.json", "metrics.jsonl", "eval.jsonl", "samples.jsonl", "checkpoint.pt",
                 "reward_curve.png", "eval_samples/step_0.jsonl", "eval_samples/step_3.jsonl"):
        assert (out / name).is_file(), name
    assert any((out / "tb").iterdir())
    assert [m["step"] for m in result.metrics] == [1, 2, 3] and [e["step"] for e in result.evals] == [0, 3]
    keys = set(result.metrics[0])
    assert {"rollout/reward_mean", "loss/policy", "loss/value", "stats/approx_kl", "stats/grad_norm",
            "rollout/kl", "time/rollout", "stats/approx_kl_first", "stats/policy_clipfrac_first"} <= keys
    assert all(k == "step" or "/" in k for k in keys)
    records = read_jsonl(out / "eval_samples" / "step_3.jsonl")
    assert len(records) == 8 and all(set(r) == {"question", "reference", "response", "answer", "correct", "marker",
                                                "length", "finished"} for r in records)
    assert result.evals[-1]["eval/correct"] == sum(r["correct"] for r in records)
    runs = json.loads((out / "run.json").read_text())
    assert [r["status"] for r in runs] == ["finished"] and runs[0]["step"] == 3 and result.status == FINISHED
    assert runs[0]["seconds"] >= runs[0]["train_seconds"] + runs[0]["eval_seconds"] > 0
    with pytest.raises(RunDirError, match="--resume"):
        train(tiny_cfg(tmp_path), SOLUTION)


def test_a_gsm8k_run_on_the_committed_sample(tmp_path):
    """The GSM8K path end to end (problems drawn from the train split, graded on the test
    split), with the tiny synthetic model: it reads GSM8K text as unknown tokens, which is enough."""
    result = train(tiny_cfg(tmp_path, "data.task=gsm8k", f"data.local_dir={GSM8K_SAMPLE}", "train.steps=1",
                            "rollout.max_prompt_tokens=32"), SOLUTION)
    assert [m["step"] for m in result.metrics] == [1] and [e["eval/n"] for e in result.evals] == [8, 8]
    assert "rollout/max_operand" not in result.metrics[0]  # the curriculum is the synthetic task's
    questions = {json.loads(line)["question"] for line in (GSM8K_SAMPLE / "train.jsonl").read_text().splitlines()}
    assert result.samples and all(sample["question"] in questions for sample in result.samples)


def test_resume_continues_a_killed_run_exactly(tmp_path):
    straight = train(tiny_cfg(tmp_path / "a", "train.steps=4"), SOLUTION)

    class Killed(Exception):
        pass

    def kill_at_3(step, metrics):
        if step == 3:  # dies after logging step 3, whose checkpoint was never written
            raise Killed

    cfg = tiny_cfg(tmp_path / "b", "train.steps=4", "train.checkpoint_every=2")
    with pytest.raises(Killed):
        train(cfg, SOLUTION, on_step=kill_at_3)
    resumed = train(cfg, SOLUTION, resume=True)
    assert [m["step"] for m in resumed.metrics] == [1, 2, 3, 4]
    for a, b in zip(straight.metrics, resumed.metrics):
        assert a["rollout/reward_mean"] == b["rollout/reward_mean"]
        assert a["loss/total"] == pytest.approx(b["loss/total"], abs=1e-6)
    assert [e["eval/accuracy"] for e in straight.evals] == [e["eval/accuracy"] for e in resumed.evals]
    statuses = [r["status"] for r in json.loads((cfg_dir(cfg) / "run.json").read_text())]
    assert statuses == ["running", "finished"]  # the killed invocation never ended


def cfg_dir(cfg):
    return Path(cfg.train.output_dir)


def test_time_limit_stops_cleanly_and_resume_matches_an_uninterrupted_run(tmp_path):
    """time_limit_s=0 stops after every PPO step and every evaluation batch (3 of 8 problems),
    including the evaluations before and after training; resuming each time until the run
    finishes gives what an uninterrupted run gives, evaluation records included."""
    extra = ("train.steps=3", "eval.batch_size=3")
    straight = train(tiny_cfg(tmp_path / "a", *extra), SOLUTION)
    cfg = tiny_cfg(tmp_path / "b", *extra, "train.time_limit_s=0")
    results = [train(cfg, SOLUTION)]
    while results[-1].status == TIME_LIMIT and len(results) < 20:
        results.append(train(cfg, SOLUTION, resume=True))
    assert [r.status for r in results[:-1]] == [TIME_LIMIT] * (len(results) - 1) and results[-1].status == FINISHED
    # 3 eval batches before, 3 steps, 3 eval batches after: each call ends after one of them.
    assert [r.step for r in results] == [0, 0, 1, 2, 3, 3, 3]
    resumed = results[-1]
    assert [m["step"] for m in resumed.metrics] == [1, 2, 3]
    for a, b in zip(straight.metrics, resumed.metrics):
        assert a["rollout/reward_mean"] == b["rollout/reward_mean"] and a["rollout/kl"] == pytest.approx(b["rollout/kl"], abs=1e-6)
        assert a["loss/total"] == pytest.approx(b["loss/total"], abs=1e-6)
    assert [{k: v for k, v in e.items()} for e in straight.evals] == resumed.evals
    for step in (0, 3):
        name = f"eval_samples/step_{step}.jsonl"
        assert read_jsonl(straight.output_dir / name) == read_jsonl(resumed.output_dir / name)
    runs = json.loads((resumed.output_dir / "run.json").read_text())
    assert [r["status"] for r in runs] == [TIME_LIMIT] * 6 + [FINISHED] and all("seconds" in r for r in runs)


def test_a_crash_in_the_last_evaluation_costs_no_training(tmp_path, monkeypatch):
    """The last step saves before it evaluates: after, say, an out-of-memory error in the final
    evaluation, --resume only evaluates."""
    real = loop.evaluate_batches

    def out_of_memory_after_training(policy, tokenizer, problems, cfg):
        if (Path(cfg.train.output_dir) / "metrics.jsonl").read_text().count("\n") == cfg.train.steps:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(policy, tokenizer, problems, cfg)

    cfg = tiny_cfg(tmp_path)
    monkeypatch.setattr(loop, "evaluate_batches", out_of_memory_after_training)
    with pytest.raises(torch.OutOfMemoryError):
        train(cfg, SOLUTION)
    monkeypatch.setattr(loop, "evaluate_batches", real)
    resumed = train(cfg, SOLUTION, resume=True)
    assert [m["step"] for m in resumed.metrics] == [1, 2, 3] and [e["step"] for e in resumed.evals] == [0, 3]
    assert json.loads((cfg_dir(cfg) / "run.json").read_text())[-1].get("train_seconds") is None  # no step re-run


def test_cli_time_limit_exits_0_and_says_how_to_resume(capsys, tmp_path):
    run = tmp_path / "run"
    argv = ["--impl", str(REFERENCE), *TINY, f"train.output_dir={run}", "train.time_limit_s=0", "eval.size=0"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "status: time_limit: stopped after step 1" in out and f"ppo-train --resume {run}" in out
    assert cli.main(["--resume", str(run), "train.time_limit_s=null"]) == 0
    assert "status: finished (3 PPO steps)" in capsys.readouterr().out


def test_prompt_template_keeps_braces_other_than_the_question():
    data = DataConfig(prompt_template="{question} Put it in \\boxed{}.")
    assert render_prompts(load_tokenizer(load_config().model), ["What is 1 + 2?"], data) == [
        "<|user|>What is 1 + 2? Put it in \\boxed{}.<|assistant|>"]


def test_static_cache_generates_what_the_dynamic_cache_generates(rollout_setup):
    cfg, tok, policy, rollout = rollout_setup
    prompts = render_prompts(tok, ["What is 1 + 2?", "What is 40 + 4?"], cfg.data)
    static = load_config(None, TINY + ["rollout.max_new_tokens=6", "rollout.cache_implementation=static"]).rollout
    dynamic = load_config(None, TINY + ["rollout.max_new_tokens=6"]).rollout
    expected = sample(policy, tok, prompts, dynamic, greedy=True)
    margin, tolerance = greedy_margin(policy, expected)
    assert margin > 2 * tolerance, (margin, tolerance)  # measured 94x tolerance: the tokens cannot differ
    assert torch.equal(sample(policy, tok, prompts, static, greedy=True).response_ids, expected.response_ids)


# --- CLI errors -----------------------------------------------------------------------------

def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    return code, capsys.readouterr().err


def test_cli_bad_key_is_one_line_with_a_suggestion(capsys):
    code, err = run_cli(capsys, "ppo.lrr=1")
    assert code == 2 and "did you mean 'ppo.lr'" in err and "Traceback" not in err


def test_cli_missing_model_file(capsys, tmp_path):
    code, err = run_cli(capsys, "--impl", str(REFERENCE), f"model.name={tmp_path}", "model.gguf_file=m.gguf",
                        f"train.output_dir={tmp_path / 'run'}")
    assert code == 2 and "GGUF model file not found" in err


def test_cli_malformed_data(capsys, tmp_path):
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n{oops\n')
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    code, err = run_cli(capsys, "--impl", str(REFERENCE), "data.task=gsm8k", f"data.local_dir={tmp_path}",
                        f"train.output_dir={tmp_path / 'run'}")
    assert code == 2 and "train.jsonl:2: not valid JSON" in err


def test_cli_submission_that_fails_to_import(capsys, tmp_path):
    bad = tmp_path / "sub.py"
    bad.write_text("import torch\nraise RuntimeError('boom')\n")
    code, err = run_cli(capsys, "--impl", str(bad))
    assert code == 2 and "failed to import: RuntimeError: boom" in err
    with pytest.raises(ImplError, match="no such file"):
        load_impl(str(tmp_path / "missing.py"))


def test_cli_unimplemented_exercise_says_where_to_fill_it_in(capsys, tmp_path):
    code, err = run_cli(capsys, *TINY, f"train.output_dir={tmp_path / 'run'}")  # the blank assignment
    assert code == 2 and "Exercise 4 (compute_gae_advantages) is not implemented yet" in err
    assert "Fill it in in assignment/exercises.py" in err and "solutions" not in err


def test_impl_loaded_by_path_is_a_fresh_module(tmp_path):
    path = tmp_path / "copy.py"
    path.write_text(open(SOLUTION.__file__).read())
    module = load_impl(str(path))
    assert module is not SOLUTION and module.ppo_minibatch_update is not SOLUTION.ppo_minibatch_update
    assert load_impl(str(path)) is not module  # the same file twice: two modules, no shared state


def test_load_module_registers_a_fresh_name_and_cleans_up_a_failure(tmp_path):
    good = tmp_path / "good.py"
    good.write_text("import sys\nNAME_SEEN = __name__ in sys.modules\n")
    first, second = load_module(good), load_module(good)
    assert first.__name__ != second.__name__ and first.NAME_SEEN and sys.modules[first.__name__] is first
    assert load_module(good, name="_test_named_module").__name__ == "_test_named_module"
    sys.modules.pop("_test_named_module")
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nNAME = __name__\nraise ValueError('boom')\n")
    before = set(sys.modules)
    with pytest.raises(ValueError, match="boom"):  # the file's own exception, unchanged
        load_module(bad)
    assert set(sys.modules) == before


# --- GGUF quantization flags ----------------------------------------------------------------

def test_clear_quantization_flags_on_a_flagged_model():
    """The flags as transformers' quantizer sets them on load (HfQuantizer.preprocess_model),
    set here by hand on a tiny model."""
    from transformers import GgufConfig
    from transformers.quantizers.quantizer_gguf import GgufHfQuantizer

    lm = tiny_llama()
    lm.config.quantization_config = GgufConfig()
    lm.hf_quantizer = GgufHfQuantizer(lm.config.quantization_config)
    lm.is_quantized, lm.quantization_method = True, "gguf"
    lm.model.config._is_quantized = True
    clear_quantization_flags(lm)
    assert getattr(lm, "hf_quantizer", None) is None and not lm.is_quantized
    assert not hasattr(lm, "quantization_method") and not lm.model.config._is_quantized
    assert not hasattr(lm.config, "quantization_config") and "quantization_config" not in lm.config.to_dict()


def test_resume_keeps_the_impl_the_run_started_with(tmp_path):
    import json

    from assignment.trainer.cli import _impl_of_run

    (tmp_path / "run.json").write_text(json.dumps([{"command": "ppo-train --config c.yaml --impl ref/exercises.py"},
                                                   {"command": "ppo-train --resume r"}]))
    assert _impl_of_run(tmp_path) == "ref/exercises.py"
    (tmp_path / "run.json").write_text(json.dumps([{"command": "ppo-train --config c.yaml"}]))
    assert _impl_of_run(tmp_path) is None
    assert _impl_of_run(tmp_path / "missing") is None


def test_the_rollout_benchmark_runs_every_variant_on_cpu(tmp_path):
    """benchmarks/rollout_speed.py falls back cleanly on CPU, where nothing compiles. Its
    numbers are not checked here: speed is measured by running it, not by timed tests."""
    bench = load_module(Path(__file__).resolve().parents[1] / "benchmarks" / "rollout_speed.py", "rollout_speed")
    out = tmp_path / "performance.md"
    config = Path(__file__).resolve().parents[1] / "configs" / "cpu_synthetic.yaml"
    assert bench.main(["--config", str(config), "--repeats", "1", "--out", str(out),
                       "rollout.batch_size=8", "ppo.minibatch_size=4", "train.cpu_threads=1"]) == 0
    text = out.read_text()
    assert all(f"| {name} |" in text for name in bench.VARIANTS)


def test_the_ppo_step_benchmark_times_the_trainers_steps_on_cpu(tmp_path):
    """benchmarks/ppo_step.py runs the trainer for a few steps with its timers in place and writes
    its tables; on CPU the numbers mean nothing and are not checked, only that every part ran."""
    bench = load_module(Path(__file__).resolve().parents[1] / "benchmarks" / "ppo_step.py", "ppo_step")
    config = Path(__file__).resolve().parents[1] / "configs" / "cpu_synthetic.yaml"
    result, out, host = tmp_path / "run.json", tmp_path / "ppo_step.md", tmp_path / "host.txt"
    assert bench.main(["--config", str(config), "--steps", "2", "--label", "cpu", "--json", str(result),
                       "--output-dir", str(tmp_path / "run"), "--host-profile", str(host), "rollout.batch_size=8",
                       "ppo.minibatch_size=4", "train.cpu_threads=1", "train.progress=false"]) == 0
    steps = json.loads(result.read_text())["steps"]
    assert [row["step"] for row in steps] == [1, 2]
    assert all(row["generate_s"] > 0 and row["policy_forward_s"] > 0 and row["reference_forward_s"] > 0
               and 0 < row["update_real_tokens"] <= row["update_columns"] for row in steps)
    # the last update's host profile: cProfile's tables, exercise 5 among the functions
    assert steps[1]["update_split"] == {"host_profile": str(host)} and "update_split" not in steps[0]
    assert "function calls" in host.read_text() and "ppo_update" in host.read_text()
    with pytest.raises(SystemExit):  # the two profilers distort each other: one at a time
        bench.main(["--config", str(config), "--json", str(result), "--profile-update", "--host-profile", str(host)])
    assert not (tmp_path / "run" / "checkpoint.pt").exists()  # stopped before the last step's checkpoint
    assert bench.main(["--report", str(result), str(result), "--out", str(out)]) == 0
    assert "| cpu |" in out.read_text() and "real-token MFU" in out.read_text()


# --- the CPU demo shows exercise-5 bugs ---------------------------------------------------------

DEMO = Path(__file__).resolve().parent.parent / "configs" / "cpu_synthetic.yaml"


def demo_output(tmp_path, impl, capsys, steps=3) -> str:
    """What the CPU demo prints in its first ``steps`` steps with ``impl``'s exercises."""
    capsys.readouterr()
    cfg = load_config(DEMO, [f"train.steps={steps}", "eval.every=0", "train.progress=false",
                             f"train.output_dir={tmp_path / 'run'}"])
    assert cfg.rollout.temperature != 1.0 and cfg.ppo.grad_accum_steps > 1  # what makes the bugs show
    train(cfg, impl)
    return capsys.readouterr().out


def test_the_demo_warns_of_a_forgotten_temperature_a_wrong_slice_and_a_clip_test_counting_ties(tmp_path, capsys):
    """The demo's temperature is not 1, so an update that forgets it computes other log-probs than the
    rollout; a slice one position late too. Each shows in the printed output at the first step, with
    the likely causes, and no clip-test warning (their clip fraction is the same misalignment). A clip
    test with >= clips every token at ratio 1 while approx_kl_first is 0: its warning names the clip
    test, not the slice. The solution prints no warning."""
    import corpus

    assert "WARNING" not in demo_output(tmp_path / "solution", SOLUTION, capsys)
    files = {}
    for name, variant in (("slice", "update_slice_off_by_one"), ("clip test", "policy_clipfrac_ge")):
        files[name] = tmp_path / f"{variant}.py"
        files[name].write_text(corpus.render(corpus.by_name(variant)))
    for name, impl in (("temperature", WrongTemperature), ("slice", load_impl(str(files["slice"])))):
        out = demo_output(tmp_path / name, impl, capsys)
        warnings = [line for line in out.splitlines() if "WARNING" in line]
        assert len(warnings) == 1 and warnings[0].startswith("[step 1] WARNING: stats/approx_kl_first"), (name, out)
        assert all(cause in warnings[0] for cause in ("slice", "temperature", "dropout")), warnings[0]
    out = demo_output(tmp_path / "clip", load_impl(str(files["clip test"])), capsys, steps=1)
    (warning,) = [line for line in out.splitlines() if "WARNING" in line]
    assert warning.startswith("[step 1] WARNING: stats/policy_clipfrac_first = 1,"), out
    assert "clip test counts ties" in warning and "strict >" in warning and "slice and the temperature are right" in warning


def test_the_update_minibatch_benchmark_runs_on_cpu(tmp_path):
    """benchmarks/update_minibatch.py on the CPU with its tiny shape: every variant and the report
    (its figures mean nothing there; the GPU run is in reports/performance/small_cards/)."""
    bench = load_module(Path(__file__).resolve().parents[1] / "benchmarks" / "update_minibatch.py", "update_minibatch")
    out = tmp_path / "update.md"
    assert bench.main(["--shape", "tiny", "--device", "cpu", "--sizes", "16", "32", "--compile", "off", "--repeat", "1",
                       "--scoring", "16:none", "16:64", "--scoring-rows", "16", "--md", str(out)]) == 0
    text = out.read_text()
    assert "| eager | 16 |" in text and "| eager | 32 |" in text and "64 tokens at a time" in text


def test_the_garbage_collector_runs_only_at_each_step_start_and_is_restored(tmp_path, monkeypatch):
    """Data-parallel, a collection that pauses one process stalls all of them at the next
    collective: during the steps the collector is off, and each step starts with one full
    collection (timed with its rollout); afterwards it is on again with nothing left frozen."""
    seen, collections = [], []
    real_collect = loop.collect_garbage
    monkeypatch.setattr(loop, "collect_garbage", lambda: collections.append(loop.gc.get_count()) or real_collect())
    cfg = tiny_cfg(tmp_path, "train.steps=3", "eval.size=0")
    train(cfg, SOLUTION, on_step=lambda step, metrics: seen.append((step, loop.gc.isenabled(), loop.gc.get_freeze_count())))
    assert [(step, enabled) for step, enabled, _ in seen] == [(1, False), (2, False), (3, False)]
    assert len(collections) == 3 and all(frozen > 0 for *_, frozen in seen)
    assert loop.gc.isenabled() and loop.gc.get_freeze_count() == 0
    real_collect()  # outside the steps: the collector's own schedule, nothing frozen
    assert loop.gc.get_freeze_count() == 0


def test_adamw_leaves_the_implementation_to_torch_on_cpu():
    """On CPU (as for FSDP's DTensors) torch picks its implementation: fused=None, never False,
    which torch reads as the slow per-tensor loop. (The fused branch needs CUDA: not tested here.)"""
    policy = PolicyWithValueHead(tiny_llama(vocab_size=16, hidden_size=8, num_layers=1))
    optimizer = loop.build_optimizer(policy, load_config(None, []).ppo)
    assert optimizer.defaults["fused"] is None


def test_running_out_of_gpu_memory_is_a_message_with_the_way_out_not_a_traceback(tmp_path, monkeypatch, capsys):
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 260.00 MiB. GPU 0 has a total capacity "
                                     "of 139.80 GiB of which 137.06 MiB is free.\nmore detail")
    monkeypatch.setattr(cli, "train", out_of_memory)
    assert cli.main(["--config", "configs/cpu_synthetic.yaml", "--impl", str(REFERENCE),
                     f"train.output_dir={tmp_path / 'run'}"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("ppo-train: out of GPU memory: CUDA out of memory. Tried to allocate 260.00 MiB.")
    assert "configs/gsm8k_qwen_coder_16gb.yaml" in err and "configs/accelerate/fsdp.yaml" in err
    assert "Traceback" not in err and "more detail" not in err


def test_a_longer_runs_first_steps_are_the_shorter_runs(tmp_path):
    """configs/gsm8k_qwen_coder_96steps.yaml reads its step-48 evaluation as the 48-step recipe's
    result: with a constant learning rate after the warmup and a fixed KL coefficient, nothing
    before step N depends on train.steps. A 2-step run against a 4-step run evaluated at step 2:
    the same metrics for steps 1-2 (times and memory aside) and the same step-2 evaluation. A
    linear schedule decays by train.steps and breaks it: that case shows the comparison can fail."""
    def run(name, steps, *extra):
        cfg = tiny_cfg(tmp_path / name, "ppo.lr=1e-3", "ppo.warmup_steps=1", "eval.size=4", f"train.steps={steps}",
                       "eval.every=2", *extra)
        train(cfg, SOLUTION)
        metrics = [{k: v for k, v in m.items() if not k.startswith(("time/", "memory/"))}
                   for m in read_jsonl(tmp_path / name / "run" / "metrics.jsonl")[:2]]
        evaluation = [(r["response"], r["correct"]) for r in read_jsonl(tmp_path / name / "run" / "eval_samples" / "step_2.jsonl")]
        return metrics, evaluation

    assert run("short", 2) == run("long", 4)
    assert run("short_linear", 2, "ppo.lr_scheduler=linear")[0] != run("long_linear", 4, "ppo.lr_scheduler=linear")[0]
