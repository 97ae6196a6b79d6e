"""The reference scorers (model.attention / attention_weights) against SCORERS.md, written here independently:
row by row, in float64, straight from the formulas, at an offset and chunked, finite at edge rows, scored in fp32
under bf16 autocast; every scorer's gradients against finite differences on the reference and the CPU path; the case
tables and helpers that tests/test_scorers_*.py share (re-weighting, each scorer's own properties) and that
test_registry.py checks against the registry."""
import math

import pytest
import torch

import kernels_cpu
import model
from cases import cases, ids, varied
from model import attention, attention_weights
from scorers import SCORERS

# (scorer, kw): every registry entry with its parameters varied and re-weighted where its rows sum to one
# (cases.cases), at its defaults, and with varied parameters and p = 15 at once; fox's c ("gates"): made by _t
SCORER_CASES = (cases() + [(name, {"c": "gates"} if e.forget else {}) for name, e in SCORERS.items() if e.params]
                + [(name, {**{prm.name: varied(prm, 2) for prm in e.params}, "p": 15.0}) for name, e in SCORERS.items()
                   if e.params and e.sums_to_one])
# every scorer's gradients on the reference and the CPU path, from the registry
GRAD_CASES = [(name, kw, backend) for backend in ("torch", "cpu") for name, kw in cases(backend)]


def _t(kw, like=None):
    """Lists as float64 tensors; c="gates": FoX's prefix sums of log forget gates for like's keys (B, H, Tk)."""
    out = {k: torch.tensor(v, dtype=torch.float64) if isinstance(v, list) else v for k, v in kw.items()}
    if out.get("c") == "gates":
        g = torch.Generator().manual_seed(7)
        out["c"] = torch.nn.functional.logsigmoid(torch.randn(like.shape[:3], generator=g, dtype=torch.float64) + 1)
        out["c"] = out["c"].cumsum(-1)
    return out


def spec_weights(q, k, scorer, p=None, offset=0, **params):
    """SCORERS.md, one row at a time (float64, no vectorisation tricks). The published scorers are written out here;
    a scorer added to the registry later is checked through its other form, its FlexAttention logits: the row
    template P = exp(logit) / (sum_j exp(den_logit or logit) + eps), or exp(logit) where rows are not divided."""
    entry = SCORERS[scorer]
    B, H, Tq, d = q.shape
    out = torch.zeros(B, H, Tq, k.shape[2], dtype=torch.float64)
    for bb in range(B):
        for h in range(H):
            prm = {**dict(entry.fixed), **{x.name: x.default if params.get(x.name) is None else float(params[x.name][h])
                                           for x in entry.params}}
            for t in range(Tq):
                i = offset + t
                n_i = i + 1
                qi, kj = q[bb, h, t].double(), k[bb, h, : i + 1].double()
                z = kj @ qi / math.sqrt(d)
                den = None  # the row's divisor, where not w's own sum
                if scorer == "softmax":
                    w = torch.exp(z - z.max())
                elif scorer == "fox":
                    x = z + params["c"][bb, h, i] - params["c"][bb, h, : i + 1]
                    w = torch.exp(x - x.max())
                elif scorer == "stickbreaking":  # keys j < i: sigmoid(z_j) prod_{j<k<i} (1 - sigmoid(z_k))
                    beta = torch.sigmoid(z)
                    w = torch.stack([beta[j] * torch.prod(1 - beta[j + 1:i]) for j in range(i)] + [z.new_zeros(())])
                elif scorer == "ssmax":
                    x = (prm["s"] * math.log(n_i) + prm["b"]) * z
                    w = torch.exp(x - x.max())
                elif scorer == "ssa":
                    w = (1 + prm["b"] * z.abs()) ** (torch.sign(z) * prm["n"])
                elif scorer == "sigmoid":
                    w = 1 / (1 + torch.exp(-(z - math.log(n_i))))
                elif scorer in ("lssa", "lssar"):
                    cos = (kj / kj.norm(dim=-1, keepdim=True)) @ (qi / qi.norm())
                    w = torch.nn.functional.softplus(math.log(d) * math.log(n_i) * cos)
                else:
                    score = (kj / kj.norm(dim=-1, keepdim=True)) @ (qi / qi.norm()) if entry.cosine else z
                    x, xd = (f(score, torch.tensor(math.log(n_i), dtype=torch.float64),
                               torch.tensor(math.log(d), dtype=torch.float64),
                               **{name: torch.tensor(val, dtype=torch.float64) for name, val in prm.items()})
                             for f in (entry.logit, entry.den_logit or entry.logit))
                    w, den = torch.exp(x), torch.exp(xd).sum() + entry.eps
                P = w / (w.sum() if den is None else den) if entry.row_sum else w  # sigmoid's are not normalised
                pp = entry.p if p is None else p
                if pp is not None:
                    o = 0.0 if i < 3 else 1.0
                    R = torch.relu(n_i * P - o)
                    if R.sum() > 0:
                        R = R / R.max()  # scaling a row does not change its normalised weights; avoids overflow
                        R = R ** pp
                        P = R / R.sum()
                out[bb, h, t, : i + 1] = P
    return out


def _qk(B=2, H=2, T=7, d=8, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(B, H, T, d, generator=g, dtype=torch.float64) * scale
    v = torch.randn(B, H, T, d, generator=g, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("scorer,kw", SCORER_CASES)
def test_weights_match_the_spec_rows_sum_to_one_and_future_is_zero(scorer, kw):
    q, k, v = _qk(T=9, scale=1.5)
    P = attention_weights(q, k, scorer, **_t(kw, k))
    torch.testing.assert_close(P, spec_weights(q, k, scorer, **_t(kw, k)), rtol=1e-9, atol=1e-12)
    if model.SCORERS[scorer].sums_to_one:  # sigmoid's rows are not (their sums: test_sigmoid_rows_...)
        torch.testing.assert_close(P.sum(-1), torch.ones(2, 2, 9, dtype=torch.float64))
    assert (P.triu(diagonal=1) == 0).all()
    torch.testing.assert_close(attention(q, k, v, scorer, **_t(kw, k)), P @ v)


@pytest.mark.parametrize("scorer,kw", SCORER_CASES)
def test_query_block_at_an_offset_gives_the_rows_of_the_full_computation(scorer, kw):
    q, k, v = _qk(T=11)
    full = attention(q, k, v, scorer, **_t(kw, k))
    for offset in (1, 4, 10):  # 10: decode, one query against a cache of 10 keys
        part = attention(q[:, :, offset:], k, v, scorer, offset=offset, **_t(kw, k))
        torch.testing.assert_close(part, full[:, :, offset:], rtol=1e-12, atol=1e-12)


def test_reference_chunking_equals_unchunked():
    q, k, v = _qk(T=13)
    for scorer in ("ssmax", "lssar"):
        torch.testing.assert_close(attention(q, k, v, scorer, chunk=4), attention(q, k, v, scorer, chunk=1024))


@pytest.mark.parametrize("scorer,kw", SCORER_CASES + [("lssar", dict(p=100.0)), ("softmax", dict(p=100.0))])
@pytest.mark.parametrize("case", ["T1", "equal", "huge"])
def test_edge_cases_are_finite(scorer, kw, case):
    if case == "T1":
        q, k, v = _qk(T=1)
    elif case == "equal":
        q, k, v = _qk(T=9)
        q = torch.zeros_like(q)
    else:  # |z| ~ 1e4
        q, k, v = _qk(T=9)
        q, k = q / q.norm(dim=-1, keepdim=True) * 300, k / k.norm(dim=-1, keepdim=True) * 300 * math.sqrt(8) / 9
    for dtype in (torch.float32, torch.float64):
        kwd = {key: (val.to(dtype) if torch.is_tensor(val) else val) for key, val in _t(kw, k).items()}
        P = attention_weights(q.to(dtype), k.to(dtype), scorer, **kwd)
        assert torch.isfinite(P).all()
        if model.SCORERS[scorer].sums_to_one:
            torch.testing.assert_close(P.sum(-1), torch.ones_like(P.sum(-1)))
        q2, k2, v2 = (x.to(dtype).requires_grad_() for x in (q, k, v))
        attention(q2, k2, v2, scorer, **kwd).square().sum().backward()
        assert all(torch.isfinite(x.grad).all() for x in (q2, k2, v2))


@pytest.mark.parametrize("scorer,kw,backend", GRAD_CASES,
                         ids=[f"{b}-{i}" for (_, _, b), i in zip(GRAD_CASES, ids([c[:2] for c in GRAD_CASES]))])
def test_gradients_match_finite_differences_in_float64(scorer, kw, backend, monkeypatch):
    monkeypatch.setattr(kernels_cpu, "CHUNK", 4)  # the CPU path: two query blocks
    q, k, v = _qk(B=1, H=2, T=6, d=4, seed=3)
    params = {key: val.requires_grad_() for key, val in _t(kw, k).items() if torch.is_tensor(val)}
    other = {key: val for key, val in _t(kw, k).items() if not torch.is_tensor(val)}
    names = list(params)

    def f(q, k, v, *ps):
        return attention(q, k, v, scorer, backend=backend, **dict(zip(names, ps)), **other)

    assert torch.autograd.gradcheck(f, (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), *params.values()))


def test_unknown_scorer_and_bad_offset_are_clear_errors():
    q, k, v = _qk()
    with pytest.raises(ValueError, match="unknown scorer 'sofmax'"):
        attention_weights(q, k, "sofmax")
    with pytest.raises(ValueError, match="unknown attention backend"):
        attention(q, k, v, "softmax", backend="cuda")
    with pytest.raises(AssertionError, match="offset"):
        attention(q[:, :, 2:], k, v, "softmax", offset=1)


def test_attention_weights_score_in_fp32_under_bf16_autocast():
    q, k, _ = (x.float() for x in _qk(T=9, d=16, seed=4))
    with torch.autocast("cpu", torch.bfloat16):  # autocast would run q @ k.T in bf16 (errors ~1e-3)
        P_auto = attention_weights(q, k, "ssmax", p=3.0)
    assert P_auto.dtype == torch.float32
    torch.testing.assert_close(P_auto, attention_weights(q, k, "ssmax", p=3.0), rtol=0, atol=1e-6)


def test_attention_rows_under_bf16_autocast_score_the_models_q_k_in_fp32(monkeypatch):
    """needle.py's scores: the bf16 model's q, k (seen through apply_rope) scored in fp32, not from bf16 logits."""
    torch.manual_seed(0)
    gpt = model.GPT(model.GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=32, ffn_hidden=64,
                                    scorer="ssmax")).eval()
    seen, rope = [], model.apply_rope
    monkeypatch.setattr(model, "apply_rope", lambda x, cos, sin: seen.append(rope(x, cos, sin)) or seen[-1])
    idx = torch.randint(0, 64, (1, 12))
    with torch.autocast("cpu", torch.bfloat16):
        rows = gpt.attention_rows(idx, rows=(-1, 5))
    q, k = seen[:2]  # layer 0: q then k, bf16 under autocast
    assert q.dtype == torch.bfloat16 and rows.dtype == torch.float32
    expect = attention_weights(q.float(), k.float(), "ssmax", s=gpt.transformer.h[0].attn.ssmax_s)
    torch.testing.assert_close(rows[0], expect[:, :, [11, 5]], rtol=0, atol=1e-6)


def test_a_row_template_scorer_is_checked_against_the_spec_without_a_formula_of_its_own(off_by_one):
    # divided by sum e^x + 1: rows below 1, no re-weighting
    q, k, v = _qk(T=9, scale=1.5)
    kw = _t(dict(s=[0.7, 1.3], b=[0.2, -0.4]))
    P = attention_weights(q, k, off_by_one, **kw)
    torch.testing.assert_close(P, spec_weights(q, k, off_by_one, **kw), rtol=1e-9, atol=1e-12)
    assert (P.sum(-1) < 1).all() and not SCORERS[off_by_one].sums_to_one
    part = attention(q[:, :, 4:], k, v, off_by_one, offset=4, **kw)
    torch.testing.assert_close(part, attention(q, k, v, off_by_one, **kw)[:, :, 4:], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="needs normalised rows"):
        attention_weights(q, k, off_by_one, p=3.0)


@pytest.mark.parametrize("p", [0.0, -2.0, math.nan, 1e3, 1e10])
@pytest.mark.parametrize("backend", ["torch", "cpu", "triton"])
def test_a_reweighting_p_out_of_range_is_one_line_on_every_backend(p, backend):
    # model.attention took p = 0 and -2 (the reference finite, kernels_cpu nan) and nan, 1e10 (Triton 3.1 off)
    q, k, v = (torch.randn(1, 1, 5, 16) for _ in range(3))
    with pytest.raises(ValueError, match=rf"re-weighting p={p} must be in \(0, 100\]"):
        attention(q, k, v, "lssa", p=p, backend=backend)


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton", "flex"])
def test_a_parameter_below_its_bound_is_one_line_on_every_backend(backend):
    # ssa's b = -0.5 ran: NaN on torch and flex, finite on cpu and Triton (|b z|), 0.06 apart at small |z|
    q, k, v = (torch.randn(1, 2, 5, 16) for _ in range(3))
    with pytest.raises(ValueError, match=r"scorer 'ssa' needs b >= 0 \(SCORERS.md\), got \[-0.5, 1.0\]"):
        attention(q, k, v, "ssa", b=torch.tensor([-0.5, 1.0]), backend=backend)
    attention(q, k, v, "ssa", b=torch.zeros(2), backend=backend)  # at the bound: every backend agrees (uniform)
    out = attention(q, k, v, "ssa", b=torch.tensor([math.nan, 1.0]), backend=backend)  # a diverged b: train.py's nan
    assert out.isnan().any()  # loss says so (it was refused as below the bound on the CPU only)


@pytest.mark.parametrize("backend", ["torch", "sdpa", "cpu", "triton", "flex"])
def test_a_parameter_given_as_a_number_is_every_heads_and_another_head_count_is_one_line(backend):
    # s=2.0 was AttributeError 'float' object has no attribute 'to'; 3 heads of 2, expand's RuntimeError deep inside
    q, k, v = (torch.randn(1, 2, 5, 16) for _ in range(3))
    torch.testing.assert_close(attention(q, k, v, "ssmax", s=2.0, backend=backend),
                               attention(q, k, v, "ssmax", s=torch.full((2,), 2.0), backend=backend))
    with pytest.raises(ValueError, match=r"s has shape \(3,\); allowed: one value a head \(2,\) or one"):
        attention(q, k, v, "ssmax", s=torch.ones(3), backend=backend)


@pytest.mark.parametrize("backend", ["torch", "sdpa", "triton", "flex"])
def test_fox_c_without_its_batch_axis_is_one_line_on_every_backend(backend):
    # c (H, Tk) ran on torch (broadcast) and sdpa, asserted against by Triton and flex
    q, k, v = (torch.randn(1, 2, 5, 16) for _ in range(3))
    with pytest.raises(ValueError, match=r"needs c= \(B, H, Tk\).*; got \(2, 5\)"):
        attention(q, k, v, "fox", c=torch.zeros(2, 5), backend=backend)


@pytest.mark.parametrize("offset", [0, 3])
@pytest.mark.parametrize("backend", ["torch", "sdpa", "cpu", "triton", "flex"])
def test_no_query_rows_is_one_line_on_every_backend(backend, offset):
    # Tq = 0: Triton ZeroDivisionError, flex and torch softpick IndexError, torch fox (offset > 0) a size mismatch
    q, k, v = torch.randn(1, 2, 0, 16), torch.randn(1, 2, offset, 16), torch.randn(1, 2, offset, 16)
    for name, entry in SCORERS.items():
        if backend in entry.backends:
            with pytest.raises(AssertionError, match=r"q has no rows \(Tq = 0\)"):
                attention(q, k, v, name, offset=offset, backend=backend, **({"c": torch.zeros(1, 2, offset)}
                                                                            if entry.forget else {}))
    import kernels  # called directly, the kernels refuse it too (scorers.prepare)
    with pytest.raises(AssertionError, match=r"q has 0 rows \(at least 1 expected\)"):
        kernels.attention(q, k, v, "softmax", offset=offset)
