"""The namespaces sandbox's worker root: an answer key installed inside the Python environment
(a non-editable ``pip install .`` copies solutions/ into site-packages, which the root shows
read-only) is covered by an empty folder there; the editable install shows none."""

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

from autograder import sandbox

ROOT = Path("/tmp/worker-root")


def test_an_answer_key_installed_in_the_environment_is_covered(monkeypatch):
    site = Path(sys.prefix).resolve() / "lib" / "site-packages" / "solutions"
    real = importlib.util.find_spec
    installed = importlib.machinery.ModuleSpec("solutions", None, is_package=True)
    installed.submodule_search_locations = [str(site)]

    def spec_with_location(name, *args):
        return installed if name == "solutions" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", spec_with_location)
    assert sandbox.answer_keys_in_environment() == [site]
    steps = sandbox._new_root_steps(ROOT, Path("/tmp/stage"))
    cover = f"mount -t tmpfs -o size=4k,mode=755 tmpfs {ROOT / site.relative_to('/')}"
    assert cover in steps
    # after the environment is mounted (else the environment's bind mount would hide the cover)
    assert steps.index(cover) > max(i for i, step in enumerate(steps) if step.startswith("mount --bind") and "site" not in step
                                    and str(Path(sys.prefix).resolve()) in step)


def test_the_editable_install_shows_no_answer_key():
    # this project's own install (the README's pip install -e): solutions/ stays in the project tree
    assert sandbox.answer_keys_in_environment() == []
    assert not any("size=4k" in step for step in sandbox._new_root_steps(ROOT, Path("/tmp/stage")))
