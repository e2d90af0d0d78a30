"""grading.yaml, typed: every number the grader uses, with no defaults in code.

The dataclasses below have no default values on purpose: a key missing from the YAML is an
error, and so is an unknown one (OmegaConf structured configs reject both).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from assignment.contract import is_bonus

VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")  # Gradescope's values
SANDBOXES = ("auto", "namespaces", "user", "process")

# Where the grader keeps the examples it records (replay.py): root's own on Gradescope, a folder
# every sandbox hides from the workers (sandbox.hidden_paths).
RECORDINGS_ENV = "PPO_GRADER_CACHE"


def recordings_dir() -> Path | None:
    """$PPO_GRADER_CACHE, else ~/.cache/ppo-grade, made (mode 0700) if missing. None when it is
    not private to this user (a folder others may read or write, such as PPO_GRADER_CACHE=/tmp:
    a recording holds the reference's results, and whoever can write one sets what later
    gradings compare against) or cannot be made: then nothing is recorded or replayed."""
    path = Path(os.environ.get(RECORDINGS_ENV) or Path.home() / ".cache" / "ppo-grade")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError:
        return None
    return path if st.st_uid == os.geteuid() and not st.st_mode & 0o077 else None

class ConfigError(ValueError):
    """grading.yaml is malformed; the message says where."""


@dataclass
class SeedConfig:
    public: int = MISSING
    hidden_env: str = MISSING
    hidden_file: str | None = MISSING


@dataclass
class WorkerConfig:
    sandbox: str = MISSING
    sandbox_user: str = MISSING
    memory_mb: int = MISSING
    nproc: int = MISSING
    threads: int = MISSING
    start_timeout_s: float = MISSING
    call_timeout_s: float = MISSING
    update_timeout_s: float = MISSING


@dataclass
class HypothesisConfig:
    shrink_calls: int = MISSING


@dataclass
class CheckConfig:
    points: float = MISSING
    examples: int = MISSING
    visibility: str = MISSING
    # The allowed error in float32 units of the quantity's error scale: |got - expected| <=
    # ulps * 2^-24 * S (autograder/compare.py; each exercise module derives its S).
    ulps: float = MISSING


@dataclass
class TrainingConfig:
    enabled: bool = MISSING
    points: float = MISSING
    threshold: float = MISSING
    timeout_s: float = MISSING
    seed: int = MISSING


@dataclass
class GradingConfig:
    seeds: SeedConfig = MISSING
    worker: WorkerConfig = MISSING
    hypothesis: HypothesisConfig = MISSING
    exercises: dict[int, dict[str, CheckConfig]] = MISSING
    # Part II (exercises 6-8): the same shape, graded as bonus points beside exercises' 100.
    bonus: dict[int, dict[str, CheckConfig]] = MISSING
    training: TrainingConfig = MISSING

    def check(self, number: int, check_id: str) -> CheckConfig:
        """The settings of one check, whichever part its exercise belongs to."""
        return (self.bonus if number in self.bonus else self.exercises)[number][check_id]


def load(path: Path, expected_checks: dict[int, tuple[str, ...]] | None) -> GradingConfig:
    """Load and validate ``path`` against the checks the grader implements (``expected_checks``;
    None leaves them to check_names: knowing them imports every exercise's module, and torch)."""
    try:
        raw = OmegaConf.load(path)
        merged = OmegaConf.merge(OmegaConf.structured(GradingConfig), raw)
        cfg: GradingConfig = OmegaConf.to_object(merged)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OmegaConfBaseException as err:
        raise ConfigError(f"{path}: {err.msg if hasattr(err, 'msg') else err}".splitlines()[0]) from None
    if cfg.worker.sandbox not in SANDBOXES:
        raise ConfigError(f"{path}: worker.sandbox must be one of {SANDBOXES}, not {cfg.worker.sandbox!r}")
    if expected_checks is not None:
        check_names(cfg, expected_checks, path)
    for key in ("memory_mb", "nproc", "threads", "start_timeout_s", "call_timeout_s", "update_timeout_s"):
        if getattr(cfg.worker, key) <= 0:
            raise ConfigError(f"{path}: worker.{key} must be positive")
    return cfg


def check_names(cfg: GradingConfig, expected: dict[int, tuple[str, ...]], path: Path) -> None:
    """The exercises and checks of ``cfg`` are exactly those the grader implements."""
    part_one = {n: ids for n, ids in expected.items() if not is_bonus(n)}
    part_two = {n: ids for n, ids in expected.items() if is_bonus(n)}
    _validate_part(cfg.exercises, part_one, path, "exercises")
    _validate_part(cfg.bonus, part_two, path, "bonus")


def _validate_part(section: dict[int, dict[str, CheckConfig]], expected: dict[int, tuple[str, ...]], path: Path,
                   key: str) -> None:
    """One section (``exercises``: Part I, ``bonus``: Part II) against the checks of its exercises."""
    if set(section) != set(expected):
        raise ConfigError(f"{path}: {key} must be exactly {sorted(expected)}, found {sorted(section)}")
    for number, checks in section.items():
        for name in checks:
            if name not in expected[number]:
                close = difflib.get_close_matches(name, expected[number], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{path}: {key}.{number}.{name} is not a check of exercise {number}{hint}")
        for name in expected[number]:
            if name not in checks:
                raise ConfigError(f"{path}: {key}.{number}.{name} is missing")
        for name, check in checks.items():
            where = f"{path}: {key}.{number}.{name}"
            if check.visibility not in VISIBILITIES:
                raise ConfigError(f"{where}.visibility must be one of {VISIBILITIES}")
            # Gradescope hides a student's total score while after_due_date or after_published tests
            # are unreleased, but a `hidden` test does not hide it ("they should only be used for tests
            # which don't contribute points to the total"): its points would show in the total, and
            # total minus the visible tests is the hidden result.
            if check.visibility == "hidden" and check.points > 0:
                raise ConfigError(f"{where}: a check with points cannot be 'hidden' (on Gradescope its points would "
                                  "show in the student's total before publication); use after_published")
            if check.points < 0 or check.examples < 1 or check.ulps < 0:
                raise ConfigError(f"{where}: points and ulps must be >= 0 and examples >= 1")


def hidden_seed(cfg: GradingConfig) -> tuple[int, str]:
    """The secret seed and where it came from: 'env', 'file', or 'public-fallback'."""
    value = os.environ.get(cfg.seeds.hidden_env)
    source = "env"
    if not value and cfg.seeds.hidden_file:
        try:
            value = Path(cfg.seeds.hidden_file).read_text().strip().splitlines()[0]
            source = "file"
        except (OSError, IndexError):
            value = None
    if not value:
        return cfg.seeds.public, "public-fallback"
    try:
        return int(value), source
    except ValueError:
        raise ConfigError(f"the hidden seed from {source} is not an integer") from None
