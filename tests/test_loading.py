"""Model loading: a real (tiny, self-made) GGUF file goes through transformers' GGUF loader,
and the trainer clears the quantization flags that loader leaves on a dequantized model."""

import numpy as np
import pytest
import torch

from assignment.trainer.config import ModelConfig
from assignment.trainer.loading import ModelError, build_models, load_lm
from assignment.trainer.synthetic import build_tokenizer

gguf = pytest.importorskip("gguf")

V, H, LAYERS, FFN, HEADS, KV_HEADS = 25, 32, 2, 64, 4, 2


def write_tiny_llama_gguf(path):
    """A 2-layer Llama in GGUF (float32 tensors, random weights), as llama.cpp would write it."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(H)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(H // HEADS)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(V)])
    w.add_token_scores([0.0] * V)
    w.add_token_types([1] * V)
    rng = np.random.default_rng(0)

    def add(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    add("token_embd.weight", V, H)
    add("output.weight", V, H)
    w.add_tensor("output_norm.weight", np.ones(H, np.float32))
    kv = KV_HEADS * H // HEADS
    for i in range(LAYERS):
        for name, shape in (("attn_q", (H, H)), ("attn_k", (kv, H)), ("attn_v", (kv, H)), ("attn_output", (H, H)),
                            ("ffn_gate", (FFN, H)), ("ffn_up", (FFN, H)), ("ffn_down", (H, FFN))):
            add(f"blk.{i}.{name}.weight", *shape)
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(H, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_model_loads_unflagged_and_trains(tmp_path):
    write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    cfg = ModelConfig(name=str(tmp_path), gguf_file="tiny.gguf", dtype="float32")
    lm = load_lm(cfg, build_tokenizer(), seed=0)
    assert lm.config.vocab_size == V and lm.training
    assert getattr(lm, "hf_quantizer", None) is None and not getattr(lm, "is_quantized", False)
    assert "quantization_config" not in lm.config.to_dict()
    lm.to(torch.bfloat16)  # transformers refuses dtype casts of a model it believes quantized
    lm.save_pretrained(tmp_path / "saved")
    assert "quantization_config" not in (tmp_path / "saved" / "config.json").read_text()


def test_gguf_policy_and_reference(tmp_path):
    write_tiny_llama_gguf(tmp_path / "tiny.gguf")
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
