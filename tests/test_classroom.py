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


def make_class(folder: Path) -> dict[str, tuple[Path, Path]]:
    """A class of 28: corpus files, two identical copies, a copy of the key, a syntax and an import
    error, a student folder, and five uploads that must be refused.
    Returns, for each student with a file, (the file, the folder it must lie in)."""
    folder.mkdir()
    files = {name: corpus.render(corpus.by_name(name)) for name in MUTANTS + ALTERNATIVES}
    files |= {"solution": SOLUTION.read_text(), "blank": BLANK.read_text(), "keycopy": SOLUTION.read_text(),
              "twin_a": corpus.render(corpus.by_name(TWIN)), "twin_b": corpus.render(corpus.by_name(TWIN)),
              "syntax": SOLUTION.read_text().replace("def compute_value_loss(", "def compute_value_loss((", 1),
              "importer": SOLUTION.read_text() + "\nimport a_module_nobody_installed\n"}
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
    students = [(sid, str(path), str(folder)) for sid, (path, folder) in sorted(run.paths.items())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", SINGLE_GRADINGS, run.config, out, json.dumps(students)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=15 * 60)
    assert proc.returncode == 0, proc.stderr
    return {sid: json.loads((out / f"{sid}.json").read_text()) for sid, _, _ in students}


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
    assert "- Students: 28 (graded 23, refused 5, grader failed 0)" in summary
    assert "## Mistakes by kind (of the 23 graded submissions)" in summary
    assert "notes.txt" in summary and "grader failure:" not in summary
    assert "warning: notes.txt: not a student" in run.proc.stderr
    assert "grading (2 at a time)" in run.proc.stderr  # the progress bar
    assert "28 students: 23 graded, 5 refused, 0 grader failed" in run.proc.stdout


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
    assert again.returncode == 0 and "(0 this run; 28 kept from an earlier run)" in again.stdout, again.stdout
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
    (root / "out").mkdir()
    found = discovery.discover(root, skip=(root / "out",))
    by_id = {s.id: s for s in found.students}
    assert list(by_id) == ["a", "b", "c", "d", "e", "f", "rita", "xavier"]
    assert found.ignored == [".hidden.py", "README.txt"]
    assert by_id["a"].path == root / "a.py" and by_id["a"].folder == root
    assert by_id["b"].path == root / "b" / "exercises.py" and by_id["b"].folder == root / "b"
    assert by_id["c"].path == root / "c" / "one.py"
    assert by_id["d"].path is None and "no .py file" in by_id["d"].problem
    assert by_id["e"].path is None and "two submissions" in by_id["e"].problem
    assert by_id["rita"].path == root / "rita.PY"
    assert by_id["xavier"].path == root / "xavier" / "exercises.py"
    notices = {n.entry: n for n in found.notices}
    assert sorted(notices) == [".hidden.py", "README.txt", "b/helpers.py", "rita.PY", "xavier/exercises_old.py"]
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
SIGN_HINT = "your loss has the opposite sign"


def write_class(out: Path, results: dict[str, dict]) -> None:
    for sid, data in results.items():
        report.write_json_atomic(data, grading.results_path(out, sid))


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
    book = gradebook.build_gradebook(tmp_path, ["ann", "ben", "cid", "dee", "eve"], run.fallback_columns(None, False))
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
    assert hidden(1)[0] in after and "failed on the hidden inputs" in after and "**Total: " in after
    assert feedback.fence("a ```` b").startswith("`````text")  # student text cannot close the fence
    feedback.write(tmp_path, ["ann", "nobody"])
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
    assert list(next(iter(rows.values())))[:5] == ["student", "name", "email", "total", "max"]
    assert rows["s001"]["name"] == "José Müller" and rows["s002"]["email"] == "zoe@example.edu"
    assert "'=cmd" in rows and rows["'=cmd"]["name"] == "Mallory"
    assert rows["s003"]["reason"] == "no submission" and rows["s003"]["total"] == ""
    assert "s003 is in the roster but has no submission" in capsys.readouterr().err
    assert "| s003 | no submission (in the roster) |" in (out / "summary.md").read_text()

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
