"""The reference scorers (model.attention / attention_weights) against SCORERS.md, written here independently:
row by row, in float64, straight from the formulas; every scorer's gradients against finite differences on the
reference and the CPU path (the registry against every place that reads it: test_registry.py)."""
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
NORMALISED = [name for name, e in SCORERS.items() if e.sums_to_one and e.p is None]  # re-weighting applies


def _no_decay(scorer, k):  # fox's c for k's keys: 0, so that equal scores give uniform rows
    return {"c": torch.zeros(k.shape[:3], dtype=k.dtype)} if SCORERS[scorer].forget else {}


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


def test_ssmax_differs_from_softmax_unless_s_log_n_is_one():
    q, k, _ = _qk(T=12)
    P_soft = attention_weights(q, k, "softmax")
    P_ss = attention_weights(q, k, "ssmax")  # s = 1: the scale log(n_i) is != 1 on every row (n_i = 1..12)
    for i in range(1, 12):
        assert not torch.allclose(P_ss[..., i, :], P_soft[..., i, :]), f"row {i} unchanged: ssmax did not run"
    # choose s so that s*log(n_i) = 1 on row i = 6 (n_i = 7): that row equals softmax, others do not
    s = torch.full((2,), 1 / math.log(7), dtype=torch.float64)
    P = attention_weights(q, k, "ssmax", s=s)
    torch.testing.assert_close(P[..., 6, :], P_soft[..., 6, :])
    assert not torch.allclose(P[..., 11, :], P_soft[..., 11, :])


def test_ssmax_variants_no_s_is_s_one_and_bias_adds_to_the_scale():
    q, k, _ = _qk(T=10)
    ones, zeros = torch.ones(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    torch.testing.assert_close(attention_weights(q, k, "ssmax"), attention_weights(q, k, "ssmax", s=ones, b=zeros))
    # b only: scale b on every row, so row 0 (log 1 = 0) equals softmax with temperature 1/b
    b = torch.full((2,), 1.0, dtype=torch.float64)
    P = attention_weights(q, k, "ssmax", s=zeros, b=b)
    torch.testing.assert_close(P, attention_weights(q, k, "softmax"))


def test_lssar_is_lssa_reweighted_with_p_15():
    q, k, _ = _qk(T=10)
    torch.testing.assert_close(attention_weights(q, k, "lssar"), attention_weights(q, k, "lssa", p=15.0))
    assert not torch.allclose(attention_weights(q, k, "lssar"), attention_weights(q, k, "lssa"))


def test_reweighting_fallback_row_keeps_uniform_weights():
    # all-equal scores: every P_ij = 1/n_i, so n_i P_ij - 1 = 0 and ReLU(.) = 0 on rows i >= 3 -> keep P
    q = torch.zeros(1, 1, 6, 4, dtype=torch.float64)
    k = torch.randn(1, 1, 6, 4, dtype=torch.float64)
    for scorer in NORMALISED:
        P = attention_weights(q, k, scorer, p=15.0, **_no_decay(scorer, k))
        expect = torch.tril(torch.ones(6, 6, dtype=torch.float64)) / torch.arange(1, 7, dtype=torch.float64)[:, None]
        torch.testing.assert_close(P[0, 0], expect)


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


def test_reweighting_large_n_and_p_does_not_overflow():
    q, k, v = _qk(B=1, H=2, T=3000, d=8, seed=1)
    P = attention_weights(q[:, :, -2:].float(), k.float(), "lssar", p=100.0, offset=2998)
    assert torch.isfinite(P).all() and torch.allclose(P.sum(-1), torch.ones(1, 2, 2))


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


def test_ssmax_switch_s_is_one_over_mean_log_n():
    assert abs(model.ssmax_s_for_switch(1024) - 0.168) < 1e-3
    N = 37
    assert math.isclose(model.ssmax_s_for_switch(N), 1 / (sum(math.log(n) for n in range(1, N + 1)) / N))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("case", ["identical_keys", "q_zero"])
@pytest.mark.parametrize("scorer", NORMALISED)
def test_reweighting_ties_uniform_rows_keep_P_exactly_whatever_the_rounding(scorer, case, dtype):
    # every row uniform; n P - 1 comes out a few ulps of either sign (identical keys: the matmul rounds columns
    # differently), and an exact "> 0" then re-weighted onto the keys that rounded up (fp64 lssa: 1/3 on three keys)
    q, k, _ = (x.to(dtype) for x in _qk(T=40, d=16, seed=5))
    k = k[:, :, :1].expand_as(k).contiguous() if case == "identical_keys" else k
    q = torch.zeros_like(q) if case == "q_zero" else q
    c = _no_decay(scorer, k)
    P, P15 = attention_weights(q, k, scorer, **c), attention_weights(q, k, scorer, p=15.0, **c)
    assert torch.equal(P15[..., 3:, :], P[..., 3:, :])  # rows i >= 3 fall back to P, bit for bit
    uniform = torch.tril(torch.ones(40, 40, dtype=dtype)) / torch.arange(1, 41, dtype=dtype)[:, None]
    torch.testing.assert_close(P15, uniform.expand_as(P15))  # rows i < 3 (o = 0) re-weight a uniform row: uniform


def test_reweighting_tie_tolerance_is_8_n_plus_lse_eps_of_the_scoring_dtype():
    # one row (n = 8, o = 1) whose largest n P - 1 is delta: re-weighted (one-hot on that key) iff delta > 8 (n + |lse|)
    # eps, lse the row's ln sum_j e^logit (P's rounding grows with it)
    for dtype in (torch.float32, torch.float64):
        for lse in (0.0, 300.0, -300.0):
            tol = 8 * (8 + abs(lse)) * torch.finfo(dtype).eps
            for f, one_hot in ((0.5, False), (2.0, True)):
                P = torch.full((1, 1, 1, 8), 1.0, dtype=dtype)
                P[..., -1] += 8 / 7 * f * tol  # normalised: n P_max - 1 = f tol up to O(tol^2)
                P = P / P.sum(-1, keepdim=True)
                out = model.reweight(P, torch.tensor([[8]]), 15.0, torch.full((1, 1, 1, 1), lse, dtype=dtype))
                expect = torch.eye(8, dtype=dtype)[-1].view_as(P) if one_hot else P
                assert torch.equal(out, expect), (dtype, lse, f)


def test_ssa_gradient_at_z_zero_is_n_b_and_matches_finite_differences():
    # the reference once wrote sgn(z) n log1p(b|z|), whose autograd slope at z = 0 is 0; the true one is n b
    q, k, v = _qk(B=1, H=2, T=5, d=4, seed=2)
    q = torch.zeros_like(q).requires_grad_()
    b, n = torch.tensor([0.5, 2.0], dtype=torch.float64), torch.tensor([1.1, 2.5], dtype=torch.float64)
    ssa = lambda q, k, v: attention(q, k, v, "ssa", b=b, n=n)  # noqa: E731
    assert torch.autograd.gradcheck(ssa, (q, k.requires_grad_(), v.requires_grad_()))
    dq = torch.autograd.grad(ssa(q, k, v).square().sum(), q)[0]
    assert (dq[:, :, 1:].abs().sum(-1) > 1e-2).all()  # row 0 has one key: no gradient there
    # at z = 0 the logits are n b z to first order: the gradient equals ssmax's with s = 0 and b = n b (logits n b z)
    linear = attention(q, k, v, "ssmax", s=torch.zeros(2, dtype=torch.float64), b=n * b)
    torch.testing.assert_close(dq, torch.autograd.grad(linear.square().sum(), q)[0])


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


def test_sigmoid_rows_are_not_normalised_and_refuse_reweighting():
    q, k, v = _qk()
    P = attention_weights(torch.zeros_like(q), k, "sigmoid")  # z = 0: w = sigmoid(-log n) = 1 / (n + 1)
    n = torch.arange(1, 8, dtype=torch.float64)
    torch.testing.assert_close(P.sum(-1)[0, 0], n / (n + 1))
    with pytest.raises(ValueError, match="needs normalised rows"):
        attention_weights(q, k, "sigmoid", p=3.0)
    with pytest.raises(ValueError, match="needs normalised rows"):
        model.GPTConfig(scorer="sigmoid", reweight_p=3.0)


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


def test_softpick_rows_sum_below_one_are_zero_without_a_positive_score_and_refuse_reweighting():
    q, k, v = _qk(T=9, scale=1.5)
    P = attention_weights(q, k, "softpick")
    assert (P >= 0).all() and (P.sum(-1) < 1).all() and (P.sum(-1) > 0.05).any()
    P0 = attention_weights(-q.abs(), k.abs(), "softpick")  # every z < 0: ReLU(e^z - 1) = 0, the divisor >= 1 - e^z
    assert torch.equal(P0, torch.zeros_like(P0))
    with pytest.raises(ValueError, match="needs normalised rows"):
        attention_weights(q, k, "softpick", p=3.0)
    with pytest.raises(ValueError, match="needs normalised rows"):
        model.GPTConfig(scorer="softpick", reweight_p=3.0)


def test_softpick_flex_logits_have_finite_gradients_at_a_zero_score():
    # a zero score (every score of a q = 0 padding row) is log 0 = -inf; its weight's gradient, 0 there, must not be
    # 0 x inf = NaN, which flex's backward turned into NaN everywhere on CUDA
    z = torch.tensor([-2.0, -1e-3, 0.0, 1e-3, 2.0], dtype=torch.float64, requires_grad=True)
    entry = SCORERS["softpick"]
    for logit in (entry.logit, entry.den_logit):
        x = logit(z, None, None)
        assert x[2] == -math.inf
        (g,) = torch.autograd.grad(torch.exp(x).sum(), z)  # d|e^z - 1|/dz (numerator: d ReLU(e^z - 1)/dz)
        assert torch.isfinite(g).all() and g[2] == 0
        want = torch.exp(z.detach()) * torch.sign(z.detach()) * (1 if logit is entry.den_logit else (z > 0))
        assert torch.allclose(g, want.double())
