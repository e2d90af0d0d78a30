"""``ppo-train``: train with PPO from a config file. Thin: parse, call ``train``, print.

    ppo-train --config configs/cpu_synthetic.yaml                   # the student's exercises
    ppo-train --config configs/cpu_synthetic.yaml --impl other/exercises.py  # any exercises file
    ppo-train --config configs/gsm8k_smollm2.yaml ppo.lr=1e-6 train.steps=10
    ppo-train --resume runs/cpu_synthetic                           # continue a killed or time-limited run
    ppo-train --config configs/gsm8k_qwen_coder.yaml train.time_limit_s=450   # stop cleanly, resume later
    ppo-train --report runs/gsm8k_qwen_coder --report-out path/to/report.md --staging-seconds 120

Problems the user can fix (a bad config key, malformed data, a missing model file, a
submission that does not import, an exercise not yet written) are printed as one message,
without a traceback, and exit with status 2; running out of GPU memory is one message with the
ways out, status 3. A run stopped by ``train.time_limit_s`` exits 0 and
prints the command that continues it. ``python -m assignment.trainer`` is the same command, and
either runs data-parallel under ``accelerate launch`` (handout.md section 1).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

from assignment.trainer.config import ALGORITHM_NAMES, ConfigError, load_config
from assignment.trainer.data import DataError
from assignment.trainer.distributed import Distributed, WorldSizeError
from assignment.trainer.impl import ImplError, load_impl
from assignment.trainer.loading import ModelError
from assignment.trainer.loop import TIME_LIMIT, RunDirError, RunResult, train
from assignment.trainer.report import ReportError, write_report
from assignment.trainer.runlog import REWARD_WINDOW, RunFileError

USER_ERRORS = (ConfigError, DataError, ModelError, ImplError, RunDirError, FileNotFoundError, WorldSizeError,
               ReportError, RunFileError)
OUT_OF_MEMORY_ADVICE = (
    "The config asks more of this card than it has. For the Qwen recipe on a 24 or 16 GB card: "
    "configs/gsm8k_qwen_coder_24gb.yaml, configs/gsm8k_qwen_coder_16gb.yaml or "
    "configs/gsm8k_qwen_coder_16gb_float16.yaml (README.md: which card); "
    "otherwise fewer rows at a time (ppo.process_minibatch_size, rollout.forward_batch_size, eval.batch_size); "
    "a model whose weights, gradients and AdamW state do not fit one card needs FSDP "
    "(configs/accelerate/fsdp.yaml). The run folder keeps what was saved: --resume continues from its "
    "last checkpoint, if it has one.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppo-train", description="Train a language model with PPO on GSM8K-style math.")
    parser.add_argument("--config", help="YAML config in configs/ (defaults: the CPU synthetic task)")
    parser.add_argument("--impl", default=None,
                        help="whose exercises to run: assignment (default: assignment/exercises.py) or the path "
                             "of any exercises file")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its checkpoint, "
                        "with the config saved there (overrides still apply)")
    parser.add_argument("--report", metavar="RUN_DIR", help="write a Markdown report of a finished run and exit")
    parser.add_argument("--report-out", metavar="PATH", help="where --report writes (default: RUN_DIR/report.md); "
                        "the run's files go to the folder of the same name without .md")
    parser.add_argument("--staging-seconds", type=float, metavar="S",
                        help="with --report: device time spent staging the model and data (measured outside the run)")
    parser.add_argument("--compare", nargs="+", metavar="RUN_DIR",
                        help="draw the reward, response length and KL per step of these runs (run directories or "
                             "--report folders) on one figure, print their evaluations side by side, and exit")
    parser.add_argument("--compare-out", metavar="PATH", default="comparison.png",
                        help="where --compare writes its figure (default: comparison.png)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. ppo.lr=1e-5")
    return parser


def _impl_of_run(run_dir: Path) -> str | None:
    """The --impl the run in ``run_dir`` was started with, so that --resume keeps the same code."""
    try:
        first = json.loads((run_dir / "run.json").read_text())[0]["command"]
    except (OSError, ValueError, LookupError, TypeError):
        return None
    words = shlex.split(first)
    return words[words.index("--impl") + 1] if "--impl" in words[:-1] else None


def unimplemented_advice(impl: str) -> str:
    """What to do about a blank exercise of the submission ``impl``."""
    where = "assignment/exercises.py" if impl == "assignment" else impl
    return f"Fill it in in {where} (its docstring and handout.md say how), then run again."


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    impl_spec = args.impl or (_impl_of_run(Path(args.resume)) if args.resume else None) or "assignment"
    try:
        if args.compare:
            from assignment.trainer.ablation import compare_tables
            from assignment.trainer.runlog import compare_runs

            folders = [Path(d) for d in args.compare]
            tables = figure = True
            try:
                print(compare_tables(folders), end="")
            except FileNotFoundError as err:  # runs without a greedy evaluation before and after: the figure alone
                print(f"no tables: {err}")
                tables = False
            try:
                print(f"wrote {compare_runs(folders, Path(args.compare_out))}")
            except ImportError as err:  # matplotlib: the student install has it, a staff cpu-extra one may not
                print(f"ppo-train: no figure: --compare draws with matplotlib ({err}): pip install matplotlib",
                      file=sys.stderr)
                figure = False
            return 0 if tables or figure else 2
        if args.report:
            path = write_report(Path(args.report), Path(args.report_out) if args.report_out else None,
                                args.staging_seconds)
            print(f"wrote {path}")
            return 0
        if args.resume:
            if args.config:
                raise ConfigError("--resume uses the config saved in the run directory; drop --config")
            cfg = load_config(Path(args.resume) / "config.yaml", args.overrides + [f"train.output_dir={args.resume}"])
        else:
            cfg = load_config(args.config, args.overrides)
        impl = load_impl(impl_spec)
        command = "ppo-train " + " ".join(shlex.quote(arg) for arg in (argv if argv is not None else sys.argv[1:]))
        result = train(cfg, impl, resume=bool(args.resume), command=command)
    except USER_ERRORS as err:
        print(f"ppo-train: {err}", file=sys.stderr)
        return 2
    except NotImplementedError as err:
        print(f"ppo-train: {err}. {unimplemented_advice(impl_spec)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ppo-train: interrupted; continue with --resume RUN_DIR (from the last checkpoint)", file=sys.stderr)
        return 130
    except torch.OutOfMemoryError as err:
        print(f"ppo-train: out of GPU memory: {str(err).splitlines()[0]}\n{OUT_OF_MEMORY_ADVICE}", file=sys.stderr)
        return 3
    if Distributed().is_main:  # under accelerate launch, one job prints one summary
        print_summary(result, cfg.algorithm)
    if torch.distributed.is_initialized():  # the job is over: its processes leave together, as torch asks
        torch.distributed.destroy_process_group()
    return 0


def print_summary(result: RunResult, algorithm: str = "ppo") -> None:
    if result.status == TIME_LIMIT:
        print(f"status: time_limit: stopped after step {result.step} ({result.seconds:.0f} s), checkpoint saved; "
              f"continue with: ppo-train --resume {result.output_dir}")
        return
    print(f"status: finished ({len(result.metrics)} {ALGORITHM_NAMES[algorithm]} steps)")
    rewards = result.rewards()
    window = min(REWARD_WINDOW, len(rewards))
    print(f"done in {result.seconds:.0f} s: {result.output_dir}")
    print(f"training reward: first {window} steps {sum(rewards[:window]) / window:.3f}, "
          f"last {window} steps {sum(rewards[-window:]) / window:.3f}")
    if result.evals:
        first, last = result.evals[0], result.evals[-1]
        print(f"eval accuracy {first['eval/accuracy']:.3f} -> {last['eval/accuracy']:.3f}, "
              f"answer rate {first['eval/format_rate']:.3f} -> {last['eval/format_rate']:.3f}")
    curve = result.output_dir / "reward_curve.png"
    print(f"reward curve: {curve}" if curve.is_file() else "no reward curve: matplotlib draws it (pip install matplotlib)")


if __name__ == "__main__":
    sys.exit(main())
