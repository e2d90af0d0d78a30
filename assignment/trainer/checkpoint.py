"""Checkpoints that let a killed run continue exactly where it stopped.

One file, ``checkpoint.pt`` in the run directory, replaced atomically (written beside it, then
renamed) so that a kill during the save leaves the previous checkpoint intact. It holds the
policy (LM and value head), the optimizer, the LR scheduler, the step, the KL controller and
every RNG state (torch CPU and CUDA, Python, NumPy): sampling after a resume draws the same
numbers the uninterrupted run would have drawn.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

FILENAME = "checkpoint.pt"


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    # load() maps every tensor to the training device; RNG states must be CPU ByteTensors
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([device_state.cpu() for device_state in state["cuda"]])


def save(out: Path, step: int, policy: dict[str, Any], optimizer: dict[str, Any], scheduler: Any,
         extra: dict[str, Any]) -> Path:
    """Write the checkpoint of ``step``: ``policy`` and ``optimizer`` are their full state dicts
    (``Distributed.model_state``, ``optimizer_state``), ``extra`` the trainer's small states (KL controller,
    curriculum) by name."""
    path = out / FILENAME
    tmp = out / (FILENAME + ".tmp")
    torch.save({"step": step, "policy": policy, "optimizer": optimizer,
                "scheduler": scheduler.state_dict(), "rng": rng_state(), **extra}, tmp)
    os.replace(tmp, path)
    return path


def load(out: Path) -> dict[str, Any]:
    """The checkpoint of the run in ``out``; raises FileNotFoundError if it has none."""
    path = out / FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint to resume from in {out}")
    # weights_only=False: the file is our own and holds Python and NumPy RNG states. Loaded to the
    # CPU: load_state_dict copies each tensor to its parameter's device, and a whole checkpoint
    # on the GPU beside the model it fills would need their memory twice (past
    # train.max_gpu_memory_gib on a small card).
    return torch.load(path, map_location="cpu", weights_only=False)
