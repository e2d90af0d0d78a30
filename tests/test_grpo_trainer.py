"""The GRPO / Dr. GRPO trainer (Part II, assignment/trainer/grpo.py): the config's algorithm and
group size, the groups of the rollout, the loss swapped around exercise 5 (exactly exercise 7's
mode of exercise 1's per-token surrogate plus beta * k3), and short runs of both algorithms."""

from pathlib import Path

import pytest
import torch

from assignment.trainer import grpo
from assignment.trainer.config import ConfigError, load_config
from assignment.trainer.impl import ImplError, load_module
from assignment.trainer.loop import train
from assignment.trainer.ppo import UpdateConfig
from tests.test_trainer import REFERENCE, TINY, first_kl_tolerances

GRPO_TINY = ["algorithm=grpo", "rollout.group_size=4", "kl.coeff=0.05"]


@pytest.mark.parametrize("overrides, message", [
    (["algorithm=reinforce"], "algorithm must be ppo, grpo or dr_grpo"),
    (["rollout.group_size=4"], "rollout.group_size must be 1 for algorithm ppo"),
    (["algorithm=grpo"], "rollout.group_size must be >= 2 for algorithm grpo"),
    (["algorithm=dr_grpo", "rollout.group_size=3"], r"rollout.group_size \(3\) must divide rollout.batch_size \(8\)"),
])
def test_bad_algorithm_settings_are_refused_with_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*TINY, *overrides])


def test_grpo_trains_no_critic_and_ppo_keeps_its_value_coefficient():
    assert UpdateConfig.from_config(load_config(None, TINY)).vf_coeff == 0.5
    assert UpdateConfig.from_config(load_config(None, [*TINY, *GRPO_TINY])).vf_coeff == 0.0


def test_groups_are_adjacent_and_a_group_with_one_reward_teaches_nothing():
    assert grpo.group_ids(8, 4, torch.device("cpu")).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert grpo.zero_spread_groups(torch.tensor([1.0, 1, 1, 1, 0, 1, 0, 0]), 4) == 0.5


def per_token_surrogate(logprobs_new, logprobs_old, advantages, clip_ratio):
    """The clipped surrogate per token, (B, T), written out here as the check's own reference."""
    ratio = torch.exp(logprobs_new - logprobs_old)
    return torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - clip_ratio, 1 + clip_ratio))


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo"])
def test_the_swapped_loss_is_the_modes_aggregate_of_the_surrogate_plus_beta_k3(algorithm):
    """Value and gradient equal, to float32 rounding, to aggregate_loss(per-token surrogate) +
    beta * aggregate_loss(k3), on rows of different lengths (where the modes differ) and with
    ratios outside the clip range (where the clipped branch is active)."""
    cfg = load_config(None, [*TINY, f"algorithm={algorithm}", "rollout.group_size=4", "rollout.max_new_tokens=6"])
    impl, beta, mode = load_module(REFERENCE), 0.3, grpo.LOSS_AGG_MODE[algorithm]
    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    old = -torch.rand(4, 5, generator=gen) * 3
    new = (old + torch.randn(4, 5, generator=gen) * 0.5).requires_grad_(True)  # ratios up to ~e^1.5: clipped
    ref = old + torch.randn(4, 5, generator=gen) * 0.3
    adv = torch.where(mask, torch.tensor([[1.5], [-0.5], [0.7], [-1.7]]), 0.0)
    with grpo.policy_loss_swap(impl, {"ref_logprobs": ref}, cfg, beta) as extra:
        loss, clip_frac, approx_kl = impl.compute_policy_loss(new, old, adv, mask, 0.2)
    (grad,) = torch.autograd.grad(loss, new)
    assert impl.compute_policy_loss.__module__ == impl.__name__  # exercise 1 is back in place

    new2 = new.detach().requires_grad_(True)
    kl = impl.aggregate_loss(impl.compute_kl(new2, ref, mask, "k3"), mask, mode, 6)
    surrogate = impl.aggregate_loss(per_token_surrogate(new2, old, adv, 0.2), mask, mode, 6)
    expected = surrogate + beta * kl
    (expected_grad,) = torch.autograd.grad(expected, new2)
    # Float32 on both sides, the same terms in two ways: the swap feeds exercise 1 advantages
    # scaled by n w_t and takes its token mean; the check weights the surrogate by w_t in the
    # mode. The n = 11 tokens' terms have both signs, so the loss cancels (measured: 8.8e-4 for
    # terms of magnitude 1.1): the bound is in the magnitudes S = aggregate(|surrogate_t|) +
    # beta aggregate(|k3_t|) (in float64; aggregate is linear with weights w_t >= 0), never in
    # |loss|. The swap rounds each token's term at most 8 times (the log-ratio, exp at 2u, the
    # weight w_t (2) and n w_t, the scaled advantage, the product), the check 4 (the log-ratio,
    # exp, the product); each then sums the n terms and scales them (at most n + 2 roundings) and
    # adds beta kl (2; the k3 term is the same computation on both sides). So
    #     |loss - expected| <= (n + 12 + n + 8) u S = 2 (n + 10) u S.
    # The gradient has no sum over tokens: per element, the surrogate's part rounds at most 10
    # times on the swap's side (1/n, w_t (2), n w_t, the scaled advantage, the ratio (3), two
    # products) and 7 on the check's, and each adds the identical k3 part once, so elementwise
    #     |grad - expected_grad| <= (11 + 8) u (|g_surrogate| + beta |g_k3|) <= 20 u (...).
    # (Measured on an AMD EPYC: the loss at most 0.87 u S, 0.02 of its bound, with the scalar
    # kernels, 0.39 u S with the vector ones; the gradients equal.)
    u, n = 2.0 ** -24, int(mask.sum())
    wide = new.detach().double().requires_grad_(True)
    per_token_surrogate64 = per_token_surrogate(wide, old.double(), adv.double(), 0.2)
    per_token_k3 = impl.compute_kl(wide, ref.double(), mask, "k3")
    magnitude = float(impl.aggregate_loss(per_token_surrogate64.abs(), mask, mode, 6)
                      + beta * impl.aggregate_loss(per_token_k3.abs(), mask, mode, 6))
    g_surrogate, g_k3 = (torch.autograd.grad(impl.aggregate_loss(x, mask, mode, 6), wide)[0]
                         for x in (per_token_surrogate64, per_token_k3))
    loss_bound = 2 * (n + 10) * u * magnitude
    assert abs(float(loss) - float(expected)) <= loss_bound, (float(loss) - float(expected), loss_bound)
    assert bool(((grad - expected_grad).abs() <= 20 * u * (g_surrogate.abs() + beta * g_k3.abs())).all())
    assert extra["loss/kl"] == float(kl)  # exercise 8 and 7 on the same tensors: the same computation
    # a positive scale of the advantage moves neither metric: they are exercise 1's own
    _, clip_frac_ppo, approx_kl_ppo = impl.compute_policy_loss(new, old, adv, mask, 0.2)
    assert float(clip_frac) == float(clip_frac_ppo) > 0 and float(approx_kl) == float(approx_kl_ppo)
    # the modes differ on these rows, far beyond the bound, so the check above tells them apart
    token_mean = impl.aggregate_loss(per_token_surrogate(new2, old, adv, 0.2), mask, "token-mean", 6)
    assert abs(float(token_mean) - float(surrogate)) > 100 * loss_bound


def test_an_update_that_bypasses_the_module_name_is_refused():
    cfg = load_config(None, [*TINY, *GRPO_TINY])
    impl = load_module(REFERENCE)
    with pytest.raises(grpo.PolicyLossNotCalled, match="hint 5.3"):
        with grpo.policy_loss_swap(impl, {"ref_logprobs": torch.zeros(2, 3)}, cfg, 0.1):
            pass
    assert impl.compute_policy_loss.__module__ == impl.__name__  # put back all the same


def test_a_submission_without_part_two_cannot_run_grpo(tmp_path):
    part_one = tmp_path / "part_one.py"
    source = REFERENCE.read_text()
    part_one.write_text(source[: source.index("def compute_grpo_advantages(")])
    cfg = load_config(None, [*TINY, *GRPO_TINY, f"train.output_dir={tmp_path / 'run'}"])
    with pytest.raises(ImplError, match="compute_grpo_advantages, aggregate_loss, compute_kl"):
        train(cfg, load_module(part_one))


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo"])
def test_a_short_grpo_run_logs_what_ppo_logs_and_no_critic(tmp_path, monkeypatch, algorithm):
    cfg = load_config(None, [*TINY, f"algorithm={algorithm}", "rollout.group_size=4", "kl.coeff=0.05",
                             f"train.output_dir={tmp_path / 'run'}"])
    impl = load_module(REFERENCE)
    tolerances = first_kl_tolerances(monkeypatch)
    result = train(cfg, impl)
    assert [m["step"] for m in result.metrics] == [1, 2, 3]
    for m, tolerance in zip(result.metrics, tolerances, strict=True):
        assert {"rollout/reward_mean", "rollout/response_length", "rollout/kl", "loss/kl", "loss/policy",
                "rollout/zero_spread_groups", "stats/approx_kl_first"} <= set(m)
        assert "rollout/value_mean" not in m and m["loss/value"] == 0.0  # values_old = returns = 0, head at 0
        # the first minibatch's ratio is still 1, up to float rounding (measured: exactly 0)
        assert abs(m["stats/approx_kl_first"]) <= tolerance
    samples = result.samples
    assert samples and samples[0]["question"] == samples[1]["question"]  # num_samples 2 of one group


def test_compare_draws_each_runs_reward_length_and_kl_labelled(tmp_path, capsys):
    from assignment.trainer import cli
    from assignment.trainer.runlog import COMPARED, draw_comparison, read_jsonl, run_label

    dirs = []
    for name, extra in (("ppo", []), ("grpo", GRPO_TINY)):
        cfg = load_config(None, [*TINY, *extra, "eval.size=0", f"train.output_dir={tmp_path / name}"])
        dirs.append(train(cfg, load_module(REFERENCE)).output_dir)
    assert [run_label(d) for d in dirs] == ["ppo (ppo)", "grpo (grpo)"]
    fig = draw_comparison([(run_label(d), read_jsonl(d / "metrics.jsonl")) for d in dirs])
    assert len(fig.axes) == len(COMPARED)
    for ax, (key, _) in zip(fig.axes, COMPARED):
        lines = ax.get_lines()
        assert [line.get_label() for line in lines] == ["ppo (ppo)", "grpo (grpo)"]
        for line, d in zip(lines, dirs):
            metrics = read_jsonl(d / "metrics.jsonl")
            assert list(line.get_xdata()) == [1, 2, 3]
            assert list(line.get_ydata()) == [m[key] for m in metrics]
    out = tmp_path / "fig.png"
    assert cli.main(["--compare", *map(str, dirs), "--compare-out", str(out)]) == 0 and out.stat().st_size > 0
    assert cli.main(["--compare", str(tmp_path / "nowhere")]) == 2
    assert "holds no metrics.jsonl" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo"])
def test_the_cpu_grpo_configs_learn_as_part_one_must(algorithm):
    """configs/cpu_synthetic_{algorithm}.yaml through Part I's learning check (the reference's
    exercises, seed 0, the grader's threshold of 0.15 on last-10 minus first-10 mean reward).
    Measured with the reference: grpo 0.060 -> 0.342, dr_grpo 0.019 -> 0.580 (handout.md section 8)."""
    from omegaconf import OmegaConf

    from assignment.trainer.learning_check import run

    path = Path(__file__).resolve().parents[1] / "configs" / f"cpu_synthetic_{algorithm}.yaml"
    raw = OmegaConf.to_container(OmegaConf.load(path))
    overrides = [f"{section}.{key}={value}" for section, values in raw.items() if isinstance(values, dict)
                 for key, value in values.items() if section not in ("train", "eval")] + [f"algorithm={raw['algorithm']}"]
    check = run(load_module(REFERENCE), seed=0, threshold=0.15, overrides=overrides)
    assert check.passed, (check.first10_mean, check.last10_mean)
    assert check.accuracy_after > check.accuracy_before


def test_the_cli_names_an_update_that_bypasses_the_module_name(tmp_path, capsys):
    """A submission whose update reaches exercise 1 by another name than its module-level one
    (here: the answer key's own functions, imported) cannot run GRPO: ppo-train says why, no
    traceback, exit status 2."""
    from assignment.trainer import cli

    imported = tmp_path / "imported.py"
    imported.write_text("from solutions.exercises import *  # the update calls solutions.exercises' names\n")
    code = cli.main(["--impl", str(imported), *TINY, *GRPO_TINY, f"train.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and "hint 5.3" in err and "Traceback" not in err, err


def test_rollout_metrics_split_the_length_by_outcome():
    """rollout/length_correct and rollout/length_wrong: the mean real length of the right and of
    the wrong responses (the curve of the Dr. GRPO paper), absent when no response is of a kind."""
    from types import SimpleNamespace

    import torch

    from assignment.trainer.loop import rollout_metrics

    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]])  # lengths 2, 4, 1, 3
    zeros = torch.zeros(4, 4)
    rollout = SimpleNamespace(sample=SimpleNamespace(response_mask=mask, finished=torch.ones(4, dtype=torch.bool),
                                                     sampler_logprobs=None),
                              logprobs=zeros, ref_logprobs=zeros, values=zeros)

    def metrics(correct):
        scores = [SimpleNamespace(correct=c, formatted=True, reasoning=True) for c in correct]
        return rollout_metrics(rollout, torch.tensor(correct, dtype=torch.float32), scores, 0.0)

    m = metrics([True, False, False, True])
    assert (m["rollout/length_correct"], m["rollout/length_wrong"], m["rollout/response_length"]) == (2.5, 2.5, 2.5)
    m = metrics([False, True, False, False])
    assert (m["rollout/length_correct"], m["rollout/length_wrong"]) == (4.0, 2.0)
    assert "rollout/length_correct" not in metrics([False] * 4) and "rollout/length_wrong" not in metrics([True] * 4)
