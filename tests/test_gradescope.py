"""The Gradescope path end to end, as CI can run it: the `user` sandbox under setup.sh's
permissions, through run_autograder, without CAP_SYS_ADMIN (as in Gradescope's Docker).

The test builds the autograder zip, unpacks it to /autograder/source inside a private mount
namespace, lends it this test run's Python environment as /autograder/venv, applies
harden.sh (setup.sh's permission steps), hides the project checkout (as Gradescope has none),
and runs /autograder/run_autograder for each submission with Docker's default capability set.
Only the installation step of setup.sh is skipped: it needs the network (course/gradescope_sim.sh
runs it in a Debian root; reports/gradescope_sim.txt holds what it printed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import corpus
from course import release

ROOT = Path(__file__).resolve().parent.parent
# Docker's default capabilities; CAP_SYS_ADMIN among the dropped ones, so no namespaces for the grader.
DOCKER_CAPS = ("-all,+chown,+dac_override,+fowner,+fsetid,+kill,+setgid,+setuid,+setpcap,+setfcap,"
               "+net_bind_service,+net_raw,+sys_chroot,+mknod,+audit_write")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("gradescope"),  # one worker builds the module fixture (a minute) and runs them all
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"),
                       reason="needs root, unshare and setpriv (CI runs as root)"),
]

# The grader's home in the test (root's is /root, itself 0700 on Gradescope's image; this one is
# 0755, so only the recordings folder's own mode protects it).
HOME = "/autograder/home"
RECORDINGS = f"{HOME}/.cache/ppo-grade"

STAFF_READER = f"\nRECORDINGS = {RECORDINGS!r}\n" + '''

def _read_staff_files():
    """Print, raise and return every staff file it can reach."""
    import glob as _glob
    found = []
    for _path in ["/autograder/source/solutions/exercises.py", "/autograder/source/README.md",
                  "/autograder/source/grading.yaml"] + _glob.glob("/autograder/source/*.egg-info/SOURCES.txt"):
        try:
            with open(_path) as _f:
                found.append(_f.read())
        except OSError as _err:
            found.append(f"{_path}: {type(_err).__name__}")
    import os as _os
    try:  # the grader's recorded examples (setup.sh records them): the reference's results
        found += [open(_os.path.join(RECORDINGS, _n), "rb").read().hex() for _n in _os.listdir(RECORDINGS)]
    except OSError as _err:
        found.append(f"{RECORDINGS}: {type(_err).__name__}")
    return "\\n".join(found)


_STAFF = _read_staff_files()
'''


def _reader() -> str:
    """The blank assignment that, in every exercise, raises whatever staff files it could read."""
    text = (ROOT / "assignment" / "exercises.py").read_text() + STAFF_READER
    return text.replace('raise NotImplementedError("Exercise', 'raise RuntimeError(_STAFF + "Exercise')


def _setup_step(marker: str) -> str:
    """The command of setup.sh that contains ``marker``, its continuation lines joined."""
    lines = (ROOT / "autograder" / "gradescope" / "setup.sh").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line)
    end = start
    while lines[end].endswith("\\"):
        end += 1
    return "\n".join(lines[start:end + 1])


def _blocked_ancestor(path: Path) -> Path | None:
    """The highest folder above ``path`` that other users cannot search (this machine keeps
    Python under /root), or None."""
    for parent in reversed(path.parents):
        if not parent.stat().st_mode & 0o001:
            return parent
    return None


@pytest.fixture(scope="module")
def gradescope(tmp_path_factory):
    """{name: results.json} of run_autograder on the solution, the blank, a symlink and a staff-file reader."""
    work = tmp_path_factory.mktemp("gradescope")
    os.chmod(work, 0o755)
    source = work / "source"
    with zipfile.ZipFile(release.build_gradescope_zip(work / "autograder.zip")) as zf:
        zf.extractall(source)
    for name in ("setup.sh", "run_autograder"):
        (source / name).chmod(0o755)
    submissions = work / "submissions"
    submissions.mkdir()
    (submissions / "solution.py").write_text((ROOT / "solutions" / "exercises.py").read_text())
    (submissions / "blank.py").write_text((ROOT / "assignment" / "exercises.py").read_text())
    (submissions / "reader.py").write_text(_reader())
    (submissions / "stealer.py").write_text(corpus.render(corpus.by_name("attack_copy_reference_import")))
    out = work / "out"
    out.mkdir()
    venv = Path(sys.prefix)
    python_home = Path(os.path.realpath(sys.base_prefix))
    blocked = _blocked_ancestor(python_home)
    lines = [
        "set -eu",
        "mount --make-rprivate /",
        "mount -t tmpfs -o mode=755 tmpfs /autograder",
        "mkdir -p /autograder/venv /autograder/submission /autograder/results /autograder/.python",
        f"mount --bind {venv} /autograder/venv",
        f"cp -a {source} /autograder/source",
        "cp /autograder/source/run_autograder /autograder/run_autograder",
    ]
    if blocked is not None:  # make the interpreter reachable, as /usr/bin/python3 is on Gradescope
        inner = python_home.relative_to(blocked)
        lines += [f"mount --bind {blocked} /autograder/.python",
                  f"mount -t tmpfs -o mode=755 tmpfs {blocked}",
                  f"mkdir -p {blocked / inner}",
                  f"mount --bind /autograder/.python/{inner} {blocked / inner}"]
    # Gradescope has no checkout of the project: hide this one (the venv's editable install points into it).
    lines += [f"mount -t tmpfs -o mode=755 tmpfs {ROOT}",
              "bash /autograder/source/autograder/gradescope/harden.sh /autograder/source /autograder/venv"]
    # setup.sh's last step, as root in /autograder/source: record the examples in root's home
    listing = f"ls -l --time-style=full-iso {RECORDINGS}"
    lines += [f"mkdir -m 755 {HOME}", f"export HOME={HOME}", "unset PPO_GRADER_CACHE",
              f"(cd /autograder/source && {_setup_step('python -m autograder solutions/exercises.py')})",
              "rm -f /tmp/setup-results.json", f"{listing} > {out}/recordings.setup 2>&1 || true"]
    cases = {"solution": f"cp {submissions}/solution.py /autograder/submission/exercises.py",
             "blank": f"cp {submissions}/blank.py /autograder/submission/exercises.py",
             "symlink": "ln -s /autograder/source/solutions/exercises.py /autograder/submission/exercises.py",
             "reader": f"cp {submissions}/reader.py /autograder/submission/exercises.py",
             "stealer": f"cp {submissions}/stealer.py /autograder/submission/exercises.py"}
    for name, put in cases.items():
        lines += ["rm -rf /autograder/submission/* /autograder/results/*", put,
                  f"(cd /autograder && setpriv --bounding-set={DOCKER_CAPS} --inh-caps=-all "
                  f"/autograder/run_autograder > {out}/{name}.log 2>&1; echo $? > {out}/{name}.status) || true",
                  f"cp /autograder/results/results.json {out}/{name}.json || true",
                  f"{listing} > {out}/recordings.{name} 2>&1 || true"]
    created = not Path("/autograder").exists()
    if created:
        Path("/autograder").mkdir()  # an empty mount point; everything happens in the private namespace
    try:
        proc = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--mount-proc", "bash", "-c", "\n".join(lines)],
                              capture_output=True, text=True, timeout=900)
    finally:
        if created:
            Path("/autograder").rmdir()
    assert proc.returncode == 0, proc.stderr
    results = {}
    for name in cases:
        log = (out / f"{name}.log").read_text()
        assert (out / f"{name}.status").read_text().strip() == "0", log
        results[name] = json.loads((out / f"{name}.json").read_text())
    results["recordings"] = {name: (out / f"recordings.{name}").read_text() for name in ["setup", *cases]}
    return results


def test_the_solution_gets_full_marks_in_the_user_sandbox(gradescope):
    data = gradescope["solution"]
    # Part I's 100 and Part II's bonus beyond it: the Gradescope zip grades both
    assert data["extra_data"]["part_one_score"] == 100 and data["extra_data"]["bonus_score"] == \
        data["extra_data"]["bonus_max"] > 0, [t["name"] for t in data["tests"] if t["score"] < t["max_score"]]
    assert data["score"] == 100 + data["extra_data"]["bonus_max"]
    assert data["extra_data"]["sandbox"] == "user" and data["extra_data"]["network"] == "seccomp"


def test_setup_records_the_examples_and_gradings_replay_them(gradescope):
    """setup.sh's recording step leaves a recording per check of the public seed, and the
    solution's grading through run_autograder replays them: it records nothing anew (a key that
    differed between the two, e.g. another entry point's literals, would rewrite them)."""
    listings = gradescope["recordings"]
    from autograder.exercises import CHECKS

    visible = sum(1 for checks in CHECKS.values() for check in checks if not check.hidden)
    assert listings["setup"].count(".safetensors") >= visible  # the hidden ones too where no hidden seed is set
    assert listings["solution"] == listings["setup"]


def test_the_blank_gets_zero_saying_not_implemented(gradescope):
    data = gradescope["blank"]
    assert data["score"] == 0
    assert all("not implemented" in t["output"] for t in data["tests"])


def test_a_symlink_to_the_solution_gets_zero_and_says_why(gradescope):
    data = gradescope["symlink"]
    assert data["score"] == 0 and "symbolic link" in data["tests"][0]["output"]


@pytest.mark.parametrize("name", ["reader", "stealer"])
def test_staff_files_stay_unreadable_and_nothing_of_the_solution_leaks(gradescope, name):
    data = gradescope[name]
    # nothing of Part I, the part they tried to read or steal (the stealer carries Part II's
    # answer-key code as its own, honestly graded: the corpus's attacks replace Part I alone)
    assert data["extra_data"]["part_one_score"] == 0
    assert data["score"] == (0 if name == "reader" else data["extra_data"]["bonus_max"])
    text = json.dumps(data)
    leaked = [line for line in release.solution_lines() if json.dumps(line)[1:-1] in text]
    assert not leaked, leaked[:3]
    if name == "reader":
        assert "PermissionError" in text  # it tried, and was refused
        assert f"{RECORDINGS}: PermissionError" in text
