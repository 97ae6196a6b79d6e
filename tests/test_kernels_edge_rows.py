"""Edge rows of the fused kernels against the float64 reference: all-equal scores (the prefix mean), identical keys
under re-weighting (ties: n P - 1 only rounding) in fp32 and 16 bits, the tie tolerance decided alike by the
reference, the kernels and FlexAttention, huge logits, large p on long rows, lssa's tiny weights and fp16 zero
vectors; no NaN/Inf for finite inputs, and clear errors for bad shapes. CPU, Triton's interpreter."""
import functools
import math

import pytest
import torch

import kernels
import kernels_flex
import model
from scorers import SCORERS
from test_kernels import CASES, IDS, _check, _err, _inputs, _ref, _run, triton_attention


@pytest.mark.parametrize("scorer,kw", CASES + [("lssa", dict(p=100.0))], ids=IDS + ["lssa_p100"])
def test_all_equal_scores_give_the_prefix_mean_and_finite_grads(scorer, kw):
    q, k, v, do = _inputs(35, 0, 16)
    q = torch.zeros_like(q)  # every score equal: uniform weights; with p, the fallback (or a uniform re-weighting)
    if SCORERS[scorer].forget:  # fox: and no decay, c = 0
        kw = dict(kw, c=torch.zeros(k.shape[:3]))
    fused = _run(triton_attention, scorer, kw, q, k, v, do, torch.float32, 0)
    # P at z = 0 from the registry's logits (sigmoid: not divided)
    n, e = torch.arange(1, 36.0).view(1, 1, 35, 1), SCORERS[scorer]
    prm = {name: torch.tensor(x).view(1, -1, 1, 1) for name, x in [*e.fixed, *kw.items()] if name not in ("p", "c")}
    at0 = lambda f: f(torch.zeros(()), n.log(), math.log(16), **prm).exp()  # noqa: E731
    if e.logit is not None:  # stickbreaking (no row template): halves backwards from the diagonal, as the reference
        prefix_mean = v.cumsum(2) * at0(e.logit) / (n * at0(e.den_logit or e.logit) + e.eps if e.row_sum else 1)
        torch.testing.assert_close(fused[0], prefix_mean, rtol=1e-5, atol=1e-5)
    assert all(torch.isfinite(g).all() for g in fused)
    # re-weighting: rows i >= 3 fall back to P in both paths (the tie tolerance, not rounding, decides), so their
    # gradient is P's; ssa: slope n b at z = 0 in both
    ref = _run(_ref, scorer, kw, q, k, v, do, torch.float64, 0)
    for name, f, r in zip(["out", "dq", "dk", "dv", "p1", "p2"], fused, ref):
        assert _err(f, r) < 1e-4, name


@pytest.mark.parametrize("scorer,kw", [("lssar", {}), ("softmax", dict(p=3.0)), ("ssa", dict(b=[0.5, 2.0], p=15.0))],
                         ids=["lssar", "softmax_p3", "ssa_p15"])
def test_reweighting_ties_identical_keys_fused_forward_and_grads_match_reference(scorer, kw):
    # every row uniform, n P - 1 only rounding: an exact "> 0" re-weighted the fused rows whose exp2/log2 rounded up
    # (n P - 1 ~ +1e-7), forward right but dq off by 1e7-1e29 through p n / (n P - 1)
    q, k, v, do = _inputs(20, 0, 16, B=1)
    k = k[:, :, :1].expand_as(k).contiguous()
    fused = _run(triton_attention, scorer, kw, q, k, v, do, torch.float32, 0)
    ref = _run(_ref, scorer, kw, q, k, v, do, torch.float64, 0)
    for name, f, r in zip(["out", "dq", "dk", "dv", "db"], fused, ref):
        assert torch.isfinite(f).all(), name  # dq, dk are ~0 (keys identical): absolute, on the scale of v and do
        torch.testing.assert_close(f.double(), r, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("scorer,kw", [("lssar", {}), ("softmax", dict(p=3.0)), ("ssa", dict(b=[0.5, 2.0], p=15.0)),
                                       ("ssmax", dict(s=[0.5, 2.0], b=[0.1, -0.2]))],
                         ids=["lssar", "softmax_p3", "ssa_p15", "ssmax"])
def test_16_bit_single_walk_backward_on_uniform_rows(scorer, kw, dtype):
    # 16-bit inputs sum sigma beside dq and correct it after (ssmax), or sum delta' and sigma in one walk before dq's
    # (re-weighting): fallback rows (every row uniform: identical keys) take h = 1, delta = 0 there and in dk/dv.
    # Exact dq, dk are 0: theirs is dS's rounding to 16 bits
    q, k, v, do = _inputs(20, 0, 16, B=1)
    k = k[:, :, :1].expand_as(k).contiguous()
    q, k, v = (x.to(dtype) for x in (q, k, v))
    fused = _run(triton_attention, scorer, kw, q, k, v, do, dtype, 0)
    ref = _run(_ref, scorer, kw, q, k, v, do, torch.float64, 0)
    own = _run(_ref, scorer, kw, q, k, v, do, dtype, 0)
    for name, f, r, lp in zip(["out", "dq", "dk", "dv", "p1", "p2"], fused, ref, own):
        atol = 1e-2 if name in ("dq", "dk") else 2e-3
        assert torch.isfinite(f).all(), name
        assert (f.double() - r).abs().max() <= 3 * (lp.double() - r).abs().max() + atol, name


def test_reweighting_tie_tolerance_decides_alike_in_reference_kernel_and_flex():
    # the last row (n = 8, o = 1) has largest n P - 1 = f tol on its last key, tol = 8 (n + |lse|) eps32: f = 1/2
    # keeps P (output: the near-mean of v), f = 2 re-weights to that key alone (output: v of that key); every path,
    # the same decision, with every logit shifted by L too (lse ~ L + log n: a wider tolerance)
    n, D = 8, 16
    for L in (0.0, 200.0):
        for f in (0.5, 2.0):
            a = math.log1p(f * 8 * (n + L + math.log(n)) * 2.0**-23 * n / (n - 1))  # n P_max - 1 = f tol + O(tol^2)
            q = torch.zeros(1, 1, n, D)
            q[..., :2] = D ** 0.5
            k = torch.zeros(1, 1, n, D)
            k[..., 1] = L
            k[0, 0, -1, 0] = a  # z = L + a on the last key, L elsewhere; earlier rows (all z = L) are uniform
            v = torch.randn(1, 1, n, D, generator=torch.Generator().manual_seed(0))
            expect = v[0, 0, -1] if f > 1 else model.attention(q, k, v, "softmax")[0, 0, -1]
            for fn in (model.attention, kernels.attention, kernels_flex.flex_attention):
                torch.testing.assert_close(fn(q, k, v, "softmax", p=15.0)[0, 0, -1], expect,
                                           msg=f"{fn.__module__} {L} {f}")


@pytest.mark.parametrize("scorer,kw", CASES + [("softmax", dict(p=100.0))], ids=IDS + ["softmax_p100"])
def test_huge_logits_stay_finite_and_match(scorer, kw):
    # |z| ~ 1e4: near one-hot rows (logits rounded at 1e-3 there), ssa's log(1 + b|z|) large
    _check(scorer, kw, 40, 9, 16, scale=60.0, atol=2e-4)


@pytest.mark.parametrize("p", [15.0, 100.0, 42.5])  # integer p: r^p by repeated squaring; 42.5: by exp2
def test_reweighting_large_p_at_long_rows(p):
    _check("lssa", dict(p=p), 1, 300, 16, B=1)  # n = 301: (n P)^p would overflow fp32
    _check("softmax", dict(p=p), 45, 0, 16, B=1)


def test_lssa_rows_with_all_scores_near_minus_one_keep_tiny_weights():
    q, k, v, do = _inputs(1, 199, 16, B=1, H=1)
    k = -q.expand_as(k) + 1e-3 * k  # cos ~ -1 everywhere: u = -log(d) log(n) cos ~ -15, softplus tiny
    ref = _ref(q.double(), k.double(), v.double(), "lssa", offset=199)
    out = kernels.attention(q, k, v, "lssa", offset=199)
    assert torch.isfinite(out).all() and _err(out, ref) < 1e-4


@pytest.mark.parametrize("zero", ["q", "k"])
def test_lssa_fp16_zero_query_or_key_leaves_the_other_rows_gradients_finite(zero):
    # F.normalize's clamp makes a zero vector's inverse norm 1e12: fp16 dots overflowed to inf, and inf * 0 spread NaN
    # to the dq of every row that saw a zero key (the dk of every key a zero query saw); only the zero vector's own
    # gradient overflows, as on the cpu path
    q, k, v, do = _inputs(20, 5, 16, B=1)
    (q if zero == "q" else k)[:, :, 7] = 0.0
    cpu = _run(functools.partial(model.attention, backend="cpu"), "lssa", {}, q, k, v, do, torch.float16, 5)
    fused = _run(triton_attention, "lssa", {}, q, k, v, do, torch.float16, 5)
    for a, b in zip(fused, cpu):
        ok = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a), ok) and _err(a[ok], b[ok].double()) < 4e-3


def test_shape_errors_are_clear():
    q, k, v, _ = _inputs(8, 0, 16)
    with pytest.raises(AssertionError, match="offset"):
        kernels.attention(q, k, v, "softmax", offset=3)
    with pytest.raises(ValueError, match="unknown scorer"):
        kernels.attention(q, k, v, "sparsemax")
    with pytest.raises(ValueError, match="needs normalised rows"):  # re-weighting does not apply to sigmoid
        kernels.attention(q, k, v, "sigmoid", p=3.0)


@pytest.mark.parametrize("scale", [3e-2, 1e-2, 3e-3])  # max |z| ~ 1e-3, 1e-4, 1e-5
def test_softpick_rows_of_small_logits_keep_e_to_the_z_minus_1_exact_in_fp32(scale):
    # e^z - 1 as e^z minus 1 cancels: each term off by ~eps/|z| relative, the output by 4e-4 (|z| ~ 1e-3) to 6e-3
    # (1e-5) of its scale before, in the fp32 reference, kernels_cpu and Triton alike (flex's log|e^z - 1| was exact)
    q, k, v, do = _inputs(37, 5, 16, scale=scale)
    ref = _run(_ref, "softpick", {}, q, k, v, do, torch.float64, 5)
    paths = dict(torch=_ref, cpu=functools.partial(model.attention, backend="cpu"), triton=triton_attention)
    for path, fn in paths.items():
        for name, f, r in zip(["out", "dq", "dk", "dv"], _run(fn, "softpick", {}, q, k, v, do, torch.float32, 5), ref):
            assert _err(f, r) < 2e-5, f"{path} {name}: {_err(f, r):.1e}"
    assert _err(kernels_flex.flex_attention(q, k, v, "softpick", offset=5), ref[0]) < 2e-5


def test_cpu_path_softpick_decode_row_with_every_logit_below_exps_range_gives_zeros():
    # a row whose logits are all < -88 and that has no future key (decoding): its max floor m = max(0, max_j z) keeps
    # e^-m = 1; without the floor e^-m overflows fp32 and the row is inf / inf = NaN (softpick: all z <= 0 gives 0)
    q, k, v, do = _inputs(1, 5, 16, B=1)
    k = k.abs() + 1.0
    q = torch.zeros_like(q)
    q[..., 0] = -400.0  # z_j = -100 k_j0 <= -100 on every key
    ref = _run(_ref, "softpick", {}, q, k, v, do, torch.float64, 5)
    fn = functools.partial(model.attention, backend="cpu")
    for name, f, r in zip(["out", "dq", "dk", "dv"], _run(fn, "softpick", {}, q, k, v, do, torch.float32, 5), ref):
        assert torch.isfinite(f).all() and (r == 0).all() and (f == 0).all(), name


@pytest.mark.parametrize("b", [1e-6, 1e-4, 1e-2, 1.0])
def test_ssa_db_and_learnable_dn_hold_at_tiny_b(b):
    # b db = sum dl (W qk - P / (b s)) cancelled |z| ~ 1e4 but lost eps / (b|z|) at small b (66 % off at 1e-6): each
    # row now takes the form its b z_max asks for. dn's log(1 + b|z|) lost the same eps / (b|z|) to 1 + b|z| in fp32
    q, k, v, do = _inputs(40, 0, 16, B=1)
    grads = {}
    for name, dtype in (("ref", torch.float64), ("triton", torch.float32)):
        bb = torch.full((q.shape[1],), b, dtype=dtype, requires_grad=True)
        nh = torch.tensor([1.2, 2.0], dtype=dtype, requires_grad=True)
        fn = functools.partial(model.attention, backend="torch") if name == "ref" else triton_attention
        out = fn(*(t.to(dtype) * 3 for t in (q, k)), v.to(dtype), "ssa", b=bb, n=nh)
        grads[name] = [g.double() for g in torch.autograd.grad(out, (bb, nh), do.to(dtype))]
    for name, f, r in zip(("db", "dn"), grads["triton"], grads["ref"]):  # large b: test_huge_logits
        torch.testing.assert_close(f, r, rtol=1e-4, atol=0, msg=lambda m: f"{name}: {m}")
