"""Independent float64 check of the files in tests/submissions/ against the contract (handout.md, section 4).

    cd /work/wt-alts && /work/main/.venv/bin/python tests/submissions/check_alternatives.py [--quick]

Not a grader: it applies no tolerance. For exercises 1-4 it computes the contract's formulas
token by token in float64 (plain Python loops, autograd for the gradients; clip fractions
also exactly, with fractions.Fraction / mpmath) and prints, per file, the largest absolute and
relative differences of the outputs and gradients over many random inputs: float32 and
float64 inputs, bool / float / long masks, empty rows, logits up to 1e3, bfloat16 logits for the
entropy, and padding filled with junk. Four junk scenarios are reported separately:

    small      |junk| <= 10: no intermediate at a padded position overflows, even in float32
    public     the magnitudes the public tests use (+-1234.5, -77, +-50): exp() of a junk
               log-ratio can overflow (also in float64: exp(2469) = inf)
    large      arbitrary finite junk (+-1e30, +-3e4, +-1e10)
    nonfinite  +-inf and nan in padding

For exercise 5 it builds PolicyWithValueHead(tiny_llama(vocab_size=32, hidden_size=16,
num_layers=1)).double() (value head re-initialised to non-zero weights), computes the reference
metrics, (loss / grad_accum_steps) gradients, grad norm after two accumulating calls and the
clipped SGD step with its own float64 code (torch's clip coefficient max_norm / (norm + 1e-6)),
and compares every file with it (and the correct files with each other). It also checks that an
inf advantage skips the step and still zeroes the gradients.

"rel" is max |a - b| / max |ref| per comparison (for a scalar: |a - b| / |ref|). "n_nonfinite" counts results (or gradient
entries) that are nan/inf where the reference is finite.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import sys
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import mpmath
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from assignment.model import PolicyWithValueHead, tiny_llama  # noqa: E402

QUICK = "--quick" in sys.argv
N_CASES = 30 if QUICK else 120
mpmath.mp.dps = 60


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"alt_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FILES = sorted(HERE.glob("correct_*.py")) + sorted(HERE.glob("wrong_*.py"))
MODULES = {p.stem: load(p) for p in FILES}


# ---------------------------------------------------------------------------------------------
# accumulation of differences
# ---------------------------------------------------------------------------------------------

class Acc:
    """Largest abs / rel difference and counts, over many comparisons."""

    def __init__(self):
        self.abs = 0.0
        self.rel = 0.0
        self.nonfinite = 0
        self.count = 0

    def add(self, got, ref):
        got = torch.as_tensor(got, dtype=torch.float64).detach().flatten()
        ref = torch.as_tensor(ref, dtype=torch.float64).detach().flatten()
        self.count += 1
        finite_ref = torch.isfinite(ref)
        self.nonfinite += int((finite_ref & ~torch.isfinite(got)).sum())
        ok = finite_ref & torch.isfinite(got)
        if ok.any():
            d = (got[ok] - ref[ok]).abs().max()
            self.abs = max(self.abs, float(d))
            scale = ref[ok].abs().max()
            if scale > 0:
                self.rel = max(self.rel, float(d / scale))

    def cell(self):
        if self.count == 0:
            return "-"
        s = f"{self.abs:.1e}/{self.rel:.1e}"
        if self.nonfinite:
            s += f" NF{self.nonfinite}"
        return s


class CountAcc:
    """Clip fractions: the difference in clipped-token counts, |a - b| * n."""

    def __init__(self):
        self.max_tokens = 0
        self.cases_differing = 0
        self.count = 0
        self.nonfinite = 0
        self.max_abs = 0.0

    def add(self, got, ref, n):
        got = float(got)
        self.count += 1
        if not math.isfinite(got):
            self.nonfinite += 1
            return
        tokens = round(abs(got - ref) * n)
        self.max_tokens = max(self.max_tokens, tokens)
        self.cases_differing += tokens > 0
        self.max_abs = max(self.max_abs, abs(got - ref))

    def cell(self):
        if self.count == 0:
            return "-"
        s = f"{self.max_tokens} tok, {self.cases_differing}/{self.count}, {self.max_abs:.1e}"
        if self.nonfinite:
            s += f" NF{self.nonfinite}"
        return s


def table(title, columns, rows):
    print()
    print(title)
    width = [max(24, max(len(r) for r in rows))] + [max(len(c), 21) for c in columns]
    print("  ".join(h.ljust(w) for h, w in zip(["file"] + list(columns), width)))
    for name, accs in rows.items():
        cells = [name.ljust(width[0])]
        for c, w in zip(columns, width[1:]):
            a = accs.get(c)
            if isinstance(a, (Acc, CountAcc)):
                cells.append(a.cell().ljust(w))
            else:
                cells.append(str(a if a is not None else "-").ljust(w))
        print("  ".join(cells))


# ---------------------------------------------------------------------------------------------
# input generation
# ---------------------------------------------------------------------------------------------

GEN = torch.Generator().manual_seed(12345)


def randn(*shape, dtype=torch.float64, scale=1.0):
    return (torch.randn(*shape, generator=GEN, dtype=torch.float64) * scale).to(dtype)


def randint(lo, hi):
    return int(torch.randint(lo, hi, (1,), generator=GEN))


def make_mask(B, T, mask_dtype):
    """Right-padded mask with random lengths (some rows empty), at least two real tokens."""
    while True:
        lengths = [randint(0, T + 1) for _ in range(B)]
        if randint(0, 4) == 0:
            lengths[randint(0, B)] = 0
        if sum(lengths) >= 2:
            break
    m = torch.zeros(B, T, dtype=torch.bool)
    for b, L in enumerate(lengths):
        m[b, :L] = True
    return m.to(mask_dtype), lengths


JUNK = {
    # |junk| <= 10: every per-token intermediate stays finite, even in float32
    "small": [10.0, -10.0, -9.0, 3.0, 0.0, 7.5],
    # the magnitudes of the public tests (1234.5, -77, +-50): exp of a junk log-ratio may overflow
    "public": [1234.5, -1234.5, -77.0, 50.0, -50.0, 9.0],
    # arbitrary finite junk
    "large": [1e30, -1e30, 3e4, -3e4, 1e10, -1e10],
    "nonfinite": [math.inf, -math.inf, math.nan],
}


def junk_like(x, scenario):
    choices = JUNK[scenario]
    vals = torch.tensor([choices[randint(0, len(choices))] for _ in range(x.numel())], dtype=torch.float64)
    return vals.view(x.shape).to(x.dtype)


def with_junk(x, mask, scenario):
    m = mask.bool()
    while m.dim() < x.dim():
        m = m.unsqueeze(-1)
    return torch.where(m, x, junk_like(x, scenario))


MASK_DTYPES = [torch.bool, torch.float32, torch.int64]
IN_DTYPES = [torch.float32, torch.float64]


def real_positions(mask):
    m = mask.bool()
    return [(b, t) for b in range(m.shape[0]) for t in range(m.shape[1]) if m[b, t]]


# ---------------------------------------------------------------------------------------------
# float64 references, token by token
# ---------------------------------------------------------------------------------------------

def ref_policy(new, old, adv, mask, eps):
    pos = real_positions(mask)
    n = len(pos)
    new64 = new.detach().to(torch.float64).clone().requires_grad_(True)
    terms, kl = [], []
    clipped_lit, clipped_exact = 0, 0
    one, e = mpmath.mpf(1), mpmath.mpf(eps)
    for b, t in pos:
        o, a = float(old[b, t]), float(adv[b, t])
        r = torch.exp(new64[b, t] - o)
        unclipped = -a * r
        clipped = -a * torch.clamp(r, 1 - eps, 1 + eps)
        terms.append(torch.maximum(unclipped, clipped))
        clipped_lit += bool(clipped > unclipped)
        # exact: the clipped term is strictly larger iff r lies outside the range on A's side
        r_exact = mpmath.exp(mpmath.mpf(float(new[b, t])) - mpmath.mpf(o))
        clipped_exact += bool((a > 0 and r_exact > one + e) or (a < 0 and r_exact < one - e))
        kl.append(o - float(new[b, t]))
    loss = torch.stack(terms).sum() / n
    loss.backward()
    return dict(loss=loss.item(), clip_frac=clipped_lit / n, clip_frac_exact=clipped_exact / n,
                approx_kl=math.fsum(kl) / n, grad=new64.grad)


def ref_value(vn, vo, ret, mask, c):
    pos = real_positions(mask)
    n = len(pos)
    vn64 = vn.detach().to(torch.float64).clone().requires_grad_(True)
    terms = []
    clipped_lit, clipped_exact = 0, 0
    C = Fraction(c)
    for b, t in pos:
        o, R = float(vo[b, t]), float(ret[b, t])
        v_clip = o + torch.clamp(vn64[b, t] - o, -c, c)
        e1 = (vn64[b, t] - R) ** 2
        e2 = (v_clip - R) ** 2
        terms.append(torch.maximum(e1, e2))
        clipped_lit += bool(e2 > e1)
        fn, fo, fr = Fraction(float(vn[b, t])), Fraction(o), Fraction(R)
        fclip = fo + min(max(fn - fo, -C), C)
        clipped_exact += bool((fclip - fr) ** 2 > (fn - fr) ** 2)
    loss = 0.5 * torch.stack(terms).sum() / n
    loss.backward()
    return dict(loss=loss.item(), clip_frac=clipped_lit / n, clip_frac_exact=clipped_exact / n, grad=vn64.grad)


def ref_entropy(logits, mask):
    pos = real_positions(mask)
    n = len(pos)
    z64 = logits.detach().to(torch.float64).clone().requires_grad_(True)
    hs = []
    for b, t in pos:
        z = z64[b, t]
        shift = z.max().detach()
        zs = z - shift
        lse = torch.log(torch.exp(zs).sum())
        p = torch.exp(zs - lse)
        hs.append(lse - (p * zs).sum())
    loss = -torch.stack(hs).sum() / n
    loss.backward()
    return dict(loss=loss.item(), grad=z64.grad)


def ref_gae(final_rewards, kl, values, mask, gamma, lam):
    m = mask.bool()
    B, T = values.shape
    A = [[0.0] * T for _ in range(B)]
    for b in range(B):
        L = int(m[b].sum())
        nxt_a, nxt_v, nxt_m = 0.0, 0.0, 0
        for t in range(T - 1, -1, -1):
            if m[b, t]:
                r = -float(kl[b, t]) + (float(final_rewards[b]) if t == L - 1 else 0.0)
                v = float(values[b, t])
                delta = r + gamma * (nxt_v if nxt_m else 0.0) - v
                A[b][t] = delta + gamma * lam * (nxt_a if nxt_m else 0.0)
                nxt_a, nxt_v, nxt_m = A[b][t], v, 1
            else:
                nxt_a, nxt_v, nxt_m = 0.0, 0.0, 0
    real = [A[b][t] for b, t in real_positions(mask)]
    n = len(real)
    mean = math.fsum(real) / n
    var = math.fsum((x - mean) ** 2 for x in real) / (n - 1)
    adv = torch.tensor(A, dtype=torch.float64)
    white = (adv - mean) / math.sqrt(var + 1e-8)
    returns = adv + values.detach().to(torch.float64)
    return dict(adv=white, returns=returns)


# ---------------------------------------------------------------------------------------------
# exercises 1-4
# ---------------------------------------------------------------------------------------------

SCENARIOS = ["small", "public", "large", "nonfinite"]
DTYPE_SEEN: dict[str, dict[str, set]] = {name: {} for name in MODULES}
GRAD_STATUS: dict[str, list] = {name: [] for name in MODULES}


def note_dtype(name, key, tensor):
    DTYPE_SEEN[name].setdefault(key, set()).add(str(tensor.dtype).replace("torch.", ""))


def call(fn, *args):
    try:
        return fn(*args), None
    except Exception as exc:  # report, do not hide
        return None, f"{type(exc).__name__}: {exc}"[:120]


def check_ex1_to_4(scenario):
    cols1 = ["loss", "clip_frac", "clip_frac vs exact", "approx_kl", "grad real", "grad padded"]
    cols2 = ["loss", "clip_frac", "clip_frac vs exact", "grad real", "grad padded"]
    regimes = ["N(0,s<=10)", "N(0,1e3)", "1e3+N(0,1)"]
    cols3 = [f"loss {r}" for r in regimes] + [f"grad real {r}" for r in regimes] + ["grad padded"]
    cols4 = ["adv", "returns"]
    counted = ("clip_frac", "clip_frac vs exact")
    dls = {"1": ("float32", "float64"), "2": ("float32", "float64"), "3": ("float32", "float64", "bfloat16"),
           "4": ("float32", "float64")}
    acc = {ex: {dl: {name: {c: CountAcc() if c in counted else Acc() for c in cols} for name in MODULES}
                for dl in dls[ex]}
           for ex, cols in (("1", cols1), ("2", cols2), ("3", cols3), ("4", cols4))}
    errors = {name: set() for name in MODULES}

    for case in range(N_CASES):
        B, T = randint(1, 6), randint(2, 9)  # B * T >= 2: every batch holds two real tokens
        dtype = IN_DTYPES[case % 2]
        mask_dtype = MASK_DTYPES[case % 3]
        mask, lengths = make_mask(B, T, mask_dtype)
        pad = ~mask.bool()
        dl = str(dtype)[6:]

        # ---- exercise 1 ----
        eps = [0.1, 0.2, 0.3][case % 3]
        scale = [0.05, 0.3, 1.0][(case // 3) % 3]
        new = randn(B, T, dtype=dtype, scale=scale)
        old = randn(B, T, dtype=dtype, scale=scale)
        adv = randn(B, T, dtype=dtype)
        if case % 5 == 0:  # some exact zeros in A and exact unit ratios
            adv[0, 0] = 0.0
            old[0, :] = new[0, :]
        ref = ref_policy(new, old, adv, mask, eps)
        n_real = len(real_positions(mask))
        jn, jo, ja = (with_junk(x, mask, scenario) for x in (new, old, adv))
        for name, mod in MODULES.items():
            x = jn.clone().requires_grad_(True)
            out, err = call(mod.compute_policy_loss, x, jo, ja, mask, eps)
            if err:
                errors[name].add("ex1 " + err)
                continue
            loss, cf, kl = out
            a = acc["1"][dl][name]
            a["loss"].add(loss, ref["loss"])
            a["clip_frac"].add(cf, ref["clip_frac"], n_real)
            a["clip_frac vs exact"].add(cf, ref["clip_frac_exact"], n_real)
            a["approx_kl"].add(kl, ref["approx_kl"])
            note_dtype(name, f"ex1 {str(dtype)[6:]}", loss)
            if cf.requires_grad or kl.requires_grad or not loss.requires_grad:
                GRAD_STATUS[name].append("ex1 gradient status")
            loss.backward()
            g = x.grad if x.grad is not None else torch.zeros_like(x)
            a["grad real"].add(g[~pad], ref["grad"][~pad])
            a["grad padded"].add(g[pad], ref["grad"][pad])

        # ---- exercise 2 ----
        c = [0.1, 0.2, 0.5][case % 3]
        vn = randn(B, T, dtype=dtype)
        vo = vn + randn(B, T, dtype=dtype, scale=[0.05, 0.3, 1.0][(case // 3) % 3])
        if case % 2:
            vo = randn(B, T, dtype=dtype)  # unrelated old values: many unclipped tokens off Sterbenz
        ret = randn(B, T, dtype=dtype)
        ref = ref_value(vn, vo, ret, mask, c)
        jvn, jvo, jr = (with_junk(x, mask, scenario) for x in (vn, vo, ret))
        for name, mod in MODULES.items():
            x = jvn.clone().requires_grad_(True)
            out, err = call(mod.compute_value_loss, x, jvo, jr, mask, c)
            if err:
                errors[name].add("ex2 " + err)
                continue
            loss, cf = out
            a = acc["2"][dl][name]
            a["loss"].add(loss, ref["loss"])
            a["clip_frac"].add(cf, ref["clip_frac"], n_real)
            a["clip_frac vs exact"].add(cf, ref["clip_frac_exact"], n_real)
            note_dtype(name, f"ex2 {str(dtype)[6:]}", loss)
            if cf.requires_grad or not loss.requires_grad:
                GRAD_STATUS[name].append("ex2 gradient status")
            loss.backward()
            g = x.grad if x.grad is not None else torch.zeros_like(x)
            a["grad real"].add(g[~pad], ref["grad"][~pad])
            a["grad padded"].add(g[pad], ref["grad"][pad])

        # ---- exercise 3 ----
        V = [2, 7, 33, 1000][case % 4]
        regime = regimes[(case // 4) % 3]
        ldtype = [torch.float32, torch.float64, torch.bfloat16][case % 3]
        if regime == "N(0,s<=10)":  # moderate logits
            logits = randn(B, T, V, scale=[1.0, 10.0][case % 2])
        elif regime == "N(0,1e3)":  # huge, peaked: entropy ~ 0
            logits = randn(B, T, V, scale=1e3)
        else:  # huge offset, O(1) spread: entropy O(1), cancellation in logsumexp(z) - sum(p z)
            logits = 1e3 * (1 - 2 * randint(0, 2)) + randn(B, T, V)
        logits = logits.to(ldtype)
        ref = ref_entropy(logits, mask)
        jl = with_junk(logits, mask, scenario)
        for name, mod in MODULES.items():
            x = jl.clone().requires_grad_(True)
            out, err = call(mod.compute_entropy_loss, x, mask)
            if err:
                errors[name].add("ex3 " + err)
                continue
            a = acc["3"][str(ldtype)[6:]][name]
            a["loss " + regime].add(out, ref["loss"])
            note_dtype(name, f"ex3 {str(ldtype)[6:]}", out)
            out.backward()
            g = x.grad if x.grad is not None else torch.zeros_like(x)
            a["grad real " + regime].add(g[~pad], ref["grad"][~pad])
            a["grad padded"].add(g[pad], ref["grad"][pad])

        # ---- exercise 4 ----
        gamma = [0.0, 0.5, 0.9, 0.99, 1.0][case % 5]
        lam = [1.0, 0.95, 0.0, 0.5, 1.0][(case // 5) % 5]
        fr = randn(B, dtype=dtype)
        kl = randn(B, T, dtype=dtype, scale=0.1)
        vals = randn(B, T, dtype=dtype)
        ref = ref_gae(fr, kl, vals, mask, gamma, lam)
        jk, jv = with_junk(kl, mask, scenario), with_junk(vals, mask, scenario)
        real = mask.bool()
        for name, mod in MODULES.items():
            v_in = jv.clone().requires_grad_(True)
            out, err = call(mod.compute_gae_advantages, fr, jk, v_in, mask, gamma, lam)
            if err:
                errors[name].add("ex4 " + err)
                continue
            adv_w, returns = out
            a = acc["4"][dl][name]
            a["adv"].add(adv_w[real], ref["adv"][real])
            a["returns"].add(returns[real], ref["returns"][real])
            note_dtype(name, f"ex4 {str(dtype)[6:]}", adv_w)
            if adv_w.requires_grad or returns.requires_grad:
                GRAD_STATUS[name].append("ex4 gradient status")

    print(f"\n=============== exercises 1-4, junk scenario: {scenario}, {N_CASES} random cases ===============")
    print("cells: max abs diff / max rel diff (max|a-b| / max|ref| per comparison) vs the float64 reference; "
          "NF<k>: k non-finite entries where the reference is finite.\n"
          "clip fractions: '<k> tok, <c>/<N>, <d>': at most k clipped tokens of difference, in c of N cases, "
          "largest abs difference d. 'clip_frac' compares with the contract's formula evaluated in float64, "
          "'vs exact' with exact rational/mpmath arithmetic.")
    for ex, title, cols in (("1", "exercise 1 (policy loss)", cols1), ("2", "exercise 2 (value loss)", cols2),
                            ("3", "exercise 3 (entropy loss)", cols3),
                            ("4", "exercise 4 (GAE), real positions only", cols4)):
        for dl in dls[ex]:
            table(f"{title}, {dl} inputs" + (" (logits)" if ex == "3" else ""), cols,
                  {n: acc[ex][dl][n] for n in MODULES})
    for name, errs in errors.items():
        for e in sorted(errs):
            print(f"  raised: {name}: {e}")


# ---------------------------------------------------------------------------------------------
# clip-fraction equivalences, near the boundaries
# ---------------------------------------------------------------------------------------------

def check_clip_equivalences():
    print("\n=============== clip-fraction forms, token by token, near the clip boundaries ===============")
    for dtype in (torch.float32, torch.float64):
        eps = 0.2
        n = 20000
        # ratios within a few ulps of 1 +- eps, and some far away
        hi = torch.tensor(1 + eps, dtype=dtype)
        lo = torch.tensor(1 - eps, dtype=dtype)
        steps = torch.randint(-4, 5, (n,), generator=GEN)
        base = torch.where(torch.rand(n, generator=GEN) < 0.5, hi, lo)
        r = base.clone()
        for k in range(4):
            up = torch.nextafter(r, torch.tensor(math.inf, dtype=dtype))
            dn = torch.nextafter(r, torch.tensor(-math.inf, dtype=dtype))
            r = torch.where(steps > k, up, torch.where(steps < -k, dn, r))
        a_real = torch.randn(n, generator=GEN, dtype=torch.float64).to(dtype)
        a_real[::7] = 0.0
        finfo = torch.finfo(dtype)
        extreme_vals = torch.tensor([finfo.max, -finfo.max, finfo.tiny, -finfo.tiny, 1e-45 if dtype == torch.float32
                                     else 5e-324, 0.0], dtype=dtype)
        a_ext = extreme_vals[torch.randint(0, len(extreme_vals), (n,), generator=GEN)]
        for label, A in (("A ~ N(0,1) (1/7 exact zeros)", a_real), ("A extreme (+-max, +-tiny, subnormal, 0)", a_ext)):
            lit = (-A * torch.clamp(r, 1 - eps, 1 + eps)) > (-A * r)
            logical = ((A > 0) & (r > 1 + eps)) | ((A < 0) & (r < 1 - eps))
            exact = torch.tensor([(float(a) > 0 and Fraction(float(x)) > 1 + Fraction(eps)) or
                                  (float(a) < 0 and Fraction(float(x)) < 1 - Fraction(eps))
                                  for a, x in zip(A.tolist(), r.tolist())])
            print(f"  ex1 {str(dtype)[6:]:8s} {label:42s} tokens={n}: literal!=logical: {int((lit != logical).sum())}, "
                  f"literal!=exact: {int((lit != exact).sum())}, logical!=exact: {int((logical != exact).sum())}")
    for dtype in (torch.float32, torch.float64):
        n, c = 20000, 0.2
        vn = torch.randn(n, generator=GEN, dtype=torch.float64).to(dtype)
        for label, vo in (("v_old unrelated N(0,1)", torch.randn(n, generator=GEN, dtype=torch.float64).to(dtype)),
                          ("v_old = v_new + N(0,0.1)", (vn.double() + 0.1 * torch.randn(n, generator=GEN,
                                                                                      dtype=torch.float64)).to(dtype))):
            R = torch.randn(n, generator=GEN, dtype=torch.float64).to(dtype)
            lit_clip = vo + torch.clamp(vn - vo, -c, c)
            verl_clip = torch.max(torch.min(vn, vo + c), vo - c)
            lit = (lit_clip - R) ** 2 > (vn - R) ** 2
            verl = (verl_clip - R) ** 2 > (vn - R) ** 2
            C = Fraction(c)
            exact = torch.tensor([((Fraction(o) + min(max(Fraction(v) - Fraction(o), -C), C)) - Fraction(q)) ** 2
                                  > (Fraction(v) - Fraction(q)) ** 2
                                  for v, o, q in zip(vn.tolist(), vo.tolist(), R.tolist())])
            unclipped_moved = ((vn - vo).abs() <= c) & (lit_clip != vn)
            print(f"  ex2 {str(dtype)[6:]:8s} {label:42s} tokens={n}: v_old+clamp(v_new-v_old) != v_new while "
                  f"unclipped: {int(unclipped_moved.sum())}; literal!=exact: {int((lit != exact).sum())}, "
                  f"verl-form!=exact: {int((verl != exact).sum())}, literal!=verl-form: {int((lit != verl).sum())}")


# ---------------------------------------------------------------------------------------------
# exercise 5
# ---------------------------------------------------------------------------------------------

KEYS = ["loss/policy", "loss/value", "loss/entropy", "loss/total", "stats/policy_clipfrac",
        "stats/value_clipfrac", "stats/approx_kl"]


def make_ex5_case(model, cfg, seed, junk):
    g = torch.Generator().manual_seed(seed)
    B, P, T, V = 4, 5, 6, 32
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[0, :2] = 0
    prompt_mask[2, :4] = 0
    lengths = [6, 3, 1, 0]  # one empty response
    response_mask = torch.zeros(B, T, dtype=torch.long)
    for b, L in enumerate(lengths):
        response_mask[b, :L] = 1
    ids = torch.randint(0, V, (B, P + T), generator=g)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    with torch.no_grad():
        logits, values = model(ids, attention_mask)
    z = (logits[:, P - 1 : P + T - 1] / cfg.temperature).double()
    lp = z.gather(-1, ids[:, P:].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, -1)
    mb = dict(input_ids=ids, attention_mask=attention_mask, response_ids=ids[:, P:].clone(),
              response_mask=response_mask,
              logprobs_old=lp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64),
              values_old=values[:, P - 1 : P + T - 1].double() + 0.3 * torch.randn(B, T, generator=g,
                                                                                dtype=torch.float64),
              advantages=torch.randn(B, T, generator=g, dtype=torch.float64),
              returns=torch.randn(B, T, generator=g, dtype=torch.float64), prompt_length=P)
    m = response_mask.bool()
    if junk == "public":
        for k, j in (("logprobs_old", 1234.5), ("values_old", -77.0), ("advantages", 1234.5), ("returns", 9.0)):
            mb[k] = torch.where(m, mb[k], torch.full_like(mb[k], j))
    elif junk == "large":
        for k, j in (("logprobs_old", -1e4), ("values_old", 1e30), ("advantages", -1e30), ("returns", 1e30)):
            mb[k] = torch.where(m, mb[k], torch.full_like(mb[k], j))
    return mb


def ref_ex5(model, mb, cfg):
    """The reference metrics and (loss / grad_accum_steps) gradients, float64, token by token."""
    model.zero_grad(set_to_none=True)
    P = mb["prompt_length"]
    T = mb["response_ids"].shape[1]
    logits, values = model(mb["input_ids"], mb["attention_mask"])
    z = logits[:, P - 1 : P + T - 1].double() / cfg.temperature
    v = values[:, P - 1 : P + T - 1].double()
    mask = mb["response_mask"].bool()
    pos = real_positions(mask)
    n = len(pos)
    pol, val, ent, kl = [], [], [], []
    pcf = vcf = 0
    eps, c = cfg.clip_ratio, cfg.clip_range_value
    for b, t in pos:
        zz = z[b, t]
        shift = zz.max().detach()
        lse = torch.log(torch.exp(zz - shift).sum()) + shift
        lp_new = zz[mb["response_ids"][b, t]] - lse
        p = torch.exp(zz - lse)
        ent.append(lse - (p * zz).sum())
        o, A = float(mb["logprobs_old"][b, t]), float(mb["advantages"][b, t])
        r = torch.exp(lp_new - o)
        u, cl = -A * r, -A * torch.clamp(r, 1 - eps, 1 + eps)
        pol.append(torch.maximum(u, cl))
        pcf += bool(cl > u)
        kl.append(o - lp_new.item())
        vo, R = float(mb["values_old"][b, t]), float(mb["returns"][b, t])
        vclip = vo + torch.clamp(v[b, t] - vo, -c, c)
        e1, e2 = (v[b, t] - R) ** 2, (vclip - R) ** 2
        val.append(torch.maximum(e1, e2))
        vcf += bool(e2 > e1)
    policy_loss = torch.stack(pol).sum() / n
    value_loss = 0.5 * torch.stack(val).sum() / n
    entropy_loss = -torch.stack(ent).sum() / n
    loss = policy_loss + cfg.vf_coeff * value_loss + cfg.entropy_coeff * entropy_loss
    (loss / cfg.grad_accum_steps).backward()
    grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    metrics = {"loss/policy": policy_loss.item(), "loss/value": value_loss.item(), "loss/entropy": entropy_loss.item(),
               "loss/total": loss.item(), "stats/policy_clipfrac": pcf / n, "stats/value_clipfrac": vcf / n,
               "stats/approx_kl": math.fsum(kl) / n}
    return metrics, grads


def check_ex5():
    print("\n=============== exercise 5: PolicyWithValueHead(tiny_llama(32, 16, 1)).double() ===============")
    base = PolicyWithValueHead(tiny_llama(vocab_size=32, hidden_size=16, num_layers=1)).double()
    with torch.no_grad():  # a non-zero value head, so that the value loss has a gradient path of its own
        base.value_head.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    settings = [
        SimpleNamespace(temperature=0.7, clip_ratio=0.2, clip_range_value=0.2, vf_coeff=0.5, entropy_coeff=0.01,
                        grad_accum_steps=2, max_grad_norm=1.0),
        SimpleNamespace(temperature=1.3, clip_ratio=0.1, clip_range_value=0.05, vf_coeff=0.1, entropy_coeff=0.1,
                        grad_accum_steps=3, max_grad_norm=100.0),
    ]
    lr = 0.1
    cols = KEYS + ["grads (1st call)", "stats/grad_norm", "params after step", "grads after step", "finite-guard"]
    for junk in ("public", "large"):
        accs = {name: {c: Acc() for c in cols if c != "finite-guard"} for name in MODULES}
        guard = {name: "" for name in MODULES}
        all_metrics = {name: [] for name in MODULES}
        errors = {name: set() for name in MODULES}
        for si, cfg in enumerate(settings):
            for seed in range(3):
                mb = make_ex5_case(base, cfg, 100 * si + seed, junk)
                ref_metrics, ref_grads = ref_ex5(base, mb, cfg)
                # reference for 2 accumulating calls, then the clipped SGD step (torch's clip semantics)
                acc_grads = [2 * g for g in ref_grads]
                norm = math.sqrt(math.fsum(float((g ** 2).sum()) for g in acc_grads))
                coef = min(1.0, cfg.max_grad_norm / (norm + 1e-6))
                ref_params = [p.detach() - lr * coef * g for p, g in zip(base.parameters(), acc_grads)]
                for name, mod in MODULES.items():
                    model = copy.deepcopy(base)
                    opt = torch.optim.SGD(model.parameters(), lr=lr)
                    try:
                        m1 = mod.ppo_minibatch_update(model, opt, mb, cfg, False)
                        g1 = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                              for p in model.parameters()]
                        m2 = mod.ppo_minibatch_update(model, opt, mb, cfg, True)
                    except Exception as exc:
                        errors[name].add(f"{type(exc).__name__}: {exc}"[:120])
                        continue
                    a = accs[name]
                    for k in KEYS:
                        a[k].add(m1[k], ref_metrics[k])
                    a["grads (1st call)"].add(torch.cat([g.flatten() for g in g1]),
                                              torch.cat([g.flatten() for g in ref_grads]))
                    a["stats/grad_norm"].add(m2.get("stats/grad_norm", math.nan), norm)
                    a["params after step"].add(torch.cat([p.detach().flatten() for p in model.parameters()]),
                                               torch.cat([p.flatten() for p in ref_params]))
                    left = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                                      for p in model.parameters()])
                    a["grads after step"].add(left, torch.zeros_like(left))
                    all_metrics[name].append(m1)
            # non-finite gradient: the step must be skipped
            mb = make_ex5_case(base, settings[0], 999, junk)
            mb["advantages"] = torch.full_like(mb["advantages"], math.inf)
            for name, mod in MODULES.items():
                model = copy.deepcopy(base)
                opt = torch.optim.SGD(model.parameters(), lr=lr)
                before = [p.detach().clone() for p in model.parameters()]
                try:
                    m = mod.ppo_minibatch_update(model, opt, mb, settings[0], True)
                except Exception as exc:
                    errors[name].add(f"inf advantages: {type(exc).__name__}: {exc}"[:120])
                    continue
                same = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
                zeroed = all(p.grad is None or bool((p.grad == 0).all()) for p in model.parameters())
                guard[name] = (f"gn={m.get('stats/grad_norm')} "
                               f"{'kept' if same else 'MOVED'} {'zeroed' if zeroed else 'NOT-ZEROED'}")
        rows = {}
        for name in MODULES:
            rows[name] = dict(accs[name])
            rows[name]["finite-guard"] = guard[name]
        what = ("logprobs_old 1234.5, values_old -77, advantages 1234.5, returns 9 (like the public test)"
                if junk == "public" else "logprobs_old -1e4, values_old 1e30, advantages -1e30, returns 1e30")
        print(f"\njunk in padding: {what}; {len(settings) * 3} minibatches (B=4, P=5, T=6, one empty response); "
              f"cells: max abs / max rel diff vs the float64 reference")
        table("exercise 5: metrics", KEYS, rows)
        table("exercise 5: gradients, grad norm, step, zero_grad, non-finite guard (inf advantages)",
              ["grads (1st call)", "stats/grad_norm", "params after step", "grads after step", "finite-guard"], rows)
        # spread among the correct files
        correct = [n for n in MODULES if n.startswith("correct_")]
        spread = {}
        for k in KEYS:
            worst = 0.0
            for i in range(len(all_metrics[correct[0]])):
                vals = [all_metrics[n][i][k] for n in correct if len(all_metrics[n]) > i]
                worst = max(worst, max(vals) - min(vals))
            spread[k] = worst
        print("  largest spread (max - min) of each metric among the correct files: "
              + ", ".join(f"{k}={v:.2e}" for k, v in spread.items()))
        for name, errs in errors.items():
            for e in sorted(errs):
                print(f"  raised: {name}: {e}")


def main():
    import time
    start = time.time()
    print("files:", ", ".join(MODULES))
    for scenario in SCENARIOS:
        check_ex1_to_4(scenario)
        print(f"[{time.time() - start:.0f} s]", flush=True)
    print("\n=============== output dtypes seen (exercise, input dtype) ===============")
    for name, seen in DTYPE_SEEN.items():
        print(f"  {name:28s} " + "; ".join(f"{k}->{'/'.join(sorted(v))}" for k, v in sorted(seen.items())))
    print("\n=============== gradient-status violations (loss without grad, metric or GAE output with grad) ===")
    for name, issues in GRAD_STATUS.items():
        print(f"  {name:28s} {len(issues)} {sorted(set(issues)) if issues else ''}")
    check_clip_equivalences()
    print(f"[{time.time() - start:.0f} s]", flush=True)
    check_ex5()
    print(f"[{time.time() - start:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
