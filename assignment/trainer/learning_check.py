"""The CPU learning check: does PPO with these five exercises actually learn?

It trains a tiny random-init Llama on the synthetic arithmetic task (the config defaults, see
``config``; no download, CPU only) with the exercise module ``impl``, and compares the mean
training reward of the last ``runlog.REWARD_WINDOW`` (10) PPO steps with that of the first 10. The reference
solution clears the default margin on every seed tried, while a sign-flipped policy loss
(gradient ascent on the surrogate loss) does not.

The autograder calls ``run`` on a submission it has already loaded, with its own margin.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from types import ModuleType
from typing import Sequence

from assignment.trainer.config import load_config
from assignment.trainer.loop import train
from assignment.trainer.runlog import REWARD_WINDOW

# Keep the check quiet and light: no progress bars, samples, TensorBoard or mid-run checkpoints,
# and one CPU thread, the fastest for this tiny model (and immune to a busy machine).
QUIET = ("train.progress=false", "train.tensorboard=false", "train.sample_every=0", "train.checkpoint_every=0",
         "train.cpu_threads=1")


@dataclass(frozen=True)
class LearningCheck:
    # Mean training reward of the first and of the last REWARD_WINDOW (10) steps.
    first10_mean: float
    last10_mean: float
    # Training reward (batch mean) of every PPO step.
    rewards: tuple[float, ...]
    threshold: float
    # Greedy strict accuracy on the synthetic test problems, before and after training.
    accuracy_before: float
    accuracy_after: float
    seconds: float

    @property
    def improvement(self) -> float:
        return self.last10_mean - self.first10_mean

    @property
    def passed(self) -> bool:
        return self.improvement >= self.threshold


def run(impl: ModuleType, seed: int = 0, threshold: float = 0.15, overrides: Sequence[str] = (),
        output_dir: str | None = None) -> LearningCheck:
    """Train ``impl`` on the synthetic task; compare the first and last 10 steps' mean rewards.

    Args:
        impl: the exercise module (already loaded, e.g. by ``impl.load_impl``).
        seed: ``train.seed``: model init, data, sampling.
        threshold: the check passes when last-10 mean - first-10 mean >= threshold.
        overrides: extra ``key=value`` config overrides (after the quiet defaults).
        output_dir: where the run writes; a temporary directory (deleted after) if None.
    """
    with tempfile.TemporaryDirectory(prefix="ppo-learning-check-") as tmp:
        cfg = load_config(None, [*QUIET, f"train.seed={seed}", f"train.output_dir={output_dir or tmp}", *overrides])
        result = train(cfg, impl)
    rewards = tuple(result.rewards())
    first, last = rewards[:REWARD_WINDOW], rewards[-REWARD_WINDOW:]
    accuracy = [e["eval/accuracy"] for e in result.evals] or [float("nan")]
    return LearningCheck(sum(first) / len(first), sum(last) / len(last), rewards, threshold,
                         accuracy[0], accuracy[-1], result.seconds)
