"""Does this config fit this card? Asked before the model loads, so that a student who runs the
recipe on a card that cannot hold it learns at once which profile to run instead.

A config states what it needs: ``train.max_gpu_memory_gib`` (a profile proven under that cap) or
``train.min_gpu_memory_gib`` (the recipe: its measured peak with room), and its dtypes say whether
it needs bfloat16, which cards before Ampere (compute capability 8.0: T4, V100) lack: a GSM8K
config on such a card is sent to the float16 profile (proven by its own run), another config is
told the float16 overrides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assignment.trainer.config import Config


@dataclass(frozen=True)
class Profile:
    config: str
    cap_gib: float  # its train.max_gpu_memory_gib: the card must hold at least this
    bfloat16: bool  # it computes in bfloat16
    cards: str  # which cards it is for, in words


# The GSM8K profiles, largest first (configs/ holds them; each was proven by a whole run under its cap).
PROFILES = (
    Profile("configs/gsm8k_qwen_coder_24gb.yaml", 20.0, True, "24 GB cards: L4, A10, RTX 3090/4090"),
    Profile("configs/gsm8k_qwen_coder_16gb.yaml", 14.0, True, "16 GB cards: T4, V100, RTX 4060 Ti/4080"),
    Profile("configs/gsm8k_qwen_coder_16gb_float16.yaml", 14.0, False,
            "16 GB cards, and the ones without bfloat16: T4, V100; trains in float16"),
)
# The dtype fields, and the override that moves each from bfloat16 to float16 on a card without it.
DTYPE_FIELDS = ("model.dtype", "model.reference_dtype", "model.train_dtype", "rollout.generation_dtype")


def bfloat16_fields(cfg: Config) -> list[str]:
    """The dtype fields of ``cfg`` that ask for bfloat16 (a null reference_dtype follows model.dtype)."""
    return [field for field in DTYPE_FIELDS if getattr(getattr(cfg, field.split(".")[0]), field.split(".")[1]) == "bfloat16"]


def float16_overrides(cfg: Config) -> str:
    """The overrides that take ``cfg`` off bfloat16: each bfloat16 field to float16."""
    return " ".join(f"{field}=float16" for field in bfloat16_fields(cfg))


def card_problem(cfg: Config, card: str, memory_gib: float, has_bfloat16: bool) -> str | None:
    """Why ``cfg`` cannot run on ``card`` (``memory_gib`` of memory, bfloat16 or not), naming the
    profiles that can; None when it can."""
    needs = cfg.train.max_gpu_memory_gib or cfg.train.min_gpu_memory_gib
    too_small = needs is not None and needs > memory_gib
    no_bfloat16 = bool(bfloat16_fields(cfg)) and not has_bfloat16
    if not (too_small or no_bfloat16):
        return None
    reasons = []
    if too_small:
        field = "train.max_gpu_memory_gib" if cfg.train.max_gpu_memory_gib else "train.min_gpu_memory_gib"
        reasons.append(f"this config needs {needs:g} GiB of GPU memory ({field}) and this {card} has {memory_gib:.1f} GiB")
    if no_bfloat16:
        reasons.append(f"it computes in bfloat16, which this {card} lacks (compute capability below 8.0)")
    # the largest profile that fits and computes in what this card has (the float16 one on a T4)
    runnable = [p for p in PROFILES if p.cap_gib <= memory_gib and (has_bfloat16 or not p.bfloat16)]
    if not too_small:
        advice = f"keep this config with the float16 overrides {float16_overrides(cfg)}"
        if cfg.data.task == "gsm8k" and runnable:
            advice = f"run {runnable[0].config} ({runnable[0].cards}), or {advice}"
    elif runnable:
        advice = f"run {runnable[0].config} ({runnable[0].cards})"
    else:
        advice = f"no GSM8K profile fits {memory_gib:.1f} GiB; the smallest needs {min(p.cap_gib for p in PROFILES):g} GiB"
    return "; ".join(reasons) + ": " + advice


def check_card(cfg: Config, device: torch.device) -> str | None:
    """``card_problem`` for the CUDA ``device`` (None off CUDA: nothing to check)."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return card_problem(cfg, props.name, props.total_memory / 2**30, props.major >= 8)
