"""The scorer registry (scorers.SCORERS) against every place that reads it, and SCORERS.md's steps for adding a
scorer checked by construction: every registry scorer has its branch in each kernels_math.py helper that its flags
reach (each helper run under the interpreter with its flags), every registry-derived test table covers every scorer
(re-weighted where its rows sum to one), the one scorer table of README.md and of SCORERS.md lists the registry,
and a special case of a scorer is one entry that runs everywhere its parent does."""
import dataclasses
import importlib.util
import inspect
import math
import os
import re

import pytest
import torch
import triton
import triton.language as tl

import kernels_cpu
import kernels_math
import model
from cases import cases, model_variants
from kernels_math import _grad_factor, _keys, _logit, _prob_bwd, _row_setup, _terms
from scorers import SCORERS, Scorer, special_case

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = [b for b in model.BACKENDS if b != "auto"]


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_registry_agrees_with_config_model_train_kernels_flex_and_ptxas():
    from lib import config
    option_fields = {f for e in SCORERS.values() for prm in e.params for f in prm.fields()}
    config_fields = {f.name for f in dataclasses.fields(model.GPTConfig)}
    assert option_fields <= config_fields  # every option a Param names is a GPTConfig field ...
    scorer_fields = {f for f in config_fields if any(f.startswith(f"{name}_") for name in SCORERS)}
    assert scorer_fields == option_fields  # ... and each <scorer>_* field (a name may hold "_")
    assert set(config.SCORER_OPTIONS) == option_fields  # train.py's
    for name, entry in SCORERS.items():
        cfg = model.GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=8, scorer=name,
                              **{prm.only_if: True for prm in entry.params if prm.only_if})
        attn = model.GPT(cfg).transformer.h[0].attn
        own = {k for k, _ in [*attn.named_parameters(), *attn.named_buffers()] if not k.startswith(("c_", "fgate."))}
        assert hasattr(attn, "fgate") == entry.forget, name  # FoX's gate projection, only there
        assert own == {model.param_name(name, prm) for prm in entry.params}, name
        # a row template (its logit) or a path by hand: the CPU path and Triton (kernels_stick.py: no row template)
        assert "cpu" not in entry.backends or entry.logit is not None or kernels_cpu._fast(entry), name
        assert ("triton" not in entry.backends or entry.logit is None
                or tuple(entry.kernel_flags().values())[:4] in kernels_math.KERNELS), name
        assert ("flex" not in entry.backends or set(list(inspect.signature(entry.logit).parameters)[3:])
                == {prm.name for prm in entry.params} | {n for n, _ in entry.fixed}), name
        assert not (entry.p is not None and not entry.sums_to_one), name  # re-weighting needs normalised rows
    # no combination a registry scorer does not use
    assert kernels_math.KERNELS == {tuple(e.kernel_flags().values())[:4] for e in SCORERS.values()
                                    if "triton" in e.backends and e.logit is not None}
    ptxas = _load("bench/ptxas_report.py", "ptxas_report")
    assert {name.split("_pass")[0] for _, name, _ in ptxas.VARIANTS} == {n for n, e in SCORERS.items()
                                                                          if "triton" in e.backends}


# ----------------------------------------------------------------------------------------------------------------
# Every kernel helper has its branch for every scorer's flags: each run alone, under the interpreter

HELPERS = ("_row_setup", "_keys", "_logit", "_terms", "_prob_bwd", "_grad_factor")
REQUIRED = ("_row_setup", "_keys", "_logit", "_grad_factor")  # _terms and _prob_bwd have a default


@triton.jit
def _one_helper(QS, KS, OUT, HELPER: tl.constexpr, ROW: tl.constexpr, LOGIT: tl.constexpr,
                ONLINE_MAX: tl.constexpr, NORMALISE: tl.constexpr):
    t = tl.arange(0, 16)
    qk = (t[:, None] - t[None, :]).to(tl.float32) * 0.125  # scores of both signs and 0
    n_i = (t + 1).to(tl.float32)
    c = n_i * 0.0 + 0.3
    ks = n_i * 0.0 + 0.5
    m1 = n_i * 0.0 + 4.0
    if HELPER == "_row_setup":
        _, _, c1 = _row_setup(QS, t, t < 16, t, 0, 1.0, 0.5, 0.25, ROW)
        y = qk + c1[:, None]
    elif HELPER == "_keys":
        y = qk + _keys(KS, t, 16, ROW)[None, :]
    elif HELPER == "_logit":
        y = _logit(qk, c, ks, n_i, 0.25, 0.5, 1.5, LOGIT, tl.float32)
    elif HELPER == "_terms":
        num, den = _terms(qk, m1[:, None], LOGIT)
        y = num + den
    elif HELPER == "_prob_bwd":
        P, F = _prob_bwd(qk, qk, m1, 0.25, 0.5, 1.5, LOGIT, ONLINE_MAX, NORMALISE)
        y = P + F
    else:
        dP, W = _grad_factor(qk, qk, tl.exp2(qk - 4.0), qk, qk > -1.0, c, ks, m1, 0.25, 0.5, 1.5, LOGIT, True)
        y = dP + W
    tl.store(OUT + t[:, None] * 16 + t[None, :], y)


def _run_helper(helper, entry):
    out, slot = torch.empty(16, 16), torch.full((16,), 0.5)
    f = entry.kernel_flags()
    _one_helper[(1,)](slot, slot, out, HELPER=helper, ROW=f["ROW"], LOGIT=f["LOGIT"], ONLINE_MAX=f["ONLINE_MAX"],
                      NORMALISE=f["NORMALISE"])
    return out


ROW_TEMPLATE = [(name, h) for name, e in SCORERS.items() if "triton" in e.backends and e.logit is not None
                for h in HELPERS]


@pytest.mark.parametrize("scorer,helper", ROW_TEMPLATE, ids=[f"{s}-{h}" for s, h in ROW_TEMPLATE])
def test_every_kernel_helper_has_a_branch_for_every_registry_scorers_flags(scorer, helper):
    try:
        out = _run_helper(helper, SCORERS[scorer])
    except Exception as e:  # the helper's tl.static_assert, under the interpreter
        pytest.fail(f"{scorer}'s flags {SCORERS[scorer].kernel_flags()}: {e} (SCORERS.md, Adding a scorer, step 4)")
    assert torch.isfinite(out).all()


def test_a_new_entry_runs_its_own_math_on_cpu_and_is_kept_off_the_paths_keyed_by_kernel_flags(monkeypatch):
    # kernel_logit once defaulted to "linear": a new entry's cpu and Triton paths silently ran softmax; so did one
    # naming "linear" without triton (kernels_cpu.FAST) or listing sdpa (auto's pick on the CPU)
    import kernels_sdpa
    cube = lambda q, k, n_i, mask: (lambda w: w / w.sum(-1, keepdim=True))(  # (1 + relu z)^3, normalised
        (1 + (q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))).relu()) ** 3 * mask)
    entry = Scorer(cube, lambda z, ln_n, ln_d: 3 * torch.log1p(z.relu()))
    assert entry.backends == ("torch", "cpu", "flex") and kernels_cpu._fast(entry) is None
    monkeypatch.setitem(SCORERS, "cube", entry)
    q, k, v = torch.randn(3, 1, 2, 9, 16).unbind(0)
    ref = model.attention(q, k, v, "cube", backend="torch")
    assert (ref - model.attention(q, k, v, "softmax", backend="torch")).abs().max() > 1e-2
    torch.testing.assert_close(model.attention(q, k, v, "cube", backend="cpu"), ref)
    with pytest.raises(ValueError, match=r"the Scorer of <lambda> has kernel_logit None, backends \('torch', "
                       r"'triton'\): kernel_logit goes with triton \(SCORERS.md, Adding a scorer, step 4\)"):
        Scorer(cube, entry.logit, backends=("torch", "triton"))
    with pytest.raises(ValueError, match="Scorer of <lambda> has kernel_logit 'linear', backends .'torch', 'cpu'"):
        Scorer(cube, entry.logit, kernel_logit="linear")
    monkeypatch.setitem(SCORERS, "cube", dataclasses.replace(entry, backends=("torch", "sdpa", "cpu")))
    with pytest.raises(ValueError, match="scorer 'cube' lists backend 'sdpa', which runs only softmax's, ssmax's"):
        model.attention(q, k, v, "cube", backend="auto")
    with pytest.raises(ValueError, match="scorer 'cube' lists backend 'sdpa'"):
        importlib.reload(kernels_sdpa)  # a registry entry: at import


def test_a_param_named_as_an_attention_keyword_is_refused_at_import():
    import kernels, kernels_flex, kernels_sdpa, kernels_stick, scorers
    for name in ("p", "c", "offset", "backend", "chunk"):  # p=3.0 ran re-weighting silently, c was taken for fox's
        with pytest.raises(ValueError, match=f"the Scorer of score_ssa has a Param '{name}', a name attention"):
            dataclasses.replace(SCORERS["ssa"], params=(scorers.Param(name, 1.0),))
    takes = [model.attention, scorers.prepare, scorers.attention_weights, kernels.attention, kernels_cpu.attention,
             kernels_flex.flex_attention, kernels_sdpa.sdpa_attention, kernels_stick.attention, scorers.score_softmax]
    names = {n for f in takes for n, x in inspect.signature(f).parameters.items() if x.kind != x.VAR_KEYWORD}
    assert names | {"c"} == set(scorers.RESERVED)  # attention()'s and its backends' keywords, the reference's, fox's c


def test_a_learnable_parameter_without_kernel_gradient_sums_fails_its_backward_in_one_line(monkeypatch):
    import kernels
    from scorers import Param
    sig = SCORERS["sigmoid"]  # its flags, plus a parameter that kernels.py sums no gradient for
    logit = lambda z, ln_n, ln_d, n: sig.logit(n * z, ln_n, ln_d)
    monkeypatch.setitem(SCORERS, "sig_a", dataclasses.replace(sig, params=(Param("n", 1.0),), logit=logit))
    q, k, v = torch.randn(3, 1, 2, 5, 16).unbind(0)
    n = torch.ones(2, requires_grad=True)
    out = kernels.attention(q, k, v, "sig_a", n=n)
    with pytest.raises(RuntimeError, match="kernels.py sums no gradient for the learnable n of scorer 'sig_a': add it"):
        out.sum().backward()


def test_a_param_field_missing_from_gptconfig_is_one_line_naming_it(monkeypatch):
    from scorers import Param
    monkeypatch.setitem(SCORERS, "ssa", dataclasses.replace(SCORERS["ssa"], params=(Param("b", 1.0, init="ssa_c"),)))
    with pytest.raises(ValueError, match="scorer 'ssa' reads GPTConfig field ssa_c, which model.py's GPTConfig lacks"):
        model.GPTConfig(scorer="softmax")


@pytest.mark.parametrize("helper", HELPERS)
def test_a_flag_value_no_helper_knows_fails_in_the_helpers_that_need_a_branch(helper):
    new = dataclasses.replace(SCORERS["softmax"], row="new", kernel_logit="new", backends=("triton",))  # not on sdpa
    if helper not in REQUIRED:  # the template's default
        assert torch.isfinite(_run_helper(helper, new)).all()
        return
    with pytest.raises(Exception, match=f"kernels_math.{helper} has no branch"):
        _run_helper(helper, new)


# ----------------------------------------------------------------------------------------------------------------
# Every registry-derived test table covers every scorer, re-weighted where its rows sum to one

def _coverage(table, backend=None):
    """The scorers a table of (scorer, kw) or (scorer, p) rows misses: those `backend` runs, and re-weighting on
    those whose rows sum to one."""
    def p_of(row):
        return row[1].get("p") if isinstance(row[1], dict) else row[1]
    runs = {n for n, e in SCORERS.items() if backend is None or backend in e.backends}
    normalised = {n for n in runs if SCORERS[n].sums_to_one}
    seen = {row[0] for row in table}
    reweighted = {row[0] for row in table if p_of(row) is not None or SCORERS[row[0]].p is not None}
    return runs - seen, normalised - reweighted


def test_the_case_builders_cover_every_scorer_of_a_registry_with_more_scorers(off_by_one, stablemax):
    for backend in (None, *BACKENDS):
        assert _coverage(cases(backend), backend) == (set(), set()), backend
        for name, kw in cases(backend):  # every parameter off its default
            assert set(kw) - {"p", "c"} == {prm.name for prm in SCORERS[name].params}, name
    variants = model_variants()
    assert _coverage([(kw["scorer"], kw.get("reweight_p")) for kw in variants.values()]) == (set(), set())


def test_every_registry_derived_test_table_covers_every_scorer():
    test_scorers, test_kernels = _load("tests/test_scorers.py", "t_scorers"), _load("tests/test_kernels.py", "t_k")
    test_sdpa, test_compile = _load("tests/test_sdpa.py", "t_sdpa"), _load("tests/test_compile.py", "t_compile")
    tables = {"test_scorers.SCORER_CASES": (test_scorers.SCORER_CASES, None),
              "test_kernels.CASES": (test_kernels.CASES, "triton"),
              "test_kernels.FLEX": ([case for case, _ in test_kernels.FLEX], "flex"),
              "test_sdpa.CPU_CASES": (test_sdpa.CPU_CASES, "cpu"),
              "test_compile.FUSED": (test_compile.FUSED, "triton"),
              "cases.VARIANTS": ([(kw["scorer"], kw.get("reweight_p")) for kw in model_variants().values()], None)}
    for backend in ("torch", "cpu"):  # gradcheck in float64
        tables[f"test_scorers.GRAD_CASES {backend}"] = ([c[:2] for c in test_scorers.GRAD_CASES if c[2] == backend],
                                                        backend)
    for backend in ("triton", "auto"):  # one compiled graph (auto: every scorer)
        tables[f"test_compile.COMPILED {backend}"] = ([(s, p) for s, b, p in test_compile.COMPILED if b == backend],
                                                      None if backend == "auto" else backend)
    for name, (table, backend) in tables.items():
        assert _coverage(table, backend) == (set(), set()), name


# ----------------------------------------------------------------------------------------------------------------
# The one scorer table of README.md and of SCORERS.md

def _scorer_table(doc):
    """The rows of the doc's table whose header's first cell is `scorer`, as lists of cells."""
    lines = open(os.path.join(ROOT, doc), encoding="utf-8").read().splitlines()
    heads = [i for i, line in enumerate(lines) if re.match(r"\|\s*`?scorer`?\s*\|", line)]
    assert len(heads) == 1, f"{doc}: {len(heads)} scorer tables"
    rows = []
    for line in lines[heads[0] + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return [cell.strip() for cell in lines[heads[0]].split("|")[1:-1]], rows


@pytest.mark.parametrize("doc", ["README.md", "SCORERS.md"])
def test_the_scorer_table_of_each_doc_lists_the_registry_in_order(doc):
    header, rows = _scorer_table(doc)
    assert [row[0].strip("`") for row in rows] == list(SCORERS), doc
    if "backends" in header:  # README.md: the backends that run each scorer
        col = header.index("backends")
        for row in rows:
            assert re.findall(r"[a-z]+", row[col]) == list(SCORERS[row[0].strip("`")].backends), row[0]


# ----------------------------------------------------------------------------------------------------------------
# A special case: one entry with its parent's math (cases.STABLEMAX: ssa at b = n = 1)

def _stablemax_spec(q, k):  # Prieto et al. 2025: s(z) = z + 1 for z >= 0, 1 / (1 - z) below, normalised per row
    z = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    s = torch.where(z >= 0, z + 1, 1 / (1 - z.clamp(max=0))).tril()
    return s / s.sum(-1, keepdim=True)


def test_a_special_case_is_one_entry_that_runs_with_its_parents_math_everywhere_it_does(stablemax):
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 21, 16, generator=g, dtype=torch.float64) for _ in range(4))
    torch.testing.assert_close(model.attention_weights(q, k, stablemax), _stablemax_spec(q, k), rtol=1e-12, atol=0)
    entry, ssa = SCORERS[stablemax], SCORERS["ssa"]
    assert entry.kernel_flags() == ssa.kernel_flags() and entry.params == () and entry.fixed == (("b", 1.0), ("n", 1.0))
    one = dict(b=torch.ones(2, dtype=torch.float64), n=torch.ones(2, dtype=torch.float64))
    for backend in entry.backends:
        x = [t.to(torch.float32 if backend in ("triton", "flex") else torch.float64).clone() for t in (q, k, v)]
        x = [t.requires_grad_(backend != "flex") for t in x]  # flex's backward is CUDA-only
        out = model.attention(*x, stablemax, backend=backend)
        ref = model.attention(*(t.detach().double() for t in x), "ssa", **one)
        assert (out.double() - ref).abs().max() < (1e-5 if x[0].dtype == torch.float32 else 1e-12), backend
        if backend != "flex":
            grads = torch.autograd.grad(out, x, do.to(out.dtype))
            xr = [t.detach().double().requires_grad_() for t in x]
            refs = torch.autograd.grad(model.attention(*xr, "ssa", **one), xr, do)
            assert all((a.double() - b).abs().max() < 1e-4 for a, b in zip(grads, refs)), backend
    with pytest.raises(ValueError, match="scorer 'stablemax' has no parameter 'b'"):
        model.attention(q, k, v, stablemax, b=one["b"])
    gpt = model.GPT(model.GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=8, scorer=stablemax))
    assert gpt.transformer.h[0].attn.scorer_params() == {}  # nothing learns
    with pytest.raises(ValueError, match="option ssa_b_init=2.0 does not apply to scorer='stablemax'"):
        model.GPTConfig(scorer=stablemax, ssa_b_init=2.0)


def test_a_special_case_that_keeps_a_parents_param_shares_its_option_with_the_parent(monkeypatch):
    # ssa2 keeps ssa's b: GPTConfig(scorer="ssa", ssa_b_init=2.0) was refused "(only to ssa2)", one owner a field
    monkeypatch.setitem(SCORERS, "ssa2", special_case(SCORERS["ssa"], n=2.0))
    for scorer in ("ssa", "ssa2"):
        cfg = model.GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=8, scorer=scorer, ssa_b_init=2.0)
        torch.testing.assert_close(model.GPT(cfg).transformer.h[0].attn.scorer_params()["b"], torch.full((2,), 2.0))
    with pytest.raises(ValueError, match=r"ssa_b_init=2.0 does not apply to scorer='softmax' \(only to ssa, ssa2\)$"):
        model.GPTConfig(scorer="softmax", ssa_b_init=2.0)
