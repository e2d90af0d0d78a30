"""What a run leaves behind: JSONL metrics, TensorBoard, optional wandb, samples, a reward curve.

A run directory holds ``config.yaml`` (the effective config), ``run.json`` (one entry per
invocation: command, machine, versions, and its times as the run goes: ``Progress``),
``metrics.jsonl`` (one line per PPO step), ``eval.jsonl`` (one line per finished evaluation),
``samples.jsonl`` (sample generations), ``eval_samples/step_N.jsonl`` (one record per problem
of the greedy evaluation after step N, written batch by batch), ``tb/`` (TensorBoard) and, at
the end, ``reward_curve.png``. Keys are namespaced: ``rollout/``, ``loss/``, ``stats/``,
``eval/``, ``time/``. On resume the JSONL files are cut back to the checkpoint's step, so that
steps a killed run logged after its last checkpoint are not counted twice.
"""

from __future__ import annotations

import gzip
import json
import sys
import time
import zlib
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the autograder imports REWARD_WINDOW from here: no omegaconf at import time
    from assignment.trainer.config import Config

METRICS, EVALS, SAMPLES = "metrics.jsonl", "eval.jsonl", "samples.jsonl"

# Training reward is judged as the mean over the first and over the last REWARD_WINDOW PPO steps
# (the learning check, the CLI's summary, the report, the autograder's training check), and the
# reward curve is smoothed over as many. Why 10: one step's batch-mean reward is noisy (64
# responses, rewards in [0, 1.1]: a standard error up to ~0.07); a mean over 10 steps brings the
# first-vs-last difference to a standard error of ~0.03, a fifth of the learning check's 0.15
# margin, while 10 of the synthetic run's 400 steps still catch the policy before it has learned.
REWARD_WINDOW = 10


class RunFileError(ValueError):
    """A run or report file that is not readable JSONL (truncated, corrupt, not gzip under a
    ``.gz`` name): the CLI prints it, naming the file, without a traceback."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL file, [] where there is none; a ``.jsonl.gz`` is read through gzip
    (a report folder's per-problem evaluations: ``write_gz``). Raises RunFileError."""
    if not path.is_file():
        return []
    try:
        data = path.read_bytes()
        text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode()
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, EOFError, zlib.error, ValueError) as err:  # BadGzipFile is an OSError; JSON and UTF-8 errors ValueErrors
        raise RunFileError(f"{path} is not readable {'gzip-compressed ' * (path.suffix == '.gz')}JSONL: {err}") from err


def write_gz(data: bytes, path: Path) -> None:
    """``data`` gzip-compressed into ``path``. A GSM8K evaluation of 1319 responses is ~1.9 MB of
    JSONL and ~0.37 MB compressed, and report folders are committed. The header carries no
    timestamp (mtime=0) and "unknown" as its OS byte (Python < 3.13 writes the system's, 3.13
    writes 255), so the same data give the same bytes on every machine with the same zlib."""
    compressed = bytearray(gzip.compress(data, compresslevel=9, mtime=0))
    compressed[9] = 255  # RFC 1952's OS field
    path.write_bytes(bytes(compressed))


def _truncate(path: Path, last_step: int) -> None:
    """Keep only the records of ``path`` with step <= last_step."""
    kept = [r for r in read_jsonl(path) if r["step"] <= last_step]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))


EVAL_RECORDS = "eval_samples"


def eval_records_path(out: Path, step: int) -> Path:
    """Where the per-problem records of the evaluation after ``step`` go."""
    return out / EVAL_RECORDS / f"step_{step}.jsonl"


def eval_step_of(path: Path) -> int:
    return int(path.stem.removeprefix("step_"))


class Progress:
    """This invocation's entry in ``run.json``, rewritten as the run goes, so that a killed
    invocation still tells how long it ran up to its last finished step or evaluation batch.

    Each entry holds the command, whether it resumed, when it started, the host, torch,
    transformers, the device, ``world_size`` (the processes of a data-parallel job, 1 for a
    plain run) and, kept current: ``seconds`` (wall time so far),
    ``train_seconds`` and ``eval_seconds`` (time in PPO steps and in evaluations), ``step`` (the
    last finished PPO step) and ``status`` ("running" until the invocation ends, then "finished"
    or "time_limit"; an invocation killed from outside stays "running").
    """

    def __init__(self, out: Path, command: str | None, resume: bool, world_size: int = 1):
        import platform

        import torch
        import transformers

        self.path, self.started = out / "run.json", time.time()
        self.runs = json.loads(self.path.read_text()) if self.path.is_file() else []
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"
        self.entry = {"command": command, "resume": resume, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                      "host": platform.node(), "torch": torch.__version__, "transformers": transformers.__version__,
                      "device": device, "world_size": world_size, "status": "running"}
        self.times: dict[str, float] = defaultdict(float)
        self.runs.append(self.entry)
        self.write()

    def add(self, kind: str, seconds: float, step: int | None = None) -> None:
        """Count ``seconds`` of ``kind`` ("train" or "eval"); record ``step`` as the last finished."""
        self.times[kind] += seconds
        if step is not None:
            self.entry["step"] = step
        self.write()

    def finish(self, status: str) -> None:
        self.entry["status"] = status
        self.write()

    def record(self, **fields: Any) -> None:
        """Add ``fields`` to this invocation's entry (the GPU memory cap, say)."""
        self.entry.update(fields)
        self.write()

    def write(self) -> None:
        self.entry["seconds"] = time.time() - self.started
        self.entry.update({f"{kind}_seconds": value for kind, value in self.times.items()})
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.runs, indent=1))
        tmp.replace(self.path)


class RunLogger:
    """Writes every record to JSONL and, when enabled, TensorBoard and wandb."""

    def __init__(self, out: Path, cfg: Config, start_step: int):
        self.out = out
        for name in (METRICS, EVALS, SAMPLES):
            _truncate(out / name, start_step)
        for path in (out / EVAL_RECORDS).glob("step_*.jsonl"):
            if eval_step_of(path) > start_step:  # from a killed invocation, after its last checkpoint
                path.unlink()
        self.tb = None
        if cfg.train.tensorboard:
            try:  # the `train` extra installs it; the CPU demo runs without (metrics.jsonl has everything)
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                print("no TensorBoard logs: tensorboard is not installed (pip install -e '.[train]'); "
                      "metrics.jsonl holds every metric", file=sys.stderr)
            else:
                # purge_step drops events a killed run wrote after its last checkpoint.
                self.tb = SummaryWriter(str(out / "tb"), purge_step=start_step + 1 if start_step else None)
        self.wandb = None
        if cfg.train.wandb:
            import wandb  # optional dependency, imported only when asked for

            from assignment.trainer.config import to_dict

            self.wandb = wandb.init(project=cfg.train.wandb_project, dir=str(out), config=to_dict(cfg),
                                    name=out.name, resume="allow")

    def _append(self, name: str, record: dict[str, Any]) -> None:
        with (self.out / name).open("a") as f:
            f.write(json.dumps(record) + "\n")

    def log(self, step: int, metrics: dict[str, float], file: str = METRICS) -> None:
        self._append(file, {"step": step, **metrics})
        for key, value in metrics.items():
            if self.tb is not None:
                self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        for sample in samples:
            self._append(SAMPLES, {"step": step, **sample})
        if self.tb is not None:
            text = "\n\n".join(f"**Q:** {sample['question']}\n\n**A:** {sample['response']}\n\n"
                               f"(reward {sample['reward']:.2f})" for sample in samples)
            self.tb.add_text("samples", text, step)

    def eval_records(self, step: int, records: list[dict[str, Any]]) -> None:
        """Append a batch of per-problem records to the evaluation after ``step``."""
        path = eval_records_path(self.out, step)
        path.parent.mkdir(exist_ok=True)
        with path.open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in records))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values (shorter at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


# The synthetic task's curriculum level, logged per step by loop.ppo_step: the operand range
# [0, level] that step's training problems were drawn from.
LEVEL_KEY = "rollout/max_operand"


def level_changes(metrics: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(step, new level) for every step whose curriculum level differs from the step before:
    the first step trained on the wider operand range. Empty for runs without a curriculum."""
    levelled = [(m["step"], m[LEVEL_KEY]) for m in metrics if LEVEL_KEY in m]
    return [(step, level) for (_, before), (step, level) in zip(levelled, levelled[1:]) if level != before]


def draw_run(metrics: list[dict[str, Any]], evals: list[dict[str, Any]]) -> Any:
    """The figure of ``plot_run`` (a matplotlib Figure; the caller saves and closes it).

    Each curriculum level change is a dashed vertical line on both panels (``gid`` "curriculum"),
    labelled with the new operand range on the top one: on the synthetic task the training reward
    dips right after a widening, which is expected, not a bug.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    steps = [m["step"] for m in metrics]
    rewards = [m["rollout/reward_mean"] for m in metrics]
    top.plot(steps, rewards, alpha=0.35, label="reward (batch mean)")
    top.plot(steps, moving_average(rewards, REWARD_WINDOW), label=f"reward ({REWARD_WINDOW}-step mean)")
    top.set_ylabel("training reward")
    top.legend()
    if evals:
        eval_steps = [e["step"] for e in evals]
        bottom.plot(eval_steps, [e["eval/accuracy"] for e in evals], "o-", label="eval accuracy")
        bottom.plot(eval_steps, [e["eval/format_rate"] for e in evals], "s--", label="eval answer rate")
        bottom.legend()
    for step, level in level_changes(metrics):
        for ax in (top, bottom):
            ax.axvline(step, color="grey", linestyle="--", linewidth=0.8, gid="curriculum")
        # x in data units, y in axes units (0 bottom, 1 top): the label sits at the panel's top edge.
        top.text(step, 0.98, f" operands 0-{level}", transform=top.get_xaxis_transform(), fontsize=7,
                 color="grey", rotation=90, va="top", ha="right")
    bottom.set_ylim(-0.02, 1.02)
    bottom.set_xlabel("PPO step")
    bottom.set_ylabel("greedy eval")
    fig.tight_layout()
    return fig


def plot_run(out: Path) -> Path:
    """Draw ``reward_curve.png``: training reward (raw and smoothed) and eval accuracy/format,
    with the curriculum's level changes marked (``draw_run``)."""
    fig = draw_run(read_jsonl(out / METRICS), read_jsonl(out / EVALS))  # sets the Agg backend first
    import matplotlib.pyplot as plt

    path = out / "reward_curve.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# What ``compare_runs`` draws, one panel each: (metrics.jsonl key, the panel's y label).
COMPARED = (("rollout/reward_mean", "training reward (batch mean)"),
            ("rollout/response_length", "response length (tokens)"),
            ("rollout/kl", "KL to the reference (nats/seq, k1)"))


def run_label(out: Path) -> str:
    """A run's name in a comparison: its folder, and its algorithm where it has a config.yaml (one
    written before Part II names none: those runs were PPO), with its reward control if it trained
    under one (reward.kind other than correct)."""
    config = out / "config.yaml"
    if not config.is_file():
        return out.name
    from omegaconf import OmegaConf  # lazily: this module imports without the trainer's dependencies

    saved = OmegaConf.load(config)
    kind = saved.get("reward", {}).get("kind", "correct")
    return f"{out.name} ({saved.get('algorithm', 'ppo')}{'' if kind == 'correct' else f', reward.kind {kind}'})"


def draw_comparison(runs: list[tuple[str, list[dict[str, Any]]]]) -> Any:
    """One figure, one panel per ``COMPARED`` metric, one line per run (labelled with its name)
    against the step: runs of PPO, GRPO and Dr. GRPO side by side (handout.md section 8)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(COMPARED), 1, figsize=(8, 9), sharex=True)
    for ax, (key, ylabel) in zip(axes, COMPARED):
        for label, metrics in runs:
            rows = [m for m in metrics if key in m]
            ax.plot([m["step"] for m in rows], [m[key] for m in rows], label=label)
        ax.set_ylabel(ylabel)
    axes[0].legend()
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    return fig


def compare_runs(run_dirs: list[Path], path: Path) -> Path:
    """Draw ``draw_comparison`` of the runs in ``run_dirs`` to ``path``. Raises
    FileNotFoundError naming a folder that holds no metrics.jsonl."""
    runs = []
    for out in run_dirs:
        if not (out / METRICS).is_file():
            raise FileNotFoundError(f"{out} holds no {METRICS}: not a run directory")
        runs.append((run_label(out), read_jsonl(out / METRICS)))
    fig = draw_comparison(runs)
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
