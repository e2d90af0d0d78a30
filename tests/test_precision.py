"""16-bit training with float32 master weights (model.train_dtype, assignment/trainer/precision.py),
the sampler's own log-probs and the mismatch metrics (rollout.SampledLogprobs, ppo.sampler_mismatch),
and the first-ratio check of a 16-bit policy (ppo.first_kl_tolerance's sampler_gap branch). All on
the CPU, where bfloat16 and float16 both compute."""

import dataclasses
import functools
import math
import types

import pytest
import torch

from assignment.model import PolicyWithValueHead, tiny_llama
from assignment.trainer import checkpoint, loop
from assignment.trainer import precision as precision_module
from assignment.trainer.config import ConfigError, PPOConfig, load_config
from assignment.trainer.impl import load_impl
from assignment.trainer.loading import build_models, load_tokenizer
from assignment.trainer.loop import FINISHED, TIME_LIMIT, train
from assignment.trainer.ppo import (FAR_RATIO, UpdateConfig, first_clipfrac_tolerance, first_kl_tolerance, ppo_update,
                                    sampler_mismatch)
from assignment.trainer.precision import LossScaler, MixedPrecision, cudnn_attention_safe, working_copy
from assignment.trainer.rollout import SampledLogprobs, generation_copy, render_prompts, response_forward, sample
from assignment.trainer.runlog import read_jsonl

from test_trainer import SOLUTION, TINY, WrongTemperature, first_kl_tolerances, tiny_cfg

# What exercise 5 reads from its cfg (the contract); a temperature other than 1 so that it matters.
UPDATE = UpdateConfig(temperature=0.7, clip_ratio=0.2, clip_range_value=0.2, vf_coeff=0.5, entropy_coeff=0.02,
                      grad_accum_steps=1, max_grad_norm=1.0)
VOCAB = 40


def hand_batch(rows: int = 4, P: int = 3, T: int = 5, seed: int = 0) -> dict:
    """A minibatch of the contract (handout.md section 4, exercise 5), by hand: input_ids and
    attention_mask (rows, P+T), row 0's prompt left-padded by one token; response_ids,
    response_mask, logprobs_old (uniform: -log VOCAB), values_old (0), advantages and returns
    (random) all (rows, T), row 1's response ending after 3 tokens; prompt_length P."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (rows, P + T), generator=g)
    response_mask = torch.ones(rows, T, dtype=torch.bool)
    response_mask[1, 3:] = False
    attention_mask = torch.cat([torch.ones(rows, P, dtype=torch.long), response_mask.long()], dim=1)
    attention_mask[0, 0] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_ids": input_ids[:, P:],
            "response_mask": response_mask, "logprobs_old": torch.full((rows, T), -math.log(VOCAB)),
            "values_old": torch.zeros(rows, T), "advantages": torch.randn(rows, T, generator=g),
            "returns": torch.randn(rows, T, generator=g), "prompt_length": P}


def small_policy(num_layers: int = 1, hidden_size: int = 32) -> PolicyWithValueHead:
    """A float32 tiny Llama (VOCAB tokens) with its value head: the masters."""
    return PolicyWithValueHead(tiny_llama(vocab_size=VOCAB, hidden_size=hidden_size, num_layers=num_layers, seed=0))


def masters_and_state(policy: PolicyWithValueHead, optimizer: torch.optim.Optimizer) -> list:
    """A copy of every master weight and of its optimizer state (tensors cloned), to compare later."""
    def copied(value):
        return value.detach().clone() if torch.is_tensor(value) else value
    return [(param.detach().clone(), {key: copied(value) for key, value in optimizer.state.get(param, {}).items()})
            for param in policy.parameters()]


def same(a: list, b: list) -> bool:
    """``masters_and_state`` snapshots equal bit for bit."""
    def equal(x, y):
        return torch.equal(x, y) if torch.is_tensor(x) else x == y
    return all(torch.equal(pa, pb) and sa.keys() == sb.keys() and all(equal(sa[k], sb[k]) for k in sa)
               for (pa, sa), (pb, sb) in zip(a, b, strict=True))


# --- 1. the loss scale ------------------------------------------------------------------------

def test_the_loss_scale_halves_on_overflow_and_doubles_after_its_growth_interval():
    # torch.amp.GradScaler's defaults: 2^16 at first, doubled after 2000 clean steps in a row
    assert (LossScaler().scale, LossScaler().growth_interval, LossScaler().clean) == (2.0 ** 16, 2000, 0)
    scaler = LossScaler(scale=8.0, growth_interval=3)
    scaler.update(False)
    scaler.update(False)
    assert (scaler.scale, scaler.clean) == (8.0, 2)
    scaler.update(True)  # an overflow halves the scale and starts the clean count again
    assert (scaler.scale, scaler.clean) == (4.0, 0)
    scaler.update(False)
    scaler.update(False)
    assert (scaler.scale, scaler.clean) == (4.0, 2)  # two clean steps after the overflow: not yet three
    scaler.update(False)
    assert (scaler.scale, scaler.clean) == (8.0, 0)
    scaler.update(False)
    # The state round trip: a fresh scaler loaded from it doubles at the same step as the original.
    restored = LossScaler()
    restored.load_state_dict(scaler.state_dict())
    assert restored.state_dict() == scaler.state_dict() == {"scale": 8.0, "clean": 1}
    restored.growth_interval = scaler.growth_interval  # a setting (the config's), not part of the state
    for _ in range(2):
        scaler.update(False)
        restored.update(False)
    assert restored.state_dict() == scaler.state_dict() == {"scale": 16.0, "clean": 0}


# --- 2. float16 with loss scaling -------------------------------------------------------------

def test_loss_scaling_changes_no_gradient_and_a_clean_step_updates_the_working_copy():
    """Without overflow the scale changes nothing: exercise 5's float32 master gradients are the
    same bits at two scales; the optimizer steps and the float16 working copy is the masters, cast."""
    # No decoder layer: embedding, final norm, LM head and value head. Bit-equality needs scales at
    # which no float16 value of the backward is subnormal (there rounding is absolute, not
    # relative) and none overflows. A decoder layer's backward spans more binades (measured at
    # 2^16: one layer of hidden 32 computes ~350 subnormal float16 values, no layer 2), so its
    # window of equal bits is narrow and depends on the batch: 2^11 to 2^17 for this one, none
    # from 2^6 to 2^18 for the same batch with logprobs_old = -3. Without one it is wide: the same
    # bits at every scale from 2^7 to 2^17, overflow at 2^18 (measured).
    policy = small_policy(num_layers=0)
    model = MixedPrecision(policy, torch.float16)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    model.attach(optimizer)
    batch = hand_batch()

    def master_gradients(scale: float) -> list[torch.Tensor]:
        model.scaler.scale = scale
        optimizer.zero_grad(set_to_none=True)
        SOLUTION.ppo_minibatch_update(model, optimizer, batch, UPDATE, step_optimizer=False)
        return [param.grad.clone() for param in policy.parameters()]

    # Multiplying by 2^k and dividing by 2^k change only the exponent of a binary float: exact for
    # every value that stays normal (neither subnormal nor overflowing) in float16, and every
    # float16 product or sum of the backward is the unscaled one times 2^k, rounded alike. So
    # the gradients at 2^10 and 2^14, three binades inside each end of the window above, agree bit
    # for bit.
    low, high = master_gradients(2.0 ** 10), master_gradients(2.0 ** 14)
    assert all(grad.dtype == torch.float32 and bool(grad.isfinite().all()) and bool(grad.any()) for grad in high)
    assert all(torch.equal(a, b) for a, b in zip(low, high, strict=True))
    # The comparison can fail: unscaled (scale 1) the float16 backward underflows, and the bits differ.
    assert not all(torch.equal(a, b) for a, b in zip(master_gradients(1.0), high, strict=True))

    before = [param.detach().clone() for param in policy.parameters()]
    model.scaler.scale = 2.0 ** 14
    optimizer.zero_grad(set_to_none=True)
    metrics = SOLUTION.ppo_minibatch_update(model, optimizer, batch, UPDATE, step_optimizer=True)
    model.end_cycle()
    assert math.isfinite(metrics["stats/grad_norm"])
    assert all(float(optimizer.state[param]["step"]) == 1 for param in policy.parameters())  # the step was taken
    assert any(not torch.equal(b, param) for b, param in zip(before, policy.parameters()))
    # the optimizer's post-step hook copied the masters into the working copy: float16 LM, float32 value head
    assert {work.dtype for work, _ in model.pairs} == {torch.float16, torch.float32}
    assert all(torch.equal(work, master.detach().to(work.dtype)) for work, master in model.pairs)
    assert (model.scaler.scale, model.scaler.clean) == (2.0 ** 14, 1)  # one clean step of 2000 before it doubles
    assert model.metrics() == {"stats/skipped_steps": 0.0, "stats/loss_scale": 2.0 ** 14}


@pytest.mark.parametrize("optimizer_name", ["adamw", "adamw_8bit"])
def test_an_overflowing_step_is_skipped_and_halves_the_scale(optimizer_name):
    """An exercise 5 that steps without looking at the norm (a student's): at a scale where float16
    overflows, the optimizer's pre-step hook finds the non-finite master gradients and clears them,
    so the step changes no weight and no optimizer state. For both optimizers the profiles use
    (bitsandbytes' AdamW8bit must call torch's step hooks too). Hidden 64: the MLP's matrices
    (64 x 128 = 8192 elements) get 8-bit state (bitsandbytes keeps tensors under 4096 at 32 bits)."""
    policy = small_policy(hidden_size=64)
    model = MixedPrecision(policy, torch.float16)
    optimizer = loop.build_optimizer(policy, dataclasses.replace(PPOConfig(), optimizer=optimizer_name, lr=1e-3))
    finite = []  # registered before attach, so it runs first: were the gradients the step met finite?
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: finite.append(
        all(bool(p.grad.isfinite().all()) for p in policy.parameters() if p.grad is not None)))
    model.attach(optimizer)
    batch = hand_batch()

    def unchecked_update(scale: float) -> None:
        model.scaler.scale = scale
        SOLUTION.ppo_minibatch_update(model, optimizer, batch, UPDATE, step_optimizer=False)
        optimizer.step()
        optimizer.zero_grad()
        model.end_cycle()

    unchecked_update(2.0 ** 10)  # a clean step first, so that the optimizer has a state to keep
    assert model.metrics() == {"stats/skipped_steps": 0.0, "stats/loss_scale": 2.0 ** 10}
    clean = masters_and_state(policy, optimizer)
    assert all(state for _, state in clean)
    working = [work.detach().clone() for work, _ in model.pairs]
    # 2^40 times any gradient above 6e-8 passes float16's largest value, 65504: inf.
    unchecked_update(2.0 ** 40)
    assert finite == [True, False]  # the step met overflowed gradients...
    assert same(masters_and_state(policy, optimizer), clean)  # ...and changed no weight nor state
    assert all(torch.equal(work, before) for (work, _), before in zip(model.pairs, working, strict=True))
    assert all(param.grad is None for param in policy.parameters())
    assert (model.scaler.scale, model.scaler.clean) == (2.0 ** 39, 0)
    assert model.metrics() == {"stats/skipped_steps": 1.0, "stats/loss_scale": 2.0 ** 39}
    assert model.metrics()["stats/skipped_steps"] == 0.0  # counted since the last metrics()


def test_exercise_5s_own_finite_norm_check_counts_as_a_skipped_step():
    """ppo_update under float16: at 2^40 every cycle overflows, the solution's exercise 5 sees the
    non-finite norm and never calls optimizer.step (the contract), and ppo_update's end_cycle
    counts each such cycle as skipped and halves the scale: 2 epochs x 2 minibatches = 4 cycles."""
    cfg = load_config(None, TINY)  # batch 8, minibatches of 4, 2 epochs, a step per minibatch
    policy = small_policy()
    model = MixedPrecision(policy, torch.float16)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    steps = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: steps.append(1))
    model.attach(optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    batch = hand_batch(rows=8)

    model.scaler.scale = 2.0 ** 10  # first the contrast: no overflow, 4 steps taken, none skipped
    metrics = ppo_update(SOLUTION, model, optimizer, scheduler, batch, cfg, torch.Generator().manual_seed(0))
    assert len(steps) == 4 and metrics["stats/skipped_steps"] == 0.0 and metrics["stats/loss_scale"] == 2.0 ** 10
    assert model.non_finite == []
    before = masters_and_state(policy, optimizer)

    model.scaler.scale = 2.0 ** 40
    metrics = ppo_update(SOLUTION, model, optimizer, scheduler, batch, cfg, torch.Generator().manual_seed(0))
    assert len(steps) == 4  # exercise 5 called no step: the skip is end_cycle's "not stepped"
    assert not math.isfinite(metrics["stats/grad_norm"])
    assert metrics["stats/skipped_steps"] == 4.0 and metrics["stats/loss_scale"] == 2.0 ** 36
    assert same(masters_and_state(policy, optimizer), before)
    # where it overflowed, by name, though the optimizer never saw it (the trainer prints them once a step)
    names = [name for name, _ in policy.named_parameters()]
    assert model.non_finite and set(model.non_finite) <= set(names)


def test_an_overflow_in_an_earlier_backward_of_the_cycle_skips_its_step(monkeypatch):
    """The finite test runs once a backward, on the masters' float32 sums: an overflow in the
    first minibatch's backward, then a clean second one, and an exercise 5 that steps without
    looking at the norm: the optimizer's pre-step hook still skips the step, on the flag the
    first backward set, and names exactly the parameters whose gradient was not finite."""
    policy = small_policy()
    model = MixedPrecision(policy, torch.float16)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    met = []  # registered before attach, so it runs first: which master gradients the step met non-finite
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: met.append(
        {name for name, p in policy.named_parameters() if p.grad is not None and not bool(p.grad.isfinite().all())}))
    model.attach(optimizer)
    checks = []
    check = model._check_finite
    monkeypatch.setattr(model, "_check_finite", lambda: (checks.append(1), check()))
    batch = hand_batch()

    def backward(scale: float) -> None:
        model.scaler.scale = scale
        SOLUTION.ppo_minibatch_update(model, optimizer, batch, UPDATE, step_optimizer=False)

    backward(2.0 ** 10)  # a clean cycle first, so that the optimizer has a state to keep
    optimizer.step()
    optimizer.zero_grad()
    model.end_cycle()
    assert checks == [1] and met == [set()] and model.metrics()["stats/skipped_steps"] == 0.0
    before = masters_and_state(policy, optimizer)

    backward(2.0 ** 40)  # inf in the first backward...
    assert checks == [1, 1] and not bool(model.finite.all())
    backward(2.0 ** 10)  # ...then a clean one: the inf stays in the sums
    assert checks == [1, 1, 1]  # one test a backward, not one a gradient
    optimizer.step()
    optimizer.zero_grad()
    model.end_cycle()
    assert met[-1] and set(model.non_finite) == met[-1]
    assert same(masters_and_state(policy, optimizer), before)
    assert model.metrics()["stats/skipped_steps"] == 1.0


def test_a_backward_that_raised_does_not_stop_the_next_one_s_test():
    """A backward that raises after queueing its finite test (an out-of-memory error, caught by a
    notebook that carries on) never runs the test; the next forward's backward must still test,
    so that an overflowing step is skipped rather than written into the masters."""
    policy = small_policy()
    model = MixedPrecision(policy, torch.float16)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    model.attach(optimizer)
    batch = hand_batch()

    def out_of_memory(grad: torch.Tensor) -> None:
        raise RuntimeError("CUDA out of memory (simulated)")

    def raise_in_backward(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
        out.register_hook(out_of_memory)

    # the embeddings' output is the last the backward reaches, after the scaled logits queued the test
    handle = model.working.lm.get_input_embeddings().register_forward_hook(raise_in_backward)
    logits, values = model(batch["input_ids"], batch["attention_mask"])
    with pytest.raises(RuntimeError, match="simulated"):
        (logits.sum() + values.sum()).backward()
    handle.remove()
    optimizer.zero_grad(set_to_none=True)
    model.discard_cycle()

    before = masters_and_state(policy, optimizer)
    model.scaler.scale = 2.0 ** 40
    SOLUTION.ppo_minibatch_update(model, optimizer, batch, UPDATE, step_optimizer=False)
    optimizer.step()  # without looking at the norm
    model.end_cycle()
    assert same(masters_and_state(policy, optimizer), before)
    assert all(bool(param.isfinite().all()) for param in policy.parameters())
    assert model.metrics()["stats/skipped_steps"] == 1.0

# --- 3. the bfloat16 working copy -------------------------------------------------------------

def test_a_bfloat16_working_copy_computes_and_the_masters_are_what_the_optimizer_sees():
    policy = small_policy()
    model = MixedPrecision(policy, torch.bfloat16)
    assert model.scaler is None  # bfloat16 has float32's exponent range: nothing to scale
    # parameters() and state_dict() are the masters themselves (float32); the working copy is no submodule
    assert [id(p) for p in model.parameters()] == [id(p) for p in policy.parameters()]
    state = model.state_dict()
    assert set(state) == {f"policy.{key}" for key in policy.state_dict()}
    assert all(state[f"policy.{key}"].data_ptr() == value.data_ptr() and value.dtype == torch.float32
               for key, value in policy.state_dict().items())
    assert all(module is not model.working for module in model.modules())
    assert {p.dtype for p in model.working.lm.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.working.value_head.parameters()} == {torch.float32}

    batch = hand_batch()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    logits, values = model(ids, mask)
    assert logits.dtype == values.dtype == torch.float32 and model.working.logits_dtype == torch.float32
    with torch.no_grad():  # the cast is MixedPrecision's: the working LM's own head gives bfloat16
        assert model.working.lm(input_ids=ids, attention_mask=mask).logits.dtype == torch.bfloat16

    def loss_of(logits, values):
        return torch.log_softmax(logits, dim=-1)[..., 0].mean() + values.pow(2).mean()

    loss_of(logits, values).backward()
    assert all(work.grad is None for work in model.working.parameters())  # freed as they reached the masters
    assert all(master.grad is not None and master.grad.dtype == torch.float32 for master in policy.parameters())
    # What reached the masters is the bfloat16 backward's gradient itself, widened: a second copy
    # of the same weights, run alone, computes the same bits (the same kernels on the same shapes).
    alone = working_copy(policy, torch.bfloat16)
    alone.logits_dtype = torch.float32
    loss_of(*alone(ids, mask)).backward()
    assert all(torch.equal(master.grad, work.grad.float())
               for master, work in zip(policy.parameters(), alone.parameters(), strict=True))

    model.eval()  # train() and eval() reach the working copy (gradient checkpointing needs train mode)
    assert not any(m.training for m in [*model.modules(), *model.working.modules()])
    model.train()
    assert all(m.training for m in [*model.modules(), *model.working.modules()])
    assert model.metrics() == {"stats/skipped_steps": 0.0}  # no loss scale to report


# --- 4. the first ratio in 16 bits ------------------------------------------------------------

@pytest.fixture(scope="module")
def late_slice(tmp_path_factory):
    """Exercise 5 slicing the logits and values one position late (tests/corpus.py's mutant)."""
    import corpus

    path = tmp_path_factory.mktemp("late_slice") / "exercises.py"
    path.write_text(corpus.render(corpus.by_name("update_slice_off_by_one")))
    return load_impl(str(path))


def gap_bounds(monkeypatch) -> list[tuple[float, float]]:
    """The list that ``train`` then fills, step by step, with (the root mean square of the step's
    sampler_gap, ppo.first_kl_tolerance's worst-case bound for the same policy without it)."""
    seen = []
    inner = loop.warn_first_kl

    def spy(run, step, metrics, logprobs, sampler_gap=None):
        seen.append((float(sampler_gap.float().pow(2).mean().sqrt()),
                     first_kl_tolerance(run.scorer, float(logprobs.abs().max()))))
        return inner(run, step, metrics, logprobs, sampler_gap)

    monkeypatch.setattr(loop, "warn_first_kl", spy)
    return seen


def test_16_bit_rounding_may_clip_a_few_first_tokens_but_not_the_share_a_clip_test_counting_ties_gives(capsys):
    """In 16 bits a few of the first minibatch's tokens may leave the clip range by rounding alone (on
    the H200, bfloat16 Qwen: clip fractions 8e-4 and 2e-3 with correct code): the first clip-fraction
    warning allows first_clipfrac_tolerance's Chebyshev share, tolerance^2 / log(1 + eps)^2, and
    still names a clip test counting ties, which clips ~every token. In float32 it allows none."""
    half, full = small_policy().to(torch.bfloat16), small_policy()
    # the run's figures: rms 0.022 (stats/first_kl_tolerance), eps 0.2: 0.022^2 / log(1.2)^2 = 1.46e-2
    assert first_clipfrac_tolerance(half, 0.022, 0.2) == pytest.approx(0.022 ** 2 / math.log(1.2) ** 2, rel=1e-12)
    assert first_clipfrac_tolerance(full, 0.022, 0.2) == 0.0

    def warned(policy, clipfrac: float, first_kl: float = 1e-4) -> str:
        run = types.SimpleNamespace(scorer=policy, first_clipfrac_warned=False)
        metrics = {"stats/policy_clipfrac_first": clipfrac, "stats/approx_kl_first": first_kl,
                   "stats/first_kl_tolerance": 0.022}
        loop.warn_first_clipfrac(run, 3, metrics, 0.2)
        return capsys.readouterr().out

    assert warned(half, 2e-3) == ""  # what correct code clipped on the H200
    ties = warned(half, 0.9)
    assert ties.startswith("[step 3] WARNING: stats/policy_clipfrac_first = 0.9, not 0 (16-bit rounding explains "
                           "at most 1.5e-02)") and "clip test counts ties" in ties
    assert warned(full, 2e-3).startswith("[step 3] WARNING: stats/policy_clipfrac_first = 0.002, not 0: ")
    assert warned(half, 0.9, first_kl=0.5) == ""  # misaligned log-probs: warn_first_kl's warning


def test_a_16_bit_run_still_names_a_clip_test_counting_ties(tmp_path, capsys):
    """The whole loop in bfloat16 with exercise 1's clip test counting ties (tests/corpus.py's
    policy_clipfrac_ge): its first clip fraction is far above what rounding explains, and the
    warning is printed at step 1 (the solution's 16-bit runs print none: the test below)."""
    import corpus

    path = tmp_path / "exercises.py"
    path.write_text(corpus.render(corpus.by_name("policy_clipfrac_ge")))
    capsys.readouterr()
    train(tiny_cfg(tmp_path / "run", "model.train_dtype=bfloat16", "eval.size=0", "train.steps=1"), load_impl(str(path)))
    warnings = [line for line in capsys.readouterr().out.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and warnings[0].startswith("[step 1] WARNING: stats/policy_clipfrac_first"), warnings
    assert "16-bit rounding explains at most" in warnings[0] and "clip test counts ties" in warnings[0]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_first_ratio_of_a_16_bit_policy_is_1_within_its_rounding_and_catches_misaligned_updates(
        tmp_path, monkeypatch, capsys, late_slice, dtype):
    """model.train_dtype: the rollout's scoring forward and exercise 5's both run the 16-bit working
    copy, so the first minibatch's approx_kl reads 0 within that copy's rounding, which the bound
    measures on the step itself (the root mean square of the sampler's own log-probs minus
    logprobs_old: first_kl_tolerance, Cauchy-Schwarz). A forgotten temperature and a slice one
    position late both exceed it, and the trainer prints its warning."""
    tolerances = first_kl_tolerances(monkeypatch)
    bounds = gap_bounds(monkeypatch)
    extra = ("rollout.temperature=0.5", f"model.train_dtype={dtype}", "eval.size=0")
    capsys.readouterr()
    right = train(tiny_cfg(tmp_path / "right", *extra), SOLUTION)
    assert "WARNING" not in capsys.readouterr().out
    first_kls = [m["stats/approx_kl_first"] for m in right.metrics]
    # Measured: exactly 0 at every step, against bounds of 2e-4 to 7e-4 (bfloat16), 4e-5 to 1.1e-4 (float16).
    assert all(abs(kl) <= tol for kl, tol in zip(first_kls, tolerances, strict=True)), (first_kls, tolerances)
    # The bound is the 16-bit branch's (the gap's RMS); the worst-case formula with the 16-bit unit
    # roundoff would be silent: (17 matrices + 2 x 2 layers + 1) x 64 x u x 3.6 = 20 for bfloat16
    # (u = 2^-8), 2.5 for float16.
    assert tolerances == [rms for rms, _ in bounds] and all(0 < rms < worst for rms, worst in bounds)

    for name, impl in (("temperature", WrongTemperature), ("slice", late_slice)):
        tolerances.clear()
        bounds.clear()
        wrong = train(tiny_cfg(tmp_path / name, *extra), impl)
        first_kls = [m["stats/approx_kl_first"] for m in wrong.metrics]
        # Measured |approx_kl_first| / bound at steps 1, 2, 3: a forgotten temperature 20x, 46x, 50x
        # (bfloat16), 127x, 479x, 390x (float16); the late slice 75x, 534x, 0.8x (bfloat16), 458x,
        # 1439x, 408x (float16). Step 1 is where the warning is printed; a late slice's log-probs can
        # average out at a later step (a signed token mean), so only a forgotten temperature is
        # asserted at every step.
        checked = first_kls if impl is WrongTemperature else first_kls[:1]
        assert all(abs(kl) > tol for kl, tol in zip(checked, tolerances)), (name, first_kls, tolerances)
        # and the worst case would not have seen it: the sampler_gap branch is what catches it
        assert abs(first_kls[0]) < bounds[0][1]
        warnings = [line for line in capsys.readouterr().out.splitlines() if "WARNING: stats/approx_kl_first" in line]
        assert len(warnings) == 1 and warnings[0].startswith("[step 1]"), (name, warnings)
        assert all(cause in warnings[0] for cause in ("slice", "temperature", "dropout")), warnings[0]


# --- 5. the sampler's own log-probs and the mismatch metrics --------------------------------------

def test_the_mismatch_metrics_on_known_values():
    """log r = log pi_policy - log pi_sampler on real tokens; every value and difference below is a
    dyadic fraction, exact in float32, and 8 real tokens make the mean exact too. Padding holds
    inf and NaN, which must not reach any metric."""
    log_ratio = [[0.5, -1.0, 0.25, 2.0, 0.0], [-0.75, 0.6875, -0.6875, 1.0, 0.0]]  # (2, 5)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    sampler = torch.tensor([[-1.0, -0.5, -2.0, -3.0, math.nan], [-0.25, -1.5, -0.5, -2.0, -math.inf]])
    policy = sampler + torch.tensor(log_ratio)
    policy[0, 4], policy[1, 4] = math.inf, math.nan
    metrics = sampler_mismatch(sampler, policy, mask)
    real = [0.5, -1.0, 0.25, 2.0, -0.75, 0.6875, -0.6875, 1.0]
    assert metrics["rollout/sampler_kl"] == -sum(real) / 8 == -0.25  # the token mean of sampler - policy
    assert metrics["rollout/sampler_ratio_max"] == float(torch.tensor(2.0).exp())  # exp of the largest log r
    # far: |log r| > log 2 = 0.693; 0.6875 is just inside, -0.75, -1, 1, 2 outside: 4 of 8
    assert FAR_RATIO == 2.0 and metrics["rollout/sampler_far_share"] == 0.5
    assert sampler_mismatch(sampler, policy, torch.zeros_like(mask)) == {}  # no real token, no metric


def test_the_sampler_records_the_log_prob_of_each_token_it_sampled():
    """SampledLogprobs as generate calls it: once per decoding step with that step's raw scores
    (B, V) and the ids so far, whose last column is the token sampled at the step before."""
    temperature = 0.7
    scores = torch.randn(3, 2, 6, generator=torch.Generator().manual_seed(0))  # (steps, B, V)
    tokens = torch.tensor([[1, 4, 2], [5, 0, 3]])  # (B, steps) sampled
    prompt = torch.tensor([[9], [9]])

    def recorded(calls: int, T: int) -> torch.Tensor:
        record = SampledLogprobs(temperature)
        for step in range(calls):
            step_scores = scores[step]  # (B, V)
            ids = torch.cat([prompt, tokens[:, :step]], dim=1)  # (B, 1 + step)
            assert record(ids, step_scores) is step_scores  # passed on to the warpers as they came
        return record.logprobs(tokens[:, :T])

    expected = torch.stack([torch.log_softmax(scores[t] / temperature, dim=-1)[torch.arange(2), tokens[:, t]]
                            for t in range(3)], dim=1)  # (B, 3): the same operations, so the same bits
    assert torch.equal(recorded(calls=3, T=3), expected)
    # a decoding loop that ran one step past the last token (transformers' deferred stop check): cut
    assert torch.equal(recorded(calls=3, T=2), expected[:, :2])
    with pytest.raises(RuntimeError, match="recorded"):
        recorded(calls=1, T=3)


@pytest.fixture(scope="module")
def spread_setup():
    """(cfg, tokenizer, policy, prompts): the tiny synthetic policy with its LM head x10, and 16
    prompts. The random-init head gives near-uniform logits (max |log p| 3.6 over 25 tokens, where
    log 25 = 3.2), on which the temperature hardly matters; x10 spreads them as a trained model's
    (max |log p| 6.2)."""
    cfg = load_config(None, TINY + ["rollout.temperature=0.7", "rollout.max_new_tokens=8", "rollout.batch_size=16"])
    tok = load_tokenizer(cfg.model)
    policy, _ = build_models(cfg.model, tok, seed=0, device=torch.device("cpu"))
    with torch.no_grad():
        policy.lm.lm_head.weight.mul_(10.0)
    prompts = render_prompts(tok, [f"What is {a} + {b}?" for a in range(4) for b in range(4)], cfg.data)
    return cfg, tok, policy, prompts


def sampled_and_scored(policy, tok, prompts, rollout_cfg, temperature, sampler=None):
    """Sample (by ``sampler`` or the policy) as ``rollout_cfg`` says, then score the responses with
    the policy's forward at ``temperature``: (the sampler's own log-probs (B, T), the policy's
    (B, T), the response mask (B, T))."""
    torch.manual_seed(0)
    responses = sample(policy, tok, prompts, rollout_cfg, sampler=sampler)
    P = responses.prompt_ids.shape[1]
    input_ids = torch.cat([responses.prompt_ids, responses.response_ids], dim=1)
    attention_mask = torch.cat([responses.prompt_mask, responses.response_mask.long()], dim=1)
    with torch.no_grad():
        logprobs, _ = response_forward(policy, input_ids, attention_mask, P, temperature, chunk=64)
    return responses.sampler_logprobs, logprobs, responses.response_mask


def test_a_float32_policy_sampling_itself_records_its_own_scoring_log_probs(spread_setup):
    """sample() records, while decoding, the log-probs that the policy's scoring forward then
    computes: the same weights and tokens, at temperature 0.7 (a recorder that saw the tempered
    scores, dividing twice, or raw ones, not at all, would be off by far more)."""
    cfg, tok, policy, prompts = spread_setup
    recorded, scored, mask = sampled_and_scored(policy, tok, prompts, cfg.rollout, cfg.rollout.temperature)
    assert recorded.dtype == torch.float32 and recorded.shape == scored.shape and bool(mask.any())
    # The decoding step (KV cache, one column at a time) and the scoring forward (whole sequences,
    # in chunks by length) sum the same terms in other orders. Each sum of n terms in float32 is
    # off by at most n * u of the sum of their magnitudes, u = 2^-24 (Higham, sec. 3.1); a
    # log-prob passes through one sum per weight matrix, two per layer's attention and the
    # log-sum-exp, each of at most n = the largest weight dimension terms, on values of at most
    # max |log p|: first_kl_tolerance's chain * n * u * max(|log p|, 1), per token. Measured:
    # at most 1.4e-6 against a bound of 5.2e-4.
    tolerance = first_kl_tolerance(policy, float(scored[mask].abs().max()))
    assert float((recorded - scored)[mask].abs().max()) <= tolerance


def test_the_mismatch_metrics_tell_a_bfloat16_sampler_from_one_at_another_temperature(spread_setup):
    """A bfloat16 copy of the policy (rollout.generation_copy) samples from almost the policy's
    distribution: its log-probs differ by the copy's rounding, clearly above float32's but never
    by a factor of 2. A sampler at temperature 1 scored at 0.5 samples from another one: its
    sampler_kl is above the largest bfloat16 difference of any single token, and many tokens are far."""
    cfg, tok, policy, prompts = spread_setup
    copy = generation_copy(policy.lm, torch.bfloat16)
    recorded, scored, mask = sampled_and_scored(policy, tok, prompts, cfg.rollout, cfg.rollout.temperature, copy)
    rounding = sampler_mismatch(recorded, scored, mask)
    largest_gap = float((recorded - scored)[mask].abs().max())
    # above float32's rounding bound (previous test's derivation): the copy's bfloat16 weights show
    assert largest_gap > first_kl_tolerance(policy, float(scored[mask].abs().max()))
    # Measured: sampler_kl 1.8e-4, largest ratio 1.02, largest single |log r| 0.027.
    assert rounding["rollout/sampler_far_share"] == 0.0 and rounding["rollout/sampler_ratio_max"] < FAR_RATIO

    at_1 = dataclasses.replace(cfg.rollout, temperature=1.0)
    recorded, scored, mask = sampled_and_scored(policy, tok, prompts, at_1, 0.5)
    other = sampler_mismatch(recorded, scored, mask)
    # Measured: sampler_kl 0.49, far share 0.53, largest ratio 2.4.
    assert other["rollout/sampler_kl"] > largest_gap and other["rollout/sampler_far_share"] > 0.0


def test_a_run_with_a_bfloat16_sampler_logs_the_mismatch_every_step(tmp_path):
    result = train(tiny_cfg(tmp_path, "rollout.generation_dtype=bfloat16", "eval.size=0"), SOLUTION)
    logged = read_jsonl(result.output_dir / "metrics.jsonl")
    keys = ("rollout/sampler_kl", "rollout/sampler_ratio_max", "rollout/sampler_far_share")
    assert [m["step"] for m in logged] == [1, 2, 3]
    assert all(key in m and math.isfinite(m[key]) for m in logged for key in keys)
    # the bfloat16 copy's rounding: never exactly the float32 policy, never a factor 2 (as above)
    assert all(m["rollout/sampler_kl"] != 0.0 and m["rollout/sampler_far_share"] == 0.0 for m in logged)


# --- 6. checkpoint and resume under float16 -----------------------------------------------------

def same_metrics(a: dict, b: dict) -> bool:
    """Two steps' metrics equal, time/* aside; NaN (an overflowed step's grad_norm) equals NaN."""
    keys = {k for k in a if not k.startswith("time/")}
    return keys == {k for k in b if not k.startswith("time/")} and all(
        a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in keys)


def test_float16_training_resumes_with_its_loss_scale(tmp_path, monkeypatch):
    """train.time_limit_s=0 stops after every step; resumed each time, the run gives the metrics
    and weights of an uninterrupted one. A growth interval of 3 cycles (4 cycles a step here) makes
    the scale move within a few steps: a resume that lost the scale or the clean count would start
    from 2^16 with none, and diverge (checked: with load_state_dict a no-op, steps 2-4 differ)."""
    monkeypatch.setattr(precision_module, "LossScaler", functools.partial(LossScaler, growth_interval=3))
    extra = ("model.train_dtype=float16", "eval.size=0", "train.steps=4")
    straight = train(tiny_cfg(tmp_path / "a", *extra), SOLUTION)
    scales = [m["stats/loss_scale"] for m in straight.metrics]
    # not a constant scale: there is something to restore (measured: 2^17 after every step, with an
    # overflow in each of steps 2-4)
    assert any(scale != 2.0 ** 16 for scale in scales[:-1]) and any(m["stats/skipped_steps"] for m in straight.metrics)

    cfg = tiny_cfg(tmp_path / "b", *extra, "train.time_limit_s=0")
    results, saved = [train(cfg, SOLUTION)], []
    while results[-1].status == TIME_LIMIT and len(results) < 10:
        state = checkpoint.load(results[-1].output_dir)
        saved.append((state["step"], state["loss_scale"]["scale"]))
        results.append(train(cfg, SOLUTION, resume=True))
    assert [r.step for r in results] == [1, 2, 3, 4] and results[-1].status == FINISHED
    assert saved == [(step, scales[step - 1]) for step in (1, 2, 3)]  # each checkpoint holds its step's scale
    resumed = results[-1].metrics
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    assert all(same_metrics(a, b) for a, b in zip(straight.metrics, resumed, strict=True))
    a, b = checkpoint.load(straight.output_dir), checkpoint.load(results[-1].output_dir)
    assert a["loss_scale"] == b["loss_scale"]
    assert a["policy"].keys() == b["policy"].keys()
    assert all(torch.equal(a["policy"][key], b["policy"][key]) for key in a["policy"])


# --- 7. the config ---------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, named", [
    (["model.train_dtype=bfloat16", "model.dtype=bfloat16"], ["model.train_dtype", "model.dtype=float32", "bfloat16"]),
    (["model.train_dtype=float8"], ["model.train_dtype", "float8"]),
    (["eval.model=sampler"], ["eval.model=sampler", "rollout.generation_dtype"]),
    (["eval.model=policy", "rollout.generation_dtype=bfloat16"], ["eval.model", "policy"]),
])
def test_the_config_refuses_16_bit_settings_it_cannot_run(overrides, named):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert all(word in str(err.value) for word in named), str(err.value)


def test_the_config_takes_the_16_bit_settings_it_can_run():
    assert load_config(None, ["model.train_dtype=bfloat16"]).model.train_dtype == "bfloat16"
    assert load_config(None, ["model.train_dtype=float16"]).model.train_dtype == "float16"
    cfg = load_config(None, ["eval.model=sampler", "rollout.generation_dtype=float16"])
    assert (cfg.eval.model, cfg.rollout.generation_dtype) == ("sampler", "float16")


def test_an_update_stopped_inside_a_cycle_leaves_no_overflow_behind():
    """ppo.target_kl stops an update after the first minibatch of a 2-minibatch cycle that overflowed
    (2^40): the cycle is discarded with what its hooks noted, so the next update's clean steps are
    taken, not skipped as if the old overflow were theirs."""
    cfg = load_config(None, [*TINY, "ppo.grad_accum_steps=2", "ppo.target_kl=1e-9", "ppo.epochs=1"])
    policy = small_policy()
    model = MixedPrecision(policy, torch.float16)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    model.attach(optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    batch = hand_batch(rows=8)
    batch["logprobs_old"] = batch["logprobs_old"] + 1.0  # approx_kl ~1 at the first minibatch: past the bound
    model.scaler.scale = 2.0 ** 40
    stopped = ppo_update(SOLUTION, model, optimizer, scheduler, batch, cfg, torch.Generator().manual_seed(0))
    assert stopped["stats/early_stop"] == 1.0 and stopped["stats/minibatches"] == 1.0  # inside the cycle
    model.scaler.scale = 2.0 ** 10
    clean = ppo_update(SOLUTION, model, optimizer, scheduler, batch, dataclasses.replace(cfg, ppo=PPOConfig(
        **{**dataclasses.asdict(cfg.ppo), "target_kl": None})), torch.Generator().manual_seed(0))
    assert clean["stats/skipped_steps"] == 0.0 and clean["stats/loss_scale"] == 2.0 ** 10, clean


def test_the_trainer_names_where_a_float16_gradient_overflowed(tmp_path, monkeypatch, capsys):
    """A float16 run whose loss scale overflows every step prints, at each step that skipped, how
    many optimizer steps and the first parameters whose gradient was not finite."""
    monkeypatch.setattr(precision_module, "LossScaler", lambda: LossScaler(scale=2.0 ** 40))
    train(tiny_cfg(tmp_path, "model.train_dtype=float16", "train.steps=1"), SOLUTION)
    printed = capsys.readouterr().out
    line = next(line for line in printed.splitlines() if "skipped: gradients not finite" in line)
    assert line.startswith("[step 1] 4 optimizer step(s) skipped") and "lm.model." in line, line


def test_cudnn_attention_is_kept_only_where_the_backward_runs_in_float32():
    """cuDNN's 16-bit attention backward gives NaN query gradients (precision.cudnn_attention_safe):
    the trainer turns it off for 16-bit training and for a policy kept in 16 bits, not for float32."""
    assert cudnn_attention_safe("float32", None)
    assert not cudnn_attention_safe("float32", "bfloat16") and not cudnn_attention_safe("float32", "float16")
    assert not cudnn_attention_safe("bfloat16", None) and not cudnn_attention_safe("float16", None)
