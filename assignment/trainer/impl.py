"""Choose whose five exercises the trainer runs: the student's, the reference, or a file.

``load_impl("assignment")`` is the student's ``assignment.exercises``, ``load_impl("solutions")``
the reference ``solutions.exercises`` (staff repository only: the student release has no
``solutions`` package), and any other value a path to a submission file, loaded by path.

``load_module`` is the project's one way to import a Python file by path
(``importlib.util.spec_from_file_location``): under a fresh module name, so that two loads
(of two submissions, or of the same file twice) never share state. ``load_impl`` and
``tests/conftest.py`` use it.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import re
import sys
from pathlib import Path
from types import ModuleType

MODULES = {"assignment": "assignment.exercises", "solutions": "solutions.exercises"}
# What the trainer calls directly; exercises 1-3 are reached through ppo_minibatch_update.
REQUIRED = ("compute_gae_advantages", "ppo_minibatch_update")

_fresh = itertools.count()


class ImplError(ImportError):
    """A submission that cannot be used; the CLI prints the message without a traceback."""


def load_module(path: str | os.PathLike, name: str | None = None) -> ModuleType:
    """Import the Python file at ``path`` and return the module.

    Args:
        path: the .py file. Its frames in tracebacks carry this path as given.
        name: the module's name; None (the default) picks a fresh one (``_loaded_<stem>_<n>``)
            that no other module has, so that nothing is shared with an earlier load.

    The module is in ``sys.modules`` under its name while its code runs (dataclasses and
    pickling look modules up by name) and stays there; if running it raises, it is removed
    again and the exception propagates unchanged. Raises ImportError when ``path`` cannot be
    loaded as a Python module at all.
    """
    if name is None:
        stem = re.sub(r"\W", "_", Path(path).stem)
        name = f"_loaded_{stem}_{next(_fresh)}"
        while name in sys.modules:
            name = f"_loaded_{stem}_{next(_fresh)}"
    spec = importlib.util.spec_from_file_location(name, os.fspath(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load '{path}' as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def reference_available() -> bool:
    """Whether the reference solution can be imported: in the staff repository, not in the
    student release. Asks for ``solutions.exercises``, not just ``solutions``: any folder named
    ``solutions`` on the path (a student's notes) would pass for a namespace package."""
    try:
        return importlib.util.find_spec(MODULES["solutions"]) is not None
    except ImportError:  # no parent package "solutions" at all
        return False


def load_impl(spec: str) -> ModuleType:
    """The exercise module named by ``spec``: "assignment", "solutions" or a path to a .py file."""
    if spec == "solutions" and not reference_available():
        raise ImplError("--impl solutions: the reference solution is not part of this copy of the course; "
                        "run your own exercises (--impl assignment, the default) or a path to a .py file")
    try:
        if spec in MODULES:
            module = importlib.import_module(MODULES[spec])
        else:
            if not Path(spec).is_file():
                choices = "assignment, solutions" if reference_available() else "assignment"
                raise ImplError(f"--impl: no such file '{spec}' (use {choices} or a path to a .py file)")
            module = load_module(spec)
    except ImplError:
        raise
    except Exception as err:  # a submission can raise anything while importing
        raise ImplError(f"the submission '{spec}' failed to import: {type(err).__name__}: {err}") from None
    missing = [name for name in REQUIRED if not callable(getattr(module, name, None))]
    if missing:
        raise ImplError(f"the submission '{spec}' does not define {', '.join(missing)}")
    return module
