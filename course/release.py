"""Build what leaves the staff repo: the student release and the Gradescope autograder zip.

The student release holds the student-facing package (with the generated blanks), the
configs, the public property tests, the handout and a student README (docs/students.md); nothing
of solutions/, autograder/ or grading.yaml. ``check_no_leak`` proves it: no line of any solution
region appears anywhere in the release; ``check_links``: every link of its pages holds there.
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib
import zipfile
from pathlib import Path

from course import links, stubs

ROOT = stubs.ROOT
# The ablation's measured curves: handout section 8 gives them to compare a student's runs against.
STUDENT_FILES = ("assignment", "configs", "tests/public", "tests/conftest.py", "handout.md", "reports/gsm8k_ablation.png")
# What the grader needs on Gradescope (README.md: pyproject.toml names it as the readme).
AUTOGRADER_FILES = ("assignment", "solutions", "autograder", "grading.yaml", "pyproject.toml", "README.md")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")

# The student README is docs/students.md, its links made relative to the release's root.
STUDENT_README = ROOT / "docs" / "students.md"

# Names of what only the staff have: the release must not send a student looking for them.
STAFF_ONLY = ("solutions/", "solutions.exercises", "--impl solutions", "autograder/", "grading.yaml", "ppo-grade",
              "ppo-course", "CONTRACT.md", "STYLE.md", "/work/")


class LeakError(RuntimeError):
    """A solution line was found in what is about to be released."""


class LinkError(RuntimeError):
    """A link, anchor or cited file of the release's Markdown pages is not in the release."""


def solution_lines() -> list[str]:
    """The distinctive (> 25 characters) code lines of the solution regions that the blanks do not show
    (a docstring may state the contract's formula, e.g. the loss sum)."""
    text = stubs.SOLUTION_PATH.read_text()
    public = stubs.generate(text)
    lines = []
    for region in re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", text, flags=re.S):
        lines += [ln.strip() for ln in region.splitlines() if len(ln.strip()) > 25 and ln.strip() not in public]
    return lines


def check_no_leak(folder: Path) -> None:
    needles = solution_lines()
    for path in folder.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="ignore")
            for needle in needles:
                if needle in text:
                    raise LeakError(f"{path.relative_to(folder)} contains a solution line: {needle!r}")
            if "BEGIN SOLUTION" in text:
                raise LeakError(f"{path.relative_to(folder)} contains a solution marker")
            for name in STAFF_ONLY:
                if name in text:
                    raise LeakError(f"{path.relative_to(folder)} names {name!r}, which the release does not ship")


def _student_pyproject() -> str:
    """A pyproject for the student folder: the student package, what the trainer and the public
    tests need, and ppo-train; nothing of the grader or the staff tooling."""
    staff = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = staff["project"]
    extras = project["optional-dependencies"]
    # The install is what the CPU demo and the public tests need, and matplotlib: the demo's reward
    # curve and --compare's figure, which the handout shows; GPU runs add the `train` extra, and
    # the small-card profiles the `lowmem` one (8-bit AdamW).
    train = [d for d in extras["train"] if not d.startswith(project["name"])]
    dependencies = project["dependencies"] + extras["cpu"] + [d for d in train if d.startswith("matplotlib")]
    from autograder import __version__

    return "\n".join([
        "[build-system]", 'requires = ["setuptools>=68"]', 'build-backend = "setuptools.build_meta"', "",
        "[project]", 'name = "ppo-llm-assignment"', f'version = "{__version__}"',
        'description = "The PPO-for-language-models assignment: five exercises (and three bonus ones) and the trainer they plug into."',
        'readme = "README.md"', f'requires-python = "{project["requires-python"]}"',
        "dependencies = [", *[f"    {json.dumps(d)}," for d in dependencies], "]", "",
        "[project.optional-dependencies]", "train = [", *[f"    {json.dumps(d)}," for d in train], "]",
        "lowmem = [", *[f"    {json.dumps(d)}," for d in extras["lowmem"]], "]", "",
        "[project.scripts]", f'ppo-train = "{project["scripts"]["ppo-train"]}"', "",
        "[tool.setuptools.packages.find]", 'include = ["assignment*"]', "",
        "[tool.pytest.ini_options]", 'testpaths = ["tests"]', 'addopts = "-ra"',
        "markers = [", *[f'    "ex{n}: the public tests of exercise {n} (pytest tests/public -m ex{n})",' for n in range(1, 9)],
        '    "bonus: the public tests of Part II, exercises 6-8 (skipped while not attempted)",',
        "]", ""])


def build_student_release(out: Path) -> Path:
    if not stubs.is_fresh():
        raise stubs.StubError("assignment/exercises.py is stale: run `ppo-course stubs` first")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for rel in STUDENT_FILES:
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, out / rel, ignore=IGNORE)
        else:
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out / rel)
    (out / "pyproject.toml").write_text(_student_pyproject())
    (out / "README.md").write_text(STUDENT_README.read_text().replace("](../", "]("))
    check_no_leak(out)
    check_links(out)
    return out


def check_links(folder: Path) -> None:
    broken = links.check(folder)
    if broken:
        raise LinkError("broken links in the release:\n" + "\n".join(broken))


def build_gradescope_zip(out: Path) -> Path:
    """The zip to upload as Gradescope's autograder: setup.sh and run_autograder at its root."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in ("setup.sh", "run_autograder"):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16
            zf.writestr(info, (ROOT / "autograder" / "gradescope" / name).read_text())
        for rel in AUTOGRADER_FILES:
            src = ROOT / rel
            paths = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
            for p in paths:
                zf.write(p, str(p.relative_to(ROOT)))
    return out
