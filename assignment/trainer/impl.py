"""Choose whose five exercises the trainer runs: the student's, the reference, or a file.

``load_impl("assignment")`` is the student's ``assignment.exercises``; any other value is the
path of an exercises file (another submission, or a reference), loaded by path.

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


def load_impl(spec: str) -> ModuleType:
    """The exercise module named by ``spec``: "assignment" or the path of a .py file."""
    try:
        if spec == "assignment":
            module = importlib.import_module("assignment.exercises")
        else:
            if not Path(spec).is_file():
                raise ImplError(f"--impl: no such file '{spec}' (use assignment, or the path of a .py file)")
            module = load_module(spec)
    except ImplError:
        raise
    except Exception as err:  # a submission can raise anything while importing
        raise ImplError(f"the submission '{spec}' failed to import: {type(err).__name__}: {err}") from None
    missing = [name for name in REQUIRED if not callable(getattr(module, name, None))]
    if missing:
        raise ImplError(f"the submission '{spec}' does not define {', '.join(missing)}")
    return module
