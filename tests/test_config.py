"""Config loading: defaults, YAML, dotlist overrides, validation, clear errors."""

import dataclasses
from pathlib import Path

import pytest

from assignment.trainer.config import Config, ConfigError, load_config, to_yaml

CONFIGS = sorted(Path(__file__).resolve().parents[1].joinpath("configs").glob("*.yaml"))


def test_defaults_are_the_synthetic_task():
    cfg = load_config()
    assert cfg == Config() and cfg.model.name == "synthetic" and cfg.data.task == "synthetic"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert cfg.rollout.batch_size % cfg.ppo.minibatch_size == 0


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("ppo:\n  lr: 0.5\n  epochs: 3\n")
    cfg = load_config(path, ["ppo.lr=0.25", "train.steps=7"])
    assert (cfg.ppo.lr, cfg.ppo.epochs, cfg.train.steps) == (0.25, 3, 7)


def test_env_var_interpolation(monkeypatch):
    monkeypatch.setenv("SMOLLM2_DIR", "/somewhere/model")
    monkeypatch.setenv("GSM8K_DIR", "/somewhere/data")
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "gsm8k_smollm2.yaml")
    assert cfg.model.name == "/somewhere/model" and cfg.data.local_dir == "/somewhere/data"


def test_gsm8k_configs_default_to_the_hub(monkeypatch):
    monkeypatch.delenv("GSM8K_DIR", raising=False)
    for name in ("gsm8k_smollm2.yaml", "gsm8k_qwen_coder.yaml"):
        data = load_config(Path(__file__).resolve().parents[1] / "configs" / name).data
        assert data.local_dir is None and data.hub_id == "openai/gsm8k", name


QWEN = Path(__file__).resolve().parents[1] / "configs" / "gsm8k_qwen_coder.yaml"


def test_qwen_config_reads_the_staged_paths_and_validates(monkeypatch):
    """The GPU run's config with the variables device-stage's env.sh exports (fake paths)."""
    monkeypatch.setenv("MODEL_DIR", "/stage/model")
    monkeypatch.setenv("MODEL_GGUF", "/stage/model/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf")
    monkeypatch.setenv("GSM8K_DIR", "/stage/gsm8k")
    cfg = load_config(QWEN)
    assert cfg.model.name == "/stage/model" and cfg.model.gguf_file.endswith("/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf")
    assert cfg.data.local_dir == "/stage/gsm8k" and "\\boxed{}" in cfg.data.prompt_template
    # What the measured runs taught (the config's comments say why).
    assert (cfg.reward.answer_format, cfg.reward.format_bonus, cfg.ppo.gamma, cfg.ppo.lam) == ("last_of_both", 0.0, 1.0, 1.0)
    assert not cfg.kl.adaptive and cfg.kl.coeff > 0 and cfg.ppo.target_kl and cfg.ppo.min_reward_std > 0
    # Fewer, larger optimizer steps: 4 of 64 responses per PPO step of 256, one epoch.
    per_step = cfg.rollout.batch_size // (cfg.ppo.minibatch_size * cfg.ppo.grad_accum_steps) * cfg.ppo.epochs
    assert (cfg.rollout.batch_size, per_step) == (256, 4)
    # past the limit: a step, a checkpoint and an eval batch (~15 + 20 + 60 s) still fit a 600 s call
    assert cfg.train.time_limit_s and cfg.train.time_limit_s + 120 < 600
    assert (cfg.rollout.cache_implementation, cfg.rollout.compile, cfg.rollout.generation_dtype) == (
        "static", True, "bfloat16")  # the fast rollout path


def test_qwen_config_without_the_environment(monkeypatch):
    for name in ("MODEL_DIR", "MODEL_GGUF", "GSM8K_DIR"):
        monkeypatch.delenv(name, raising=False)
    model = load_config(QWEN).model
    assert (model.name, model.gguf_file) == ("models/qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf")


def test_qwen_config_takes_the_hub_model(monkeypatch):
    model = load_config(QWEN, ["model.name=Qwen/Qwen2.5-0.5B-Instruct", "model.gguf_file=null"]).model
    assert (model.name, model.gguf_file) == ("Qwen/Qwen2.5-0.5B-Instruct", None)


def test_smollm2_keeps_the_strict_reward_it_was_measured_with():
    assert load_config(Path(__file__).resolve().parents[1] / "configs" / "gsm8k_smollm2.yaml").reward.answer_format == "strict"


def test_no_config_names_a_folder_of_this_workplace():
    for path in CONFIGS:
        assert "/work/" not in path.read_text(), path.name


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        load_config().ppo.lr = 1.0


def test_effective_config_round_trips(tmp_path):
    cfg = load_config(None, ["ppo.lr=0.01", "data.curriculum_start=2"])
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    assert load_config(tmp_path / "config.yaml") == cfg


@pytest.mark.parametrize("override, suggestion", [
    ("ppo.lrr=1", "ppo.lr"), ("ppo.minibatch=8", "ppo.minibatch_size"), ("trian.steps=3", "train"),
])
def test_unknown_key_names_the_closest(override, suggestion):
    with pytest.raises(ConfigError, match=f"unknown config key .*did you mean '{suggestion}'"):
        load_config(None, [override])


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rollout:\n  temprature: 0.5\n")
    with pytest.raises(ConfigError, match=r"rollout\.temprature.*bad\.yaml.*rollout\.temperature"):
        load_config(path)


@pytest.mark.parametrize("override, message", [
    ("ppo.lr=-1", "ppo.lr must be > 0"),
    ("ppo.minibatch_size=7", "must divide rollout.batch_size"),
    ("ppo.grad_accum_steps=3", "grad_accum_steps"),
    ("rollout.temperature=0", "temperature must be > 0"),
    ("rollout.top_p=1.5", "top_p"),
    ("model.dtype=float64", "model.dtype"),
    ("reward.format_bonus_when=sometimes", "format_bonus_when"),
    ("data.curriculum_start=9", "curriculum_start"),
    ("ppo.lr=fast", "could not be converted"),
    ("reward.answer_format=boxed", "answer_format"),
    ("ppo.target_kl=0", "target_kl"),
    ("ppo.advantage_clip=-1", "advantage_clip"),
    ("kl.adaptive=true", "kl.adaptive needs kl.coeff > 0"),  # the default coefficient is 0
    ("rollout.cache_implementation=sliding", "cache_implementation"),
    ("rollout.compile=true", "rollout.compile needs rollout.cache_implementation=static"),
    ("rollout.generation_dtype=int8", "generation_dtype"),
    ("train.time_limit_s=-5", "time_limit_s"),
    ("ppo.optimizer=sgd", "ppo.optimizer must be adamw or adamw_8bit"),
    ("model.reference_dtype=int8", "model.reference_dtype"),
    ("rollout.logits_chunk_tokens=0", "logits_chunk_tokens"),
    ("train.max_gpu_memory_gib=0", "max_gpu_memory_gib"),
])
def test_bad_values_are_refused_by_name(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_missing_file_and_malformed_override():
    with pytest.raises(ConfigError, match="not found"):
        load_config("configs/nope.yaml")
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["ppo.lr"])


def test_a_profile_is_its_base_recipe_with_its_own_changes(monkeypatch):
    """configs/gsm8k_qwen_coder_{24gb,16gb}.yaml name the recipe as their base: every field they do
    not set is the recipe's, and the optimizer steps see as many responses as the recipe's."""
    monkeypatch.setenv("MODEL_DIR", "/models")
    recipe = load_config("configs/gsm8k_qwen_coder.yaml")
    for name, cap in (("24gb", 20), ("16gb", 14)):
        profile = load_config(f"configs/gsm8k_qwen_coder_{name}.yaml")
        assert profile.train.max_gpu_memory_gib == cap and recipe.train.max_gpu_memory_gib is None
        assert profile.ppo.minibatch_size * profile.ppo.grad_accum_steps == recipe.ppo.minibatch_size * recipe.ppo.grad_accum_steps
        assert (profile.ppo.lr, profile.kl, profile.reward, profile.data) == (recipe.ppo.lr, recipe.kl, recipe.reward, recipe.data)
        assert profile.model.name == "/models" and profile.train.steps == recipe.train.steps


def test_a_base_that_is_missing_circular_or_not_a_path_is_a_config_error(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\nppo:\n  lr: 0.5\n")
    with pytest.raises(ConfigError, match="not found.*b.yaml"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="its own base"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("base: [1]\n")
    with pytest.raises(ConfigError, match="base must be the path"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("ppo:\n  epochs: 3\n  lr: 0.1\n")
    cfg = load_config(tmp_path / "a.yaml", ["train.steps=2"])
    assert (cfg.ppo.epochs, cfg.ppo.lr, cfg.train.steps) == (3, 0.5, 2)
