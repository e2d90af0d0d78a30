"""What only a GPU exercises: transformers' deferred stop check that the rollout turns on for CUDA,
and the sampler's grouped decoding attention through transformers' static-cache decoding. Skipped without
CUDA (CI has none); run on a GPU machine with `pytest tests/test_gpu.py`."""

import copy

import pytest
import torch
from transformers import GenerationConfig

from assignment.model import PolicyWithValueHead, tiny_llama
from assignment.trainer import attention
from assignment.trainer.ppo import first_kl_tolerance
from assignment.trainer.rollout import deferred_stop_check

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def prompts(batch=6, length=7, vocab=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :3] = mask[1, :1] = 0  # left padding
    return ids.cuda(), mask.cuda()


def test_the_deferred_stop_check_changes_no_token():
    """Rows end at different steps (25 of the 64 tokens are EOS: sampled, a row outlives 40
    steps with probability (39/64)^40 < 1e-8), and the deferred check pays one extra step that
    transformers removes: the same tokens as the check it replaces."""
    lm = tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, seed=0).cuda()
    ids, mask = prompts()
    for cache in ({}, {"cache_implementation": "static"}):
        config = GenerationConfig(max_new_tokens=40, pad_token_id=0, eos_token_id=list(range(5, 30)),
                                  do_sample=True, temperature=1.0, top_k=0, top_p=1.0, **cache)
        torch.manual_seed(0)
        plain = lm.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        torch.manual_seed(0)
        with deferred_stop_check(ids.device):
            deferred = lm.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        assert plain.shape[1] < ids.shape[1] + 40  # every row ended early: the stop was tested
        assert torch.equal(plain, deferred)


def test_grouped_decoding_compiled_on_cuda_gives_sdpa_logits(monkeypatch):
    """The rollout's decoding path on CUDA (static cache, compiled step) with the grouped attention
    against transformers' sdpa. Float32 without TF32, so the bound is ppo.first_kl_tolerance's:
    the same weights on batches of other shapes. The prefill (step 0) runs sdpa in both; step 1
    is the first decoding step, from the same token (step 0's logits are the same)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    lm = tiny_llama(vocab_size=64, hidden_size=64, num_layers=2, seed=0).cuda()
    grouped = copy.deepcopy(lm)
    attention.use_grouped_decoding(grouped)
    ids, mask = prompts()
    config = GenerationConfig(do_sample=False, max_new_tokens=4, pad_token_id=0, eos_token_id=[63],
                              cache_implementation="static", output_logits=True, return_dict_in_generate=True)
    plain = lm.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    mine = grouped.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    assert torch.equal(plain.logits[0], mine.logits[0])
    tolerance = first_kl_tolerance(PolicyWithValueHead(lm), float(plain.logits[1].abs().max()))
    assert float((plain.logits[1] - mine.logits[1]).abs().max()) <= tolerance
