"""Check: does this card's attention backward give NaN query gradients under the trainer's 16-bit masks?

    python benchmarks/cudnn_attention_nan.py          # a CUDA machine; seconds

cuDNN's fused attention backward (PyTorch's first SDPA choice in 16 bits on Hopper) returns NaN in
the query gradient when a mask is passed, the key length is 64 mod 128, and some query row's
logsumexp is below ln(float32 max) = -88.7 (pytorch/pytorch#196678): the padded half of its last
128-wide key tile is scored 0 instead of -inf. Qwen2.5 meets the third condition in every batch
(its attention sinks: the first real token of a row attends to itself at a logit near -300), so
1 minibatch in 128, by its length, poisons its optimizer step. ``precision.cudnn_attention_safe``
turns that kernel off for 16-bit training.

The inputs: Qwen2.5-0.5B's attention shape (14 heads of 64), rows left-padded as the trainer pads
prompts, a causal boolean mask, and in head 1 each row's first real token scoring every key at
about -300. For each length and dtype, the count of non-finite entries of the gradients of q, k
and v, with PyTorch's default choice of kernel, with cuDNN's alone and with the memory-efficient
kernel alone. What it printed on an H200 (torch 2.11, cuDNN 9.19): reports/performance/small_cards/lease_16bit_2/cudnn_attention_nan.txt.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROWS, HEADS, HEAD_DIM, PADDING = 4, 14, 64, (0, 37, 90, 5)
KERNELS = {"default": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                       SDPBackend.MATH],
           "cudnn": [SDPBackend.CUDNN_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION]}


def non_finite_gradients(length: int, dtype: torch.dtype, kernels: list[SDPBackend]) -> list[int]:
    """Non-finite entries of the gradients of q, k, v (B, H, L, d) after one masked SDPA backward."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    shape = (ROWS, HEADS, length, HEAD_DIM)
    q = torch.randn(shape, device="cuda", generator=generator) * 0.5
    k = torch.randn(shape, device="cuda", generator=generator) * 0.5
    v = torch.randn(shape, device="cuda", generator=generator)
    real = torch.ones(ROWS, length, dtype=torch.bool, device="cuda")  # (B, L): False on the left padding
    for row, pad in enumerate(PADDING):
        real[row, :pad] = False
        # the sink: q.k = 1 x (-300 sqrt(d)), scaled by 1/sqrt(d): every logit of this query row ~ -300
        q[row, 1, pad, 0], k[row, 1, pad, 0] = 1.0, -300 * math.sqrt(HEAD_DIM)
    mask = torch.ones(length, length, dtype=torch.bool, device="cuda").tril()[None, None] & real[:, None, None, :]
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    with sdpa_kernel(kernels):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        # no gradient flows into fully masked query rows (the trainer's losses mask them out)
        out.backward(torch.randn_like(out) * mask.any(-1)[..., None])
    return [int((~t.grad.isfinite()).sum()) for t in (q, k, v)]


def main() -> int:
    if not torch.cuda.is_available():
        print("cudnn_attention_nan: needs a CUDA card (the kernel in question is cuDNN's)")
        return 2
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    print("non-finite entries of (dq, dk, dv) by kernel")
    for dtype in (torch.float16, torch.bfloat16):
        for length in (640, 703, 704, 705, 768, 832):
            cells = "  ".join(f"{name} {non_finite_gradients(length, dtype, kernels)}" for name, kernels in KERNELS.items())
            print(f"{str(dtype).removeprefix('torch.'):9} L={length}  {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
