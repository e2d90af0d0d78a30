"""Grading a class: ``ppo-grade FOLDER --out DIR`` (autograder/classroom/).

The class run grades every exercise of a corpus class with few examples per check (a copy of
grading.yaml written to a file, since the CLI reads --config), in two processes; every CSV row
and results file must equal what a single grading of that student gives under the same config.
Failures of the grader are tested in-process with a fake ``grade``.
"""

from __future__ import annotations

import csv
import io
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import corpus
from assignment.contract import exercise as contract_exercise, is_bonus
from autograder import cli, config, report, submission
from autograder.classroom import discovery, grading, gradebook, pool, run, state
from autograder.exercises import CHECK_IDS, CHECKS
from autograder.grade import GradingResult, nothing_to_grade
from autograder.sandbox import GraderFailure

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "grading.yaml"
SOLUTION = ROOT / "solutions" / "exercises.py"
BLANK = ROOT / "assignment" / "exercises.py"
QUICK_EXAMPLES = 3  # the batch machinery is under test here, not the checks: few examples each

MUTANTS = ["policy_sign_flipped", "policy_clipfrac_ge", "value_missing_half", "value_no_clipping",
           "entropy_sign_flipped", "entropy_no_upcast", "gae_forward_loop", "gae_no_whitening",
           "update_no_temperature", "update_zero_grad_first"]
ALTERNATIVES = ["alt_vectorized_gae", "alt_categorical_entropy", "alt_where_masking", "alt_log_softmax_gather"]
TWIN = "value_min_instead_of_max"  # twin_a and twin_b hand in this mutant, byte for byte
# Students without a normal grading besides the refused ones, and the start of their reason.
UNUSUAL = {"blank": "not attempted (every exercise)", "syntax": "syntax error: raised SyntaxError",
           "importer": "import error: raised ModuleNotFoundError"}
KEY_COPIES = {"solution", "carol", "keycopy"}  # byte-identical to solutions/exercises.py
REFUSED = {"eve": "symbolic link", "frank": "holds no .py file", "gina": "holds 2 .py files", "hal": "not UTF-8",
           "ivan": "symbolic link"}


def quick_config(folder: Path) -> Path:
    raw = OmegaConf.load(CONFIG)
    for checks in raw.exercises.values():
        for check in checks.values():
            check.examples = min(check.examples, QUICK_EXAMPLES)
    raw.hypothesis.shrink_calls = 10
    raw.worker.call_timeout_s = 4
    path = folder / "quick.yaml"
    OmegaConf.save(raw, path)
    return path


def run_cli(*args, timeout=15 * 60):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


# Part II (optional) left as the starter has it: each function raises NotImplementedError.
PART_TWO_LEFT_BLANK = "".join(
    f"\n\ndef {contract_exercise(n).name}(*args, **kwargs):\n"
    f"    raise NotImplementedError(\"Exercise {n} ({contract_exercise(n).name}) is not implemented yet\")\n"
    for n in CHECKS if is_bonus(n))


def make_class(folder: Path) -> dict[str, tuple[Path, Path]]:
    """A class of 29: corpus files, two identical copies, a copy of the key, a syntax and an import
    error, a student who left the optional Part II blank, a student folder, and five uploads that
    must be refused.
    Returns, for each student with a file, (the file, the folder it must lie in)."""
    folder.mkdir()
    files = {name: corpus.render(corpus.by_name(name)) for name in MUTANTS + ALTERNATIVES}
    files |= {"solution": SOLUTION.read_text(), "blank": BLANK.read_text(), "keycopy": SOLUTION.read_text(),
              "twin_a": corpus.render(corpus.by_name(TWIN)), "twin_b": corpus.render(corpus.by_name(TWIN)),
              "syntax": SOLUTION.read_text().replace("def compute_value_loss(", "def compute_value_loss((", 1),
              "importer": SOLUTION.read_text() + "\nimport a_module_nobody_installed\n",
              "part_one_only": SOLUTION.read_text() + PART_TWO_LEFT_BLANK}
    paths = {}
    for sid, text in files.items():
        (folder / f"{sid}.py").write_text(text)
        paths[sid] = (folder / f"{sid}.py", folder)
    for sid, name, text in [("bob", "exercises.py", corpus.render(corpus.by_name("gae_no_next_mask"))),
                            ("carol", "my_ppo.py", SOLUTION.read_text())]:  # a folder holding one .py file
        (folder / sid).mkdir()
        (folder / sid / name).write_text(text)
        paths[sid] = (folder / sid / name, folder / sid)
    (folder / "eve.py").symlink_to(SOLUTION)
    (folder / "frank").mkdir()
    (folder / "gina").mkdir()
    (folder / "gina" / "a.py").write_text(SOLUTION.read_text())
    (folder / "gina" / "b.py").write_text(SOLUTION.read_text())
    (folder / "hal.py").write_bytes(b"\xff\xfe junk")
    (folder / "ivan").mkdir()
    (folder / "ivan" / "exercises.py").symlink_to(SOLUTION)  # a link out of the student's folder
    (folder / "notes.txt").write_text("not a student\n")
    paths |= {"eve": (folder / "eve.py", folder), "hal": (folder / "hal.py", folder),
              "ivan": (folder / "ivan" / "exercises.py", folder / "ivan")}
    return paths


@dataclasses.dataclass
class ClassRun:
    submissions: Path
    out: Path
    config: Path
    paths: dict[str, tuple[Path, Path]]
    proc: subprocess.CompletedProcess
    seconds: float


# The tests of graded_class run on one xdist worker, one after another: one class grading for all.
CLASS_GROUP = pytest.mark.xdist_group("graded-class")


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory) -> ClassRun:
    base = tmp_path_factory.mktemp("class")
    quick = quick_config(base)
    paths = make_class(base / "submissions")
    started = time.monotonic()
    proc = run_cli(base / "submissions", "--out", base / "gradebook", "--jobs", 2, "--config", quick)
    return ClassRun(base / "submissions", base / "gradebook", quick, paths, proc, time.monotonic() - started)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        return list(csv.DictReader(f))


def without_time(data: dict) -> dict:
    return {k: v for k, v in data.items() if k != "execution_time"}


# ---- a class, against single gradings ---------------------------------------------------------------

# Single gradings as `ppo-grade FILE` makes them: in a process that has imported autograder.cli and
# no test module. Hypothesis draws some examples from the literals of the local modules imported
# (see classroom/pool._examples_as_alone), so a grading inside pytest would meet other examples. `-c`: the
# script itself is no module. One sandbox serves them all, as in tests/test_grader.py.
SINGLE_GRADINGS = """
import json, sys
from pathlib import Path
import autograder.cli
from autograder import config, report, submission
from autograder.exercises import CHECK_IDS
from autograder.grade import grade, nothing_to_grade, open_sandbox
config_path, out, students = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
cfg = config.load(config_path, CHECK_IDS)
with open_sandbox(cfg, config_path) as sandbox:
    for sid, path, folder in students:
        try:
            result = grade(submission.read(Path(path), Path(folder)), cfg, config_path, sandbox=sandbox)
        except submission.Refused as err:
            result = nothing_to_grade(cfg, str(err))
        report.write_json_atomic(report.to_gradescope(result), out / (sid + ".json"))
"""


def single_gradings(run: ClassRun, out: Path) -> dict[str, dict]:
    """Each student's single grading. Byte-identical files (the key's copies, the twins) are graded
    once: a grading is a function of the file's text (test_grader.py's three identical gradings)."""
    students = [(sid, str(path), str(folder)) for sid, (path, folder) in sorted(run.paths.items())]

    def text(sid: str, path: str) -> tuple:  # a link is refused whatever it points to: its own
        return (sid,) if Path(path).is_symlink() else (Path(path).read_bytes(),)

    first: dict[tuple, str] = {}
    for sid, path, _ in students:
        first.setdefault(text(sid, path), sid)
    graded = [(sid, path, folder) for sid, path, folder in students if first[text(sid, path)] == sid]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", SINGLE_GRADINGS, run.config, out, json.dumps(graded)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=15 * 60)
    assert proc.returncode == 0, proc.stderr
    return {sid: json.loads((out / f"{first[text(sid, path)]}.json").read_text()) for sid, path, _ in students}


@pytest.mark.slow
@CLASS_GROUP
def test_every_row_and_results_file_equals_a_single_grading(graded_class, tmp_path):
    run = graded_class
    assert run.proc.returncode == 0, run.proc.stderr
    rows = read_csv(run.out / "gradebook.csv")
    expected_ids = sorted(set(run.paths) | set(REFUSED))
    assert [r["student"] for r in rows] == expected_ids and len(rows) >= 20
    singles = single_gradings(run, tmp_path)
    cfg = config.load(run.config, CHECK_IDS)
    for sid in ("frank", "gina"):  # the layout is wrong: no file to hand to submission.read
        status = rows[expected_ids.index(sid)]["status"]
        assert REFUSED[sid] in status
        singles[sid] = report.to_gradescope(nothing_to_grade(cfg, status.split(": ", 1)[1]))
    for row in rows:
        sid, expected = row["student"], singles[row["student"]]
        actual = json.loads((run.out / "results" / f"{sid}.json").read_text())
        assert without_time(actual) == without_time(expected), sid
        for test in expected["tests"]:
            column = f"{test['extra_data']['exercise']}/{test['extra_data']['check']}"
            assert float(row[column]) == test["score"], (sid, column)
        # total and max are Part I's; Part II's points are the bonus column (results.json's score adds them)
        part_one = [t for t in expected["tests"] if not t["extra_data"].get("bonus")]
        assert float(row["total"]) == sum(t["score"] for t in part_one), sid
        assert float(row["total"]) + float(row["bonus"] or 0) == expected["score"], sid
        assert float(row["max"]) == sum(t["max_score"] for t in part_one), sid
        for n in CHECKS:
            assert float(row[f"ex{n}"]) == sum(t["score"] for t in expected["tests"]
                                               if t["extra_data"]["exercise"] == n), (sid, n)
    assert rows[expected_ids.index("solution")]["total"] == "100"
    # and the real thing, once: ppo-grade FILE in its own process
    path, folder = run.paths["gae_forward_loop"]
    alone = run_cli(path, "--results", tmp_path / "alone.json", "--config", run.config, "--quiet")
    assert alone.returncode == 0, alone.stderr
    assert without_time(json.loads((tmp_path / "alone.json").read_text())) == \
        without_time(json.loads((run.out / "results" / "gae_forward_loop.json").read_text()))


@pytest.mark.slow
@CLASS_GROUP
def test_statuses_summary_and_exit_status(graded_class):
    run = graded_class
    assert run.proc.returncode == 0
    rows = {r["student"]: r for r in read_csv(run.out / "gradebook.csv")}
    for sid, reason in REFUSED.items():
        assert rows[sid]["status"].startswith("refused: ") and reason in rows[sid]["status"], rows[sid]
        assert rows[sid]["total"] == "0"
    assert all(r["status"] == "graded" for sid, r in rows.items() if sid not in REFUSED)
    summary = (run.out / "summary.md").read_text()
    assert "- Students: 29 (graded 24, refused 5, grader failed 0)" in summary
    assert "## Mistakes by kind (of the 24 graded submissions)" in summary
    assert "notes.txt" in summary and "grader failure:" not in summary
    assert "warning: notes.txt: not a student" in run.proc.stderr
    assert "grading (2 at a time)" in run.proc.stderr  # the progress bar
    assert "29 students: 24 graded, 5 refused, 0 grader failed" in run.proc.stdout


@pytest.mark.slow
@CLASS_GROUP
def test_the_gradebook_names_the_right_students(graded_class):
    """What a TA reads first: the reason column, the mistakes-by-kind table and the similarity
    report of a class of corpus submissions, two identical copies and a key copy."""
    run = graded_class
    rows = {r["student"]: r for r in read_csv(run.out / "gradebook.csv")}
    reasons = {sid: r["reason"] for sid, r in rows.items() if r["reason"]}
    assert set(reasons) == set(UNUSUAL) | set(REFUSED), reasons
    for sid, start in UNUSUAL.items():
        assert reasons[sid].startswith(start), (sid, reasons[sid])
    # the file the TA knows, not the grader's staged copy (submission.py)
    assert "(syntax.py, line " in reasons["syntax"] and "submission.py" not in reasons["syntax"], reasons["syntax"]
    # Part II left blank is a normal grading: no reason, full Part I, no bonus
    skipper = rows["part_one_only"]
    assert (skipper["reason"], skipper["total"], skipper["bonus"]) == ("", "100", "0"), skipper
    assert all(skipper[f"ex{n} status"] == "not attempted" for n in CHECKS if is_bonus(n))
    assert all(rows["blank"][f"ex{n} status"] == "not attempted" for n in CHECKS)
    assert all(rows["syntax"][f"ex{n} status"] == "syntax error" for n in CHECKS)
    assert all(rows[sid][f"ex{n} status"] == "refused" for sid in REFUSED for n in CHECKS)
    summary = (run.out / "summary.md").read_text()
    unusual = summary.split("## Students without a normal grading")[1].split("\n## ")[0]
    assert sorted(line.split(" | ")[0][2:] for line in unusual.splitlines() if line.startswith("| ")
                  and not line.startswith(("| student", "|---"))) == sorted(reasons)

    # mistakes by kind: every mutant under its own exercise, the twins under the same kinds,
    # nobody who is right, did not attempt or could not be graded
    table = summary.split("## Mistakes by kind")[1].split("\n## ")[0]
    kinds = [line.split(" | ") for line in table.splitlines() if line.startswith("| ex") and "| mistake |" not in line]
    named = {(cells[0][2:], cells[1]): cells[3].rstrip(" |").split(", ") for cells in kinds}
    students = {sid for who in named.values() for sid in who}
    assert students == set(MUTANTS) | {"bob", "twin_a", "twin_b"}, students
    hinted = 0
    for sid in [*MUTANTS, "twin_a"]:
        v = corpus.by_name(sid if sid != "twin_a" else TWIN)
        own = {kind for (column, kind), who in named.items() if column == f"ex{v.exercise}" and sid in who}
        tests = json.loads((run.out / "results" / f"{sid}.json").read_text())["tests"]
        failed = [t["output"].split("\n\n", 1)[1] for t in tests if t["extra_data"]["exercise"] == v.exercise
                  and t["status"] == "failed" and t["visibility"] == "visible"]
        expected = {summary_module.failure_kind(f) for f in failed}  # each hint (or kind) the student was shown
        assert own == expected and own, (sid, own, expected)
        hinted += any(k != summary_module.NO_HINT for k in own)
    assert hinted >= len(MUTANTS) // 2  # the grader recognised most mistakes even on 3 examples a check
    assert all(("twin_a" in who) == ("twin_b" in who) for who in named.values())

    # similarity: the identical pair and the key copies by name, the refused files not read
    similar = read_csv(run.out / "similarity.csv")
    identical_pairs = {(r["student_a"], r["student_b"]) for r in similar if r["identical"] == "yes"}
    assert {p for p in identical_pairs if similarity.KEY not in p} == \
        {("carol", "keycopy"), ("carol", "solution"), ("keycopy", "solution"), ("twin_a", "twin_b")}
    assert {a for a, b in identical_pairs if b == similarity.KEY} == KEY_COPIES
    report_md = (run.out / "similarity.md").read_text()
    assert "| twin_a | twin_b | 100% |" in report_md
    assert all(f"| {sid} | 100% | yes | yes | yes |" in report_md for sid in KEY_COPIES)
    assert "Not compared (no readable file): eve, frank, gina, hal, ivan." in report_md


@pytest.mark.slow
@CLASS_GROUP
def test_a_rerun_grades_nobody_and_a_touched_submission_alone_is_regraded(graded_class):
    run = graded_class
    results = sorted((run.out / "results").glob("*.json"))
    before = {p.name: p.stat().st_mtime_ns for p in results}
    gradebook = (run.out / "gradebook.csv").read_text()
    similar = (run.out / "similarity.csv").read_text()
    args = (run.submissions, "--out", run.out, "--jobs", 2, "--config", run.config)
    started = time.monotonic()
    again = run_cli(*args)
    assert again.returncode == 0 and "(0 this run; 29 kept from an earlier run)" in again.stdout, again.stdout
    assert time.monotonic() - started < 30  # no grading process, no sandbox
    assert {p.name: p.stat().st_mtime_ns for p in results} == before
    assert (run.out / "gradebook.csv").read_text() == gradebook
    assert (run.out / "similarity.csv").read_text() == similar

    os.utime(run.paths["bob"][0])  # touch
    touched = run_cli(*args)
    assert touched.returncode == 0 and "(1 this run" in touched.stdout, touched.stdout
    changed = {p.name for p in results if p.stat().st_mtime_ns != before[p.name]}
    assert changed == {"bob.json"}
    assert (run.out / "gradebook.csv").read_text() == gradebook


@pytest.mark.slow
def test_restart_or_another_selection_grades_everyone_again(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "ann.py").write_text(SOLUTION.read_text())
    (subs / "ben.py").write_text(corpus.render(corpus.by_name("gae_no_whitening")))
    args = [subs, "--out", tmp_path / "out", "--exercise", 4, "--jobs", 1, "--config", quick_config(tmp_path)]
    for extra, this_run in [((), 2), ((), 0), (("--restart",), 2), (("--exercise", 3), 2), (("--exercise", 3), 0)]:
        proc = run_cli(*args, *extra)
        assert proc.returncode == 0 and f"({this_run} this run" in proc.stdout, (extra, proc.stdout, proc.stderr)
    header = read_csv(tmp_path / "out" / "gradebook.csv")[0].keys()
    assert "ex3" in header and "4/advantages" in header and "ex1" not in header


@pytest.mark.slow
def test_each_sandbox_hides_the_class_and_earlier_submissions(tmp_path):
    """A submission must not read its classmates' code (the submissions folder, the other processes'
    stages, the earlier students' staged files) nor the gradebook, then raise it into its feedback."""
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    for i in range(3):
        (subs / f"s{i}.py").write_text(SOLUTION.read_text() + f"\nSECRET_OF_S{i} = 1\n")
    (subs / "z_probe.py").write_text(f"""
import glob
found = []
for pattern in ("{subs}/*", "{out}/*", "{out}/results/*", "/tmp/ppo-batch-*/slot-*/*/submission-*/*"):
    for path in glob.glob(pattern):
        try:
            found.append(path + ": " + open(path).read())
        except OSError as err:
            found.append(path + ": " + type(err).__name__)
raise RuntimeError(" | ".join(found))
""")
    proc = run_cli(subs, "--out", out, "--exercise", 4, "--jobs", 2, "--config", quick_config(tmp_path))
    assert proc.returncode == 0, proc.stderr
    probe = json.loads((out / "results" / "z_probe.json").read_text())
    feedback = "\n".join(t["output"] for t in probe["tests"])
    assert "raised RuntimeError" in feedback and "SECRET_OF_S" not in feedback, feedback
    assert "s0.py" not in feedback and "gradebook.csv" not in feedback and "s0.json" not in feedback, feedback


# ---- the grader's own failures ------------------------------------------------------------------------

def fake_grade(broken: set[str], graded: list[str]):
    """A stand-in for grade.grade: full marks, or a failure of the grader's own for texts in ``broken``."""

    def run(source, cfg, config_path, with_training=False, exercises=None, sandbox=None):
        graded.append(source.strip())
        if source.strip() in broken and source.startswith("fork"):
            raise GraderFailure("starting the fork server (importing torch) took longer than 60 s")
        if source.strip() in broken:
            raise KeyError("a bug of the grader's own")
        checks = [dataclasses.replace(c, score=c.max_score, feedback="", passed=True)
                  for c in nothing_to_grade(cfg, "").checks]
        return GradingResult(checks, {"sandbox": "fake"}, 0.0)

    return run


def in_process(grade_fn):
    def run_pool(todo, setup, jobs, on_done):
        for student in todo:
            on_done(grading.grade_student(student, setup, grade_fn=grade_fn))
    return run_pool


def test_grader_failures_are_recorded_exit_1_and_the_others_are_kept(tmp_path, monkeypatch, capsys):
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    for sid in ("alice", "fork", "keyerror"):
        (subs / f"{sid}.py").write_text(sid + "\n")
    broken, graded = {"fork", "keyerror"}, []
    monkeypatch.setattr(run, "run_pool", in_process(fake_grade(broken, graded)))
    args = [str(subs), "--out", str(out)]
    assert cli.main(args) == 1
    rows = {r["student"]: r for r in read_csv(out / "gradebook.csv")}
    assert rows["alice"]["status"] == "graded" and rows["alice"]["total"] == "100"
    assert rows["fork"]["status"] == "grader failed: starting the fork server (importing torch) took longer than 60 s"
    assert rows["keyerror"]["status"] == "grader failed: KeyError: \"a bug of the grader's own\""
    assert rows["fork"]["total"] == "" and rows["fork"]["1/loss"] == ""
    assert sorted(p.name for p in (out / "results").iterdir()) == ["alice.json"]
    assert "Traceback" in json.loads((out / "grader-failures" / "keyerror.json").read_text())["details"]
    summary = (out / "summary.md").read_text()
    assert "## Students without a normal grading" in summary
    assert "| fork | grader failure: starting the fork server" in summary
    captured = capsys.readouterr()
    assert "the grader failed on fork" in captured.err and "rerun to retry" in captured.out

    broken.clear()  # the grader is mended: the rerun retries the two, and only them
    graded.clear()
    assert cli.main(args) == 0
    assert sorted(graded) == ["fork", "keyerror"] and not (out / "grader-failures" / "fork.json").exists()
    assert all(r["status"] == "graded" for r in read_csv(out / "gradebook.csv"))


def test_a_failure_removes_a_stale_result_so_that_the_next_run_retries(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    (subs / "alice.py").write_text("alice\n")
    student = discovery.discover(subs).students[0]
    setup = grading.Setup(config.load(CONFIG, CHECK_IDS), CONFIG, out, None, False)
    first = grading.grade_student(student, setup, grade_fn=fake_grade(set(), []))
    assert first.status == "graded" and grading.read_results(out, "alice") is not None
    failed = grading.grade_student(student, setup, grade_fn=fake_grade({"alice"}, []))
    assert failed.failed and grading.read_results(out, "alice") is None
    row = gradebook.row_for(out, "alice", run.fallback_columns(None, False)[1])
    assert row.status == failed.status and row.total is None


class _DiesOnArrival(discovery.Student):
    """Unpickling it in the grading process ends that process (a crash of the grader's own)."""

    def __reduce__(self):
        return os._exit, (3,)


def test_a_grading_process_that_dies_costs_only_its_student(tmp_path):
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    setup = grading.Setup(config.load(CONFIG, CHECK_IDS), CONFIG, out, None, False, slots=(tmp_path,))
    todo = [_DiesOnArrival("crash", None, tmp_path, "x"), discovery.Student("zoe", None, tmp_path, "an empty folder")]
    outcomes = []
    pool.run_pool(todo, setup, 1, outcomes.append)
    assert [o.student for o in outcomes] == ["crash", "zoe"]
    assert outcomes[0].status == "grader failed: the grading process died (exit status 3)"
    assert outcomes[1].status == "refused: an empty folder"


# ---- layouts and usage ----------------------------------------------------------------------------

def test_layouts(tmp_path):
    """The accepted-names rule (classroom/discovery.py, README): every entry not graded, or graded
    under a bent name, gets a notice; none is dropped in silence."""
    root = tmp_path / "subs"
    root.mkdir()
    (root / "a.py").write_text("x")
    (root / "b").mkdir()
    (root / "b" / "exercises.py").write_text("x")
    (root / "b" / "helpers.py").write_text("x")  # exercises.py is the one graded
    (root / "c").mkdir()
    (root / "c" / "one.py").write_text("x")
    (root / "d").mkdir()
    (root / "e.py").write_text("x")
    (root / "e").mkdir()  # two submissions for e
    (root / "f").symlink_to(root / "c")
    (root / ".hidden.py").write_text("x")
    (root / "README.txt").write_text("x")
    (root / "rita.PY").write_text("x")  # a submission: the extension in any case
    (root / "xavier").mkdir()
    (root / "xavier" / "exercises.py").write_text("x")
    (root / "xavier" / "exercises_old.py").write_text("x")
    (root / "yan").mkdir()
    (root / "yan" / "exercises.PY").write_text("x")  # the graded name, typed in capitals
    (root / "yan" / "helpers.py").write_text("x")
    (root / "out").mkdir()
    (root / "__MACOSX").mkdir()  # what a Mac's unzip adds: no student
    (root / "__MACOSX" / "._a.py").write_text("x")
    found = discovery.discover(root, skip=(root / "out",))
    by_id = {s.id: s for s in found.students}
    assert list(by_id) == ["a", "b", "c", "d", "e", "f", "rita", "xavier", "yan"]
    assert found.ignored == [".hidden.py", "__MACOSX/", "README.txt"]
    assert by_id["a"].path == root / "a.py" and by_id["a"].folder == root
    assert by_id["b"].path == root / "b" / "exercises.py" and by_id["b"].folder == root / "b"
    assert by_id["c"].path == root / "c" / "one.py"
    assert by_id["d"].path is None and "no .py file" in by_id["d"].problem
    assert by_id["e"].path is None and "two submissions" in by_id["e"].problem
    assert by_id["rita"].path == root / "rita.PY"
    assert by_id["xavier"].path == root / "xavier" / "exercises.py"
    assert by_id["yan"].path == root / "yan" / "exercises.PY"
    notices = {n.entry: n for n in found.notices}
    assert sorted(notices) == [".hidden.py", "README.txt", "__MACOSX/", "b/helpers.py", "rita.PY", "xavier/exercises_old.py",
                               "yan/helpers.py"]
    assert notices["__MACOSX/"].why == "hidden, cache or archive entry, not a student"
    assert notices["xavier/exercises_old.py"].student == "xavier" and "xavier/exercises.py is" in \
        notices["xavier/exercises_old.py"].why
    assert notices["rita.PY"].student == "rita" and "not lowercase" in notices["rita.PY"].why
    assert notices["README.txt"].student is None and "not a student" in notices["README.txt"].why
    with pytest.raises(submission.Refused, match="symbolic link"):
        submission.read(by_id["f"].path, by_id["f"].folder)


@pytest.mark.parametrize("args, message", [
    (["{subs}"], "give --out DIR"),
    (["{file}", "--out", "{out}"], "is not a folder of submissions"),
    (["{subs}", "--out", "{out}", "--results", "r.json"], "a class takes --out"),
    (["{file}", "--jobs", "2"], "grade a class"),
    (["{subs}", "--out", "{out}", "--jobs", "0"], "at least 1"),
    (["{file}", "--layout", "canvas"], "grade a class"),
    (["{subs}", "--out", "{out}", "--roster", "r.csv", "--canvas-gradebook", "g.csv"], "give it or --roster, not both"),
    (["{subs}", "--out", "{out}", "--canvas-assignment", "PPO"], "name columns of --canvas-gradebook: give it"),
    (["{subs}", "--out", "{out}", "--canvas-gradebook", "g.csv", "--canvas-assignment", "PPO",
      "--canvas-bonus-assignment", "Bonus", "--bonus", "add"], "give one of them"),
])
def test_usage_errors(tmp_path, capsys, args, message):
    (tmp_path / "subs").mkdir()
    (tmp_path / "a.py").write_text("x")
    values = {"subs": tmp_path / "subs", "file": tmp_path / "a.py", "out": tmp_path / "out"}
    with pytest.raises(SystemExit) as exit:
        cli.main([a.format(**values) for a in args])
    assert exit.value.code == 2 and message in capsys.readouterr().err


def test_one_run_at_a_time_per_out_folder(tmp_path):
    import fcntl

    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    (subs / "alice.py").write_text("x\n")
    out.mkdir()
    with open(out / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(run.BatchError, match="another ppo-grade is grading into"):
            run.grade_class(run.Options(subs, out, CONFIG), config.load(CONFIG, CHECK_IDS))


def test_results_are_stale_under_another_hidden_seed(tmp_path, monkeypatch, capsys):
    """The hidden seed lives outside grading.yaml (environment or file): a new one must regrade
    everyone, and a malformed one stops the class with the reason before anyone is graded."""
    keys = {seed: state.run_key(CONFIG, None, False, seed) for seed in (1, 2)}
    assert keys[1] != keys[2] and keys[1] == state.run_key(CONFIG, None, False, 1)
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "ann.py").write_text("x = 1\n")
    monkeypatch.setenv("PPO_GRADER_HIDDEN_SEED", "not a number")
    assert cli.main([str(subs), "--out", str(tmp_path / "out"), "--jobs", "1"]) == 1
    assert "the hidden seed from env is not an integer" in capsys.readouterr().err
    assert not list((tmp_path / "out").rglob("ann.json"))  # nobody graded


# ---- what a TA acts on: reasons, mistakes by kind, feedback, similarity, --only, the roster ---------

from autograder import grade as grade_module  # noqa: E402
from autograder import sandbox as sandbox_module  # noqa: E402
from autograder.classroom import feedback, roster, similarity, status  # noqa: E402
from autograder.classroom import summary as summary_module  # noqa: E402

CFG = config.load(CONFIG, CHECK_IDS)
PART_ONE_MAX = sum(c.max_score for c in nothing_to_grade(CFG, "").checks if not c.bonus)  # 100 as shipped
BONUS_MAX = sum(c.max_score for c in nothing_to_grade(CFG, "").checks if c.bonus)         # what Part II adds


def results_with(failures: dict[tuple[int, str], str]) -> dict:
    """results.json as the grader writes it: every check passed but ``failures`` (check -> feedback)."""
    checks = [dataclasses.replace(c, score=0.0 if (c.exercise, c.check) in failures else c.max_score,
                                  feedback=failures.get((c.exercise, c.check), ""), passed=None)
              for c in nothing_to_grade(CFG, "").checks]
    return report.to_gradescope(GradingResult(checks, {"sandbox": "fake"}, 0.0))


def visible(n: int) -> list[str]:
    return [c.id for c in CHECKS[n] if not c.hidden]


def hidden(n: int) -> list[str]:
    return [c.id for c in CHECKS[n] if c.hidden]


def whole_exercise(n: int, feedback_text: str, hidden_text: str | None = None) -> dict[tuple[int, str], str]:
    """Every check of exercise n failed as the grader fails them after a fatal abort."""
    return {**{(n, c): feedback_text for c in visible(n)},
            **{(n, c): hidden_text or grade_module._hidden_feedback(n, "crash") for c in hidden(n)}}


COUNTEREXAMPLE = "Counterexample (shrunk):\n    x = 1\nloss: expected 1, got -1"
PART_TWO = sorted(n for n in CHECKS if is_bonus(n))
SIGN_HINT = "your loss has the opposite sign"


def write_class(out: Path, results: dict[str, dict]) -> None:
    for sid, data in results.items():
        report.write_json_atomic(data, grading.results_path(out, sid))


def gradings(folder: Path, *ids: str) -> list[discovery.Student]:
    """Plain-layout gradings (one student each) of the results files ``write_class`` wrote."""
    return [discovery.Student(sid, None, folder, file=f"{sid}.py") for sid in ids]


def test_statuses_and_reasons_from_the_graders_own_words():
    """Each status comes from the phrase grade.py or sandbox.py writes (built from them where they
    are functions); the class tests see the same phrases come out of real gradings."""
    import_error = grade_module.calls.StudentError({"type": "ModuleNotFoundError", "message": "No module named 'x'"})
    syntax = grade_module.calls.StudentError({"type": "SyntaxError", "message": "invalid syntax (line 3)"})
    cases = {
        "importer": ({k: status.IMPORT_FAILED + import_error.describe() for n in CHECKS for k in
                      whole_exercise(n, "")}, {n: status.IMPORT_ERROR for n in CHECKS},
                     "import error: raised ModuleNotFoundError: No module named 'x'"),
        "syntax": ({k: status.IMPORT_FAILED + syntax.describe() for n in CHECKS for k in whole_exercise(n, "")},
                   {n: status.SYNTAX_ERROR for n in CHECKS}, "syntax error: raised SyntaxError: invalid syntax (line 3)"),
        "slow": (whole_exercise(3, "the call took longer than its time limit; the remaining checks of this exercise "
                                   "were not run"), {3: status.TIMEOUT}, "ex3 timeout"),
        "hog": (whole_exercise(4, sandbox_module._death_reason(-9, "") + "; the remaining checks were not run"),
                {4: status.OUT_OF_MEMORY}, "ex4 out of memory"),
        "memerr": (whole_exercise(2, f"ran out of memory (the worker's cap is {CFG.worker.memory_mb} MiB): x; the "
                                     "remaining checks of this exercise were not run"), {2: status.OUT_OF_MEMORY},
                   "ex2 out of memory"),
        "partial": ({**whole_exercise(5, "not implemented: Exercise 5 is not implemented yet",
                                      grade_module._hidden_feedback(5, "not implemented")),
                     (1, "loss"): COUNTEREXAMPLE}, {5: status.NOT_ATTEMPTED}, "ex5 not attempted"),
        # Part II is optional: left blank, a normal grading; attempted, it counts like any exercise
        "part_one_only": ({k: v for n in PART_TWO for k, v in whole_exercise(
            n, f"not implemented: Exercise {n} is not implemented yet", grade_module._hidden_feedback(n, "not implemented")).items()},
            {n: status.NOT_ATTEMPTED for n in PART_TWO}, ""),
        "slow_bonus": ({**{k: v for n in PART_TWO[1:] for k, v in whole_exercise(
            n, "not implemented: later", grade_module._hidden_feedback(n, "not implemented")).items()},
            **whole_exercise(PART_TWO[0], "the call took longer than its time limit; the remaining checks of this "
                                          "exercise were not run")},
            {PART_TWO[0]: status.TIMEOUT, **{n: status.NOT_ATTEMPTED for n in PART_TWO[1:]}}, f"ex{PART_TWO[0]} timeout"),
        "blank": ({k: v for n in CHECKS for k, v in whole_exercise(
            n, "not implemented: blank", grade_module._hidden_feedback(n, "not implemented")).items()},
            {n: status.NOT_ATTEMPTED for n in CHECKS}, "not attempted (every exercise)"),
        "wrong": ({(1, "loss"): COUNTEREXAMPLE, (1, hidden(1)[0]): grade_module._hidden_feedback(1, "crash")}, {}, ""),
    }
    for sid, (failures, expected, reason) in cases.items():
        data = results_with(failures)
        got = status.student_status(data, grading.status_of(data), None, sorted(CHECKS))
        assert got.exercises == {n: expected.get(n, status.GRADED) for n in CHECKS}, sid
        assert got.reason == reason, sid
    refused = report.to_gradescope(nothing_to_grade(CFG, "eve.py is a symbolic link, not a file"))
    got = status.student_status(refused, grading.status_of(refused), None, [1, 2])
    assert got.exercises == {1: "refused", 2: "refused"} and got.reason == "refused: eve.py is a symbolic link, not a file"
    got = status.student_status(None, "", "the fork server died", [1])
    assert got.exercises == {1: "grader failure"} and got.reason == "grader failure: the fork server died"


def test_mistakes_by_kind_count_each_student_once_and_leave_out_what_was_not_attempted(tmp_path):
    hint = f"{COUNTEREXAMPLE}\nHint: {SIGN_HINT}."
    write_class(tmp_path, {
        # the same mistake on two visible checks and their hidden twins: counted once
        "ann": results_with({(1, "loss"): hint, (1, "gradient"): hint,
                             **{(1, c): grade_module._hidden_feedback(1, "mismatch") for c in hidden(1)}}),
        "ben": results_with({(1, "loss"): hint}),
        # a wrong result no hint matched, and a failure on hidden inputs alone
        "cid": results_with({(1, "loss"): COUNTEREXAMPLE, (2, hidden(2)[0]): grade_module._hidden_feedback(2, "mismatch")}),
        # the blank: every exercise not attempted, in no mistake
        "dee": results_with({k: v for n in CHECKS for k, v in whole_exercise(
            n, "not implemented: blank", grade_module._hidden_feedback(n, "not implemented")).items()}),
        "eve": results_with({}),
    })
    book = gradebook.build_gradebook(tmp_path, gradings(tmp_path, "ann", "ben", "cid", "dee", "eve"),
                                     run.fallback_columns(None, False))
    found = {(m.exercise, m.kind): m.students for m in summary_module.mistakes(book)}
    assert found == {
        (1, SIGN_HINT): ("ann", "ben"),
        (1, summary_module.NO_HINT): ("cid",),
        (2, "passes the visible checks, fails the hidden ones (a value differs from the reference)"): ("cid",),
    }
    text = summary_module.summary_markdown(book)
    assert f"| ex1 | {SIGN_HINT} | 2 | ann, ben |" in text
    assert "| dee | not attempted (every exercise) |" in text and "| ann |" not in text.split("## Mistakes")[0]
    assert "[  90,  100] " in text  # the text histogram's last bin holds the full marks


def test_feedback_shows_the_visible_checks_and_the_hidden_ones_only_once_published(tmp_path):
    data = results_with({(1, "loss"): f"{COUNTEREXAMPLE}\nHint: {SIGN_HINT}.",
                         (1, hidden(1)[0]): grade_module._hidden_feedback(1, "mismatch")})
    write_class(tmp_path, {"ann": data})
    before = feedback.render("ann", data)
    after = feedback.render("ann", data, published=True)
    assert "Counterexample" in before and SIGN_HINT in before and "Visible checks:" in before
    assert hidden(1)[0] not in before and "failed on the hidden inputs" not in before
    assert hidden(1)[0] in after and "failed on the hidden inputs" in after
    # the gradebook's denominator: Part I's total of its maximum, the bonus beyond it
    lost = sum(t["max_score"] - t["score"] for t in data["tests"])
    assert f"**Total: {PART_ONE_MAX - lost:g} / {PART_ONE_MAX:g}**\n" in after
    assert f"**Bonus (Part II, optional): {BONUS_MAX:g} / {BONUS_MAX:g}**, beyond the total" in after
    assert feedback.fence("a ```` b").startswith("`````text")  # student text cannot close the fence
    feedback.write(tmp_path, [("ann", "ann", "ann"), ("nobody", "nobody", "nobody")])
    assert (tmp_path / "feedback" / "ann.md").read_text() == before
    assert not (tmp_path / "feedback" / "nobody.md").exists()


def test_similarity_names_copies_and_key_matches_but_not_independent_work():
    starter, key = BLANK.read_text(), SOLUTION.read_text()
    mutant = corpus.render(corpus.by_name("gae_no_whitening"))
    renamed = mutant.replace("advantages", "adv_estimates").replace("    ### END SOLUTION", "    # my own work\n    ### END SOLUTION")
    independent = {p.stem: p.read_text() for p in sorted((ROOT / "tests" / "submissions").glob("correct_*.py"))}
    assert len(independent) >= 5
    texts = {"twin_a": mutant, "twin_b": mutant, "disguised": renamed, "keycopy": key, **independent}
    result = similarity.compare(texts, starter, key)
    pairs = {(p.a, p.b): p for p in result.pairs}
    assert pairs["twin_a", "twin_b"].identical and pairs["twin_a", "twin_b"].same_code
    assert pairs["disguised", "twin_a"].same_code and not pairs["disguised", "twin_a"].identical
    assert not any(a in independent and b in independent for a, b in pairs), pairs.keys()
    by_student = {p.a: p for p in result.key}
    assert by_student["keycopy"].identical and result.markers == ["disguised", "keycopy", "twin_a", "twin_b"]
    assert not set(by_student) & set(independent)
    md = similarity.to_markdown(result)
    assert "| twin_a | twin_b | 100% |" in md and "| keycopy | 100% | yes | yes | yes |" in md
    rows = list(csv.DictReader(io.StringIO(similarity.to_csv(result).removeprefix("\ufeff"))))
    assert {"student_a": "keycopy", "student_b": similarity.KEY, "identical": "yes"}.items() <= rows[0].items()


def test_only_regrades_exactly_the_named_students_and_rebuilds_the_gradebook(tmp_path, monkeypatch, capsys):
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    for sid in ("ann", "ben", "cid", "dee"):
        (subs / f"{sid}.py").write_text(sid + "\n")
    graded = []
    monkeypatch.setattr(run, "run_pool", in_process(fake_grade(set(), graded)))
    args = [str(subs), "--out", str(out), "--jobs", "1"]
    assert cli.main(args) == 0 and sorted(graded) == ["ann", "ben", "cid", "dee"]
    before = {p.name: p.stat().st_mtime_ns for p in (out / "results").iterdir()}
    (out / "gradebook.csv").unlink()
    (subs / "dee.py").write_text("dee, changed\n")  # stale, but not named: left as it is
    graded.clear()
    assert cli.main(args + ["--only", "ben", "cid"]) == 0
    assert sorted(graded) == ["ben", "cid"]
    changed = {p.name for p in (out / "results").iterdir() if p.stat().st_mtime_ns != before[p.name]}
    assert changed == {"ben.json", "cid.json"}
    assert [r["student"] for r in read_csv(out / "gradebook.csv")] == ["ann", "ben", "cid", "dee"]
    captured = capsys.readouterr()
    assert "--only left 1 students whose results are missing or older than their files (dee)" in captured.err
    assert "1 students unchanged since the last run are kept" in captured.err  # ann; dee is not unchanged
    assert "(2 this run" in captured.out and "2 kept" in captured.out
    graded.clear()
    assert cli.main(args + ["--only", "zed"]) == 1 and not graded
    assert "--only: no student zed in" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(args + ["--only", "ann", "--restart"])


def test_gradebook_csv_opens_in_spreadsheets_and_takes_names_from_a_roster(tmp_path, monkeypatch, capsys):
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    for sid in ("s001", "s002"):
        (subs / f"{sid}.py").write_text(sid + "\n")
    (subs / "=cmd.py").write_text("x\n")  # a file name a spreadsheet would run as a formula
    monkeypatch.setattr(run, "run_pool", in_process(fake_grade(set(), [])))
    roster_csv = tmp_path / "roster.csv"
    roster_csv.write_text("\ufeffID,Name,Email,Section\ns001,José Müller,jose@example.edu,A\n"
                          "s002,Zoë Ødegård,zoe@example.edu,B\n=cmd,Mallory,m@example.edu,C\ns003,Absent Student,a@x,A\n",
                          encoding="utf-8")
    assert cli.main([str(subs), "--out", str(out), "--roster", str(roster_csv)]) == 0
    raw = (out / "gradebook.csv").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf") and "José Müller".encode() in raw  # UTF-8 with a BOM
    rows = {r["student"]: r for r in read_csv(out / "gradebook.csv")}
    assert list(next(iter(rows.values())))[:6] == ["student", "name", "email", "file", "total", "max"]
    assert rows["s001"]["name"] == "José Müller" and rows["s002"]["email"] == "zoe@example.edu"
    assert "'=cmd" in rows and rows["'=cmd"]["name"] == "Mallory"
    assert rows["s003"]["reason"] == "no submission" and rows["s003"]["total"] == ""
    assert "s003 is in the roster but has no submission" in capsys.readouterr().err
    assert "| s003 (Absent Student) | no submission |" in (out / "summary.md").read_text()

    roster_csv.write_text("id,name\ns001,José\n", encoding="utf-8")  # s002 and =cmd are missing
    assert cli.main([str(subs), "--out", str(out), "--roster", str(roster_csv)]) == 1
    err = capsys.readouterr().err
    assert "2 submissions have an id that is not in the roster" in err and "=cmd, s002" in err
    assert "Traceback" not in err
    for text, message in [("name,email\nx,y\n", "has no 'id' column"), ("id,section\ns001,A\n", "neither a 'name'"),
                          ("id,name\ns001,a\ns001,b\n", "more than once: s001")]:
        roster_csv.write_text(text)
        with pytest.raises(roster.RosterError, match=message):
            roster.load(roster_csv)


# ---- a class as its platform hands it over: Gradescope, Canvas, Moodle ----------------------------------

import re  # noqa: E402

from autograder.classroom import exports, upload  # noqa: E402

LOSS_POINTS = next(c.max_score for c in nothing_to_grade(CFG, "").checks if (c.exercise, c.check) == (1, "loss"))
SYNTAX_MESSAGE = "'(' was never closed (submission.py, line 3)"  # Python names the staged copy so


def scripted_grade(source, cfg, config_path, with_training=False, exercises=None, sandbox=None):
    """A stand-in for grade.grade, in the grader's own words, chosen by the file's first line:
    ``# full``, ``# part one`` (Part II left blank), ``# sign`` (exercise 1's sign mistake),
    ``# syntax`` (the file cannot be imported)."""
    kind = source.split("\n", 1)[0].removeprefix("# ").strip()
    blank = {k: v for n in CHECKS if is_bonus(n) for k, v in whole_exercise(
        n, f"not implemented: Exercise {n} is not implemented yet", grade_module._hidden_feedback(n, "not implemented")).items()}
    syntax = status.IMPORT_FAILED + grade_module.calls.StudentError({"type": "SyntaxError", "message": SYNTAX_MESSAGE}).describe()
    failures = {"full": {}, "part one": blank, "sign": {(1, "loss"): f"{COUNTEREXAMPLE}\nHint: {SIGN_HINT}."},
                "syntax": {k: syntax for n in CHECKS for k in whole_exercise(n, "")}}[kind]
    checks = [dataclasses.replace(c, score=0.0 if (c.exercise, c.check) in failures else c.max_score,
                                  feedback=failures.get((c.exercise, c.check), ""), passed=None)
              for c in nothing_to_grade(cfg, "").checks]
    return GradingResult(checks, {"sandbox": "fake"}, 0.0)


def code(kind: str, body: str = "") -> str:
    """A submission graded as ``kind``; ``body`` makes files differ (or alike) for the similarity report."""
    return f"# {kind}\n{body or kind}\n"


GRADESCOPE_METADATA = """\
---
submission_301000001:
  :submitters:
  - :name: José Müller
    :sid: '12345'
    :email: jose@example.edu
  :created_at: 2025-03-01 23:58:10.123456000 -08:00
  :score: !ruby/object:BigDecimal 18:0.1e3
  :history: []
submission_301000002:
  :submitters:
  - :name: Siobhán O'Brien
    :sid: '12346'
    :email: siobhan@example.edu
  - :name: Zoë Ødegård
    :sid: '12347'
    :email: zoe@example.edu
  :created_at: 2025-03-02 10:00:00.000000000 -08:00
  :score: !ruby/object:BigDecimal 18:0.9e2
  :history:
  - :created_at: 2025-03-01 09:00:00.000000000 -08:00
    :score: !ruby/object:BigDecimal 18:0.5e2
submission_301000003:
  :submitters:
  - :name: Ann Lee
    :sid:
    :email: ann@example.edu
  :created_at: 2025-03-01 12:00:00.000000000 -08:00
submission_301000004:
  :submitters:
  - :name: Bob Stone
    :sid: '12349'
    :email: bob@example.edu
  :created_at: 2025-03-01 12:30:00.000000000 -08:00
submission_301000005:
  :submitters:
  - :name: Cleo Park
    :sid: '12350'
    :email: cleo@example.edu
  :created_at: 2025-03-01 13:00:00.000000000 -08:00
"""


def gradescope_export(folder: Path) -> Path:
    """An "Export Submissions" as Gradescope builds it: the zip's folder, submission_metadata.yml
    beside submission_<id>/ with the files as uploaded; a group submission; a submitter without
    SID; a listed submission whose folder is missing; a folder the metadata does not list."""
    root = folder / "assignment_5551_export"
    root.mkdir(parents=True)
    (root / "submission_metadata.yml").write_text(GRADESCOPE_METADATA, encoding="utf-8")
    files = {"submission_301000001/exercises.py": code("full", SOLUTION.read_text()),
             "submission_301000002/exercises.py": code("part one"),
             "submission_301000003/my_ppo.py": code("sign"), "submission_301000004/exercises.py": code("syntax"),
             "submission_301000006/exercises.py": code("full", "unlisted"), "__MACOSX/._x": ""}
    for name, text in files.items():
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return folder


def test_a_gradescope_export_is_keyed_by_its_submitters(tmp_path, monkeypatch, capsys):
    subs, out = gradescope_export(tmp_path / "export"), tmp_path / "out"
    monkeypatch.setattr(run, "run_pool", in_process(scripted_grade))
    assert cli.main([str(subs), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "read " in printed.err and "as a Gradescope export (submission_metadata.yml): 7 students in 6 gradings" in printed.err
    rows = {r["student"]: r for r in read_csv(out / "gradebook.csv")}
    assert list(next(iter(rows.values())))[:11] == ["student", "name", "sid", "email", "submitted", "file", "total",
                                                    "max", "bonus", "bonus max", "reason"]
    assert sorted(rows) == ["12345", "12346", "12347", "12349", "12350", "ann@example.edu", "submission_301000006"]
    max_, bonus_max = f"{PART_ONE_MAX:g}", f"{BONUS_MAX:g}"
    expected = {  # student: name, sid, email, submitted, file, total, bonus, reason
        "12345": ("José Müller", "12345", "jose@example.edu", "2025-03-01 23:58:10-08:00",
                  "submission_301000001/exercises.py", max_, bonus_max, ""),
        "12346": ("Siobhán O'Brien", "12346", "siobhan@example.edu", "2025-03-02 10:00:00-08:00",
                  "submission_301000002/exercises.py", max_, "0", ""),
        "12347": ("Zoë Ødegård", "12347", "zoe@example.edu", "2025-03-02 10:00:00-08:00",
                  "submission_301000002/exercises.py", max_, "0", ""),
        "ann@example.edu": ("Ann Lee", "", "ann@example.edu", "2025-03-01 12:00:00-08:00",
                            "submission_301000003/my_ppo.py", f"{PART_ONE_MAX - LOSS_POINTS:g}", bonus_max, ""),
        "12349": ("Bob Stone", "12349", "bob@example.edu", "2025-03-01 12:30:00-08:00",
                  "submission_301000004/exercises.py", "0", "0",
                  "syntax error: raised SyntaxError: '(' was never closed (submission_301000004/exercises.py, line 3)"),
        # a partial unzip: no grade at all (a 0 uploaded would overwrite the real one)
        "12350": ("Cleo Park", "12350", "cleo@example.edu", "2025-03-01 13:00:00-08:00", "submission_301000005/", "",
                  "", "submission_301000005/ is listed in submission_metadata.yml but is not in the export: "
                      "unzip the export again"),
        "submission_301000006": ("", "", "", "", "submission_301000006/exercises.py", max_, bonus_max,
                                 "not in submission_metadata.yml: graded under its folder's name, no student known"),
    }
    for key, (name, sid, email, submitted, file, total, bonus, reason) in expected.items():
        row = rows[key]
        assert (row["name"], row["sid"], row["email"], row["submitted"], row["file"], row["total"], row["max"],
                row["bonus"], row["bonus max"], row["reason"]) == \
            (name, sid, email, submitted, file, total, max_ if total else "", bonus, bonus_max if total else "",
             reason), key
    assert rows["12350"]["status"] == "not graded"
    assert all(rows[k][f"ex{n}"] == rows["12346"][f"ex{n}"] for k in ("12347",) for n in CHECKS)  # one grading
    assert sorted(p.name for p in (out / "results").iterdir()) == [f"submission_30100000{i}.json" for i in (1, 2, 3, 4, 6)]

    # grades.csv: email,sid,name,score with the bonus added; left out: Cleo (no grade: her folder is
    # missing) and the unlisted folder (no email or sid: no platform could match it), both named
    graded = list(csv.reader(io.StringIO((out / "grades.csv").read_text(encoding="utf-8"))))
    assert graded[0] == ["email", "sid", "name", "score"]
    assert {tuple(r) for r in graded[1:]} == {
        ("jose@example.edu", "12345", "José Müller", f"{PART_ONE_MAX + BONUS_MAX:g}"),
        ("siobhan@example.edu", "12346", "Siobhán O'Brien", max_), ("zoe@example.edu", "12347", "Zoë Ødegård", max_),
        ("ann@example.edu", "", "Ann Lee", f"{PART_ONE_MAX - LOSS_POINTS + BONUS_MAX:g}"),
        ("bob@example.edu", "12349", "Bob Stone", "0")}
    assert f"warning: not in grades.csv: {upload.NO_GRADE}: 12350" in printed.out
    assert f"warning: not in grades.csv: {upload.NOBODY}: submission_301000006" in printed.out

    # feedback per student (a group's members one each), similarity and summary by name
    assert sorted(p.name for p in (out / "feedback").iterdir()) == sorted(f"{k}.md" for k in expected if k != "12350")
    assert (out / "feedback" / "12347.md").read_text().startswith("# Feedback for 12347 (Zoë Ødegård)\n")
    similar = (out / "similarity.md").read_text()
    assert "| 12345 (José Müller) | 100% | yes |" in similar
    assert {r["student_a"] for r in read_csv(out / "similarity.csv")} == {"12345"}
    summary = (out / "summary.md").read_text()
    reasons = summary.split("## Students without a normal grading")[1].split("\n## ")[0]
    assert [line.split(" | ")[0][2:] for line in reasons.splitlines() if line.startswith("| ") and "---" not in line
            and not line.startswith("| student")] == ["12349 (Bob Stone)", "12350 (Cleo Park)", "submission_301000006"]
    assert f"adds a bonus of up to {BONUS_MAX:g} points beyond the {PART_ONE_MAX:g}: attempted by 3" in summary
    assert "`__MACOSX/`" in summary and "the Gradescope export inside" in summary


def test_gradescope_metadata_that_cannot_be_read_stops_the_class_with_the_reason(tmp_path, capsys):
    subs = gradescope_export(tmp_path / "export") / "assignment_5551_export"
    (subs / "submission_metadata.yml").write_text("submission_1:\n  :submitters: [\n", encoding="utf-8")
    assert cli.main([str(subs), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "submission_metadata.yml is not YAML as Gradescope writes it" in err and "Traceback" not in err
    (subs / "submission_metadata.yml").write_text("- a list\n", encoding="utf-8")
    assert cli.main([str(subs), "--out", str(tmp_path / "out")]) == 1
    assert "does not map submission folders to their records" in capsys.readouterr().err
    assert not (tmp_path / "out" / "results").exists() or not list((tmp_path / "out" / "results").iterdir())


def canvas_file_name(sortable_name: str, user_id: int, attachment_id: int, display_name: str, late: bool = False) -> str:
    """A file name of Canvas's "Download Submissions", built as Canvas builds it (lib/content_zipper.rb:
    sanitize_user_name, get_filename, sanitize_file_name, add_upload_submission)."""
    name = re.sub(r"_(\d+)_", r"\1", sortable_name)
    name = re.sub(r"^(\d+)$", r"\1", name).lower()
    stem = re.sub(r"[^\w]", "", "_".join([name, *(["LATE"] if late else []), str(user_id)]))
    display = re.sub(r'[\x00/\\:*?"<>|]+', "_", display_name)
    return f"{stem}_{attachment_id}_{display}"


# Canvas's gradebook export as lib/gradebook_exporter.rb writes it: the student columns, one per
# assignment "<title> (<id>)", the totals; a Manual Posting row, the Points Possible row; students by
# sortable name, the test student last; a name starting with = quoted; a byte-order mark.
CANVAS_EXPORT = (
    "\ufeffStudent,ID,SIS User ID,SIS Login ID,Section,PPO exercises (5001),PPO bonus (5002),Quiz 1 (5003),"
    "Current Points,Final Points,Current Score,Unposted Current Score,Final Score,Unposted Final Score\n"
    ",,,,,Manual Posting,Manual Posting,,,,,,,\n"
    f"    Points Possible,,,,,100.00,{BONUS_MAX:.2f},10.00,(read only),(read only),(read only),(read only),"
    "(read only),(read only)\n"
    "\"=\"\"=Eve\"\"\",4104,900104,eve,Section A,,,8.00,8.00,8.00,80.00,80.00,80.00,80.00\n"
    "\"Müller, José\",4101,900101,jmuller,Section A,,,9.00,9.00,9.00,90.00,90.00,90.00,90.00\n"
    "\"O'Brien, Siobhán\",4102,900102,sobrien,Section B,,,,0.00,0.00,,,0.00,0.00\n"
    "\"Wu, Carol\",4106,900106,cwu,\"Section A and Section B\",,,7.00,7.00,7.00,70.00,70.00,70.00,70.00\n"
    "\"Ødegård, Zoë\",4103,900103,zodegard,Section B,,,10.00,10.00,10.00,100.00,100.00,100.00,100.00\n"
    "\"Student, Test\",4199,,,Section A,,,,,,,,,\n")


def canvas_download(folder: Path) -> dict[str, str]:
    """A "Download Submissions" of Canvas, unzipped: José on time, Carol LATE with a file she uploaded
    again (-1), Siobhán's folder holding two downloads' files (exercises.py, then exercises-1.py),
    Eve's notebook (no .py), a student the gradebook export does not list (4200), and a file a TA
    dropped in by hand. Returns file name -> user id."""
    folder.mkdir()
    uploads = [("Müller, José", 4101, 90001, "exercises.py", False, code("full", SOLUTION.read_text())),
               ("Wu, Carol", 4106, 90006, "exercises-1.py", True, code("syntax")),
               ("O'Brien, Siobhán", 4102, 90002, "exercises.py", False, code("full", "the first upload")),
               ("O'Brien, Siobhán", 4102, 90012, "exercises-1.py", False, code("part one")),
               ("=Eve", 4104, 90004, "exercises.ipynb", False, "{}"),
               ("Late, Larry", 4200, 90020, "exercises.py", False, code("sign"))]
    names = {}
    for sortable, user, attachment, display, late, text in uploads:
        name = canvas_file_name(sortable, user, attachment, display, late)
        (folder / name).write_text(text, encoding="utf-8")
        names[name] = str(user)
    (folder / "solution_by_hand.py").write_text(code("full", "by hand"))
    return names


def test_a_canvas_download_is_keyed_by_user_id_and_gives_canvas_its_import_file(tmp_path, monkeypatch, capsys):
    subs, out, export = tmp_path / "canvas", tmp_path / "out", tmp_path / "2025-03-02T1200_Grades-PPO.csv"
    names = canvas_download(subs)
    assert "wucarol_LATE_4106_90006_exercises-1.py" in names and "obriensiobhán_4102_90002_exercises.py" in names
    export.write_text(CANVAS_EXPORT, encoding="utf-8")
    monkeypatch.setattr(run, "run_pool", in_process(scripted_grade))
    args = [str(subs), "--out", str(out), "--canvas-gradebook", str(export), "--canvas-assignment", "PPO exercises"]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert "warning: 2 students are not in" in err and "4200, solution_by_hand" in err
    assert "warning: 4103 is in the roster but has no submission" in err
    rows = {r["student"]: r for r in read_csv(out / "gradebook.csv")}
    assert list(next(iter(rows.values())))[:10] == ["student", "name", "user id", "late", "sis user id", "sis login id",
                                                    "section", "file", "total", "max"]
    max_ = f"{PART_ONE_MAX:g}"
    expected = {  # student: name, late, sis user id, file, total, reason (its start)
        "4101": ("Müller, José", "", "900101", "müllerjosé_4101_90001_exercises.py", max_, ""),
        "4102": ("O'Brien, Siobhán", "", "900102", "obriensiobhán_4102_90012_exercises-1.py", max_,
                 "2 .py files (obriensiobhán_4102_90012_exercises-1.py, obriensiobhán_4102_90002_exercises.py): graded "
                 "obriensiobhán_4102_90012_exercises-1.py, the latest upload"),
        "4103": ("Ødegård, Zoë", "", "900103", "", "", "no submission"),
        "4199": ("Student, Test", "", "", "", "", "no submission"),  # Canvas's test student, in its gradebook
        # the name with the gradebook's guard: a spreadsheet would run =Eve
        "4104": ("'=Eve", "", "900104", "eve_4104_90004_exercises.ipynb", "0",
                 "refused: the submission holds no .py file (only eve_4104_90004_exercises.ipynb): submit exercises.py"),
        "4106": ("Wu, Carol", "late", "900106", "wucarol_LATE_4106_90006_exercises-1.py", "0",
                 "syntax error: raised SyntaxError: '(' was never closed (wucarol_LATE_4106_90006_exercises-1.py, line 3)"),
        "4200": ("latelarry", "", "", "latelarry_4200_90020_exercises.py", f"{PART_ONE_MAX - LOSS_POINTS:g}", ""),
        "solution_by_hand": ("", "", "", "solution_by_hand.py", max_,
                             "file name not in Canvas's scheme (name[_LATE]_userid_attachmentid_filename): graded, "
                             "but no Canvas user is known"),
    }
    assert sorted(rows) == sorted(expected)
    for key, (name, late, sis, file, total, reason) in expected.items():
        row = rows[key]
        assert (row["name"], row["late"], row["sis user id"], row["file"], row["total"]) == (name, late, sis, file, total), key
        assert row["reason"].startswith(reason) and (reason or not row["reason"]), (key, row["reason"])
    assert rows["4106"]["section"] == "Section A and Section B" and rows["4101"]["user id"] == "4101"
    # a student of the export without a file: their user id in its column, and why (a group's other members)
    assert (rows["4103"]["user id"], rows["4199"]["user id"]) == ("4103", "4199")
    assert rows["4103"]["reason"] == run.NO_CANVAS_FILE and "group assignment" in run.NO_CANVAS_FILE

    # canvas-import.csv: the export's student columns as exported, the assignment's column, the
    # graded students the export knows, in its order; no Points Possible row
    lines = list(csv.reader(io.StringIO((out / "canvas-import.csv").read_text(encoding="utf-8"))))
    total_with_bonus = f"{PART_ONE_MAX + BONUS_MAX:g}"
    assert lines == [["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "PPO exercises (5001)"],
                     ["=\"=Eve\"", "4104", "900104", "eve", "Section A", "0"],
                     ["Müller, José", "4101", "900101", "jmuller", "Section A", total_with_bonus],
                     ["O'Brien, Siobhán", "4102", "900102", "sobrien", "Section B", max_],
                     ["Wu, Carol", "4106", "900106", "cwu", "Section A and Section B", "0"]]
    assert not (out / "canvas-import.csv").read_bytes().startswith(b"\xef\xbb\xbf")
    # named by the export's names, not the file name's sanitised ones
    assert (out / "feedback" / "4101.md").read_text().startswith("# Feedback for 4101 (Müller, José)\n")
    assert "| 4101 (Müller, José) | 100% | yes |" in (out / "similarity.md").read_text()
    summary = (out / "summary.md").read_text()
    assert "not in canvas-import.csv: 4200\n" in summary
    assert f"not in grades.csv or canvas-import.csv: {upload.NO_GRADE}: 4103, 4199\n" in summary
    assert f"not in grades.csv or canvas-import.csv: {upload.NOBODY}: solution_by_hand\n" in summary

    # a second download unzipped over the first: the same files again, and Carol's new upload
    # beside her old one (a new attachment id, the -2 of a name uploaded again): the same keys
    canvas_download(tmp_path / "again")
    for entry in (tmp_path / "again").iterdir():
        os.replace(entry, subs / entry.name)
    carol = canvas_file_name("Wu, Carol", 4106, 90099, "exercises-2.py", late=True)
    (subs / carol).write_text(code("full", "Carol's fix"), encoding="utf-8")
    assert cli.main(args) == 0
    assert "is not in the roster" not in capsys.readouterr().err
    rows = {r["student"]: r for r in read_csv(out / "gradebook.csv")}
    assert sorted(rows) == sorted(expected) and (rows["4106"]["file"], rows["4106"]["total"]) == (carol, max_)
    assert rows["4106"]["reason"].startswith(f"2 .py files ({carol}, wucarol_LATE_4106_90006_exercises-1.py): "
                                             f"graded {carol}, the latest upload; check it is the one")

    # the bonus in its own Canvas assignment
    assert cli.main(args + ["--canvas-bonus-assignment", "5002"]) == 0
    lines = list(csv.reader(io.StringIO((out / "canvas-import.csv").read_text(encoding="utf-8"))))
    assert lines[0][-2:] == ["PPO exercises (5001)", "PPO bonus (5002)"]
    assert lines[2][-2:] == [max_, f"{BONUS_MAX:g}"] and lines[3][-2:] == [max_, "0"]
    graded_csv = list(csv.reader(io.StringIO((out / "grades.csv").read_text(encoding="utf-8"))))
    assert graded_csv[0] == ["email", "sid", "name", "score", "bonus"]
    assert ["", "4101", "Müller, José", max_, f"{BONUS_MAX:g}"] in graded_csv


@pytest.mark.parametrize("args, message", [
    ([], "--canvas-assignment: which assignment of"),
    (["--canvas-assignment", "Homework 9"], "'Homework 9': no assignment of"),
    (["--canvas-assignment", "PPO exercises", "--bonus", "column"], "--bonus column: give --canvas-bonus-assignment"),
])
def test_canvas_options_that_do_not_match_the_export_stop_before_grading(tmp_path, capsys, args, message):
    subs, export = tmp_path / "canvas", tmp_path / "grades.csv"
    canvas_download(subs)
    export.write_text(CANVAS_EXPORT, encoding="utf-8")
    assert cli.main([str(subs), "--out", str(tmp_path / "out"), "--canvas-gradebook", str(export), *args]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not (tmp_path / "out").exists()
    if "assignment of" in message:  # the TA is shown what to choose from
        assert "(its assignments: PPO exercises (5001); PPO bonus (5002); Quiz 1 (5003))" in err
    export.write_text("name,email\nx,y\n", encoding="utf-8")
    assert cli.main([str(subs), "--out", str(tmp_path / "out"), "--canvas-gradebook", str(export),
                     "--canvas-assignment", "x"]) == 1
    assert "is not a Canvas gradebook export" in capsys.readouterr().err


def test_a_moodle_download_in_folders_is_keyed_by_participant(tmp_path, monkeypatch):
    subs, out = tmp_path / "moodle", tmp_path / "out"
    for folder, name, text in [("José Müller_1001_assignsubmission_file", "exercises.py", code("full")),
                               ("Ann Lee_1002_assignsubmission_file", "ppo.py", code("part one")),
                               ("Ann Lee_1002_assignsubmission_onlinetext", "onlinetext.html", "<p>hi</p>")]:
        (subs / folder).mkdir(parents=True)
        (subs / folder / name).write_text(text, encoding="utf-8")
    monkeypatch.setattr(run, "run_pool", in_process(scripted_grade))
    assert cli.main([str(subs), "--out", str(out)]) == 0
    rows = {r["student"]: r for r in read_csv(out / "gradebook.csv")}
    assert {k: (r["name"], r["participant id"], r["file"], r["reason"]) for k, r in rows.items()} == {
        "1001": ("José Müller", "1001", "José Müller_1001_assignsubmission_file/exercises.py", ""),
        "1002": ("Ann Lee", "1002", "Ann Lee_1002_assignsubmission_file/ppo.py", "")}
    assert "not graded: a Moodle 'onlinetext' submission" in (out / "summary.md").read_text()


def test_moodle_flat_files_take_the_rule_of_a_folder_and_grades_csv_carries_no_participant_id(tmp_path, monkeypatch,
                                                                                               capsys):
    """Flat files (folders off) through the CLI: exercises.py beside a helper is graded, two .py
    files and no exercises.py are refused, as in a student's folder. Moodle's CSV import matches
    by email, username or ID number, never by participant id: grades.csv leaves sid blank, and a
    row without an email (no --roster) is left out, named."""
    subs, out = tmp_path / "flat", tmp_path / "out"
    subs.mkdir()
    for name, text in [("José Müller_1001_assignsubmission_file_exercises.py", code("full")),
                       ("José Müller_1001_assignsubmission_file_helpers.py", code("full", "a helper")),
                       ("Ann Lee_1002_assignsubmission_file_ppo.py", code("full", "ppo")),
                       ("Ann Lee_1002_assignsubmission_file_helpers.py", code("full", "helpers")),
                       ("Bo Li_1003_assignsubmission_file_ppo.py", code("sign"))]:
        (subs / name).write_text(text, encoding="utf-8")
    monkeypatch.setattr(run, "run_pool", in_process(scripted_grade))
    assert cli.main([str(subs), "--out", str(out)]) == 0
    rows = {r["student"]: r for r in read_csv(out / "gradebook.csv")}
    assert {k: (r["participant id"], r["file"], r["total"]) for k, r in rows.items()} == {
        "1001": ("1001", "José Müller_1001_assignsubmission_file_exercises.py", f"{PART_ONE_MAX:g}"),
        "1002": ("1002", "Ann Lee_1002_assignsubmission_file_helpers.py, Ann Lee_1002_assignsubmission_file_ppo.py", "0"),
        "1003": ("1003", "Bo Li_1003_assignsubmission_file_ppo.py", f"{PART_ONE_MAX - LOSS_POINTS:g}")}
    assert rows["1002"]["reason"] == (
        "refused: the submission holds 2 .py files (Ann Lee_1002_assignsubmission_file_helpers.py, "
        "Ann Lee_1002_assignsubmission_file_ppo.py) and no exercises.py: submit only exercises.py")
    assert "`José Müller_1001_assignsubmission_file_helpers.py`: not graded: José Müller_1001_assignsubmission_file_" \
           "exercises.py is" in (out / "summary.md").read_text()
    assert (out / "grades.csv").read_text(encoding="utf-8") == "email,sid,name,score\n"
    assert f"warning: not in grades.csv: {upload.NOBODY}: 1001, 1002, 1003" in capsys.readouterr().out

    roster_csv = tmp_path / "roster.csv"
    roster_csv.write_text("id,name,email\n1001,José Müller,jose@example.edu\n1002,Ann Lee,ann@example.edu\n"
                          "1003,Bo Li,bo@example.edu\n1004,Cy Ng,cy@example.edu\n", encoding="utf-8")
    assert cli.main([str(subs), "--out", str(out), "--roster", str(roster_csv)]) == 0
    assert list(csv.reader(io.StringIO((out / "grades.csv").read_text(encoding="utf-8")))) == [
        ["email", "sid", "name", "score"], ["jose@example.edu", "", "José Müller", f"{PART_ONE_MAX + BONUS_MAX:g}"],
        ["ann@example.edu", "", "Ann Lee", "0"],
        ["bo@example.edu", "", "Bo Li", f"{PART_ONE_MAX - LOSS_POINTS + BONUS_MAX:g}"]]
    absent = {r["student"]: r for r in read_csv(out / "gradebook.csv")}["1004"]
    assert (absent["participant id"], absent["email"], absent["reason"]) == ("1004", "cy@example.edu", "no submission")


def test_canvas_files_outside_the_scheme_never_share_a_results_file(tmp_path, monkeypatch):
    """Stray files are graded under their names made safe: "a b.py" and "a_b.py" are both a_b,
    "x.py" and "x.PY" both x, and a stray "4101.py" is user 4101's id. Each grading keeps its own
    results file and grade (-2 for the later one, noted); the user keeps theirs."""
    subs, out = tmp_path / "canvas", tmp_path / "out"
    subs.mkdir()
    files = {canvas_file_name("Müller, José", 4101, 90001, "exercises.py"): code("full", SOLUTION.read_text()),
             "a b.py": code("sign", "a b"), "a_b.py": code("syntax"), "x.py": code("part one", "x"),
             "x.PY": code("sign", "x upper"), "4101.py": code("syntax", "a stray 4101")}
    for name, text in files.items():
        (subs / name).write_text(text, encoding="utf-8")
    monkeypatch.setattr(run, "run_pool", in_process(scripted_grade))
    assert cli.main([str(subs), "--out", str(out), "--layout", "canvas"]) == 0
    rows = {r["student"]: (r["file"], r["total"], r["bonus"]) for r in read_csv(out / "gradebook.csv")}
    sign = f"{PART_ONE_MAX - LOSS_POINTS:g}"
    assert rows == {"4101": ("müllerjosé_4101_90001_exercises.py", f"{PART_ONE_MAX:g}", f"{BONUS_MAX:g}"),
                    "4101-2": ("4101.py", "0", "0"), "a_b": ("a b.py", sign, f"{BONUS_MAX:g}"),
                    "a_b-2": ("a_b.py", "0", "0"), "x": ("x.PY", sign, f"{BONUS_MAX:g}"),
                    "x-2": ("x.py", f"{PART_ONE_MAX:g}", "0")}
    assert sorted(p.stem for p in (out / "results").iterdir()) == sorted(rows)
    summary = (out / "summary.md").read_text()
    assert "- `a_b.py`: graded as a_b-2: the id a_b is a b.py's" in summary
    assert "- `4101.py`: graded as 4101-2: the id 4101 is müllerjosé_4101_90001_exercises.py's" in summary


def test_canvas_text_and_url_entries_are_submissions_and_an_anonymous_download_is_keyed_by_its_ids(tmp_path,
                                                                                                 monkeypatch):
    """Canvas writes a text entry as <name>[_LATE]_<user id>_text.html and a URL as ..._link.html
    (content_zipper.rb, add_text_or_url): the student submitted, so the row says what (0 and the
    reason), never "no submission"; and such pages count towards recognising the download."""
    subs, out, export = tmp_path / "canvas", tmp_path / "out", tmp_path / "grades.csv"
    subs.mkdir()
    (subs / canvas_file_name("Müller, José", 4101, 90001, "exercises.py")).write_text(code("full"), encoding="utf-8")
    (subs / "obriensiobhán_4102_text.html").write_text("<p>my answer</p>", encoding="utf-8")
    (subs / "wucarol_LATE_4106_link.html").write_text("<a href='https://x'>", encoding="utf-8")
    export.write_text(CANVAS_EXPORT, encoding="utf-8")
    assert exports.detect(subs) == exports.CANVAS  # 1 upload and 2 pages: all three in Canvas's scheme
    monkeypatch.setattr(run, "run_pool", in_process(scripted_grade))
    assert cli.main([str(subs), "--out", str(out), "--canvas-gradebook", str(export),
                     "--canvas-assignment", "PPO exercises"]) == 0
    rows = {r["student"]: r for r in read_csv(out / "gradebook.csv")}
    assert {k: (r["late"], r["total"], r["reason"]) for k, r in rows.items() if k in ("4102", "4106")} == {
        "4102": ("", "0", "refused: a text entry submitted in Canvas (obriensiobhán_4102_text.html), not a .py "
                          "file: submit exercises.py as a file upload"),
        "4106": ("late", "0", "refused: a website URL submitted in Canvas (wucarol_LATE_4106_link.html), not a .py "
                              "file: submit exercises.py as a file upload")}
    imported = list(csv.reader(io.StringIO((out / "canvas-import.csv").read_text(encoding="utf-8"))))
    assert [r[1] for r in imported[1:]] == ["4101", "4102", "4106"]

    anonymous, out = tmp_path / "anonymous", tmp_path / "out-anonymous"
    anonymous.mkdir()
    for name, text in [("anon_x8Kq2_90123_exercises.py", code("full")), ("LATE_anon_Zq7_90124_exercises.py", code("sign")),
                       ("anon_P3n_text.html", "<p>text</p>")]:
        (anonymous / name).write_text(text, encoding="utf-8")
    assert cli.main([str(anonymous), "--out", str(out)]) == 0
    rows = {r["student"]: (r["user id"], r["late"], r["total"]) for r in read_csv(out / "gradebook.csv")}
    assert rows == {"anon_x8Kq2": ("anon_x8Kq2", "", f"{PART_ONE_MAX:g}"),
                    "anon_Zq7": ("anon_Zq7", "late", f"{PART_ONE_MAX - LOSS_POINTS:g}"), "anon_P3n": ("anon_P3n", "", "0")}


def test_a_canvas_name_that_reads_two_ways_takes_the_user_id_of_the_gradebook_export(tmp_path):
    """Canvas joins a _<digits>_ inside a name, but a name ending in _12 stays: "Kim, Lab_12" gives
    kimlab_12_4101_90001_exercises.py, which reads as user 12 (attachment 4101) or user 4101 (as
    Canvas's own parser, the first). The gradebook export's user ids settle it."""
    subs = tmp_path / "canvas"
    subs.mkdir()
    name = canvas_file_name("Kim, Lab_12", 4101, 90001, "exercises.py")
    assert name == "kimlab_12_4101_90001_exercises.py"
    (subs / name).write_text(code("full"), encoding="utf-8")
    alone = exports.discover_class(subs)
    assert [(s.id, s.persons[0].fields["name"]) for s in alone.students] == [("12", "kimlab")]
    joined = exports.discover_class(subs, known=frozenset({"4101", "4102"}))
    assert [(s.id, s.persons[0].fields["name"], s.path.name) for s in joined.students] == [("4101", "kimlab_12", name)]


def test_which_canvas_file_is_graded_follows_the_rule_of_a_folder(tmp_path):
    """discovery.choose for a Canvas user: exercises.py (in any case) before a helper uploaded
    after it; two .py files and no exercises.py: the latest upload, with a note."""
    for user, attachment, name in [(4107, 90001, "exercises.PY"), (4107, 90002, "helpers.py"),
                                   (4108, 90003, "ppo.py"), (4108, 90004, "ppo_v2.py")]:
        (tmp_path / canvas_file_name("Lee, Kim", user, attachment, name)).write_text(code("full"), encoding="utf-8")
    found = {s.id: s for s in exports.discover_class(tmp_path).students}
    assert found["4107"].path.name == "leekim_4107_90001_exercises.PY" and found["4107"].persons[0].note == ""
    assert found["4108"].path.name == "leekim_4108_90004_ppo_v2.py"
    assert found["4108"].persons[0].note.startswith(
        "2 .py files (leekim_4108_90004_ppo_v2.py, leekim_4108_90003_ppo.py): graded leekim_4108_90004_ppo_v2.py, "
        "the latest upload")


def test_a_folder_that_is_not_the_layout_named_or_holds_an_export_beside_its_zip_says_what_to_pass(tmp_path, capsys):
    """An export unzipped in place (the zip beside its folder) is not read as a plain class: the
    TA is told which folder to pass. A layout named for a folder that is not one stops with why."""
    holder = gradescope_export(tmp_path / "downloads")
    (holder / "assignment_5551_export.zip").write_bytes(b"PK\x05\x06" + bytes(18))
    for args, message in [([], f"{holder / 'assignment_5551_export'} holds a Gradescope export "
                               f"(submission_metadata.yml) and {holder} other entries too: pass "
                               f"{holder / 'assignment_5551_export'}"),
                          (["--layout", "gradescope"], f"{holder / 'assignment_5551_export'} holds a Gradescope export")]:
        assert cli.main([str(holder), "--out", str(tmp_path / "out"), *args]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "alice.py").write_text("x\n")
    for layout, message in [("gradescope", f"no submission_metadata.yml in {plain}: not a Gradescope export"),
                            ("canvas", f"no entry of {plain} is named as a Canvas download names them "
                                       "(name[_LATE]_userid_attachmentid_filename); --layout auto reads it as one "
                                       "NAME.py or NAME/ per student"),
                            ("moodle", f"no entry of {plain} is named as a Moodle download names them")]:
        assert cli.main([str(plain), "--out", str(tmp_path / "out"), "--layout", layout]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_file_names_that_are_not_utf8_reach_every_output_escaped(tmp_path, monkeypatch, capsys):
    """A file name's bytes that are not UTF-8 (an archive from another system) are written \\xNN in
    the gradebook, summary, similarity and feedback, and the terminal: no traceback once grading
    is done. A refused file's reason names it so too."""
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    (subs / os.fsdecode(b"j\xf6rg.py")).write_text(code("full"), encoding="utf-8")  # Latin-1's ö
    (subs / os.fsdecode(b"link\xff.py")).symlink_to(SOLUTION)
    (subs / os.fsdecode(b"notes\xe9.txt")).write_text("x")
    monkeypatch.setattr(run, "run_pool", in_process(scripted_grade))
    assert cli.main([str(subs), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "Traceback" not in printed.err
    rows = {r["student"]: r for r in read_csv(out / "gradebook.csv")}
    assert {k: (r["file"], r["total"]) for k, r in rows.items()} == {
        "j\\xf6rg": ("j\\xf6rg.py", f"{PART_ONE_MAX:g}"), "link\\xff": ("link\\xff.py", "0")}
    assert rows["link\\xff"]["reason"] == "refused: link\\xff.py is a symbolic link, not a file: submit the Python file itself"
    assert "`notes\\xe9.txt`: not a student" in (out / "summary.md").read_text(encoding="utf-8")
    assert (out / "feedback" / "j\\xf6rg.md").read_text(encoding="utf-8").startswith("# Feedback for j\\xf6rg\n")

    export = gradescope_export(tmp_path / "export") / "assignment_5551_export"
    (export / "submission_301000001" / "exercises.py").rename(export / "submission_301000001" / os.fsdecode(b"\xe9x.py"))
    assert cli.main([str(export), "--out", str(tmp_path / "out-gs")]) == 0
    assert "Traceback" not in capsys.readouterr().err
    rows = {r["student"]: r for r in read_csv(tmp_path / "out-gs" / "gradebook.csv")}
    assert rows["12345"]["file"] == "submission_301000001/\\xe9x.py"


def test_absent_roster_students_carry_the_platform_id_and_shared_ids_stay_out_of_grades_csv(tmp_path, monkeypatch,
                                                                                           capsys):
    """A Gradescope export with a roster: a roster student without a submission keeps their SID
    (or email) in its column. One SID on two submissions (a student in a group and alone) is two
    rows; neither is uploaded until the TA decides which counts."""
    export = tmp_path / "export"
    (export / "submission_1").mkdir(parents=True)
    (export / "submission_2").mkdir()
    (export / "submission_1" / "exercises.py").write_text(code("full"), encoding="utf-8")
    (export / "submission_2" / "exercises.py").write_text(code("sign"), encoding="utf-8")
    (export / "submission_metadata.yml").write_text(
        "submission_1:\n  :submitters:\n  - :name: Ann Lee\n    :sid: '1'\n    :email: ann@example.edu\n"
        "  - :name: Bo Li\n    :sid: '2'\n    :email: bo@example.edu\n"
        "submission_2:\n  :submitters:\n  - :name: Ann Lee\n    :sid: '1'\n    :email: ann@example.edu\n", encoding="utf-8")
    roster_csv = tmp_path / "roster.csv"
    roster_csv.write_text("id,name,email\n1,Ann Lee,ann@example.edu\n2,Bo Li,bo@example.edu\n1@submission_2,Ann Lee,"
                          "ann@example.edu\n3,Cy Ng,cy@example.edu\nzed@example.edu,Zed,\n", encoding="utf-8")
    monkeypatch.setattr(run, "run_pool", in_process(scripted_grade))
    assert cli.main([str(export), "--out", str(tmp_path / "out"), "--roster", str(roster_csv)]) == 0
    rows = {r["student"]: r for r in read_csv(tmp_path / "out" / "gradebook.csv")}
    assert {k: (r["sid"], r["email"], r["reason"][:13]) for k, r in rows.items() if k in ("3", "zed@example.edu")} == {
        "3": ("3", "cy@example.edu", "no submission"), "zed@example.edu": ("", "zed@example.edu", "no submission")}
    assert rows["1@submission_2"]["sid"] == "1" and "in 2 submissions" in rows["1@submission_2"]["reason"]
    graded = list(csv.reader(io.StringIO((tmp_path / "out" / "grades.csv").read_text(encoding="utf-8"))))
    assert graded == [["email", "sid", "name", "score"], ["bo@example.edu", "2", "Bo Li", f"{PART_ONE_MAX + BONUS_MAX:g}"]]
    assert f"warning: not in grades.csv: {upload.SHARED}: 1, 1@submission_2" in capsys.readouterr().out


def test_a_canvas_export_with_first_and_last_names_apart(tmp_path):
    """Canvas's "LastName,FirstName" export (a course setting): the name joined first-last, each
    part's = guard undone; the import file copies both columns as exported."""
    export = tmp_path / "grades.csv"
    export.write_text('LastName,FirstName,ID,SIS User ID,SIS Login ID,Section,PPO exercises (5001)\n'
                      ',,,,,,Manual Posting\n    Points Possible,,,,,,100.00\n'
                      'Müller,José,4101,900101,jmuller,Section A,\n"=""=Smith""","=""=Al""",4102,,asmith,Section B,\n',
                      encoding="utf-8")
    found = roster.load_canvas(export)
    assert found.columns == ["name", "sis user id", "sis login id", "section"]
    assert {k: v["name"] for k, v in found.students.items()} == {"4101": "José Müller", "4102": "=Al =Smith"}
    assert found.canvas.assignments == {"PPO exercises (5001)": "100.00"}
    book = gradebook.Gradebook([1], [(1, "loss")], [gradebook.Row("4101", "graded", 90.0, 100.0),
                                                    gradebook.Row("4102", "graded", 80.0, 100.0)])
    text, notes = upload.canvas_csv(book, found.canvas, "PPO exercises (5001)", None)
    assert text == ("LastName,FirstName,ID,SIS User ID,SIS Login ID,Section,PPO exercises (5001)\n"
                    "Müller,José,4101,900101,jmuller,Section A,90\n\"=\"\"=Smith\"\"\",\"=\"\"=Al\"\"\",4102,,asmith,Section B,80\n")
    assert notes == []


def test_restart_reads_no_results_file_to_plan(tmp_path, monkeypatch):
    """--restart grades everyone: whether a result is current is never asked (each read is a
    results file parsed, hundreds of them in a class)."""
    subs, reads = tmp_path / "subs", []
    subs.mkdir()
    for sid in ("a", "b"):
        (subs / f"{sid}.py").write_text("x\n")
    students = discovery.discover(subs).students
    graded_before = {s.id: {"run": "key", "stamp": discovery.stamp(s)} for s in students}  # as batch-state.json says
    monkeypatch.setattr(state, "read_results", lambda out, sid: reads.append(sid))
    assert [s.id for s in state.plan(students, tmp_path, graded_before, "key", restart=True).todo] == ["a", "b"]
    assert reads == []
    state.plan(students, tmp_path, graded_before, "key", restart=False)
    assert reads == ["a", "b"]


def test_the_layout_is_recognised_and_can_be_named():
    layout = next(a for a in cli.build_parser()._actions if a.dest == "layout")
    assert tuple(layout.choices) == exports.LAYOUTS  # the CLI names them without importing the classroom
    assert exports.detect(ROOT / "tests" / "submissions") == exports.PLAIN
    assert exports.CANVAS_NAME.fullmatch(canvas_file_name("Müller, José", 4101, 90001, "exercises.py"))
    m = exports.CANVAS_NAME.fullmatch(canvas_file_name("Lab_12_, Kim", 7, 8, "ex_1_2.py", late=True))
    assert (m["user"], m["attachment"], m["file"], bool(m["late"])) == ("7", "8", "ex_1_2.py", True)
    m = exports.CANVAS_ANONYMOUS.fullmatch("LATE_anon_x8Kq2_90123_exercises.py")
    assert (m["user"], m["attachment"], bool(m["late"])) == ("anon_x8Kq2", "90123", True)


@pytest.mark.skipif(not __import__("shutil").which("soffice"), reason="LibreOffice is not installed")
def test_libreoffice_reads_the_gradebook_with_the_readme_s_filter_option(tmp_path, monkeypatch):
    """The README's LibreOffice line: its CSV filter with character set 76 (UTF-8) reads the names
    (the byte-order mark alone does not make it: its default import takes the system's code page)."""
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    (subs / "s001.py").write_text(code("full"))
    roster_csv = tmp_path / "roster.csv"
    roster_csv.write_text("id,name,email\ns001,José Müller,jose@example.edu\n", encoding="utf-8")
    monkeypatch.setattr(run, "run_pool", in_process(scripted_grade))
    assert cli.main([str(subs), "--out", str(out), "--roster", str(roster_csv)]) == 0
    converted = tmp_path / "converted"
    proc = subprocess.run(["soffice", f"-env:UserInstallation=file://{tmp_path}/profile", "--headless",
                           "--infilter=CSV:44,34,76", "--convert-to", "csv:Text - txt - csv (StarCalc):44,34,76",
                           "--outdir", str(converted), str(out / "gradebook.csv")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = (converted / "gradebook.csv").read_text(encoding="utf-8")
    assert text.startswith("student,name,email,file,total,max,") and "s001,José Müller,jose@example.edu," in text


def test_canvas_import_warns_when_canvas_gives_the_assignment_other_points(tmp_path):
    """A semicolon export with decimal commas (Canvas's CSV in some locales) is read too."""
    export = tmp_path / "grades.csv"
    export.write_text("Student;ID;SIS Login ID;Section;PPO exercises (5001);Current Points\n"
                      "    Points Possible;;;;10,00;(read only)\n"
                      "Müller, José;4101;jmuller;Section A;9,50;9,50\n", encoding="utf-8")
    found = roster.load_canvas(export)
    assert found.students == {"4101": {"name": "Müller, José", "sis login id": "jmuller", "section": "Section A"}}
    book = gradebook.Gradebook([1], [(1, "loss")], [gradebook.Row("4101", "graded", 90.0, 100.0)])
    text, notes = upload.canvas_csv(book, found.canvas, found.canvas.assignment("5001", "--canvas-assignment"), None)
    assert text == "Student,ID,SIS Login ID,Section,PPO exercises (5001)\n\"Müller, José\",4101,jmuller,Section A,90\n"
    assert notes == ["Canvas's PPO exercises (5001) is worth 10,00 points and these grades are out of 100: change its "
                     "points in Canvas or scale the column before importing"]
