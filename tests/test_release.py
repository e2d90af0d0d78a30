"""What leaves the staff repo: the student release and the Gradescope zip."""

import zipfile

import pytest

from course import release


def test_student_release_has_the_blanks_and_nothing_of_the_solution(tmp_path):
    out = release.build_student_release(tmp_path / "release")
    assert (out / "assignment" / "exercises.py").read_text() == (release.ROOT / "assignment" / "exercises.py").read_text()
    assert (out / "handout.md").exists() and (out / "tests" / "public" / "test_contract.py").exists()
    for secret in ("solutions", "autograder", "grading.yaml", "tests/corpus.py"):
        assert not (out / secret).exists(), secret
    pyproject = (out / "pyproject.toml").read_text()
    assert 'include = ["assignment*"]' in pyproject and "ppo-course" not in pyproject and "ppo-grade" not in pyproject


def test_leak_check_catches_a_planted_solution_line(tmp_path):
    out = release.build_student_release(tmp_path / "release")
    line = release.solution_lines()[0]
    (out / "assignment" / "notes.py").write_text(f"# {line}\n")
    with pytest.raises(release.LeakError, match="notes.py"):
        release.check_no_leak(out)


def test_gradescope_zip_has_executable_entry_points_and_the_grader(tmp_path):
    path = release.build_gradescope_zip(tmp_path / "autograder.zip")
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        assert {"setup.sh", "run_autograder", "grading.yaml", "solutions/exercises.py", "autograder/grade.py"} <= names
        assert (zf.getinfo("run_autograder").external_attr >> 16) & 0o111
        assert not any("__pycache__" in n for n in names)
