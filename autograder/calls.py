"""Exercises 1-4 are one function call per case: how the grader makes it, on both sides.

The reference runs here, in float64 on float64 copies of the inputs, so that it is exact to
about 1e-16 and every difference is the submission's own rounding (compare.py). The
submission runs in the worker on the inputs exactly as generated (float32, float64 or
bfloat16, with a bool, float or integer mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assignment.contract import Exercise
from solutions import exercises as reference

from .cases import Case
from .compare import unpack, validate


@dataclass
class Called:
    """The outputs of one call by name, and the gradient of output 0 w.r.t. the grad param."""

    outputs: dict[str, torch.Tensor]
    requires_grad: dict[str, bool]
    grad: torch.Tensor | None  # None: no gradient reached the grad param


class StudentError(Exception):
    """The submission raised; ``reply`` is the worker's description of the exception."""

    def __init__(self, reply: dict):
        super().__init__(reply.get("message", ""))
        self.reply = reply

    def describe(self) -> str:
        where = "".join(f"\n    {w}" for w in self.reply.get("where", []))
        return f"raised {self.reply.get('type')}: {self.reply.get('message')}{where}"


def as_float64(t: torch.Tensor) -> torch.Tensor:
    """A float64 copy of a floating tensor (exact for bfloat16/float32); other dtypes as they are."""
    return t.double() if t.dtype.is_floating_point else t.clone()


def call_reference(ex: Exercise, case: Case) -> Called:
    kwargs = {n: as_float64(case.tensors[n]) for n in ex.tensor_params}
    kwargs.update({n: case.scalars[n] for n in ex.scalar_params})
    x = kwargs[ex.grad_param].requires_grad_(True)
    out = getattr(reference, ex.name)(**kwargs)
    out = out if isinstance(out, tuple) else (out,)
    # Part II's exercise 8 returns a per-token (B, T) output: its gradient is that of the sum, i.e.
    # each token's own derivative (the worker does the same when the header says grad_of_sum).
    first = out[0].sum() if ex.part == 2 else out[0]
    grad = torch.autograd.grad(first, x)[0] if out[0].requires_grad else None
    return Called(dict(zip(ex.outputs, [o.detach() for o in out])),
                  {n: o.requires_grad for n, o in zip(ex.outputs, out)}, grad)


def call_submission(ex: Exercise, case: Case, run) -> tuple[Called | None, list[str]]:
    """Run the submission through ``run(header, tensors)``; validate what came back.

    Returns (result, problems); raises StudentError when the submission raised.
    """
    header = {"op": "call", "fn": ex.name, "tensor_args": list(ex.tensor_params),
              "scalars": {n: case.scalars[n] for n in ex.scalar_params}, "grad_wrt": [ex.grad_param]}
    if ex.part == 2:  # Part I's requests stay exactly as they were
        header["grad_of_sum"] = True
    reply, tensors = run(header, {n: case.tensors[n] for n in ex.tensor_params})
    if reply.get("op") == "error":
        raise StudentError(reply)
    out = unpack(reply["output"], tensors)
    if len(ex.outputs) == 1:
        if isinstance(out, list):
            return None, [f"returned a sequence of {len(out)} items, expected one tensor ({ex.outputs[0]})"]
        items = [out]
    else:
        if not isinstance(out, list) or len(out) != len(ex.outputs):
            what = f"a sequence of {len(out)} items" if isinstance(out, list) else f"a {out.desc.get('type')}"
            return None, [f"returned {what}, expected a tuple of {len(ex.outputs)} tensors ({', '.join(ex.outputs)})"]
        items = out
    shape = tuple(case.mask.shape)
    problems = []
    for name, item in zip(ex.outputs, items):
        problems += validate(item, name, shape if name in ex.per_token_outputs else ())
    if problems:
        return None, problems
    return Called({name: item.tensor for name, item in zip(ex.outputs, items)},
                  {name: bool(item.desc["requires_grad"]) for name, item in zip(ex.outputs, items)},
                  tensors.get(f"grad.{ex.grad_param}")), []


def expect_error(ex: Exercise, case: Case, run) -> list[str]:
    """The contract makes ``ex`` raise ``case.raises`` on these arguments (an unknown mode): the
    problem in words if the submission returns instead, or raises something else."""
    wanted = f"the contract raises {case.raises} here ({case.notes.get('why', 'see the handout')})"
    try:
        call_submission(ex, case, run)
    except StudentError as err:
        if case.raises in err.reply.get("bases", [err.reply.get("type")]):
            return []
        if err.reply.get("type") == "NotImplementedError":
            raise  # a blank, as every other check sees it
        return [f"{err.describe()}\n{wanted}"]
    return [f"it returned a value; {wanted}"]
