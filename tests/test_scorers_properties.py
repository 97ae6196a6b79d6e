"""Each scorer's own properties on the reference: ssmax differs from softmax unless s log n = 1 (its variants: no s is
s = 1, a bias adds to the scale; the switch's s = 1 / mean log n), ssa's gradient n b at z = 0, sigmoid's and
softpick's rows not normalised and refusing re-weighting, softpick's FlexAttention logits finite in their gradients
at a zero score. float64, CPU only."""
import math

import pytest
import torch

import model
from model import attention, attention_weights
from scorers import SCORERS
from test_scorers import _qk


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


def test_ssmax_switch_s_is_one_over_mean_log_n():
    assert abs(model.ssmax_s_for_switch(1024) - 0.168) < 1e-3
    N = 37
    assert math.isclose(model.ssmax_s_for_switch(N), 1 / (sum(math.log(n) for n in range(1, N + 1)) / N))


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


def test_sigmoid_rows_are_not_normalised_and_refuse_reweighting():
    q, k, v = _qk()
    P = attention_weights(torch.zeros_like(q), k, "sigmoid")  # z = 0: w = sigmoid(-log n) = 1 / (n + 1)
    n = torch.arange(1, 8, dtype=torch.float64)
    torch.testing.assert_close(P.sum(-1)[0, 0], n / (n + 1))
    with pytest.raises(ValueError, match="needs normalised rows"):
        attention_weights(q, k, "sigmoid", p=3.0)
    with pytest.raises(ValueError, match="needs normalised rows"):
        model.GPTConfig(scorer="sigmoid", reweight_p=3.0)


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
