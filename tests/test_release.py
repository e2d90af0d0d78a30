"""What leaves the staff repo: the student release and the Gradescope zip."""

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from course import release

# A relative path with a folder, ending in a file type the project uses.
PATH_REFERENCE = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md|yaml|yml|jsonl|json|txt|sh|png|gguf))")
# Placeholders and what a run writes, not files to ship.
NOT_SHIPPED_ON_PURPOSE = ("RUN_DIR/", "runs/", "eval_samples/", "other/", "my_", "path/to/")
# `python -m NAME` (a module the text sends the reader to run) and `README "Section"`.
MODULE_REFERENCE = re.compile(r"python -m ([A-Za-z_][\w.]*)")
INSTALLED_TOOLS = {"pytest", "pip", "venv"}
SECTION_REFERENCE = re.compile(r'README "([^"]+)"')
# A file named without its folder (a report, a benchmark): the release must carry one of that name
# when the course repository has one, except what a run writes and GSM8K's own files.
BARE_NAME = re.compile(r"(?<![\w./-])([\w-][\w.-]*\.(?:py|md|yaml|yml|jsonl|json|txt|sh|png|csv|gguf|gz))\b")
RUN_FILES = re.compile(r"(config\.yaml|run\.json|summary\.json|(metrics|samples|eval|train|test)\.jsonl|eval_\w+\.jsonl\.gz)$")
# Ways of citing what only the course repository has, and paths under a machine's temporary folder.
STAFF_CITATION = re.compile(r"course repository|course's repository|staging script|device-stage|project's tests?\b", re.I)
TEMPORARY = re.compile(r"(?<![\w.])/(?:var/)?tmp/|\$TMPDIR")


def test_student_release_has_the_blanks_and_nothing_of_the_solution(tmp_path):
    out = release.build_student_release(tmp_path / "release")
    assert (out / "assignment" / "exercises.py").read_text() == (release.ROOT / "assignment" / "exercises.py").read_text()
    assert (out / "handout.md").exists() and (out / "tests" / "public" / "test_contract.py").exists()
    for secret in ("solutions", "autograder", "grading.yaml", "tests/corpus.py"):
        assert not (out / secret).exists(), secret
    pyproject = (out / "pyproject.toml").read_text()
    assert 'include = ["assignment*"]' in pyproject and "ppo-course" not in pyproject and "ppo-grade" not in pyproject
    assert "--impl" not in pyproject  # the staff addopts check the answer key; a student's default is their file


def test_student_release_names_only_files_it_ships(tmp_path):
    """Every file, module to run and README section the release names is in the release; it cites
    nothing only the course repository has, and no path under a temporary folder."""
    out = release.build_student_release(tmp_path / "release")
    readme = (out / "README.md").read_text()
    shipped = {path.name for path in out.rglob("*")}
    staff = {Path(name).name for name in subprocess.run(["git", "ls-files"], cwd=release.ROOT, capture_output=True,
                                                         text=True, check=True).stdout.split()}
    missing = []
    for path in out.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="ignore")
            for ref in PATH_REFERENCE.findall(text):
                if not (out / ref).exists() and not any(p in ref for p in NOT_SHIPPED_ON_PURPOSE):
                    missing.append(f"{path.relative_to(out)} -> {ref}")
            for name in set(BARE_NAME.findall(text)) & staff - shipped:
                if not RUN_FILES.match(name):
                    missing.append(f"{path.relative_to(out)} -> {name}")
            for pattern in (STAFF_CITATION, TEMPORARY):
                missing += [f"{path.relative_to(out)} -> {m.group(0)!r}" for m in pattern.finditer(text)]
            for module in set(MODULE_REFERENCE.findall(text)) - INSTALLED_TOOLS:
                where = out / module.replace(".", "/")
                if not (where.with_suffix(".py").is_file() or (where / "__main__.py").is_file()):
                    missing.append(f"{path.relative_to(out)} -> python -m {module}")
            for section in SECTION_REFERENCE.findall(text):
                if not re.search(rf"^#+ {re.escape(section)}$", readme, flags=re.M):
                    missing.append(f"{path.relative_to(out)} -> README section {section!r}")
    assert not missing, missing


def test_no_shipped_config_defaults_to_a_temporary_folder(monkeypatch):
    """Every config as a student loads it (no variables of a staging machine set): no value under a
    temporary folder."""
    import tempfile

    from omegaconf import OmegaConf

    from assignment.trainer.config import load_config

    for name in ("MODEL_DIR", "MODEL_GGUF", "GSM8K_DIR", "SMOLLM2_DIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    temporary = ("/tmp", "/var/tmp", tempfile.gettempdir())
    for config in sorted((release.ROOT / "configs").glob("*.yaml")):
        values = OmegaConf.to_container(OmegaConf.structured(load_config(config)))
        flat = json.dumps(values)
        assert not any(f'"{folder}' in flat for folder in temporary), (config.name, flat)


def test_release_check_refuses_staff_names(tmp_path):
    out = release.build_student_release(tmp_path / "release")
    (out / "assignment" / "notes.md").write_text("compare with ppo-grade\n")
    with pytest.raises(release.LeakError, match="ppo-grade"):
        release.check_no_leak(out)


@pytest.mark.slow
def test_release_installs_and_passes_its_own_public_tests_in_a_fresh_venv(tmp_path):
    """As a student gets it: a fresh environment, no solutions package, the release alone."""
    out = release.build_student_release(tmp_path / "release")
    # PYTHONDONTWRITEBYTECODE goes too (set on this project's machines): with it, every process
    # below compiled torch and transformers from source again, 6-8 s of each one's 10-13.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    venv = tmp_path / "venv"
    constraints = release.ROOT / "autograder" / "gradescope" / "constraints.txt"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # --no-compile: pip skips writing bytecode for every installed file (torch's thousands: half the
    # install's CPU time); Python compiles what the tests import, as they first import it, and
    # caches it for the next process. What is installed, and from where, is what a student gets.
    install = subprocess.run([venv / "bin" / "pip", "install", "-q", "--no-compile", "-c", constraints, "-e", out],
                             capture_output=True, text=True, env=env)
    assert install.returncode == 0, install.stderr[-2000:]
    python = venv / "bin" / "python"
    probe = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('solutions'))"],
                           cwd=tmp_path, capture_output=True, text=True, env=env)
    assert probe.stdout.strip() == "None"
    solved = tmp_path / "my_exercises.py"  # a finished assignment: the reference, outside the release
    solved.write_text((release.ROOT / "solutions" / "exercises.py").read_text())
    passing = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/public", "--impl", solved],
                             cwd=out, capture_output=True, text=True, env=env)
    assert passing.returncode == 0, passing.stdout[-3000:]
    blank = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/public"],
                           cwd=out, capture_output=True, text=True, env=env)
    assert blank.returncode == 1 and "not implemented yet" in blank.stdout
    train = subprocess.run([venv / "bin" / "ppo-train", "--config", "configs/cpu_synthetic.yaml", "train.steps=2",
                            "train.progress=false"], cwd=out, capture_output=True, text=True, env=env)
    assert train.returncode == 2 and "Fill it in in assignment/exercises.py" in train.stderr
    assert "Traceback" not in train.stderr and "solutions" not in train.stderr
    # What the README and the handout promise of this install: a demo writes the reward curve it
    # names (PPO's and Part II's), and --compare prints the tables and draws the figure.
    runs = tmp_path / "runs"
    for name, label in (("cpu_synthetic", "PPO"), ("cpu_synthetic_grpo", "GRPO")):
        demo = subprocess.run([venv / "bin" / "ppo-train", "--config", f"configs/{name}.yaml", "--impl", solved,
                               "train.steps=2", "eval.size=8", "train.progress=false", f"train.output_dir={runs / name}"],
                              cwd=out, capture_output=True, text=True, env=env)
        assert demo.returncode == 0, demo.stderr[-3000:]
        assert f"status: finished (2 {label} steps)" in demo.stdout, demo.stdout
        assert f"reward curve: {runs / name / 'reward_curve.png'}" in demo.stdout, demo.stdout + demo.stderr
        assert (runs / name / "reward_curve.png").is_file() and "no reward curve" not in demo.stdout + demo.stderr
    figure = tmp_path / "ablation.png"
    compare = subprocess.run([venv / "bin" / "ppo-train", "--compare", runs / "cpu_synthetic", runs / "cpu_synthetic_grpo",
                              "--compare-out", figure], cwd=out, capture_output=True, text=True, env=env)
    assert compare.returncode == 0, compare.stderr[-3000:]
    assert "| run | greedy accuracy (n) |" in compare.stdout and "| A | B |" in compare.stdout, compare.stdout
    assert f"wrote {figure}" in compare.stdout and figure.is_file()


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


def test_the_cpu_demo_needs_nothing_beyond_the_cpu_extra(tmp_path):
    """The release installs torch's CPU wheel and the `cpu` extra; the `train` extra's own packages
    (datasets, gguf, matplotlib, tensorboard) are for GPU runs; accelerate is the cpu extra's (the
    trainer's process group, one process or many). The demo, its config as
    shipped, must run with every one of them unimportable, and say what it leaves out."""
    import tomllib

    extras = tomllib.loads((release.ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    train_only = sorted(re.split(r"[<>=\[]", d)[0] for d in extras["train"] if not d.startswith("ppo-llm-course"))
    assert train_only == ["datasets", "gguf", "matplotlib", "tensorboard"], train_only
    code = (f"import sys\nfor m in {train_only!r}: sys.modules[m] = None  # import m raises ImportError\n"
            "from assignment.trainer.cli import main\n"
            f"sys.exit(main(['--config', 'configs/cpu_synthetic.yaml', '--impl', 'solutions/exercises.py', "
            f"'train.steps=2', 'eval.size=8', 'train.progress=false', 'train.output_dir={tmp_path / 'run'}']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=release.ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no TensorBoard logs" in proc.stderr and "no reward curve" in proc.stdout + proc.stderr
    assert (tmp_path / "run" / "metrics.jsonl").exists()
