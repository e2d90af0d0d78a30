"""The card check before the model loads (assignment/trainer/cards.py): the recipe and each GSM8K
profile on four cards, the advice followed to the letter, the profiles' table against their
files, and setup_run stopping before it builds a model."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from assignment.trainer import cli, loop
from assignment.trainer.cards import PROFILES, bfloat16_fields, card_problem, check_card, float16_overrides
from assignment.trainer.config import ConfigError, load_config
from assignment.trainer.loop import train

from test_trainer import SOLUTION, TINY, tiny_cfg

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "configs/gsm8k_qwen_coder.yaml"
PROFILE_24 = "configs/gsm8k_qwen_coder_24gb.yaml"
PROFILE_16 = "configs/gsm8k_qwen_coder_16gb.yaml"
PROFILE_16_FP16 = "configs/gsm8k_qwen_coder_16gb_float16.yaml"

# (the name torch reports, its memory in GiB, whether it computes in bfloat16: compute capability >= 8.0)
T4 = ("Tesla T4", 14.6, False)
RTX_4090 = ("NVIDIA GeForce RTX 4090", 23.6, True)
A100_40GB = ("NVIDIA A100-SXM4-40GB", 39.4, True)
H200 = ("NVIDIA H200", 139.8, True)


def config(path: str, *overrides: str):
    return load_config(ROOT / path, list(overrides))


def test_the_profiles_table_is_the_profiles_files():
    """Each profile the check may name exists, and its cap and its bfloat16 are its file's."""
    assert [p.cap_gib for p in PROFILES] == sorted((p.cap_gib for p in PROFILES), reverse=True)  # largest first
    for profile in PROFILES:
        cfg = config(profile.config)
        assert profile.cap_gib == cfg.train.max_gpu_memory_gib and profile.bfloat16 == bool(bfloat16_fields(cfg)), profile
    assert {p.config for p in PROFILES} == {PROFILE_24, PROFILE_16, PROFILE_16_FP16}
    recipe = config(RECIPE)
    assert recipe.train.min_gpu_memory_gib == 38 and recipe.train.max_gpu_memory_gib is None


# (config, card, what the message must advise: a profile to run, "keep" (this config with the float16
# overrides), or None where it fits; whether the advice includes this config's float16 overrides)
CASES = [
    (RECIPE, T4, PROFILE_16_FP16, False),  # too small and no bfloat16: the float16 profile as it is
    (PROFILE_24, T4, PROFILE_16_FP16, False),
    (PROFILE_16, T4, PROFILE_16_FP16, True),  # it fits 14.6 GiB: the float16 profile, or its dtypes changed
    (PROFILE_16_FP16, T4, None, False),
    (RECIPE, RTX_4090, PROFILE_24, False),  # 38 GiB > 23.6: the largest profile that fits
    (PROFILE_24, RTX_4090, None, False),
    (PROFILE_16, RTX_4090, None, False),
    (PROFILE_16_FP16, RTX_4090, None, False),
    (RECIPE, A100_40GB, None, False),  # 38 <= 39.4
    (PROFILE_24, A100_40GB, None, False),
    (PROFILE_16, A100_40GB, None, False),
    (RECIPE, H200, None, False),
    (PROFILE_24, H200, None, False),
    (PROFILE_16, H200, None, False),
]


@pytest.mark.parametrize("path, card, advised, float16", CASES,
                         ids=[f"{Path(c[0]).stem}-{c[1][0]}" for c in CASES])
def test_the_card_check_names_the_card_the_need_and_the_profile_that_fits(path, card, advised, float16):
    name, memory, bfloat16 = card
    cfg = config(path)
    message = card_problem(cfg, name, memory, bfloat16)
    if advised is None:
        assert message is None
        return
    assert message is not None and name in message, message
    needs = cfg.train.max_gpu_memory_gib or cfg.train.min_gpu_memory_gib
    field = "train.max_gpu_memory_gib" if cfg.train.max_gpu_memory_gib else "train.min_gpu_memory_gib"
    if needs > memory:
        assert f"needs {needs:g} GiB" in message and field in message and f"{memory:.1f} GiB" in message, message
    else:
        assert "GiB" not in message.split(":")[0], message  # memory is not the reason given
    assert ("bfloat16" in message.split(":")[0]) == (not bfloat16), message  # named as a reason only where lacking
    overrides = float16_overrides(cfg)  # this config's bfloat16 fields, to float16
    assert ("float16 overrides" in message) == float16 and (not float16 or overrides in message), message
    named = [p.config for p in PROFILES if p.config in message]
    assert named == ([] if advised == "keep" else [advised]), message  # one profile, the right one
    # Followed to the letter (the profile named as it is, or this config with the overrides given),
    # the advice runs on this card.
    followed = ([] if advised == "keep" else [config(advised)]) + ([config(path, *overrides.split())] if float16 else [])
    assert followed and all(card_problem(f, name, memory, bfloat16) is None for f in followed)


def test_a_bfloat16_working_copy_is_told_every_field_to_move():
    """model.train_dtype=bfloat16 on a T4: the overrides move it too, and followed, the check passes."""
    cfg = config(PROFILE_16, "model.train_dtype=bfloat16")
    message = card_problem(cfg, *T4)
    assert "model.train_dtype=float16" in message and "model.reference_dtype=float16" in message, message
    followed = config(PROFILE_16, "model.train_dtype=bfloat16", *float16_overrides(cfg).split())
    assert card_problem(followed, *T4) is None


def test_a_card_smaller_than_every_profile_is_told_so():
    message = card_problem(config(RECIPE), "NVIDIA GeForce RTX 3070", 7.8, True)
    assert "7.8 GiB" in message and "no GSM8K profile fits" in message and "the smallest needs 14 GiB" in message
    assert not any(p.config in message for p in PROFILES)


def test_a_config_stating_no_need_and_no_bfloat16_runs_anywhere():
    cfg = load_config(None, TINY)  # the CPU synthetic task: float32 throughout, no memory stated
    assert not bfloat16_fields(cfg) and card_problem(cfg, "Tesla T4", 14.6, False) is None
    assert card_problem(cfg, "a 1 GiB card", 1.0, False) is None


def test_check_card_reads_the_cards_name_memory_and_compute_capability(monkeypatch):
    """check_card asks torch for the CUDA card's properties (faked here: no GPU is used) and passes
    bfloat16 = compute capability >= 8.0; off CUDA it asks nothing."""
    cards = {"T4": SimpleNamespace(name="Tesla T4", total_memory=int(14.6 * 2**30), major=7, minor=5),
             "A100": SimpleNamespace(name="NVIDIA A100-SXM4-40GB", total_memory=int(39.4 * 2**30), major=8, minor=0)}
    asked = []

    def properties(device):
        asked.append(device)
        return cards[which]

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    recipe = config(RECIPE)
    assert check_card(recipe, torch.device("cpu")) is None and asked == []
    which = "T4"
    assert check_card(recipe, torch.device("cuda")) == card_problem(recipe, "Tesla T4", 14.6, False)
    which = "A100"  # capability 8.0 exactly computes in bfloat16 (>=, not >), and 39.4 GiB holds 38
    assert check_card(recipe, torch.device("cuda")) is None
    assert asked == [torch.device("cuda")] * 2


def test_min_gpu_memory_must_be_positive():
    with pytest.raises(ConfigError, match="train.min_gpu_memory_gib"):
        load_config(None, ["train.min_gpu_memory_gib=0"])


def test_a_run_on_a_card_that_cannot_hold_it_stops_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """setup_run asks check_card first: its message becomes a ConfigError (one line from the CLI,
    exit status 2), and no model is built."""
    message = "this config needs 38 GiB of GPU memory (train.min_gpu_memory_gib) and this Tesla T4 has 14.6 GiB"
    checked, built = [], []
    monkeypatch.setattr(loop, "check_card", lambda cfg, device: checked.append(device) or message)
    monkeypatch.setattr(loop, "build_models", lambda *args, **kwargs: built.append(args))
    with pytest.raises(ConfigError, match=re.escape(message)):
        train(tiny_cfg(tmp_path / "api"), SOLUTION)
    assert checked == [torch.device("cpu")] and built == []
    capsys.readouterr()
    assert cli.main(["--impl", str(ROOT / "solutions" / "exercises.py"), *TINY,
                     f"train.output_dir={tmp_path / 'cli'}"]) == 2
    assert capsys.readouterr().err.strip() == f"ppo-train: {message}"
    assert len(checked) == 2 and built == []


def test_a_config_of_another_task_on_a_card_without_bfloat16_is_told_its_overrides_not_a_profile():
    """The GSM8K profiles are no advice for the synthetic task: a bfloat16 sampler there is told the
    override that moves it to float16, and followed, the check passes."""
    cfg = load_config(None, [*TINY, "rollout.generation_dtype=bfloat16"])
    message = card_problem(cfg, *T4)
    assert message.endswith(": keep this config with the float16 overrides rollout.generation_dtype=float16"), message
    assert not any(p.config in message for p in PROFILES)
    assert card_problem(load_config(None, [*TINY, *float16_overrides(cfg).split()]), *T4) is None
