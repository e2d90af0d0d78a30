"""What the staff tools that read committed runs share: which config keys say where a run was
rather than what it computed, and a run's config as a flat dict to compare with another's.

A report folder (``ppo-train --report``) holds the run's effective ``config.yaml``. Two runs made
the same computation when their configs agree on every key outside ``RUN_CONTROL``; a key added
to the schema after a run takes its default, which is what the code before it did.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from assignment.trainer.config import Config, load_config

# Where the run was, not what it computed: the device's paths and how the run was split into calls.
# Keys that say where a run's files go, how long a call may run, where the model and data are, or
# whether the card may start it (train.min_gpu_memory_gib: a check before loading) or how much of it
# the allocator may hold (train.max_gpu_memory_gib: past it a run fails, it computes nothing else):
# none changes what the run computes.
RUN_CONTROL = frozenset({"train.output_dir", "train.time_limit_s", "train.final_checkpoint", "model.name",
                         "model.gguf_file", "data.local_dir", "train.min_gpu_memory_gib",
                         "train.max_gpu_memory_gib"})


def flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {"section.key": value}."""
    out = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return out


def _defaults() -> dict[str, Any]:
    return flat(OmegaConf.to_container(OmegaConf.structured(Config)))


def run_config(folder: Path) -> dict[str, Any]:
    """The flat config a run folder's ``config.yaml`` holds, with the schema's default for each key
    added since the run. Raises ValueError for a key the schema no longer has (what it meant is
    unknown)."""
    ran, defaults = flat(yaml.safe_load((folder / "config.yaml").read_text())), _defaults()
    if not ran.keys() <= defaults.keys():
        raise ValueError(f"{folder}/config.yaml holds keys the config no longer has: {sorted(ran.keys() - defaults.keys())}")
    return {key: ran.get(key, value) for key, value in defaults.items()}


def shipped_config(path: Path) -> dict[str, Any]:
    """The flat config of a config file as the trainer loads it (its ``base`` included)."""
    return flat(OmegaConf.to_container(OmegaConf.structured(load_config(path))))


def changed(a: dict[str, Any], b: dict[str, Any]) -> set[str]:
    """The keys outside ``RUN_CONTROL`` whose values differ between two flat configs."""
    return {key for key in a.keys() | b.keys() if key not in RUN_CONTROL and a.get(key) != b.get(key)}


def write_or_check(path: Path, page: str, updated: str, check: bool, what: str, rerun: str) -> int:
    """Write ``updated`` (``page`` with its generated part, ``what``, recomputed) to ``path``; with
    ``check``, write nothing and return 1 if the page on disk is stale (``rerun``: the command that
    mends it). What the generators of committed pages (course.controls, course.seeds) end with."""
    if not check:
        path.write_text(updated)
        print(f"{path}: wrote {what}")
        return 0
    if updated != page:
        print(f"{path}: stale ({what}): run {rerun}", file=sys.stderr)
        return 1
    print(f"{path}: current ({what})")
    return 0
