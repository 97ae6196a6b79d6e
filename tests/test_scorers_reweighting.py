"""Re-weighting on the reference (model.attention_weights with p): lssar is lssa re-weighted with p = 15, fallback
rows keep their weights (uniform rows bit for bit, whatever the rounding of n P - 1), the tie tolerance 8 (n + |lse|)
eps of the scoring dtype, large n and p without overflow. float64 and fp32, CPU only."""
import math

import pytest
import torch

import model
from model import attention_weights
from scorers import SCORERS
from test_scorers import _qk

NORMALISED = [name for name, e in SCORERS.items() if e.sums_to_one and e.p is None]  # re-weighting applies


def _no_decay(scorer, k):  # fox's c for k's keys: 0, so that equal scores give uniform rows
    return {"c": torch.zeros(k.shape[:3], dtype=k.dtype)} if SCORERS[scorer].forget else {}


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


def test_reweighting_large_n_and_p_does_not_overflow():
    q, k, v = _qk(B=1, H=2, T=3000, d=8, seed=1)
    P = attention_weights(q[:, :, -2:].float(), k.float(), "lssar", p=100.0, offset=2998)
    assert torch.isfinite(P).all() and torch.allclose(P.sum(-1), torch.ones(1, 2, 2))


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


def test_reweighting_tie_tolerance_reads_foxs_logits_with_its_forget_bias():
    # fox's lse is of z + c_i - c_j, not of z: here z_j = c_j - c_i (~700) cancels the decay, so the logits are 0
    # (lse = log 8) while the scores' own lse is ~700, a tolerance 70 times wider that would keep P at f = 2
    n, D = 8, 16
    for dtype in (torch.float32, torch.float64):
        # log gates of -100, c shifted to c_i = 0 (only c_i - c_j counts): z_i + c_i keeps the bump on z_i exact
        c = (100.0 * torch.arange(n - 1, -1, -1, dtype=dtype)).view(1, 1, n)
        tol = 8 * (n + math.log(n)) * torch.finfo(dtype).eps
        for f, one_hot in ((0.5, False), (2.0, True)):
            q = torch.zeros(1, 1, 1, D, dtype=dtype)
            q[..., 0] = D ** 0.5
            k = torch.zeros(1, 1, n, D, dtype=dtype)
            k[0, 0, :, 0] = c[0, 0]  # z_j = c_j - c_i: every logit 0
            k[0, 0, -1, 0] = f * tol * n / (n - 1)  # n P_max - 1 = f tol on the last key, up to O(tol^2)
            P = attention_weights(q, k, "fox", p=15.0, offset=n - 1, c=c)
            expect = torch.eye(n, dtype=dtype)[-1] if one_hot else torch.full((n,), 1 / n, dtype=dtype)
            torch.testing.assert_close(P[0, 0, 0], expect, rtol=0, atol=1e-6, msg=f"{dtype} f={f}")
