"""Self-test of the submission corpus (tests/corpus.py), independent of the grader.

* Every variant renders, every ``old`` occurs exactly once, every rendered module compiles.
* Structure: a mutant changes only its own exercise's function; an attack on exercise k leaves
  the other four functions intact; an import-time attack leaves all five intact (but one).
* Mutants (imported from a temp file; attacks are NEVER imported) differ from the solution on
  their own exercise on concrete deterministic inputs and match it on the other exercises
  (1-4; exercise 5 runs the module's own exercises 1-3, so only ex-5 mutants are checked there).
* Alternatives match the solution on all five exercises.
"""

from __future__ import annotations

import ast
import copy
import functools
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
from assignment.trainer.impl import load_module  # noqa: E402
from corpus import ALTERNATIVES, ATTACKS, EXERCISE_NAMES, MUTANTS, Variant, render  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# ----------------------------------------------------------------------------------------------
# Static checks
# ----------------------------------------------------------------------------------------------

def test_counts_and_names():
    assert len(MUTANTS) >= 30
    assert len(ALTERNATIVES) >= 5
    names = [v.name for v in corpus.ALL]
    assert len(names) == len(set(names)), "variant names must be unique"
    for v in corpus.ALL:
        assert v.name.isidentifier() and v.name == v.name.lower(), v.name
        assert v.why.strip(), v.name
        assert v.edits, v.name
    assert all(1 <= v.exercise <= 5 for v in MUTANTS)
    assert all(v.exercise == 0 for v in ALTERNATIVES)
    assert all(0 <= v.exercise <= 5 for v in ATTACKS)
    for k in range(1, 6):
        assert sum(v.exercise == k for v in MUTANTS) >= 4, f"too few mutants for exercise {k}"


@pytest.mark.parametrize("v", corpus.ALL, ids=lambda v: v.name)
def test_renders_and_compiles(v: Variant):
    src = corpus.solution_source()
    for old, _ in v.edits:
        assert src.count(old) == 1, f"{v.name}: an old text does not occur exactly once: {old[:80]!r}"
    text = render(v)
    assert text != src
    compile(text, f"<{v.name}>", "exec")


def test_render_rejects_ambiguous_or_missing_edit():
    with pytest.raises(ValueError):
        render(Variant("bad", 0, "x", (("this text is nowhere in the file", ""),)))
    with pytest.raises(ValueError):
        render(Variant("bad", 0, "x", (("torch", "torch"),)))


def _function_dumps(source: str) -> tuple[dict[str, str], list[str]]:
    funcs, rest = {}, []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            funcs[node.name] = ast.dump(node)
        else:
            rest.append(ast.dump(node))
    return funcs, rest


@pytest.mark.parametrize("v", MUTANTS + ATTACKS, ids=lambda v: v.name)
def test_confined_to_its_exercise(v: Variant):
    sol_funcs, sol_rest = _function_dumps(corpus.solution_source())
    funcs, rest = _function_dumps(render(v))
    if v in MUTANTS:
        assert rest == sol_rest, "a mutant must not touch module-level code"
    if v.exercise == 0:
        if v.name == "attack_copy_reference_import":  # its bodies are blank on purpose
            assert all(funcs[n] != sol_funcs[n] for n in EXERCISE_NAMES)
        else:
            assert all(funcs[n] == sol_funcs[n] for n in EXERCISE_NAMES)
        return
    own = EXERCISE_NAMES[v.exercise - 1]
    assert funcs[own] != sol_funcs[own]
    # the leak attack records in exercise 1 what it shows in exercise 2
    accomplices = {"attack_leak_hidden_inputs": {EXERCISE_NAMES[0]}}.get(v.name, set())
    for n in EXERCISE_NAMES:
        if n != own and n not in accomplices:
            assert funcs[n] == sol_funcs[n], f"{v.name} changes {n}"


# ----------------------------------------------------------------------------------------------
# Loading (mutants and alternatives only)
# ----------------------------------------------------------------------------------------------

def _load(source: str, tmp_dir: Path, name: str):
    path = tmp_dir / f"{name}.py"
    path.write_text(source)
    return load_module(path)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus")
    modules = {"__solution__": _load(corpus.solution_source(), tmp, "solution")}
    for v in MUTANTS + ALTERNATIVES:
        modules[v.name] = _load(render(v), tmp, v.name)
    return modules


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------

def _mask(lengths, T, dtype=torch.float32):
    return (torch.arange(T).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(dtype)


def _junk(x, mask, value):
    """x with ``value`` at padded positions (x: (B, T) or (B, T, V))."""
    pad = ~mask.bool()
    if x.dim() == 3:
        pad = pad.unsqueeze(-1).expand_as(x)
    return torch.where(pad, torch.as_tensor(value, dtype=x.dtype), x)


def _ex1_cases():
    g = torch.Generator().manual_seed(1)
    cases = []
    for lengths, junk, mask_dtype, adv_dtype in [([6, 3, 0, 1], 50.0, torch.float32, torch.float32),
                                                 ([6, 3, 0, 1], float("nan"), torch.bool, torch.float32),
                                                 ([2, 5, 4], float("inf"), torch.float32, torch.float32),
                                                 ([7, 3, 0, 5], 1.0, torch.int64, torch.float64)]:
        B, T = len(lengths), 7
        m = _mask(lengths, T, mask_dtype)
        new = -3.0 * torch.rand(B, T, generator=g)
        old = new + 0.4 * torch.randn(B, T, generator=g)
        adv = torch.randn(B, T, generator=g).to(adv_dtype)
        cases.append(dict(logprobs_new=_junk(new, m, junk), logprobs_old=_junk(old, m, -junk),
                          advantages=_junk(adv, m, junk), response_mask=m, clip_ratio=0.2))
    # Real log-probs near -110, which a long response's rare tokens reach: exp of them is 0 in
    # float32 (below -103.3), so only exp(new - old) keeps the ratio, never exp(new) / exp(old).
    m = _mask([5, 2, 0], 6, torch.bool)
    new = -110.0 - 3.0 * torch.rand(3, 6, generator=g)
    old = new + 0.4 * torch.randn(3, 6, generator=g)
    cases.append(dict(logprobs_new=_junk(new, m, -300.0), logprobs_old=_junk(old, m, -300.0),
                      advantages=_junk(torch.randn(3, 6, generator=g), m, 50.0), response_mask=m, clip_ratio=0.2))
    return cases


def _ex2_cases():
    g = torch.Generator().manual_seed(2)
    cases = []
    for lengths, junk, c, dtype in [([6, 3, 0, 1], 50.0, 0.2, torch.float32),
                                    ([6, 3, 0, 1], float("nan"), 0.2, torch.float32),
                                    ([2, 5, 4], float("inf"), 0.5, torch.float32),
                                    ([6, 6, 2], 2.0, 0.1, torch.float64)]:
        B, T = len(lengths), 6
        m = _mask(lengths, T)
        old = torch.randn(B, T, generator=g)
        new = old + 0.3 * torch.randn(B, T, generator=g)
        ret = (old + torch.randn(B, T, generator=g)).to(dtype)
        cases.append(dict(values_new=_junk(new, m, junk), values_old=_junk(old, m, -junk),
                          returns=_junk(ret, m, junk), response_mask=m, clip_range_value=c))
    return cases


def _ex3_cases():
    g = torch.Generator().manual_seed(3)
    cases = []  # (kwargs, atol): the contract's formula cancels catastrophically for huge logits
    for lengths, scale, junk, dtype, atol in [([5, 2, 0, 3], 3.0, 1e4, torch.float32, 1e-6),
                                              ([5, 2, 0, 3], 3.0, float("nan"), torch.float32, 1e-6),
                                              ([4, 4, 1], 1e3, float("inf"), torch.float32, 1e-3),
                                              ([5, 2, 0, 3], 10.0, 7.0, torch.bfloat16, 1e-5)]:
        B, T, V = len(lengths), 5, 11
        m = _mask(lengths, T)
        z = (scale * torch.randn(B, T, V, generator=g)).to(dtype)
        cases.append((dict(logits=_junk(z, m, junk), response_mask=m), atol))
    return cases


def _ex4_cases():
    g = torch.Generator().manual_seed(4)
    cases = []
    for lengths, junk, gamma, lam in [([6, 3, 0, 2], 30.0, 0.9, 0.8),
                                      ([6, 3, 0, 2], float("nan"), 1.0, 0.95),
                                      ([4, 6, 1, 5], -5.0, 0.7, 1.0),
                                      ([1, 1, 0, 9], 2.0, 0.99, 0.95)]:
        B, T = len(lengths), max(lengths) + 1
        m = _mask(lengths, T, torch.bool if gamma == 0.99 else torch.float32)
        cases.append(dict(final_rewards=2.0 * torch.randn(B, generator=g),
                          kl_penalties=_junk(0.1 * torch.randn(B, T, generator=g), m, junk),
                          values=_junk(torch.randn(B, T, generator=g), m, junk),
                          response_mask=m, gamma=gamma, lam=lam))
    # A row as long as the batch (no padding after it): its last token sits at T - 1, the one
    # position a loop over reversed(range(T - 1)) never computes.
    m = _mask([5, 3, 0], 5, torch.bool)
    cases.append(dict(final_rewards=2.0 * torch.randn(3, generator=g), kl_penalties=_junk(0.1 * torch.randn(3, 5, generator=g), m, 3.0),
                      values=_junk(torch.randn(3, 5, generator=g), m, 3.0), response_mask=m, gamma=0.9, lam=0.8))
    return cases


# ----------------------------------------------------------------------------------------------
# Running and comparing
# ----------------------------------------------------------------------------------------------

def _fresh(kwargs):
    """Clones of the tensor arguments, so that calls never share inputs."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def _call(fn, kwargs, grad_arg=None):
    """Run fn on fresh inputs; return its outputs (+ the gradient wrt grad_arg), or ('error', ...)."""
    kw = _fresh(kwargs)
    if grad_arg is not None:
        kw[grad_arg] = kw[grad_arg].detach().requires_grad_(True)
    try:
        out = fn(**kw)
        outs = list(out) if isinstance(out, tuple) else [out]
        if grad_arg is not None:
            loss = outs[0]
            if isinstance(loss, torch.Tensor) and loss.requires_grad:
                loss.backward()
            outs.append(kw[grad_arg].grad)
        return outs
    except Exception as e:  # a crash counts as a difference
        return ("error", repr(e))


def _values_close(a: torch.Tensor, b: torch.Tensor, rtol, atol) -> bool:
    a64, b64 = a.detach().double(), b.detach().double()
    return bool(torch.isclose(a64, b64, rtol=rtol, atol=atol, equal_nan=True).all())


def _agree(a, b, sel=None, rtol=1e-5, atol=1e-6) -> bool:
    """Same type, dtype, shape, requires_grad and values (on the selection ``sel`` if given)."""
    if isinstance(a, tuple) and a and a[0] == "error" or isinstance(b, tuple) and b and b[0] == "error":
        return a == b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_agree(x, y, sel, rtol, atol) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_agree(a[k], b[k], sel, rtol, atol) for k in a)
    if isinstance(a, torch.Tensor):
        if type(a) is not type(b) or a.dtype != b.dtype or a.shape != b.shape or a.requires_grad != b.requires_grad:
            return False
        if sel is not None and a.shape[:2] == sel.shape:
            a, b = a[sel], b[sel]
        return _values_close(a, b, rtol, atol)
    if isinstance(a, float):
        return type(b) is float and (math.isclose(a, b, rel_tol=rtol, abs_tol=atol) or (math.isnan(a) and math.isnan(b)))
    return a == b


def _results(module, exercise):
    """[(outputs, selection of real tokens, atol)] of ``module``'s exercise 1-5 on its input cases."""
    if exercise == 1:
        return [(_call(module.compute_policy_loss, kw, "logprobs_new"), kw["response_mask"].bool(), 1e-6)
                for kw in _ex1_cases()]
    if exercise == 2:
        return [(_call(module.compute_value_loss, kw, "values_new"), kw["response_mask"].bool(), 1e-6)
                for kw in _ex2_cases()]
    if exercise == 3:
        return [(_call(module.compute_entropy_loss, kw, "logits"), kw["response_mask"].bool(), atol)
                for kw, atol in _ex3_cases()]
    if exercise == 4:
        return [(_call(module.compute_gae_advantages, kw), kw["response_mask"].bool(), 1e-5)
                for kw in _ex4_cases()]
    if exercise == 5:
        return [(_ex5_trace(module), None, 1e-6)]
    raise ValueError(exercise)


def _same_results(r1, r2, rtol=1e-5, atol=None) -> bool:
    """Agreement within rtol (and each case's atol, unless ``atol`` is given). A mutant must
    differ beyond rtol = 1e-4, a hundred times float32's relative rounding."""
    return all(_agree(a, b, sel, rtol=rtol, atol=case_atol if atol is None else atol)
               for (a, sel, case_atol), (b, _, _) in zip(r1, r2))


# ----------------------------------------------------------------------------------------------
# Exercise 5 harness: a tiny Llama with a value head, SGD, two accumulation steps
# ----------------------------------------------------------------------------------------------

def _one_thread(fn):
    """Run the tiny model on one thread: much faster than intra-op parallelism at this size."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        old = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(old)
    return wrapper


@_one_thread
def _build_ex5():
    """Fill _EX5 with the base model and the scenarios (idempotent)."""
    if _EX5:
        return
    from assignment.helpers import logprobs_from_logits
    from assignment.model import PolicyWithValueHead, tiny_llama

    V, B, P, T = 64, 3, 4, 5
    # float64: correct alternatives differ here by rounding only (Categorical's entropy against the
    # contract's formula), which float32 SGD steps amplified to the comparison's tolerance.
    model = PolicyWithValueHead(tiny_llama(vocab_size=V, hidden_size=32, num_layers=2, seed=0)).double()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # a non-zero value head, so that the values (and their gradients) are not trivial
        model.value_head.weight.copy_(0.5 * torch.randn(model.value_head.weight.shape, generator=g))
        model.value_head.bias.fill_(0.1)

    def minibatch(prompt_lengths, response_lengths, temperature, bad_returns=False):
        rmask = _mask(response_lengths, T)
        pmask = (torch.arange(P).unsqueeze(0) >= P - torch.tensor(prompt_lengths).unsqueeze(1)).float()
        prompt_ids = torch.randint(1, V, (B, P), generator=g) * pmask.long()
        response_ids = torch.randint(1, V, (B, T), generator=g) * rmask.long()
        input_ids = torch.cat([prompt_ids, response_ids], dim=1)
        attention_mask = torch.cat([pmask, rmask], dim=1).long()
        with torch.no_grad():
            logits, values = model(input_ids, attention_mask)
            lp = logprobs_from_logits(logits[:, P - 1:P + T - 1] / temperature, response_ids)
            vals = values[:, P - 1:P + T - 1]
        returns = vals + torch.randn(B, T, generator=g)
        if bad_returns:
            returns[0, 0] = float("inf")
        return {
            "input_ids": input_ids, "attention_mask": attention_mask,
            "response_ids": response_ids, "response_mask": rmask,
            "logprobs_old": _junk(lp + 0.3 * torch.randn(B, T, generator=g), rmask, -20.0),
            "values_old": _junk(vals + 0.3 * torch.randn(B, T, generator=g), rmask, 9.0),
            "advantages": _junk(torch.randn(B, T, generator=g), rmask, 3.0),
            "returns": _junk(returns, rmask, 4.0),
            "prompt_length": P,
        }

    temperature = 0.7
    mb1 = minibatch([4, 2, 3], [5, 3, 1], temperature)
    mb2 = minibatch([1, 4, 2], [2, 5, 0], temperature)
    mb_bad = minibatch([4, 2, 3], [5, 3, 1], temperature, bad_returns=True)

    def cfg(max_grad_norm):
        return SimpleNamespace(temperature=temperature, clip_ratio=0.2, clip_range_value=0.2, vf_coeff=0.1,
                               entropy_coeff=0.05, grad_accum_steps=2, max_grad_norm=max_grad_norm)

    scenarios = [
        ("accumulate", cfg(1e6), [(mb1, False), (mb2, True), (mb1, False), (mb2, True)]),
        ("clip", cfg(0.05), [(mb1, False), (mb2, True)]),
        ("nonfinite", cfg(1.0), [(mb_bad, True), (mb1, True)]),
    ]
    _EX5["model"], _EX5["scenarios"] = model, scenarios


_EX5: dict = {}


@_one_thread
def _ex5_trace(module):
    """Everything observable over the scenarios: metrics, parameters and gradients after each call."""
    _build_ex5()
    trace = []
    for _, cfg, calls in _EX5["scenarios"]:
        model = copy.deepcopy(_EX5["model"])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for mb, step in calls:
            batch = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in mb.items()}
            try:
                metrics = module.ppo_minibatch_update(model, optimizer, batch, cfg, step)
            except Exception as e:
                metrics = ("error", repr(e))
            with torch.no_grad():
                params = torch.cat([p.detach().flatten() for p in model.parameters()])
                grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten()
                                   for p in model.parameters()])
            trace.append([metrics, params, grads])
    return trace


# ----------------------------------------------------------------------------------------------
# Behavioural checks
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def solution_results(loaded):
    sol = loaded["__solution__"]
    return {k: _results(sol, k) for k in range(1, 6)}


@pytest.mark.parametrize("v", MUTANTS, ids=lambda v: v.name)
def test_mutant_differs_on_its_exercise_only(v: Variant, loaded, solution_results):
    module = loaded[v.name]
    assert not _same_results(_results(module, v.exercise), solution_results[v.exercise], rtol=1e-4), \
        f"{v.name} is indistinguishable from the solution on exercise {v.exercise}"
    for k in range(1, 5):
        if k != v.exercise:  # the same code as the solution's: the same numbers, exactly
            assert _same_results(_results(module, k), solution_results[k], rtol=0.0, atol=0.0), \
                f"{v.name} differs on exercise {k}"


# Alternatives are correct by their own derivation; that the grader and the public tests accept
# them, at tolerances derived from float32 arithmetic, is tested in test_grader.py and below.


def test_solution_agrees_with_itself(loaded, solution_results):
    """Guards the harness: reruns are deterministic and the ex-5 scenarios do what they claim."""
    sol = loaded["__solution__"]
    for k in range(1, 6):
        assert _same_results(_results(sol, k), solution_results[k], rtol=0.0)
    trace = solution_results[5][0][0]
    (acc1, acc2, acc3, acc4, clip1, clip2, bad, after_bad) = trace
    assert "stats/grad_norm" not in acc1[0] and "stats/grad_norm" in acc2[0]
    assert not torch.equal(acc1[1], acc2[1])  # it stepped
    assert clip2[0]["stats/grad_norm"] > 0.05  # clipping was active
    initial = torch.cat([p.detach().flatten() for p in _EX5["model"].parameters()])
    assert not math.isfinite(bad[0]["stats/grad_norm"])
    assert torch.equal(bad[1], initial)  # no step on a non-finite norm
    assert not torch.equal(after_bad[1], initial)


# ----------------------------------------------------------------------------------------------
# The public tests are as strong as the grader where that gives nothing away: a student rarely
# meets a grader failure that `pytest tests/public` did not show first.
# ----------------------------------------------------------------------------------------------

_PUBLIC_DRIVER = """
import gc, json, sys, pytest

class Failures:
    def __init__(self):
        self.messages = []
    def pytest_runtest_logreport(self, report):
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            self.messages.append(crash.message if crash else str(report.longrepr))

found = {}
for path in sys.argv[1:]:
    failures = Failures()
    pytest.main(["-q", "-p", "no:cacheprovider", "--no-header", "-o", "addopts=", "tests/public", "--impl", path],
                plugins=[failures])
    found[path] = failures.messages
    # Each session ends with gc.collect() (pytest's unraisable-exception check, after every test
    # report), which walked all ~390,000 objects of torch and the loaded tests again: half of each
    # run's time. What outlives a run is imported code, not garbage; frozen, the next runs' collections
    # skip it. The reports, the failures counted here, are the same.
    gc.freeze()
print("MESSAGES " + json.dumps(found))
"""

@pytest.mark.slow
def test_public_tests_fail_every_mutant_and_pass_every_correct_file_and_name_no_other_mistake(tmp_path):
    """The public tests fail every mutant and pass every correct file; no failure message names
    another mistake than the mutant's (corpus.misled), and the cases reported in them
    (corpus.REPORTED) are named by their own phrase."""
    import json
    import subprocess

    files = {}
    mutants = MUTANTS + corpus.PART2_MUTANTS
    for v in mutants + ALTERNATIVES + corpus.PART2_ALTERNATIVES:
        files[v.name] = tmp_path / f"{v.name}.py"
        files[v.name].write_text(render(v))
    for path in sorted((ROOT / "tests" / "submissions").glob("correct_*.py")):
        files[path.stem] = path
    proc = subprocess.run([sys.executable, "-c", _PUBLIC_DRIVER, *map(str, files.values())], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    found = json.loads(proc.stdout.split("MESSAGES ")[-1])
    messages = {name: found[str(path)] for name, path in files.items()}
    assert not [v.name for v in mutants if not messages[v.name]], "the public tests miss these mutants"
    assert not [n for n in messages if n not in {v.name for v in mutants} and messages[n]], \
        "the public tests reject correct files"
    misleading = {v.name: [m for m in messages[v.name] if corpus.misled(v, m)] for v in mutants}
    assert not {name: wrong for name, wrong in misleading.items() if wrong}
    reported = [name for name, channel in corpus.REPORTED.items() if channel == "public"]
    unnamed = [name for name in reported if not any(corpus.by_name(name).hint in m for m in messages[name])]
    assert not unnamed, {name: messages[name] for name in unnamed}


def test_the_exercises_a_variant_edits_are_found_where_its_edits_are():
    """corpus.exercises_edited, which lets the grader tests grade an alternative on the exercises it
    changes alone: every mutant's edits lie in the exercise it must lose points on, and two
    alternatives edit what their names say."""
    for v in MUTANTS + corpus.PART2_MUTANTS:
        assert corpus.exercises_edited(v) == {v.exercise}, v.name
    assert corpus.exercises_edited(corpus.by_name("alt_vectorized_gae")) == {4}
    assert corpus.exercises_edited(corpus.by_name("alt_float32_everywhere")) == {1, 2, 3, 4, 5}
