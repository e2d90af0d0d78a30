"""Tiny GGUF files written with the ``gguf`` package, as llama.cpp's converter lays them out, for
tests of transformers' GGUF loader on the two architectures the project uses: ``llama``
(SmolLM2) and ``qwen2`` (Qwen2.5-Coder, the GPU run's model: attention biases, a GPT-2-style
byte-level BPE tokenizer with Qwen's special tokens, a ChatML chat template)."""

from __future__ import annotations

import numpy as np

H, LAYERS, FFN, HEADS, KV_HEADS = 32, 2, 64, 4, 2

# Qwen2.5's ChatML layout (its template without the tool-calling branches): the default system
# message, then each turn between <|im_start|>role and <|im_end|>.
QWEN_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}{%- if message['role'] != 'system' %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_level_alphabet() -> list[str]:
    """GPT-2's 256 byte-level symbols (bytes_to_unicode), in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes, extra = [], 0
    for byte in range(256):
        if byte in printable:
            codes.append(byte)
        else:
            codes.append(256 + extra)
            extra += 1
    return [chr(c) for c in codes]


def _add_blocks(w, rng, vocab: int, biases: bool) -> None:
    def add(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    add("token_embd.weight", vocab, H)
    add("output.weight", vocab, H)
    w.add_tensor("output_norm.weight", np.ones(H, np.float32))
    kv = KV_HEADS * H // HEADS
    for i in range(LAYERS):
        for name, shape in (("attn_q", (H, H)), ("attn_k", (kv, H)), ("attn_v", (kv, H)), ("attn_output", (H, H)),
                            ("ffn_gate", (FFN, H)), ("ffn_up", (FFN, H)), ("ffn_down", (H, FFN))):
            add(f"blk.{i}.{name}.weight", *shape)
        if biases:  # Qwen2 has q/k/v biases
            for name, size in (("attn_q", H), ("attn_k", kv), ("attn_v", kv)):
                add(f"blk.{i}.{name}.bias", size)
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(H, np.float32))


def _add_hparams(w, context: int, rope_dims: bool) -> None:
    w.add_context_length(context)
    w.add_embedding_length(H)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    if rope_dims:
        w.add_rope_dimension_count(H // HEADS)


def _write(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny_llama_gguf(path, vocab: int = 25) -> None:
    """A 2-layer Llama in GGUF (float32 tensors, random weights) with a toy SentencePiece vocabulary."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    _add_hparams(w, 64, rope_dims=True)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([1] * vocab)
    _add_blocks(w, np.random.default_rng(0), vocab, biases=False)
    _write(w)


def write_tiny_qwen2_gguf(path, context: int = 1024) -> int:
    """A 2-layer Qwen2 in GGUF with a byte-level BPE vocabulary (256 bytes, two merges, then
    <|endoftext|>, <|im_start|>, <|im_end|>), Qwen's roles for them as BOS/EOS/pad, and the
    ChatML template; returns the vocabulary size."""
    import gguf

    merges = ["Ġ t", "t h"]  # transformers' converter needs some merges; any text still encodes
    tokens = byte_level_alphabet() + [m.replace(" ", "") for m in merges] + QWEN_SPECIALS
    eot, im_start, im_end = (tokens.index(t) for t in QWEN_SPECIALS)
    w = gguf.GGUFWriter(str(path), "qwen2")
    _add_hparams(w, context, rope_dims=False)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - len(QWEN_SPECIALS)) + [3] * len(QWEN_SPECIALS))  # 3: control tokens
    w.add_token_merges(merges)
    w.add_bos_token_id(eot)  # as the real file: BOS = pad = <|endoftext|>, EOS = <|im_end|>
    w.add_eos_token_id(im_end)
    w.add_pad_token_id(eot)
    w.add_chat_template(QWEN_CHAT_TEMPLATE)
    _add_blocks(w, np.random.default_rng(0), len(tokens), biases=True)
    _write(w)
    return len(tokens)
