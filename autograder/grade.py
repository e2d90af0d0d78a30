"""Grade one submission: run every check of every exercise and collect typed results.

Hypothesis drives each check (derandomized, no database, seeded per check from the public or
hidden seed), so the same file always meets the same examples and gets the same feedback.
The submission runs only in worker processes (sandbox.py); exercises 1-4 share one worker,
restarted after a crash, and exercise 5 gets its own, started early so that importing
transformers overlaps the grading of exercises 1-4.
"""

from __future__ import annotations

import platform
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import hypothesis
import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import HypothesisException

from assignment import EXERCISES

from . import __version__, checks, hints
from .compare import Tolerance
from .config import GradingConfig, hidden_seed
from .sandbox import Limits, Worker, WorkerDied, WorkerTimeout, detect_strategy

HIDDEN = "hidden"


@dataclass
class CheckResult:
    exercise: int
    check: str
    description: str
    score: float
    max_score: float
    visibility: str
    feedback: str = ""
    passed: bool | None = None  # None: passed means full marks (a 0-point check must say it)

    def __post_init__(self):
        if self.passed is None:
            self.passed = self.score == self.max_score


@dataclass
class GradingResult:
    checks: list[CheckResult]
    extra: dict
    execution_time: float
    notes: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        return sum(c.score for c in self.checks)

    @property
    def max_score(self) -> float:
        return sum(c.max_score for c in self.checks)


class _Failed(Exception):
    """Raised inside a Hypothesis example: this case fails the check."""

    def __init__(self, case, problems, submitted, reference=None):
        super().__init__("; ".join(problems))
        self.case, self.problems, self.submitted, self.reference = case, problems, submitted, reference


class _Abort(BaseException):
    """Escapes Hypothesis at once (it does not catch BaseException): the check cannot go on."""

    def __init__(self, message: str, fatal: bool):
        super().__init__(message)
        self.message, self.fatal = message, fatal


class _Workers:
    """The two workers of one grading, restarted on demand after a death."""

    def __init__(self, submission: Path, cfg: GradingConfig, strategy: str, hide: list[Path]):
        self.submission, self.cfg, self.strategy, self.hide = submission, cfg, strategy, hide
        self.limits = Limits(cfg.worker.memory_mb, cfg.worker.import_timeout_s, cfg.worker.threads)
        self._workers: dict[str, Worker] = {}

    def start(self, role: str) -> None:
        if role not in self._workers:
            self._workers[role] = Worker(self.submission, self.limits, self.strategy, self.hide,
                                         self.cfg.worker.sandbox_user, preload=role != "call")

    def get(self, role: str) -> Worker:
        self.start(role)
        worker = self._workers[role]
        if worker.import_error is None and not worker.ready:
            try:
                worker.wait_ready()
            except (WorkerDied, WorkerTimeout) as err:  # e.g. the module kills its own process on import
                worker.import_error = {"type": type(err).__name__, "message": str(err), "where": []}
        return worker

    def drop(self, role: str) -> None:
        worker = self._workers.pop(role, None)
        if worker:
            worker.close()

    def close(self) -> None:
        for role in list(self._workers):
            self.drop(role)


def _seed_for(base: int, exercise: int, check: str) -> int:
    """A stable per-check seed, so checks of one exercise see different examples."""
    return (base * 1_000_003 + zlib.crc32(f"{exercise}:{check}".encode())) % 2**32


def grade(submission: Path, cfg: GradingConfig, config_path: Path, with_training: bool = False,
          exercises: set[int] | None = None) -> GradingResult:
    """Grade ``submission`` (a path to a student's exercises.py) under ``cfg``.

    ``exercises`` restricts grading to those exercise numbers (all five by default).
    """
    selected = {n: c for n, c in checks.CHECKS.items() if exercises is None or n in exercises}
    started = time.monotonic()
    secret, secret_source = hidden_seed(cfg)
    strategy = detect_strategy(cfg.worker.sandbox, cfg.worker.sandbox_user)
    hide = _secret_paths(config_path, cfg)
    if strategy == "user":
        _check_root_only(hide)
    torch.set_num_threads(1)
    workers = _Workers(submission, cfg, strategy, hide)
    results: list[CheckResult] = []
    notes = []
    if secret_source == "public-fallback":
        notes.append(f"hidden checks used the public seed: set ${cfg.seeds.hidden_env} at deployment")
    training = with_training or cfg.training.enabled
    # the workers this grading needs, each started at once so their imports overlap
    roles = [r for r, needed in (("call", bool(set(selected) - {5})), ("update", 5 in selected),
                                 ("train", training)) if needed]
    try:
        for role in roles:
            workers.start(role)
        context = {"model": checks.grading_model()} if 5 in selected else {}  # transformers, meanwhile
        ready = workers.get(roles[0]) if roles else None
        if ready is not None and ready.import_error is not None:
            message = "the submission could not be imported: " + _describe_error(ready.import_error)
            results = [_zero(n, c, cfg, message) for n in selected for c in selected[n]]
            if training:
                results.append(CheckResult(0, "learning", TRAINING_DESCRIPTION, 0.0, cfg.training.points,
                                           "visible", message, passed=False))
        else:
            for number, exercise_checks in selected.items():
                results += _grade_exercise(number, exercise_checks, cfg, workers, context, secret, ready.callable)
            if training:
                results.append(_training_check(cfg, workers))
    finally:
        workers.close()
    extra = {
        "grader_version": __version__, "torch_version": torch.__version__,
        "hypothesis_version": hypothesis.__version__, "python_version": platform.python_version(),
        "public_seed": cfg.seeds.public, "hidden_seed_source": secret_source, "sandbox": strategy,
    }
    return GradingResult(results, extra, round(time.monotonic() - started, 3), notes)


TRAINING_DESCRIPTION = ("the assembled submission trains a tiny model on synthetic arithmetic on CPU: the mean "
                        "reward of the last 10 PPO steps exceeds that of the first 10 by the threshold")


def _training_check(cfg: GradingConfig, workers: _Workers) -> CheckResult:
    """Exercise 0: run the whole trainer with the submission's five exercises in a worker.

    The rewards come from student code running end to end, so this is a learning sanity check
    rather than a tamper-proof measurement; grading.yaml gives it 0 points by default.
    """
    t = cfg.training
    header = {"op": "train", "seed": t.seed, "threshold": t.threshold, "threads": max(cfg.worker.threads, 2)}
    try:
        reply, _ = workers.get("train").request(header, {}, t.timeout_s)
    except (WorkerDied, WorkerTimeout) as err:
        workers.drop("train")
        return CheckResult(0, "learning", TRAINING_DESCRIPTION, 0.0, t.points, "visible", str(err), passed=False)
    if reply.get("op") == "error":
        return CheckResult(0, "learning", TRAINING_DESCRIPTION, 0.0, t.points, "visible",
                           "training failed: " + _describe_error(reply), passed=False)
    rewards = reply.get("rewards")
    if not isinstance(rewards, list) or len(rewards) < 20 or not all(isinstance(r, float) for r in rewards):
        return CheckResult(0, "learning", TRAINING_DESCRIPTION, 0.0, t.points, "visible",
                           "the training run reported no usable rewards", passed=False)
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    passed = last - first >= t.threshold
    feedback = (f"mean reward of the first 10 steps {first:.3f}, of the last 10 {last:.3f} "
                f"(improvement {last - first:+.3f}, needed {t.threshold:+.3f}); greedy accuracy "
                f"{reply.get('accuracy_before', float('nan')):.3f} -> {reply.get('accuracy_after', float('nan')):.3f}; "
                f"{len(rewards)} steps in {reply.get('seconds', float('nan')):.0f} s")
    if not passed:
        feedback += ". Run `ppo-train --config configs/cpu_synthetic.yaml --impl YOUR_FILE.py` and watch rollout/reward_mean"
    return CheckResult(0, "learning", TRAINING_DESCRIPTION, t.points if passed else 0.0, t.points, "visible",
                       feedback, passed=passed)


def _secret_paths(config_path: Path, cfg: GradingConfig) -> list[Path]:
    """What the worker must never read: the solution, the grader, its config and the hidden seed."""
    import solutions

    paths = [Path(solutions.__file__).resolve().parent, Path(__file__).resolve().parent, config_path.resolve()]
    if cfg.seeds.hidden_file:
        paths.append(Path(cfg.seeds.hidden_file).resolve())
    return paths


def _check_root_only(paths: list[Path]) -> None:
    """The user sandbox relies on file permissions: refuse to grade if "others" can read a secret."""
    for path in paths:
        if path.exists() and path.stat().st_mode & 0o005:
            raise RuntimeError(f"sandbox misconfigured: {path} is readable by other users; run "
                               f"`chmod -R go-rwx {path}` (autograder/gradescope/setup.sh does this)")


def _zero(number: int, check: checks.Check, cfg: GradingConfig, message: str) -> CheckResult:
    c = cfg.exercises[number][check.id]
    return CheckResult(number, check.id, check.description, 0.0, c.points, c.visibility, message)


def _describe_error(reply: dict) -> str:
    return checks.StudentError(reply).describe()


def _grade_exercise(number, exercise_checks, cfg, workers, context, secret, callable_names) -> list[CheckResult]:
    name = EXERCISES[number - 1]
    if name not in callable_names:
        return [_zero(number, c, cfg, f"the submission defines no function {name}") for c in exercise_checks]
    results, fatal = [], None
    for check in exercise_checks:
        if fatal:
            results.append(_zero(number, check, cfg, fatal))
            continue
        result, fatal = _run_check(number, check, cfg, workers, context, secret)
        results.append(result)
    return results


def _run_check(number, check: checks.Check, cfg: GradingConfig, workers: _Workers, context, secret):
    """Run one check; return (result, message that fails the rest of the exercise or None)."""
    c = cfg.exercises[number][check.id]
    tol = Tolerance(c.rtol, c.atol)
    hidden = check.id == HIDDEN
    base = secret if hidden else cfg.seeds.public
    role = "update" if number == 5 else "call"
    timeout = cfg.worker.update_timeout_s if number == 5 else cfg.worker.call_timeout_s
    last: list[_Failed] = []

    def run(header, tensors, meanwhile=None):
        try:
            return workers.get(role).request(header, tensors, timeout, oracle=checks.oracle if number == 5 else None,
                                             meanwhile=meanwhile)
        except (WorkerDied, WorkerTimeout) as err:
            workers.drop(role)
            raise _Abort(f"{err}; the remaining checks of this exercise were not run", fatal=True) from None

    def evaluate(case):
        ref = []  # computed while the worker runs the submission
        if number == 5:
            sub, problems = checks.call_submission_update(
                case, context["model"],
                lambda h, t: run(h, t, lambda: ref.append(checks.run_reference_update(context["model"], case))))
        else:
            spec = checks.SPECS[number]
            sub, problems = checks.call_submission(
                spec, case, lambda h, t: run(h, t, lambda: ref.append(checks.call_reference(spec, case))))
        if not problems:
            problems = check.compare(case, ref[0], sub, tol)
        return sub, problems, ref[0] if ref else None

    @hypothesis_seed(_seed_for(base, number, check.id))
    @settings(max_examples=c.examples, derandomize=True, database=None, deadline=None, print_blob=False,
              verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
              phases=(Phase.generate, Phase.shrink))
    @given(check.strategy(context))
    def prop(case):
        reference = None
        try:
            sub, problems, reference = evaluate(case)
        except checks.StudentError as err:
            if err.reply.get("type") == "NotImplementedError":
                raise _Abort(f"not implemented: {err.reply.get('message')}", fatal=True) from None
            if err.reply.get("type") == "MemoryError":
                raise _Abort(f"ran out of memory (the worker's cap is {cfg.worker.memory_mb} MiB): "
                             f"{err.reply.get('message')}; the remaining checks of this exercise were not run",
                             fatal=True) from None
            sub, problems = None, [_describe_error(err.reply)]
        if problems:
            failure = _Failed(case, problems, sub, reference)
            last.append(failure)
            if len(last) > cfg.hypothesis.shrink_calls:
                raise _Abort("", fatal=False)  # enough shrinking: report the smallest failure so far
            raise failure

    feedback, fatal = "", None
    try:
        prop()
        score = c.points
    except _Failed as failure:
        score, feedback = 0.0, _feedback(number, check, failure, tol, hidden, context)
    except _Abort as abort:
        score = 0.0
        if last and not abort.fatal:
            feedback = _feedback(number, check, last[-1], tol, hidden, context)
        else:
            feedback, fatal = abort.message, (abort.message if abort.fatal else None)
    except HypothesisException as err:  # e.g. Flaky: the submission is not deterministic
        score, feedback = 0.0, f"the check could not conclude ({type(err).__name__}): results differ between runs " \
                               "of the same input; make the function deterministic"
    return CheckResult(number, check.id, check.description, score, c.points, c.visibility, feedback), fatal


def _feedback(number, check, failure: _Failed, tol, hidden: bool, context) -> str:
    if hidden:
        return ("failed on an input from the hidden set: " + failure.problems[0].split(":")[0]
                + ". The visible checks of this exercise show the details.")
    lines = ["Counterexample (shrunk):", _indent(failure.case.describe()), *failure.problems]
    if number == 5:
        hint = hints.suggest_update(
            failure.case, failure.submitted, lambda v: checks.run_reference_update(context["model"], v),
            check.compare, tol)
    else:
        hint = hints.suggest(number, failure.case, failure.submitted, failure.reference, tol)
    if hint:
        lines.append(f"Hint: {hint}.")
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def nothing_to_grade(cfg: GradingConfig, message: str) -> GradingResult:
    """Every check at 0 with ``message``: the file cannot be graded (missing, not text, too big)."""
    results = [_zero(n, c, cfg, message) for n in checks.CHECKS for c in checks.CHECKS[n]]
    return GradingResult(results, {"grader_version": __version__}, 0.0, [message])
