"""Exercise 6 (Part II), compute_grpo_advantages: inputs, error scales, checks and hints.

Error scales (see compare.py). For response i of group g (n members, rewards r_j, exact mean mu,
centred c_i = r_i - mu, exact sample std s, output o_i), first order:
    mean        E_mu = (n + 1) mean_g |r|        casting each reward, n - 1 additions in any
                                                 order, the division
    centred     E_c = |r_i| + E_mu + |c_i|       the cast of r_i, mu's error, the subtraction
    Dr. GRPO    o_i = c_i: S = E_c
    GRPO        o_i = c_i / (s + eps):
                S = E_c / (s + eps) + |o_i| (E_s + s + eps) / (s + eps) + |o_i|
                with E_var = (2 sum_g |c_j| E_c_j + (n + 2) sum_g c_j^2) / (n - 1) the error of
                the variance (each square perturbed by its centred error, n + 2 roundings of
                squares, sum and division) and E_s = E_var / (2 s) + s that of its square root;
                s + eps and the division add one rounding each. Where o_i = 0 exactly (a group of
                one, or of equal rewards) the second term vanishes: the submission's o_i is then
                its own centred error over its (s + eps) >= eps, which the first term bounds.
Both scales are 0 on padding, where the contract asks for an exact 0.
"""

from __future__ import annotations

import torch
from hypothesis import assume
from hypothesis import strategies as st

from assignment.contract import exercise

from ..cases import DTYPES, Case, array, grid, mask_as
from . import Check, all_of, common, fixed

EXERCISE = exercise(6)


@st.composite
def grpo_case(draw, norm_by_std: bool | None = None, layout: str | None = None, edges: bool = False) -> Case:
    """B responses in groups, every response at least one real token long. ``layout`` "blocks":
    B = prompts x G in contiguous groups of one size G >= 2, as the trainer lays them out;
    "scattered": groups of 2 to 4 under arbitrary integer ids, in any order. ``edges``: what the
    contract rules on and no trainer produces: groups of one response and empty responses, beside
    a group of two or more and at least two real tokens. Rewards are binary-like (a grid: ties,
    whole groups equal) or continuous."""
    layout = "scattered" if edges else layout or draw(st.sampled_from(["blocks", "scattered"]))
    if layout == "blocks":
        prompts, size = draw(st.integers(1, 4)), draw(st.integers(2, 4))
        B = prompts * size
        ids = torch.arange(prompts).repeat_interleave(size) * draw(st.sampled_from([1, 7]))
    else:
        sizes = draw(st.lists(st.integers(1 if edges else 2, 4), min_size=2 if edges else 1, max_size=4))
        assume(not edges or (min(sizes) == 1 and max(sizes) >= 2))
        names = draw(st.lists(st.integers(-3, 40), min_size=len(sizes), max_size=len(sizes), unique=True))
        order = draw(st.permutations([name for name, size in zip(names, sizes) for _ in range(size)]))
        B, ids = len(order), torch.tensor(order, dtype=torch.int64)
    T = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0 if edges else 1, T), min_size=B, max_size=B))
    assume(sum(lengths) >= 2)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    dtype = draw(st.sampled_from(DTYPES))
    if draw(st.booleans()):
        rewards = grid(draw, (B,), 0, 2, 2)  # 0, 0.5, 1: exact in float32, ties everywhere
    else:
        rewards = array(draw, (B,), -3.0, 3.0)
    norm = draw(st.booleans()) if norm_by_std is None else norm_by_std
    return Case(tensors={"rewards": rewards.to(dtype), "group_ids": ids,
                         "response_mask": mask_as(draw, mask, dtype)},
                scalars={"norm_by_std": norm, "eps": draw(st.sampled_from([1e-6, 1e-4, 0.1]))})


def _groups(case: Case) -> torch.Tensor:
    return torch.unique(case.tensors["group_ids"], return_inverse=True)[1]


# What each layout of grpo_case draws, for counterexamples with rows dropped (Check.fewer_rows).
def _sizes(case: Case) -> list[int]:
    return torch.unique(case.tensors["group_ids"], return_counts=True)[1].tolist()


def _trainer_input(case: Case) -> bool:
    """Groups of 2 to 4 responses, each at least one real token long."""
    return 2 <= min(_sizes(case)) and max(_sizes(case)) <= 4 and bool(case.mask.any(1).all())


def _blocks(case: Case) -> bool:
    """Contiguous groups of one size, as the trainer lays them out."""
    ids = case.tensors["group_ids"]
    return _trainer_input(case) and len(set(_sizes(case))) == 1 and \
        int((ids[1:] != ids[:-1]).sum()) == len(_sizes(case)) - 1


def _edges(case: Case) -> bool:
    """A group of one beside a group of two or more, and at least two real tokens."""
    return min(_sizes(case)) == 1 and max(_sizes(case)) >= 2 and case.n_real >= 2


def group_stats(case: Case, batch: bool = False, unbiased: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean, std, size) of each response's group, (B,) float64 each; ``batch``: of the whole
    batch instead (a known mistake), ``unbiased=False``: the population std (another)."""
    r = case.tensors["rewards"].double()
    group = torch.zeros_like(_groups(case)) if batch else _groups(case)
    mean, std, size = (torch.zeros_like(r) for _ in range(3))
    for g in group.unique():
        members = group == g
        n = int(members.sum())
        mean[members] = r[members].mean()
        c = r[members] - mean[members]
        std[members] = torch.sqrt((c ** 2).sum() / max(n - 1 if unbiased else n, 1))
        size[members] = n
    return mean, std, size


def advantages(case: Case, batch: bool = False, unbiased: bool = True, norm_by_std: bool | None = None,
               eps_inside: bool = False, unit_std: bool = False) -> torch.Tensor:
    """(B, T) float64 advantages in closed form; the keyword arguments reproduce known mistakes
    (``unit_std``: Dr. GRPO divided by 1 + eps, a std of 1)."""
    r = case.tensors["rewards"].double()
    mean, std, _ = group_stats(case, batch, unbiased)
    norm = case.scalars["norm_by_std"] if norm_by_std is None else norm_by_std
    eps = case.scalars["eps"]
    c = r - mean
    if norm:
        out = c / torch.sqrt(std ** 2 + eps) if eps_inside else c / (std + eps)
    else:
        out = c / (1 + eps) if unit_std else c
    return torch.where(case.mask, out[:, None], 0.0)


def scales(case: Case, ref=None) -> dict[str, torch.Tensor]:
    r = case.tensors["rewards"].double()
    group = _groups(case)
    mean, s, size = group_stats(case)
    eps = case.scalars["eps"]
    c = r - mean
    mean_abs = torch.zeros_like(r)
    for g in group.unique():
        members = group == g
        mean_abs[members] = r[members].abs().mean()
    e_mu = (size + 1) * mean_abs
    e_c = r.abs() + e_mu + c.abs()
    if case.scalars["norm_by_std"]:
        e_var = torch.zeros_like(r)
        for g in group.unique():
            members = group == g
            n = int(members.sum())
            if n > 1:
                e_var[members] = (2 * (c[members].abs() * e_c[members]).sum()
                                  + (n + 2) * (c[members] ** 2).sum()) / (n - 1)
        o = c / (s + eps)
        e_s = torch.where(s > 0, e_var / (2 * s.clamp(min=1e-300)) + s, 0.0)
        per_row = e_c / (s + eps) + torch.where(o != 0, o.abs() * (e_s + s + eps) / (s + eps), 0.0) + o.abs()
    else:
        per_row = e_c
    return {"advantages": torch.where(case.mask, per_row[:, None], 0.0)}


def _zero_padding(case, ref, sub, ulps) -> list[str]:
    got = sub.outputs["advantages"][~case.mask]
    if got.numel() and not bool((got == 0).all()):
        return ["advantages is non-zero at padded positions; the contract asks for 0 there "
                "(torch.where(response_mask, A, 0))"]
    return []


def patterns(case: Case) -> list[tuple[str, torch.Tensor, str]]:
    out = [
        ("advantages", advantages(case, batch=True), "the mean and std are per group (the responses to one prompt), "
                                                      "not over the whole batch"),
        ("advantages", advantages(case, unbiased=False), "you divide by n (the population std); the contract's std "
                                                         "is the sample std, Bessel's n - 1, as torch.std computes "
                                                         "by default"),
        ("advantages", advantages(case, eps_inside=True), "eps is added to the std, outside the square root: "
                                                          "(r - mean) / (std + eps)"),
    ]
    if case.scalars["norm_by_std"]:
        out.append(("advantages", advantages(case, norm_by_std=False), "with norm_by_std=True (GRPO) divide by "
                                                                        "std + eps"))
    else:
        out += [("advantages", advantages(case, norm_by_std=True), "with norm_by_std=False (Dr. GRPO) the "
                                                                    "advantage is r - mean alone: no std"),
                ("advantages", advantages(case, unit_std=True), "Dr. GRPO's advantage is r - mean with no divisor; "
                                                                "yours divides by 1 + eps")]
    return out


SINGLETON = ("a group of one response gives NaN: torch.std of a single value divides by n - 1 = 0. The contract "
             "gives such a response advantage 0 (its own reward is its baseline)")


def _nan_in_groups_of_one(case: Case, sub) -> bool | None:
    """Whether every non-finite advantage sits in a group of one, on a case that also holds a larger
    group (there a std over the whole batch is finite, so the NaN is the group of one's; a batch of
    one response is a group of one for both mistakes, and tells nothing); None: all are finite."""
    broken = ~torch.isfinite(sub.outputs["advantages"]).all(dim=-1) & case.mask.any(dim=-1)  # (B,)
    if not bool(broken.any()):
        return None
    size = group_stats(case)[2]
    return bool((size[broken] == 1).all()) and bool((size > 1).any())


def hint(evidence, ulps) -> str | None:
    """The hint for a failed check; ``evidence`` is [(case, submitted, reference)], the case shown
    last (common.suggest). SINGLETON needs the case shown to hold NaNs in groups of one only, and no
    case to hold them anywhere else."""
    nan = [_nan_in_groups_of_one(case, sub) for case, sub, _ in evidence if sub is not None]
    if nan and nan[-1] and False not in nan:
        return SINGLETON
    return common.suggest(patterns, scales, evidence, ulps)


_no_grad = common.no_gradient("advantages")
_values = all_of(common.outputs(scales, "advantages"), _zero_padding, _no_grad)

CHECKS = (
    Check("grpo", "GRPO (norm_by_std=True): (r - group mean) / (group std + eps) on real tokens, 0 on padding, "
          "no gradient; groups of 2 to 4 in any order", fixed(grpo_case(norm_by_std=True)), _values,
          fewer_rows=_trainer_input),
    Check("dr_grpo", "Dr. GRPO (norm_by_std=False): r - group mean on real tokens, 0 on padding, no gradient; "
          "groups of 2 to 4 in any order", fixed(grpo_case(norm_by_std=False)), _values, fewer_rows=_trainer_input),
    Check("trainer_layout", "contiguous groups of one size (2 to 4), as the trainer samples them, GRPO or Dr. GRPO",
          fixed(grpo_case(layout="blocks")), _values, fewer_rows=_blocks),
    Check("edge_cases", "the contract's rules for what the trainer never sends (its groups hold 2 or more "
          "responses of at least one token): a group of one gets 0, an empty response counts in its group",
          fixed(grpo_case(edges=True)), _values, fewer_rows=_edges),
    Check("hidden_advantages", "the advantages on the hidden inputs (groups of 2 or more)", fixed(grpo_case()), _values,
          fewer_rows=_trainer_input),
)
