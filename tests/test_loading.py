"""Model loading: real (tiny, self-made) GGUF files go through transformers' GGUF loader, the
llama architecture (SmolLM2) and the qwen2 one (Qwen2.5-Coder, the GPU run's model), and the
trainer clears the quantization flags that loader leaves on a dequantized model. A hub id is
passed to transformers as it is."""

import sys

import pytest
import torch

from assignment.trainer import loading
from assignment.trainer.config import DataConfig, ModelConfig
from assignment.trainer.loading import ModelError, build_models, load_lm, load_tokenizer
from assignment.trainer.rollout import eos_token_ids, render_prompts
from assignment.trainer.synthetic import build_tokenizer

gguf = pytest.importorskip("gguf")
from gguf_models import QWEN_SPECIALS, write_tiny_llama_gguf, write_tiny_qwen2_gguf  # noqa: E402

V = 25


def test_gguf_model_loads_unflagged_and_trains(tmp_path):
    write_tiny_llama_gguf(tmp_path / "tiny.gguf", V)
    cfg = ModelConfig(name=str(tmp_path), gguf_file="tiny.gguf", dtype="float32")
    lm = load_lm(cfg, build_tokenizer(), seed=0)
    assert lm.config.vocab_size == V and lm.training
    assert getattr(lm, "hf_quantizer", None) is None and not getattr(lm, "is_quantized", False)
    assert "quantization_config" not in lm.config.to_dict()
    lm.to(torch.bfloat16)  # transformers refuses dtype casts of a model it believes quantized
    lm.save_pretrained(tmp_path / "saved")
    assert "quantization_config" not in (tmp_path / "saved" / "config.json").read_text()


def test_gguf_policy_and_reference(tmp_path):
    write_tiny_llama_gguf(tmp_path / "tiny.gguf", V)
    cfg = ModelConfig(name=str(tmp_path), gguf_file="tiny.gguf", gradient_checkpointing=True)
    policy, ref = build_models(cfg, build_tokenizer(), seed=0, device=torch.device("cpu"))
    ids = torch.randint(0, V, (2, 5))
    logits, values = policy(ids, torch.ones_like(ids))
    assert logits.shape == (2, 5, V) and values.shape == (2, 5)
    assert not any(p.requires_grad for p in ref.parameters()) and not ref.training
    assert torch.allclose(ref(input_ids=ids).logits, policy.lm(input_ids=ids).logits)


def test_missing_gguf_file_is_a_clear_error(tmp_path):
    with pytest.raises(ModelError, match="GGUF model file not found"):
        load_lm(ModelConfig(name=str(tmp_path), gguf_file="absent.gguf"), build_tokenizer(), seed=0)


@pytest.mark.parametrize("package", ["gguf", "accelerate"])
def test_a_gguf_model_without_its_packages_is_a_clear_error(tmp_path, monkeypatch, package):
    write_tiny_llama_gguf(tmp_path / "m.gguf", V)
    monkeypatch.setitem(sys.modules, package, None)  # `import package` now raises ImportError
    with pytest.raises(ModelError, match=f"needs the {package} package"):
        loading._source(ModelConfig(name=str(tmp_path), gguf_file="m.gguf"))


@pytest.fixture(scope="module")
def qwen2_gguf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2")
    vocab = write_tiny_qwen2_gguf(folder / "tiny-qwen2.gguf")
    return folder, vocab


def test_qwen2_gguf_loads_with_its_tokenizer_chat_template_and_eos(qwen2_gguf):
    """What the GPU run needs of the real file: a Qwen2 model with q/k/v biases, dequantized and
    unflagged; the GGUF's ChatML template; <|im_end|> among the ids that end a response, whichever
    of <|endoftext|> / <|im_end|> the transformers version calls the tokenizer's EOS (5.17 and
    5.24 differ); the pad token is <|endoftext|>, not the end of turn."""
    folder, vocab = qwen2_gguf
    cfg = ModelConfig(name=str(folder), gguf_file="tiny-qwen2.gguf", gradient_checkpointing=True)
    tokenizer = load_tokenizer(cfg)
    policy, ref = build_models(cfg, tokenizer, seed=0, device=torch.device("cpu"))
    lm = policy.lm
    assert type(lm).__name__ == "Qwen2ForCausalLM" and lm.config.vocab_size == vocab
    assert lm.model.layers[0].self_attn.q_proj.bias is not None and not getattr(lm, "is_quantized", False)
    endoftext, im_start, im_end = tokenizer.convert_tokens_to_ids(QWEN_SPECIALS)
    assert im_end in eos_token_ids(lm, tokenizer) and tokenizer.pad_token_id == endoftext
    data = DataConfig(prompt_template="{question}\nPlease reason step by step, and put your final answer within \\boxed{}.")
    prompt = render_prompts(tokenizer, ["What is 2 + 3?"], data)[0]
    assert prompt == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                      "<|im_start|>user\nWhat is 2 + 3?\nPlease reason step by step, and put your final answer within "
                      "\\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    assert ids[0] == im_start and ids.count(im_end) == 2 and tokenizer.decode(ids) == prompt
    logits, values = policy(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
    assert logits.shape == (1, len(ids), vocab) and torch.isfinite(logits).all()


def test_gguf_file_may_be_a_path_of_its_own(qwen2_gguf):
    folder, _ = qwen2_gguf
    # As device-stage's env.sh exports it: MODEL_GGUF is the file's full path.
    assert loading._source(ModelConfig(name="elsewhere", gguf_file=str(folder / "tiny-qwen2.gguf"))) == (
        str(folder), {"gguf_file": "tiny-qwen2.gguf"})
    assert loading._source(ModelConfig(name=str(folder), gguf_file="tiny-qwen2.gguf")) == (
        str(folder), {"gguf_file": "tiny-qwen2.gguf"})


def test_a_hub_id_goes_to_transformers_unchanged(monkeypatch):
    """model.name=Qwen/Qwen2.5-0.5B-Instruct model.gguf_file=null (no network here: the calls are recorded)."""
    calls = []

    class Recorder:
        @staticmethod
        def from_pretrained(source, **kwargs):
            calls.append((source, kwargs))
            raise OSError("offline")

    monkeypatch.setattr(loading, "AutoTokenizer", Recorder)
    monkeypatch.setattr(loading, "AutoModelForCausalLM", Recorder)
    cfg = ModelConfig(name="Qwen/Qwen2.5-0.5B-Instruct", gguf_file=None)
    with pytest.raises(ModelError, match="Qwen/Qwen2.5-0.5B-Instruct"):
        load_tokenizer(cfg)
    with pytest.raises(ModelError, match="cannot load the model 'Qwen/Qwen2.5-0.5B-Instruct'"):
        load_lm(cfg, build_tokenizer(), seed=0)
    assert calls == [("Qwen/Qwen2.5-0.5B-Instruct", {}), ("Qwen/Qwen2.5-0.5B-Instruct", {"dtype": torch.float32})]


def test_a_bfloat16_reference_is_cast_parameter_by_parameter_and_keeps_ties_and_buffers():
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(config)

    def no_float32_copy(*args):
        raise AssertionError("the float32 parameters were deep-copied whole before the cast")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.Parameter, "__deepcopy__", no_float32_copy)
        ref = loading.reference_model(lm, torch.bfloat16)
    assert ref.lm_head.weight is ref.model.embed_tokens.weight  # tied, as in the policy
    assert all(torch.equal(param.detach().to(torch.bfloat16), copied) and not copied.requires_grad
               for param, copied in zip(lm.parameters(), ref.parameters()))
    assert {buffer.dtype for buffer in ref.buffers()} == {torch.float32}  # RoPE's inv_freq as loaded
    assert lm.lm_head.weight.dtype == torch.float32 and lm.lm_head.weight.requires_grad and not ref.training
    for same in (loading.reference_model(lm), loading.reference_model(lm, torch.float32)):  # the policy's own dtype
        assert all(torch.equal(a, b) and a.data_ptr() != b.data_ptr() for a, b in zip(lm.parameters(), same.parameters()))
