"""Grade one submission: the visible checks, then the training check, then the hidden checks.

Hypothesis drives each check (derandomized, no database, seeded per check from the public or
hidden seed), so the same file always meets the same examples and gets the same feedback.
The submission runs only in workers forked by the sandbox's server (sandbox.py), one at a
time, each fresh when its role changes and every process it left killed before the next:
exercises 1-4, then exercise 5, then the training check, then one per exercise for the hidden
checks. Hidden checks come last, so no text a submission produces after it has seen a hidden
input reaches the visible feedback; their own feedback is the grader's words only.
"""

from __future__ import annotations

import functools
import platform
import time
import warnings
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import hypothesis
import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import HypothesisException, HypothesisWarning

from assignment.contract import exercise, is_bonus
from assignment.trainer.runlog import REWARD_WINDOW

from . import __version__, calls, replay
from .config import GradingConfig, hidden_seed
from .exercises import CHECKS, MODULES, Check, update
from .sandbox import Sandbox, WorkerDied, WorkerTimeout, open_sandbox

MAX_PROBLEM_LINES = 6  # per failed check: the worst few, not a wall of numbers


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
    staff_note: str = ""  # for the staff log only (a hidden check's failure in the grader's words)

    def __post_init__(self):
        if self.passed is None:
            self.passed = self.score == self.max_score

    @property
    def not_attempted(self) -> bool:
        """The check met a blank (NotImplementedError) or no function at all."""
        return self.feedback.startswith((NOT_IMPLEMENTED, NO_FUNCTION)) or \
            HIDDEN_FEEDBACK["not implemented"] in self.feedback.split("\n", 1)[0]

    @property
    def bonus(self) -> bool:
        """A Part II check: its points are a bonus beside Part I's 100."""
        return is_bonus(self.exercise)


@dataclass
class GradingResult:
    checks: list[CheckResult]
    extra: dict
    execution_time: float
    # For the staff, never for students: the grader's own log (e.g. a missing hidden seed).
    log: list[str] = field(default_factory=list)
    # For the student, above everything else: why no check could run (the file does not import).
    notice: str = ""

    @property
    def staff_notes(self) -> list[str]:
        """For the staff too: which value of a failed hidden check differed, and by how much."""
        return [c.staff_note for c in self.checks if c.staff_note]

    @property
    def score(self) -> float:
        """Part I's score (out of ``max_score``, 100 as shipped); Part II's is ``bonus_score``."""
        return sum(c.score for c in self.checks if not c.bonus)

    @property
    def max_score(self) -> float:
        return sum(c.max_score for c in self.checks if not c.bonus)

    @property
    def bonus_score(self) -> float:
        """Part II's bonus points, earned beyond ``max_score``."""
        return sum(c.score for c in self.checks if c.bonus)

    @property
    def bonus_max(self) -> float:
        return sum(c.max_score for c in self.checks if c.bonus)


class _Failed(Exception):
    """Raised inside a Hypothesis example: this case fails the check. ``kind`` is "error" (the
    submission raised), "invalid" (wrong type, shape or dtype) or "mismatch" (wrong values)."""

    def __init__(self, case, problems: list[str], kind: str, submitted=None, reference=None):
        super().__init__("; ".join(problems))
        self.case, self.problems, self.kind, self.submitted, self.reference = case, problems, kind, submitted, reference


class _Abort(BaseException):
    """Escapes Hypothesis at once (it does not catch BaseException): the check cannot go on."""

    def __init__(self, message: str, fatal: bool, kind: str = "crash"):
        super().__init__(message)
        self.message, self.fatal, self.kind = message, fatal, kind


# The first words of a check that met a blank or no function (autograder/classroom reads them too).
NOT_IMPLEMENTED = "not implemented: "
NO_FUNCTION = "the submission defines no function "
IMPORT_FAILED = "the submission could not be imported: "

HIDDEN_FEEDBACK = {
    "error": "the function raised an exception",
    "invalid": "it returned the wrong type, shape or dtype",
    "mismatch": "a value differs from the reference",
    "crash": "the worker crashed, ran out of memory or ran out of time",
    "not implemented": "the function is not implemented",
}


class _Workers:
    """The one live worker of a grading, replaced by a fresh one when the role changes."""

    def __init__(self, sandbox: Sandbox, submission):
        self.sandbox, self.submission = sandbox, submission
        self.current = None

    def get(self, role: str):
        if self.current is not None and (self.current.role != role or not self.current.alive):
            self.drop()
        if self.current is None:
            self.current = self.sandbox.spawn(role, self.submission)
            self.current.wait_ready()
        return self.current

    def drop(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None


def _seed_for(base: int, number: int, check: str) -> int:
    """A stable per-check seed, so that the checks of one exercise see different examples."""
    return (base * 1_000_003 + zlib.crc32(f"{number}:{check}".encode())) % 2**32


@functools.lru_cache(maxsize=1)
def _grading_model() -> torch.nn.Module:
    return update.grading_model()  # read only: every reference run works on a scratch copy


class _Context(dict):
    """What strategies, references and hints share: exercise 5's grading model, built on first use
    (importing transformers takes seconds: a grading that replays every check never needs it).

    ``recordings``: whether checks record and replay their examples (not under the process
    sandbox, whose workers could rewrite them). ``model``: whether the grading includes exercise
    5; then the model is built before Hypothesis draws anything (``before_drawing``), whatever
    check comes first, so that the pool of literals Hypothesis mixes into its draws holds the
    model module's (replay.py) every time."""

    def __init__(self, model: bool, recordings: bool):
        super().__init__()
        self.model = model
        self.recordings = recordings  # record and replay examples (replay.py)

    def __missing__(self, key: str):
        if key != "model" or not self.model:
            raise KeyError(key)
        self.before_drawing()
        return self[key]

    def before_drawing(self) -> None:
        if self.model and "model" not in self:
            self["model"] = _grading_model()

    def modules(self) -> tuple[str, ...]:
        """The project's modules a grading imports before it draws, beyond those imported now."""
        return update.MODEL_MODULES if self.model else ()


# What each strategy cannot hide, for the staff log (stderr), never for the student's text.
STRATEGY_NOTES = {
    "user": ["the user sandbox hides only what file modes hide: a copy of the answer key readable by all "
             "(an unzipped release or zip in /tmp, a clone in a home folder) is readable by submissions. Keep "
             "every copy root-only (chmod -R go-rwx DIR) or grade as root where unshare works (namespaces). "
             "Gradescope's image holds no such copy"],
    "process": ["the process sandbox runs submissions as you: they can read every file you can, answer keys "
                "included; use it to check your own code, never to grade others'. It records and replays no "
                "examples (a submission could rewrite them), so every grading draws them"],
}


def grade(source: str, cfg: GradingConfig, config_path, with_training: bool = False,
          exercises: set[int] | None = None, sandbox: Sandbox | None = None) -> GradingResult:
    """Grade the submission whose text is ``source`` under ``cfg``.

    ``exercises`` restricts grading to those exercise numbers (all five by default). A batch
    passes one ``sandbox`` (open_sandbox) for all its submissions; by default each grading
    opens its own. Raises sandbox.GraderFailure when the grader itself cannot run (never the
    student's fault).
    """
    started = time.monotonic()
    selected = {n: c for n, c in CHECKS.items() if exercises is None or n in exercises}
    secret, secret_source = hidden_seed(cfg)
    torch.set_num_threads(1)
    log = ["hidden checks used the public seed: set $" + cfg.seeds.hidden_env + " at deployment"] \
        if secret_source == "public-fallback" else []
    training = with_training or cfg.training.enabled
    first_role = "exercises 1-4" if set(selected) & {1, 2, 3, 4} else "exercise 5" if 5 in selected else \
        "exercises 6-8" if set(selected) - {5} else "training check"
    own = sandbox is None
    sandbox = open_sandbox(cfg, config_path) if own else sandbox
    log += STRATEGY_NOTES.get(sandbox.strategy, [])
    try:
        context = _Context(model=5 in selected, recordings=sandbox.strategy != "process")
        workers = _Workers(sandbox, sandbox.add(source))
        # A grading that will draw examples (a check without a recording) builds the model now,
        # while the server imports the model code; one that replays them all never builds it.
        drawing = context.model and not _all_recorded(selected, cfg, secret, context)
        if drawing or first_role in ("exercise 5", "training check"):
            sandbox.preload()  # before the first worker: it needs the model code, or we build the model meanwhile
        if drawing:
            context.before_drawing()
        first = workers.get(first_role)
        if 5 in selected or training:
            sandbox.preload()  # if not yet: imported by the server while the other exercises are graded
        if first.import_error is not None:
            message = IMPORT_FAILED + calls.StudentError(first.import_error).describe()
            results = [_zero(n, c, cfg, message) for n in selected for c in selected[n]]
            if training:
                results.append(_training_result(cfg, 0.0, message))
        else:
            results = _grade_all(selected, cfg, workers, context, secret, first.callable, training)
        workers.drop()
    finally:
        if own:
            sandbox.close()
    extra = {"grader_version": __version__, "torch_version": torch.__version__,
             "hypothesis_version": hypothesis.__version__, "python_version": platform.python_version(),
             "public_seed": cfg.seeds.public, "hidden_seed_source": secret_source, "sandbox": sandbox.strategy,
             "network": first.network}
    order = {(n, c.id): i for n in selected for i, c in enumerate(selected[n])}
    results.sort(key=lambda r: (r.exercise, order.get((r.exercise, r.check), -1)))
    notice = "" if first.import_error is None else \
        f"Your file could not be imported, so no check could run: {calls.StudentError(first.import_error).describe()}"
    return GradingResult(results, extra, round(time.monotonic() - started, 3), log, notice)


def _grade_all(selected, cfg, workers, context, secret, defined, training) -> list[CheckResult]:
    """Visible checks, the training check, then hidden checks: in that order, always."""
    results = []
    for hidden in (False, True):
        for number, checks in selected.items():
            phase = [c for c in checks if c.hidden == hidden]
            name = exercise(number).name
            if name not in defined:
                results += [_zero(number, c, cfg, NO_FUNCTION + name) for c in phase]
                continue
            role = f"hidden checks of exercise {number}" if hidden else \
                "exercise 5" if number == 5 else "exercises 6-8" if is_bonus(number) else "exercises 1-4"
            fatal = None
            for check in phase:
                result, fatal = (_zero(number, check, cfg, fatal), fatal) if fatal else \
                    _run_check(number, check, cfg, lambda: workers.get(role), workers, context,
                               _base_seed(check, cfg, secret))
                results.append(result)
            if hidden:
                workers.drop()  # a fresh worker for each exercise's hidden checks
        if not hidden and training:
            results.append(_training_check(cfg, workers))
    return results


def _training_result(cfg: GradingConfig, score: float, feedback: str, passed: bool = False) -> CheckResult:
    description = ("the assembled submission trains a tiny model on synthetic arithmetic on CPU: the mean reward "
                   f"of the last {REWARD_WINDOW} PPO steps exceeds that of the first {REWARD_WINDOW} by at least "
                   f"{cfg.training.threshold:g}")
    return CheckResult(0, "learning", description, score, cfg.training.points, "visible", feedback, passed)


def _training_check(cfg: GradingConfig, workers: _Workers) -> CheckResult:
    """Exercise 0: run the whole trainer with the submission's five exercises in a worker.

    The rewards come from student code running end to end, so this is a learning sanity check
    rather than a tamper-proof measurement; grading.yaml gives it 0 points by default.
    """
    t = cfg.training
    header = {"op": "train", "seed": t.seed, "threshold": t.threshold, "threads": max(cfg.worker.threads, 2)}
    try:
        reply, _ = workers.get("training check").request(header, {}, t.timeout_s)
    except (WorkerDied, WorkerTimeout) as err:
        workers.drop()
        return _training_result(cfg, 0.0, str(err))
    if reply.get("op") == "error":
        return _training_result(cfg, 0.0, "training failed: " + calls.StudentError(reply).describe())
    rewards = reply.get("rewards")
    if not isinstance(rewards, list) or len(rewards) < 2 * REWARD_WINDOW or not all(isinstance(r, float) for r in rewards):
        return _training_result(cfg, 0.0, "the training run reported no usable rewards")
    first, last = sum(rewards[:REWARD_WINDOW]) / REWARD_WINDOW, sum(rewards[-REWARD_WINDOW:]) / REWARD_WINDOW
    passed = last - first >= t.threshold
    feedback = (f"mean reward of the first {REWARD_WINDOW} steps {first:.3f}, of the last {REWARD_WINDOW} {last:.3f}: improvement "
                f"{last - first:+.3f}, threshold {t.threshold:+.3f}; greedy accuracy "
                f"{reply.get('accuracy_before', float('nan')):.3f} -> {reply.get('accuracy_after', float('nan')):.3f}; "
                f"{len(rewards)} steps in {reply.get('seconds', float('nan')):.0f} s")
    if not passed:
        feedback += ". Run `ppo-train --config configs/cpu_synthetic.yaml` and watch rollout/reward_mean"
    return _training_result(cfg, t.points if passed else 0.0, feedback, passed)


def _zero(number: int, check: Check, cfg: GradingConfig, message: str) -> CheckResult:
    c = cfg.check(number, check.id)
    return CheckResult(number, check.id, check.description, 0.0, c.points, c.visibility, message)


def _evaluate(number: int, case, context: dict, run: Callable, reference=None):
    """(submission's result, reference's result, validation problems) for one case. The reference
    is computed while the worker runs the submission, unless it is given (a replayed example)."""
    ref = [] if reference is None else [reference]

    def meanwhile():
        if not ref:
            ref.append(update.run_reference(context["model"], case, answers=True) if number == 5 else
                       calls.call_reference(exercise(number), case))

    if number == 5:
        oracle = update.oracle_for(case, lambda: ref[0] if ref else None)
        sub, problems = update.call_submission(case, lambda h, t: run(h, t, oracle, meanwhile))
    elif getattr(case, "raises", ""):  # nothing to compare: the contract demands an exception
        return None, None, calls.expect_error(exercise(number), case, lambda h, t: run(h, t, None, lambda: None))
    else:
        sub, problems = calls.call_submission(exercise(number), case, lambda h, t: run(h, t, None, meanwhile))
    return sub, (ref[0] if ref else None), problems


def _base_seed(check: Check, cfg: GradingConfig, secret: int) -> int:
    """The seed a check's examples derive from: the hidden seed for hidden checks."""
    return secret if check.hidden else cfg.seeds.public


def _recording(number: int, check_id: str, cfg: GradingConfig, base_seed: int, context: _Context) -> str | None:
    """The name of the check's examples as recorded by an earlier grading (replay.py), or None
    where this grading neither records nor replays."""
    if not context.recordings:
        return None
    return replay.key(number, check_id, _seed_for(base_seed, number, check_id), cfg.check(number, check_id).examples,
                      context.modules())


def _all_recorded(selected: dict, cfg: GradingConfig, secret: int, context: _Context) -> bool:
    """Whether every check of ``selected`` has its examples recorded: the grading draws none unless
    the submission fails one."""
    for number, checks in selected.items():
        for check in checks:
            name = _recording(number, check.id, cfg, _base_seed(check, cfg, secret), context)
            if name is None or not replay.exists(name):
                return False
    return True


def _run_check(number: int, check: Check, cfg: GradingConfig, get_worker, workers: _Workers, context: _Context,
               base_seed: int) -> tuple[CheckResult, str | None]:
    """Run one check; return (result, message that fails the rest of the exercise's phase, or None)."""
    c = cfg.check(number, check.id)
    timeout = cfg.worker.update_timeout_s if number == 5 else cfg.worker.call_timeout_s
    failures: list[_Failed] = []
    seed = _seed_for(base_seed, number, check.id)
    name = _recording(number, check.id, cfg, base_seed, context)
    recorded = replay.load(name) if name else None
    recording = [] if name and recorded is None else None
    answered: deque = deque()  # (digest, outcome) of the recorded examples run before Hypothesis

    def run(header, tensors, oracle, meanwhile):
        try:
            return get_worker().request(header, tensors, timeout, oracle=oracle, meanwhile=meanwhile)
        except (WorkerDied, WorkerTimeout) as err:
            workers.drop()
            raise _Abort(f"{err}; the remaining checks of this exercise were not run", fatal=True) from None

    def drawn() -> None:
        """Hypothesis's run of the check: draws the examples (the recorded ones it meets first are
        recalled, not run again) and shrinks a failure; raises the failure it reports. A hidden
        check does not shrink: its feedback shows no counterexample, and the staff log names the
        first one's worst value."""
        context.before_drawing()

        @hypothesis_seed(seed)
        @settings(max_examples=c.examples, derandomize=True, database=None, deadline=None, print_blob=False,
                  verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                  phases=(Phase.generate,) if check.hidden else (Phase.generate, Phase.shrink))
        @given(check.strategy(context))
        def prop(case):
            failed = recalled(case) if answered else attempt(case)
            if failed is not None:
                failures.append(failed)
                if len(failures) > cfg.hypothesis.shrink_calls:
                    raise _Abort("", fatal=False)  # enough shrinking: report the smallest failure so far
                raise failed

        prop()

    def attempt(case, reference=None) -> _Failed | None:
        """Run the check on one case: the failure, or None when it holds."""
        sub = ref = None
        try:
            sub, ref, problems = _evaluate(number, case, context, run, reference)
            kind = "invalid"
            if not problems and not getattr(case, "raises", ""):
                problems, kind = check.compare(case, ref, sub, c.ulps), "mismatch"
        except calls.StudentError as err:
            kind = err.reply.get("type")
            if kind == "NotImplementedError":
                raise _Abort(NOT_IMPLEMENTED + str(err.reply.get("message")), fatal=True, kind="not implemented") from None
            if kind == "MemoryError":
                raise _Abort(f"ran out of memory (the worker's cap is {cfg.worker.memory_mb} MiB): "
                             f"{err.reply.get('message')}; the remaining checks of this exercise were not run",
                             fatal=True) from None
            problems, kind = [err.describe()], "error"
        if problems:
            return _Failed(case, problems, kind, sub, ref)
        if recording is not None:
            recording.append((case, ref))
        return None

    def replayed() -> bool:
        """Run the recorded examples: True when every one holds (the check passes, as Hypothesis
        would find). At the first failure, False: Hypothesis must run, and it meets the examples run
        here first (``answered``). An abort escapes at once, as it would from Hypothesis."""
        for i, (case, ref) in enumerate(recorded):
            failed = attempt(case, ref)
            if failed is not None:
                answered.extend((replay.digest(c), None) for c, _ in recorded[:i])
                answered.append((replay.digest(case), failed))
                return False
        return True

    def recalled(case) -> _Failed | None:
        """The outcome of a recorded example already run, without asking the worker again."""
        expected, failed = answered.popleft()
        if replay.digest(case) != expected:  # not the recorded sequence after all: run it as usual
            answered.clear()
            return attempt(case)
        return failed

    def simplest(failure: _Failed) -> _Failed:
        """Hypothesis stops shrinking at shrink_calls, and it rarely deletes a row that later draws
        depend on (exercise 6's groups, lengths and rewards): drop rows one at a time, for at most
        shrink_calls more calls, while the case still fails the same way and stays an input of the
        check (check.fewer_rows), so that the counterexample shown holds no row it does not need."""
        if check.hidden or check.fewer_rows is None:
            return failure
        calls, dropped = cfg.hypothesis.shrink_calls, True
        while dropped and calls > 0:
            dropped, b = False, 0
            while b < failure.case.rows and calls > 0:
                smaller = failure.case.without_row(b)
                if not check.fewer_rows(smaller):
                    b += 1
                    continue
                calls -= 1
                try:
                    again = attempt(smaller)
                except _Abort:  # the worker died on it: keep the counterexample that was found
                    return failure
                if again is not None and again.kind == failure.kind:
                    failure, dropped = again, True  # the next row is now row b
                else:
                    b += 1
        return failure

    fatal, note = None, ""
    try:
        with warnings.catch_warnings():
            # Hypothesis warns its own users (e.g. "Generating overly large repr" of exercise 5's
            # strategy, whose arguments hold the model's weights); the grader's settings are fixed
            # and tested, and neither a student nor a TA can act on such a line.
            warnings.simplefilter("ignore", HypothesisWarning)
            if recorded is None or not replayed():
                drawn()
        if recording is not None:
            replay.save(name, recording)
        score, feedback = c.points, ""
    except _Failed as failure:
        score, feedback = 0.0, _feedback(number, check, simplest(failure), c.ulps, context, failures)
        note = "; ".join(failure.problems)
    except _Abort as abort:
        score = 0.0
        if failures and not abort.fatal:
            feedback = _feedback(number, check, simplest(failures[-1]), c.ulps, context, failures)
            note = "; ".join(failures[-1].problems)
        elif check.hidden:
            feedback, fatal, note = _hidden_feedback(number, abort.kind), abort.message, abort.message
        else:
            feedback, fatal = abort.message, (abort.message if abort.fatal else None)
    except HypothesisException as err:  # e.g. Flaky: the submission is not deterministic
        score, feedback = 0.0, f"the check could not conclude ({type(err).__name__}): results differ between " \
                               "runs of the same input; make the function deterministic"
    staff = f"exercise {number}, hidden check {check.id}: failed on an example of the hidden seed: " \
        f"{_clip(note)}" if check.hidden and score == 0 and note else ""
    return CheckResult(number, check.id, check.description, score, c.points, c.visibility, feedback,
                       staff_note=staff), fatal


STAFF_NOTE_CHARS = 600  # a submission's exception message could be any length


def _clip(text: str) -> str:
    return text if len(text) <= STAFF_NOTE_CHARS else text[:STAFF_NOTE_CHARS] + " ..."


def _hidden_feedback(number: int, kind: str) -> str:
    """Only the grader's own words: a hidden check's feedback never carries student text."""
    return (f"failed on the hidden inputs: {HIDDEN_FEEDBACK.get(kind, HIDDEN_FEEDBACK['error'])}. "
            f"The visible checks of exercise {number} show the details on inputs you can see.")


def _feedback(number: int, check: Check, failure: _Failed, ulps: float, context: _Context,
              failures: Sequence[_Failed] = ()) -> str:
    if check.hidden:
        return _hidden_feedback(number, failure.kind)
    problems = failure.problems
    if len(problems) > MAX_PROBLEM_LINES:
        problems = problems[:MAX_PROBLEM_LINES] + [f"... and {len(problems) - MAX_PROBLEM_LINES} more differences"]
    lines = ["Counterexample (shrunk):", _indent(failure.case.describe()), *problems]
    if failure.kind == "mismatch":
        if number == 5:
            hint = update.hint(failure.case, failure.submitted, context["model"], check.compare, ulps, failure.reference)
        else:
            evidence = [(f.case, f.submitted, f.reference) for f in (*failures, failure) if f.kind == "mismatch"]
            hint = MODULES[number].hint(evidence, ulps)
        if hint:
            lines.append(f"Hint: {hint}.")
    if number == 5:
        lines += ["To rerun this case yourself (your exercises 1-3 stand in for the reference's):",
                  _indent(failure.case.snippet())]
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def nothing_to_grade(cfg: GradingConfig, message: str) -> GradingResult:
    """Every check at 0 with ``message``: the file cannot be graded (missing, a link, not text, too big)."""
    results = [_zero(n, c, cfg, message) for n in CHECKS for c in CHECKS[n]]
    return GradingResult(results, {"grader_version": __version__}, 0.0, [message], notice=message)
