"""Load the tokenizer, the policy (LM + value head) and the frozen reference model.

A model is a Hugging Face hub id (``model.name=Qwen/Qwen2.5-0.5B-Instruct``, downloaded and cached
by transformers), a local folder in the same layout, or a GGUF file (``model.gguf_file``: a file
name inside the folder ``model.name``, or a path of its own, which then stands alone):
transformers dequantizes GGUF weights into a plain model but still marks it as quantized
(``hf_quantizer``, ``is_quantized``, ``config.quantization_config``). Those flags would make
transformers refuse dtype casts and training, and make ``save_pretrained`` write a GGUF
quantization config for weights that are plain tensors; ``clear_quantization_flags`` removes
them on purpose, right after loading.

The reference model is a frozen deep copy of the LM as loaded (trl's ``create_reference_model``
does the same, but in trl 1.16 it moved to ``trl.experimental``, whose import warns).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from assignment.trainer.config import ModelConfig
from assignment.model import PolicyWithValueHead, tiny_llama
from assignment.trainer.synthetic import build_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(ValueError):
    """A model that cannot be loaded; the CLI prints the message without a traceback."""


def _source(cfg: ModelConfig) -> tuple[str, dict]:
    """The path or hub id to load from, and the extra from_pretrained kwargs (GGUF)."""
    if cfg.gguf_file is None:
        return cfg.name, {}
    path = Path(cfg.name) / cfg.gguf_file  # an absolute gguf_file ignores the folder
    if not path.is_file():
        raise ModelError(f"GGUF model file not found: {path} "
                         "(model.name is its folder, model.gguf_file the file name or its path)")
    # transformers reads GGUF files with gguf and places their weights with accelerate; name a
    # missing one here rather than deep inside from_pretrained.
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ModelError("model.gguf_file needs the gguf package: pip install gguf") from None
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise ModelError("model.gguf_file needs the accelerate package: pip install accelerate") from None
    return str(path.parent), {"gguf_file": path.name}


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    """The tokenizer, left-padding, with a pad token (EOS when the model has none)."""
    if cfg.name == "synthetic" or cfg.tokenizer == "synthetic":
        return build_tokenizer()
    source, kwargs = (cfg.tokenizer, {}) if cfg.tokenizer else _source(cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot load the tokenizer from '{source}': {err}") from None
    # Left padding puts every prompt's last token at column P-1, where the response starts.
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def clear_quantization_flags(model: PreTrainedModel) -> PreTrainedModel:
    """Unmark a dequantized (GGUF-loaded) model as quantized; return it.

    Undoes what transformers' quantizer sets: ``hf_quantizer``, ``is_quantized``,
    ``quantization_method``, ``config.quantization_config`` and the submodules'
    ``config._is_quantized`` (as ``HfQuantizer.remove_quantization_config`` does, which not every
    transformers version has). Only for a model whose weights are plain float tensors, as GGUF
    loading leaves them.
    """
    for owner, name in ((model, "hf_quantizer"), (model, "quantization_method"), (model.config, "quantization_config")):
        if name in vars(owner):
            delattr(owner, name)
    if not isinstance(getattr(type(model), "is_quantized", None), property):
        model.is_quantized = False
    for module in model.modules():
        if getattr(getattr(module, "config", None), "_is_quantized", False):
            module.config._is_quantized = False
    return model


def load_lm(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int,
            device: torch.device | None = None) -> PreTrainedModel:
    """The causal LM in ``cfg.dtype``, in train mode; raises ModelError when it cannot load.
    On the CPU, but with ``model.random_init`` on ``device``."""
    dtype = DTYPES[cfg.dtype]
    if cfg.name == "synthetic":
        lm = tiny_llama(vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                        seed=seed, dtype=dtype, pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    elif cfg.random_init:
        lm = random_lm(cfg.name, dtype, seed, device or torch.device("cpu"), len(tokenizer))
    else:
        source, kwargs = _source(cfg)
        try:
            lm = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
        except (OSError, ValueError) as err:
            raise ModelError(f"cannot load the model '{source}': {err}") from None
        if "gguf_file" in kwargs:
            clear_quantization_flags(lm)
    return lm.train()


def random_lm(source: str, dtype: torch.dtype, seed: int, device: torch.device, vocabulary: int) -> PreTrainedModel:
    """A causal LM of the architecture and shape of ``source``'s config.json (a folder or hub id),
    its weights drawn by transformers' initialisation after ``torch.manual_seed(seed)``
    (``model.random_init``). Drawn on ``device`` itself: a 7B model's float32 weights take about
    two minutes on one CPU thread, and the CPU would hold a full copy per process. Every process of
    a job draws the same weights (the same seed, and cards of one kind run the same kernels), as
    FSDP2 needs to shard one model. ``vocabulary``: the tokenizer's size, which the model's must cover."""
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot read the model config '{source}' (model.random_init): {err}") from None
    if config.get_text_config().vocab_size < vocabulary:
        raise ModelError(f"the model config '{source}' has a vocabulary of {config.get_text_config().vocab_size}, "
                         f"fewer than the tokenizer's {vocabulary} tokens")
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), device:
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def reference_model(lm: PreTrainedModel, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """A frozen copy of ``lm`` in eval mode, its weights in ``dtype`` (None: as loaded): the KL
    anchor, never updated. Parameters only are cast: buffers such as RoPE's inv_freq stay as
    loaded (in bfloat16 it would shift the rotary phase, as ``rollout.generation_copy`` says).
    Each parameter is cast as it is copied, so the float32 copy never exists whole: with a 7B
    model's bfloat16 reference, the build holds 30.5 + 15.2 GB instead of 2 x 30.5 GB. A
    parameter that two modules share (tied embeddings) stays one."""
    # copy=True: a dtype the parameter already has would otherwise give back its own storage
    memo = {} if dtype is None else {id(param): torch.nn.Parameter(param.detach().to(dtype, copy=True), requires_grad=False)
                                     for param in lm.parameters()}
    return copy.deepcopy(lm, memo).eval().requires_grad_(False)


def build_models(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int,
                 device: torch.device) -> tuple[PolicyWithValueHead, PreTrainedModel]:
    """The trainable policy (LM + value head) and the frozen reference, both on ``device``."""
    lm = load_lm(cfg, tokenizer, seed, device)
    # copied before checkpointing: the reference never runs backward
    ref = reference_model(lm, DTYPES[cfg.reference_dtype] if cfg.reference_dtype else None)
    if cfg.gradient_checkpointing:
        # transformers 5.24 renamed it (the old name warns); 5.17 has only the old one.
        enable = getattr(lm, "activation_checkpointing_enable", None) or lm.gradient_checkpointing_enable
        enable()
    return PolicyWithValueHead(lm).to(device), ref.to(device)


def compile_layers(lm: PreTrainedModel, backend: str = "inductor", scope: str = "part") -> None:
    """Compile, in place and with dynamic shapes (one graph serves every row count and length),
    the ``forward`` of each decoder layer of ``lm`` (``scope`` "layer") or of each of its parts, its
    attention, MLP and norms ("part"). What it saves is host time: an eager forward of
    Qwen2.5-0.5B launches ~1000 kernels from Python, which small minibatches cannot hide behind GPU
    work (model.compile and model.compile_scope in the config). A compiled call has a host cost of
    its own (guards, autograd wrappers): a layer is one call where its parts are four.

    Layers or parts, and not the whole transformer as one graph: that graph (24 layers with their
    gradient checkpointing) took inductor ~5 min to compile for the scoring forwards and ~11 min
    for the update's first step, and recompiled in the second (two H200s). A layer's forward is
    what gradient checkpointing wraps, so a compiled layer is recomputed by its compiled code.
    The state dict keeps its keys."""
    for module in compiled_parts(lm, scope):
        module.forward = torch.compile(module.forward, dynamic=True, backend=backend)


def compiled_parts(lm: PreTrainedModel, scope: str = "part") -> list[torch.nn.Module]:
    """The repeated blocks of ``lm`` (its ``_no_split_modules`` classes, as FSDP wraps them: the
    decoder layers) for ``scope`` "layer", or their direct children (a decoder layer's attention,
    MLP and norms) for "part"."""
    classes = set(getattr(lm, "_no_split_modules", None) or ())
    layers = [module for module in lm.modules() if type(module).__name__ in classes]
    return layers if scope == "layer" else [child for layer in layers for child in layer.children()]


@contextmanager
def eager_layers(lm: PreTrainedModel) -> Iterator[None]:
    """Inside the block, ``compile_layers``' parts run eagerly: decoding with a growing KV cache
    (evaluation, or sampling from the policy itself) would recompile them at every new length."""
    compiled = [(module, vars(module).pop("forward")) for scope in ("layer", "part") for module in compiled_parts(lm, scope)
                if "forward" in vars(module)]
    try:
        yield
    finally:
        for module, forward in compiled:
            module.forward = forward
