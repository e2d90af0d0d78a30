"""Feedback for students, logs for staff: messages that say what to do, counterexamples
without clutter, and nothing meant for staff or for Hypothesis's users in the student's text."""

from __future__ import annotations

import torch

from autograder import submission
from autograder.cases import Case
from autograder.compare import TINY, bound, compare


def refusal(path) -> str:
    try:
        submission.read(path)
    except submission.Refused as err:
        return str(err)
    raise AssertionError(f"{path} was accepted")


def test_an_empty_file_is_called_empty(tmp_path):
    for text in ("", "\n\n   \n"):
        path = tmp_path / "exercises.py"
        path.write_text(text)
        assert refusal(path).startswith("the file is empty"), refusal(path)


def test_a_file_that_is_not_utf8_is_told_to_save_as_utf8(tmp_path):
    path = tmp_path / "exercises.py"
    path.write_bytes("def f():\n    return 'caf\u00e9'\n".encode("latin-1"))
    message = refusal(path)
    assert "not UTF-8" in message and "save it as UTF-8" in message and "submit the Python file" not in message


def test_a_counterexample_names_padding_junk_and_keeps_real_tokens_apart():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    logits = torch.where(mask[..., None], torch.zeros(2, 3, 30), torch.full((2, 3, 30), 52.41))
    case = Case({"logits": logits, "response_mask": mask}, notes={"scale": 0.0})
    text = case.describe()
    assert "real tokens in [0, 0], padding junk in [52.41, 52.41]" in text, text
    assert "padding junk" in text.splitlines()[-2] and text.splitlines()[-1].startswith("(real tokens generated"), text


def test_a_row_dropped_from_a_counterexample_leaves_the_others_as_they_were():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    x = torch.arange(9.0).reshape(3, 3)
    case = Case({"x": x, "r": torch.arange(3.0), "response_mask": mask}, {"gamma": 0.5})
    smaller = case.without_row(1)
    assert smaller.tensors["x"].tolist() == [[0, 1, 2], [6, 7, 8]] and smaller.tensors["r"].tolist() == [0, 2]
    assert smaller.mask.tolist() == [[True, True, False], [True, False, False]] and smaller.scalars == {"gamma": 0.5}
    assert (case.rows, smaller.rows) == (3, 2)


def test_a_bound_below_resolution_is_called_exact():
    # scale 0: the bound is the underflow allowance alone, ulps * 2^-126, below any float32 difference
    tight = bound(2, 0.0)
    assert float(tight) == 2 * TINY
    (line,) = compare("loss", torch.tensor(1e-3), torch.tensor(0.0), tight)
    assert "must be exact" in line and "allowed" not in line, line
    (line,) = compare("loss", torch.tensor(1.5), torch.tensor(1.0), bound(2, 1.0))
    assert "allowed 1.19209e-07" in line, line
