"""Exercise 7 (Part II), aggregate_loss: inputs, error scales, checks and hints.

Error scales (see compare.py), with l the per-token loss, L_b row b's real tokens, n = sum L_b,
B' the rows with L_b > 0, C = max_response_length, and the result y:
    token-mean               (n + 2) mean|l|
                                 a cast per token, n - 1 additions in any order, one division
    seq-mean-token-mean      mean_b' ((L_b + 2) mean_t |l_bt|) + (B' + 2) mean_b' |s_b|
                                 each row's mean s_b errs like a token-mean of its own; the mean of
                                 the B' row means adds B' roundings of magnitude |s_b|
    seq-mean-token-sum-norm  (n + 2) sum|l| / (B C)
                                 the sum as in token-mean; B * C is an exact integer
    gradient                 4 w_bt, with w_bt = d y / d l_bt (1/n, 1/(L_b B') or 1/(B C)):
                                 at most two divisions and a cast, each one rounding of w_bt;
                                 exactly 0 on padding
"""

from __future__ import annotations

import torch
from hypothesis import assume
from hypothesis import strategies as st

from assignment.contract import LOSS_AGG_MODES, exercise

from ..cases import DTYPES, Case, array, junk, mask_as, padding, two_real_tokens, with_empty_row
from . import Check, all_of, common, fixed

EXERCISE = exercise(7)


# Names a student might pass or accept by mistake: TRL's loss_type names, near misses of verl's.
UNKNOWN_MODES = ("grpo", "dr_grpo", "bnpo", "token_mean", "seq-mean-token-sum", "mean")


@st.composite
def aggregate_case(draw, modes=LOSS_AGG_MODES, empty_rows: bool = False) -> Case:
    """Every row holds a real token, as the trainer's responses do (their EOS); ``empty_rows``: at
    least one row holds none (the contract's rule for them: seq-mean-token-mean leaves them out,
    seq-mean-token-sum-norm counts them in B)."""
    mask = draw(padding(max_b=6, max_t=10, empty_rows=empty_rows))
    assume(not empty_rows or not bool(mask.any(1).all()))
    B, T = mask.shape
    dtype = draw(st.sampled_from(DTYPES))
    loss = array(draw, (B, T), -5.0, 5.0).to(dtype)
    # the budget is at least the padded width and usually more: dividing by T is a known mistake
    budget = T + draw(st.sampled_from([0, 3, 17, 500]))
    return Case(tensors={"loss_mat": junk(draw, loss, mask, -100.0, 100.0), "response_mask": mask_as(draw, mask, dtype)},
                scalars={"loss_agg_mode": draw(st.sampled_from(modes)), "max_response_length": budget})


@st.composite
def edge_case(draw) -> Case:
    """What the trainer never sends: empty rows (any mode), or a mode that is none of the three."""
    if not draw(st.booleans()):
        return draw(aggregate_case(empty_rows=True))
    case, mode = draw(aggregate_case()), draw(st.sampled_from(UNKNOWN_MODES))
    return Case(case.tensors, {**case.scalars, "loss_agg_mode": mode},
                {"why": f"loss_agg_mode {mode!r} is none of the three modes"}, raises="ValueError")


def _edge_input(case: Case) -> bool:
    """What edge_case draws: an unknown mode on any batch, or a batch with an empty row."""
    return two_real_tokens(case) if case.raises else with_empty_row(case)


def weights(case: Case, mode: str | None = None, budget: float | None = None, empty_rows: bool = False) -> torch.Tensor:
    """(B, T) float64 d loss / d loss_mat: the aggregation is linear, y = sum(w * l). The keyword
    arguments reproduce known mistakes (another mode; another divisor; empty rows counted)."""
    mask = case.mask
    m = mask.double()
    mode = mode or case.scalars["loss_agg_mode"]
    B, T = mask.shape
    lengths = m.sum(1, keepdim=True)
    if mode == "token-mean":
        return m / m.sum()
    if mode == "seq-mean-token-mean":
        rows = B if empty_rows else int((lengths > 0).sum())
        return torch.where(mask, 1.0 / (lengths.clamp(min=1) * rows), 0.0)
    if mode == "seq-mean-token-sum-norm":
        return m / (B * (case.scalars["max_response_length"] if budget is None else budget))
    raise ValueError(mode)


def aggregate(case: Case, **mistake) -> torch.Tensor:
    l = torch.where(case.mask, case.tensors["loss_mat"].double(), 0.0)
    return (weights(case, **mistake) * l).sum()


def scales(case: Case, ref=None) -> dict[str, torch.Tensor]:
    mask, n = case.mask, case.n_real
    m = mask.double()
    l = torch.where(mask, case.tensors["loss_mat"].double(), 0.0).abs()
    mode = case.scalars["loss_agg_mode"]
    B = mask.shape[0]
    if mode == "token-mean":
        loss = (n + 2) * l.sum() / n
    elif mode == "seq-mean-token-mean":
        lengths = m.sum(1)
        rows = lengths > 0
        row_abs = l.sum(1)[rows] / lengths[rows]
        row_mean = (torch.where(mask, case.tensors["loss_mat"].double(), 0.0).sum(1)[rows] / lengths[rows]).abs()
        loss = ((lengths[rows] + 2) * row_abs).mean() + (int(rows.sum()) + 2) * row_mean.mean()
    else:
        loss = (n + 2) * l.sum() / (B * case.scalars["max_response_length"])
    return {"loss": loss, "grad": 4 * weights(case)}


def patterns(case: Case) -> list[tuple[str, torch.Tensor, str]]:
    mode = case.scalars["loss_agg_mode"]
    T = case.mask.shape[1]
    out = []
    if mode == "seq-mean-token-sum-norm":
        # most specific first: on small shrunk cases two mistakes can give the same number
        out += [
            ("loss", aggregate(case) * case.mask.shape[0], "divide by B * max_response_length: the mean over the B "
                                                           "responses stays"),
            ("loss", aggregate(case, budget=T), "divide by max_response_length (the generation budget), not by T, "
                                                "the batch's padded width"),
            ("loss", aggregate(case, mode="seq-mean-token-mean"),
             "Dr. GRPO's mode divides each response's sum by one constant, not by the response's own length: "
             "that per-response length is GRPO's length bias"),
        ]
    if mode == "seq-mean-token-mean":
        out += [
            ("loss", aggregate(case, mode="token-mean"), "seq-mean-token-mean averages each response's token-mean, "
                                                         "then averages over responses"),
            ("loss", aggregate(case, empty_rows=True), "a response with no real token has no mean: leave it out of "
                                                       "the mean over responses"),
        ]
    if mode == "token-mean":
        out.append(("loss", aggregate(case, mode="seq-mean-token-mean"), "token-mean divides the sum over all real "
                                                                         "tokens by their number, not a mean of "
                                                                         "per-row means"))
    return out


EMPTY_ROW = ("an empty row's count of real tokens is 0: dividing by it gives 0 / 0, and selecting the result away "
             "afterwards (torch.where, or indexing the other rows) still sends 0 * inf = NaN back through the "
             "division. Divide by a clamped count (count.clamp(min=1)), or select the non-empty rows before dividing")


def _empty_row_division(case: Case, sub) -> bool:
    """The evidence of a division by an empty row's count: a non-finite gradient in rows with no real
    token only."""
    if sub.grad is None:
        return False
    bad = ~torch.isfinite(sub.grad)  # (B, T)
    return bool(bad.any()) and not bool(case.mask[bad.any(1)].any())


def hint(evidence, ulps) -> str | None:
    """The hint for a failed check; ``evidence`` is [(case, submitted, reference)], the case shown
    last (common.suggest)."""
    if _empty_row_division(*evidence[-1][:2]):
        return EMPTY_ROW
    return common.suggest(patterns, scales, evidence, ulps)


_loss = common.outputs(scales, "loss")
_gradient = common.gradient(scales, "loss_mat")

CHECKS = (
    Check("token_mean", "token-mean: the sum over real tokens over their number",
          fixed(aggregate_case(modes=("token-mean",))), _loss),
    Check("seq_mean_token_mean", "seq-mean-token-mean (GRPO): the mean over responses of their token-means",
          fixed(aggregate_case(modes=("seq-mean-token-mean",))), _loss),
    Check("seq_mean_token_sum_norm", "seq-mean-token-sum-norm (Dr. GRPO): the sum over real tokens over "
          "B * max_response_length", fixed(aggregate_case(modes=("seq-mean-token-sum-norm",))), _loss),
    Check("gradient", "the gradient w.r.t. loss_mat is each token's weight in the mode, 0 on padding; every mode, "
          "on the inputs of the three checks above", fixed(aggregate_case()), _gradient),
    Check("edge_cases", "the contract's rules for what the trainer never sends: an empty response has no mean and "
          "counts in B (the loss and its gradient), an unknown mode raises ValueError",
          fixed(edge_case()), all_of(_loss, _gradient), fewer_rows=_edge_input),
    Check("hidden_loss", "the loss on the hidden inputs, every mode", fixed(aggregate_case()), _loss),
)
