"""Choose whose five exercises the trainer runs: the student's, the reference, or a file.

``load_impl("assignment")`` is the student's ``assignment.exercises``, ``load_impl("solutions")``
the reference ``solutions.exercises``, and any other value a path to a submission file,
loaded by path (``importlib.util.spec_from_file_location``) under a fresh module name so that
two submissions never share state.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

MODULES = {"assignment": "assignment.exercises", "solutions": "solutions.exercises"}
# What the trainer calls directly; exercises 1-3 are reached through ppo_minibatch_update.
REQUIRED = ("compute_gae_advantages", "ppo_minibatch_update")


class ImplError(ImportError):
    """A submission that cannot be used; the CLI prints the message without a traceback."""


def load_impl(spec: str) -> ModuleType:
    """The exercise module named by ``spec``: "assignment", "solutions" or a path to a .py file."""
    try:
        if spec in MODULES:
            module = importlib.import_module(MODULES[spec])
        else:
            path = Path(spec)
            if not path.is_file():
                raise ImplError(f"--impl: no such file '{spec}' (use assignment, solutions or a path to a .py file)")
            name = f"_ppo_submission_{abs(hash(str(path.resolve())))}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            if module_spec is None or module_spec.loader is None:
                raise ImplError(f"--impl: cannot load '{spec}' as a Python module")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module  # dataclasses and pickling look modules up by name
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
    except ImplError:
        raise
    except Exception as err:  # a submission can raise anything while importing
        raise ImplError(f"the submission '{spec}' failed to import: {type(err).__name__}: {err}") from None
    missing = [name for name in REQUIRED if not callable(getattr(module, name, None))]
    if missing:
        raise ImplError(f"the submission '{spec}' does not define {', '.join(missing)}")
    return module
