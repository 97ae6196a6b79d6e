"""Fused Triton kernels (kernels.py) against the float64 reference (model.attention, backend="torch").
On CPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1): small shapes only.
Errors are max|fused - ref64| / max|ref64| per tensor, bounded by a multiple of the reference's own error when it
runs in the same precision (fp32, fp16, bf16) plus a small atol: a well-conditioned case is then held to ~1e-4,
while re-weighting, whose dP carries p n / (n P - o), is allowed the reference's own fp32 sensitivity."""
import csv
import functools
import importlib.util
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from triton.runtime import interpreter

import kernels
import kernels_flex
import model
from cases import cases, ids
from scorers import SCORERS

# Every scorer of the registry that the kernels run (cases.cases), with each parameter per head (H = 2) off its
# default, so that every one matters (within its constraint: ssa's b > 0, n > 1), fox's c from forget gates (_param),
# and each again re-weighted where its rows sum to one
CASES = cases("triton", lambda prm: [prm.default - 0.3, prm.default + 0.5])
IDS = ids(CASES)
SHAPES = [  # (Tq, offset, D): odd lengths, a query block after a cache, decoding one token after a long cache
    (1, 0, 16), (15, 0, 16), (63, 0, 32), (130, 0, 16), (40, 23, 32), (1, 129, 16),
]
FLEX = [(case, i) for case, i in zip(CASES, IDS) if "flex" in SCORERS[case[0]].backends]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
triton_attention = functools.partial(model.attention, backend="triton")  # kernels.py; stickbreaking: kernels_stick.py


def _inputs(Tq, offset, D, B=2, H=2, dtype=torch.float32, seed=0, scale=1.0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    Tk = offset + Tq
    q = torch.randn(B, H, Tq, D, generator=g) * scale
    k = torch.randn(B, H, Tk, D, generator=g) * scale
    v = torch.randn(B, H, Tk, D, generator=g)
    do = torch.randn(B, H, Tq, D, generator=g)
    return [x.to(device, dtype) for x in (q, k, v, do)]


def _param(val, k, dtype=torch.float32):
    """A case's parameter as a tensor on k's device: a list per head, or "gates": FoX's c for k's keys (B, H, Tk),
    prefix sums of log forget gates (made in fp32: every dtype's run sees the same values)."""
    if isinstance(val, str):
        g = torch.Generator().manual_seed(7)
        val = torch.nn.functional.logsigmoid(torch.randn(k.shape[:3], generator=g) + 1).cumsum(-1)  # to ~ -0.4 T
    return torch.as_tensor(val, dtype=dtype).to(k.device)


def _run(fn, scorer, kw, q, k, v, do, dtype, offset):
    """Output and gradients [out, dq, dk, dv, ds/db/dn or dc] of fn on inputs cast to dtype."""
    xs = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    params = {n: _param(val, k, torch.float64 if dtype == torch.float64 else torch.float32).requires_grad_()
              for n, val in kw.items() if n != "p"}
    out = fn(*xs, scorer, p=kw.get("p"), offset=offset, **params)
    grads = torch.autograd.grad(out, xs + list(params.values()), do.to(dtype))
    return [out.detach()] + [g.detach() for g in grads]


def _ref(*args, **kw):
    return model.attention(*args, **kw, backend="torch")


def _err(a, ref):  # relative to the largest reference entry; absolute where the reference is 0 (dq at T = 1)
    scale = ref.abs().max().item()
    return (a.double() - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def _check(scorer, kw, Tq, offset, D, dtype=torch.float32, factor=3.0, atol=3e-5, **inp):
    q, k, v, do = _inputs(Tq, offset, D, **inp)
    q, k, v = (x.to(dtype) for x in (q, k, v))  # both paths see the same rounded inputs
    ref64 = _run(_ref, scorer, kw, q, k, v, do, torch.float64, offset)
    ref_lp = _run(_ref, scorer, kw, q, k, v, do, dtype, offset)
    fused = _run(triton_attention, scorer, kw, q, k, v, do, dtype, offset)
    names = ["out", "dq", "dk", "dv"] + [n for n in kw if n != "p"]
    for name, f, r, lp in zip(names, fused, ref64, ref_lp):
        assert f.dtype == lp.dtype and f.shape == r.shape, name
        assert torch.isfinite(f).all(), f"{name} has NaN/Inf"
        err, own = _err(f, r), _err(lp, r)
        assert err <= factor * own + atol, f"{scorer} {kw} {name}: error {err:.2e}, reference's own {own:.2e}"
    return fused, ref64


# ----------------------------------------------------------------------------------------------------------------
# Fused vs reference, fp32: forward and every gradient

@pytest.mark.parametrize("Tq,offset,D", SHAPES, ids=[f"Tq{t}-off{o}-D{d}" for t, o, d in SHAPES])
@pytest.mark.parametrize("scorer,kw", CASES, ids=IDS)
def test_fused_fp32_matches_float64_reference_forward_and_grads(scorer, kw, Tq, offset, D):
    _check(scorer, kw, Tq, offset, D)


@pytest.mark.parametrize("scorer,kw", [("softmax", {}), ("ssmax", dict(s=[0.5, 2.0], p=15.0)), ("lssar", {})],
                         ids=["softmax", "ssmax_p15", "lssar"])
def test_fused_fp32_head_dim_64_and_ssmax_with_reweighting(scorer, kw):
    _check(scorer, kw, 33, 17, 64, B=1)


@pytest.mark.parametrize("scorer,kw", CASES, ids=IDS)
def test_fused_fp32_head_dim_128(scorer, kw):  # the largest head dim: wide tiles, every scorer
    _check(scorer, kw, 21, 6, 128, B=1)


def _tf32(x):  # fp32 rounded to tf32 as the tensor cores' cvt.rna does: 10 mantissa bits, ties away from zero
    return ((x.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


@pytest.mark.parametrize("scorer,kw", CASES, ids=IDS)
def test_fp32_inputs_keep_fp32_accuracy_with_the_gpu_tf32x3_dots(scorer, kw, monkeypatch):
    """A GPU runs fp32 dots as tf32x3 (a_hi b_hi + a_hi b_lo + a_lo b_hi, each part tf32), the interpreter exactly:
    emulate the GPU's dots and hold the kernels to the same fp32 bounds, re-weighting's p n / y amplification too."""
    calls = []

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        assert input_precision.name == "TF32x3" and a.data.dtype == b.data.dtype == np.float32
        calls.append(1)
        a_hi, b_hi = _tf32(a.data), _tf32(b.data)
        a_lo, b_lo = _tf32(a.data - a_hi), _tf32(b.data - b_hi)
        return interpreter.TensorHandle(d.data + a_hi @ b_lo + a_lo @ b_hi + a_hi @ b_hi, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
    _check(scorer, kw, 63, 0, 32)
    _check(scorer, kw, 40, 23, 32)
    assert calls


def _gpu_lg2(self, arg):  # sm_90's lg2.approx at its documented bound: 2^-22 absolute on [1/2, 2], else 2 ulp
    x = arg.data.astype(np.float64)
    y = np.log2(x)
    err = np.where((x >= 0.5) & (x <= 2.0), 2.0**-22, 2 * np.spacing(np.abs(y).astype(np.float32)).astype(np.float64))
    sign = np.where(arg.data.astype(np.float32).view(np.uint32) & 1, 1.0, -1.0)  # both signs, by the last bit
    return interpreter.TensorHandle((y + sign * err).astype(arg.data.dtype), arg.dtype.scalar)


def _gpu_ex2(self, arg):  # ex2.approx.ftz: 2 ulp, and results below 2^-126 flushed to 0
    sign = np.where(arg.data.astype(np.float32).view(np.uint32) & 1, 1.0, -1.0)
    y = np.exp2(arg.data.astype(np.float64)) * (1 + 2.0**-22 * sign)
    return interpreter.TensorHandle(np.where(y < 2.0**-126, 0.0, y).astype(arg.data.dtype), arg.dtype.scalar)


@pytest.mark.parametrize("scorer,kw", CASES + [("softmax", dict(p=100.0))], ids=IDS + ["softmax_p100"])
def test_fp32_accuracy_holds_with_the_gpu_approximate_log2_and_exp2(scorer, kw, monkeypatch):
    """The kernels' _log2 is lg2.approx on a GPU and tl.exp2 ex2.approx.ftz: emulate their documented errors (and the
    flush of tiny powers, which ssa's and re-weighting's one-power backward relies on) and hold every scorer to the
    fp32 bounds, huge logits too."""
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_log2", _gpu_lg2)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_exp2", _gpu_ex2)
    _check(scorer, kw, 63, 0, 32)
    _check(scorer, kw, 40, 23, 32)
    _check(scorer, kw, 40, 9, 16, scale=60.0, atol=2e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("scorer,kw", CASES, ids=IDS)
def test_fused_low_precision_error_bounded_by_reference_own_error(scorer, kw, dtype):
    _check(scorer, kw, 50, 13, 32, dtype=dtype, factor=3.0, atol=2e-3)


def test_decode_one_token_equals_last_row_of_full_pass():
    q, k, v, _ = _inputs(77, 0, 32)
    for scorer, kw in CASES:
        kw = {n: x if n == "p" else _param(x, k) for n, x in kw.items()}
        full = triton_attention(q, k, v, scorer, **kw)
        last = triton_attention(q[:, :, -1:], k, v, scorer, offset=76, **kw)
        torch.testing.assert_close(last, full[:, :, -1:], rtol=1e-5, atol=1e-6)


def test_strided_qkv_as_the_model_passes_them():
    B, T, H, D = 2, 37, 2, 16
    qkv = torch.randn(B, T, 3 * H * D)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(H * D, dim=2))  # non-contiguous views
    assert not q.is_contiguous()
    for scorer in ("ssa", "lssar"):
        torch.testing.assert_close(kernels.attention(q, k, v, scorer),
                                   kernels.attention(q.contiguous(), k.contiguous(), v.contiguous(), scorer))


def test_fused_ssmax_differs_from_softmax():
    q, k, v, _ = _inputs(63, 0, 16)
    ssmax, softmax = kernels.attention(q, k, v, "ssmax"), kernels.attention(q, k, v, "softmax")
    assert (ssmax - softmax).abs().max() > 0.05  # s log n_i != 1 for most rows: the scorer really ran
    s = torch.full((2,), 1 / math.log(3))  # s log n = 1 at row i = 2 (n = 3): that row equals softmax
    torch.testing.assert_close(kernels.attention(q, k, v, "ssmax", s=s)[:, :, 2], softmax[:, :, 2])


def test_scorer_parameters_receive_nonzero_gradients():
    q, k, v, do = _inputs(20, 5, 16)
    for scorer, kw in [(name, kw) for name, kw in CASES if SCORERS[name].params]:  # re-weighted too
        grads = _run(triton_attention, scorer, kw, q, k, v, do, torch.float32, 5)[4:]
        assert len(grads) == len(SCORERS[scorer].params) and all((g.abs() > 0).all() for g in grads), (scorer, grads)


class _Pinned:
    """An autotuned launcher pinned to one block shape (the interpreter can run only one config)."""
    def __init__(self, kernel, block_m, block_n):
        self.kernel, self.meta = kernel, dict(BLOCK_M=block_m, BLOCK_N=block_n)

    def __getitem__(self, grid):
        return lambda *args, **kw: self.kernel[grid(self.meta)](*args, **kw, **self.meta)


def test_autotune_keeps_the_shapes_of_the_inputs_dtype_and_drops_tiles_whose_accumulator_would_spill():
    import triton
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
               for m, n, w, s in kernels.FWD_TUNE + kernels.FWD_TUNE_FP32]
    prune = kernels._pick(kernels.FWD_TUNE, kernels.FWD_TUNE_FP32, "fwd")
    kept = lambda dtype, D: [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)  # noqa: E731
                             for c in prune(configs, {"Q": torch.empty(0, dtype=dtype)}, HEAD_DIM=D)]
    assert kept(torch.bfloat16, 64) == kernels.FWD_TUNE  # 128 x 64 fp32 over 128 threads: 64 registers, fits
    assert kept(torch.bfloat16, 128) == [t for t in kernels.FWD_TUNE if t[:3] != (128, 64, 4)]
    assert kept(torch.float32, 128) == kernels.FWD_TUNE_FP32  # tf32x3 shapes that fit sm_90's shared memory


def test_dkdv_autotune_drops_tiles_whose_dk_and_dv_accumulators_exceed_64_registers_a_thread():
    # (32, 64) on 4 warps at D = 128 holds 2 x 64 x 128 fp32 over 128 threads: on an H100 its dk came out wrong,
    # differently each run, where every other config was right (bench/README.md, 2026-11-27)
    import triton
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
               for m, n, w, s in dict.fromkeys(kernels.BWD_TUNE + kernels.BWD_TUNE_FP32)]  # as kernels._configs
    kept = lambda kernel, dtype, D: [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)  # noqa
                                     for c in kernels._pick(kernels.BWD_TUNE, kernels.BWD_TUNE_FP32, kernel)(
                                         configs, {"Q": torch.empty(0, dtype=dtype)}, HEAD_DIM=D)]
    assert kept("dkdv", torch.bfloat16, 128) == [t for t in kernels.BWD_TUNE if t != (32, 64, 4, 2)]
    assert (32, 64, 4, 2) in kept("dq", torch.bfloat16, 128)  # dq accumulates BLOCK_M x D only
    assert kept("dkdv", torch.bfloat16, 64) == kept("dq", torch.bfloat16, 64) == kernels.BWD_TUNE
    assert kept("dkdv", torch.float32, 128) == [(64, 32, 8, 2), (32, 32, 4, 2)]


GPU_SHAPES = list(zip(kernels.FWD_TUNE + kernels.FWD_TUNE_FP32, kernels.BWD_TUNE + kernels.BWD_TUNE_FP32))


@pytest.mark.parametrize("i", range(len(GPU_SHAPES)),
                         ids=[f"fwd{f[0]}x{f[1]}-bwd{b[0]}x{b[1]}" for f, b in GPU_SHAPES])
def test_every_gpu_block_shape_matches_reference(monkeypatch, i):
    # the GPU autotunes over these shapes; T = 257 leaves a ragged last block for every one of them. The tiling is
    # the same code for every scorer (each runs every path at the default shape above): a shape runs three cases in
    # turn, so every case runs at two shapes or more
    fwd, bwd = GPU_SHAPES[i]
    monkeypatch.setattr(kernels, "_attn_fwd_tuned", _Pinned(kernels._attn_fwd, *fwd[:2]))
    monkeypatch.setattr(kernels, "_attn_bwd_dq_tuned", _Pinned(kernels._attn_bwd_dq, *bwd[:2]))
    monkeypatch.setattr(kernels, "_attn_bwd_dkdv_tuned", _Pinned(kernels._attn_bwd_dkdv, *bwd[:2]))
    for scorer, kw in {j % len(CASES): CASES[j % len(CASES)] for j in range(3 * i, 3 * i + 3)}.values():
        _check(scorer, kw, 257, 0, 32, B=1)


@pytest.mark.parametrize("Tq,offset,D", SHAPES, ids=[f"Tq{t}-off{o}-D{d}" for t, o, d in SHAPES])
def test_fused_runs_a_row_template_scorer_it_has_no_branch_for(off_by_one, Tq, offset, D):
    """cases.OFF_BY_ONE: the running max from 0, eps in decode's first split, exact sigma without dividing by sum P
    (s, b learn), the same in FlexAttention; all scores 0 and large ones."""
    kw = dict(s=[0.7, 1.3], b=[0.2, -0.4])
    _check(off_by_one, kw, Tq, offset, D)
    q, k, v, _ = _inputs(Tq, offset, D)
    prm = {n: torch.tensor(x) for n, x in kw.items()}
    ref = _ref(q.double(), k.double(), v.double(), off_by_one, offset=offset, **{n: x.double() for n, x in prm.items()})
    assert _err(kernels_flex.flex_attention(q, k, v, off_by_one, offset=offset, **prm), ref) < 2e-5
    if Tq == 40:
        _check(off_by_one, kw, Tq, offset, D, scale=0.0)
        _check(off_by_one, kw, Tq, offset, D, scale=60.0, atol=2e-4)


# ----------------------------------------------------------------------------------------------------------------
# Edge rows: no NaN/Inf for finite inputs

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


def test_shape_errors_are_clear():
    q, k, v, _ = _inputs(8, 0, 16)
    with pytest.raises(AssertionError, match="offset"):
        kernels.attention(q, k, v, "softmax", offset=3)
    with pytest.raises(ValueError, match="unknown scorer"):
        kernels.attention(q, k, v, "sparsemax")
    with pytest.raises(ValueError, match="needs normalised rows"):  # re-weighting does not apply to sigmoid
        kernels.attention(q, k, v, "sigmoid", p=3.0)


# ----------------------------------------------------------------------------------------------------------------
# FlexAttention peer: eager forward on CPU (its backward is CUDA-only)

@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("Tq,offset", [(1, 0), (37, 0), (20, 30), (1, 130)])
@pytest.mark.parametrize("scorer,kw", [case for case, _ in FLEX], ids=[i for _, i in FLEX])
def test_flex_forward_matches_reference(scorer, kw, Tq, offset):
    q, k, v, _ = _inputs(Tq, offset, 16)
    params = {n: _param(x, k) for n, x in kw.items() if n != "p"}
    out = kernels_flex.flex_attention(q, k, v, scorer, p=kw.get("p"), offset=offset, **params)
    ref = _ref(q.double(), k.double(), v.double(), scorer, p=kw.get("p"), offset=offset,
               **{n: x.double() for n, x in params.items()})
    assert out.shape == q.shape and _err(out, ref) < 2e-5


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("Tq,offset", [(1, 0), (37, 0), (20, 30), (1, 130)])
def test_flex_runs_fox_with_its_forget_bias(Tq, offset):
    q, k, v, _ = _inputs(Tq, offset, 16)
    c = torch.nn.functional.logsigmoid(torch.randn(k.shape[:3]) + 1).cumsum(-1)  # c_i - c_j: down to ~ -40
    out = kernels_flex.flex_attention(q, k, v, "fox", offset=offset, c=c)
    ref = _ref(q.double(), k.double(), v.double(), "fox", offset=offset, c=c.double())
    assert _err(out, ref) < 2e-5
    assert offset + Tq == 1 or _err(out, _ref(q, k, v, "softmax", offset=offset)) > 1e-2  # the bias ran


def test_fox_dc_is_minus_the_column_sums_of_dS_because_its_row_sums_vanish():
    # dc_i = sum_j dS_ij - sum_i' dS_i'i with dS = P (dP - delta): the fused backward sums only the columns, as each
    # row of dS sums to 0 (a softmax row is shift-invariant). Checked on the float64 reference, after a cache
    q, k, v, do = (x.double() for x in _inputs(40, 23, 16))
    c = _param("gates", k, torch.float64).requires_grad_()
    dc, = torch.autograd.grad(_ref(q, k, v, "fox", offset=23, c=c), c, do)
    P = model.attention_weights(q, k, "fox", offset=23, c=c.detach())
    dP = do @ v.transpose(-2, -1)
    dS = P * (dP - (P * dP).sum(-1, keepdim=True))
    assert dS.sum(-1).abs().max() < 1e-13 * dS.abs().max()  # the row-sum term: rounding only
    torch.testing.assert_close(dc, -dS.sum(-2), rtol=1e-10, atol=1e-12)


def test_a_scorer_without_a_kernel_on_a_backend_is_refused_there_with_one_line():
    q = torch.randn(1, 2, 8, 16)
    c = torch.zeros(1, 2, 8)
    with pytest.raises(ValueError, match="scorer 'stickbreaking' runs on backends .*, not 'flex' .no kernel"):
        kernels_flex.flex_attention(q, q, q, "stickbreaking")
    with pytest.raises(ValueError, match="backend='flex' does not run scorer='stickbreaking'"):
        model.GPTConfig(scorer="stickbreaking", backend="flex")
    with pytest.raises(ValueError, match="needs normalised rows; scorer='stickbreaking'"):  # its own kernel too
        triton_attention(q, q, q, "stickbreaking", p=3.0)
    with pytest.raises(ValueError, match="scorer 'fox' runs on backends torch, sdpa, triton, flex, not 'cpu'"):
        model.attention(q, q, q, "fox", backend="cpu", c=c)
    with pytest.raises(ValueError, match="scorer 'fox' needs c="):
        model.attention(q, q, q, "fox")
    with pytest.raises(AssertionError, match=r"c \(B, H, Tk\) = \(1, 2, 8\) expected, got \(1, 2, 7\)"):
        kernels.attention(q, q, q, "fox", c=c[..., 1:])


# ----------------------------------------------------------------------------------------------------------------
# CUDA only: real bf16, D = 128, long sequences, compiled FlexAttention backward

@cuda
@pytest.mark.parametrize("scorer,kw", CASES, ids=IDS)
def test_cuda_bf16_head_dim_128_long_sequence(scorer, kw):
    _check(scorer, kw, 1000, 0, 128, dtype=torch.bfloat16, B=1, device="cuda", atol=3e-3)
    _check(scorer, kw, 300, 700, 64, dtype=torch.float16, B=1, device="cuda", atol=3e-3)


@cuda
@pytest.mark.parametrize("scorer,kw", CASES, ids=IDS)
def test_cuda_fp32_inputs_tf32x3_dots_match_reference(scorer, kw):  # ~fp32 accuracy, not tf32's 1e-3
    _check(scorer, kw, 257, 0, 64, device="cuda")


@cuda
@pytest.mark.parametrize("scorer,kw", CASES, ids=IDS)
def test_cuda_decode_after_long_cache(scorer, kw):
    _check(scorer, kw, 1, 8191, 128, dtype=torch.bfloat16, B=1, device="cuda", atol=3e-3)


@cuda
@pytest.mark.parametrize("scorer,kw", CASES, ids=IDS)
def test_cuda_calls_never_synchronize_with_the_host(scorer, kw):
    # a host-to-device copy per call (say, default s, b, n made on the CPU) stalls the GPU queue in every layer
    q, k, v, do = _inputs(300, 0, 64, B=1, dtype=torch.bfloat16, device="cuda")
    params = {n: _param(x, k).requires_grad_() for n, x in kw.items() if n != "p"}
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    full = lambda: triton_attention(q, k, v, scorer, p=kw.get("p"), **params).backward(do)  # noqa: E731
    decode = lambda: triton_attention(q[:, :, -1:], k, v, scorer, p=kw.get("p"), offset=299,  # noqa: E731
                                       **params).backward(do[:, :, -1:])
    for call in (full, decode):
        call()  # compiling and autotuning synchronize: once, before the check
        torch.cuda.set_sync_debug_mode("error")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")


@cuda
@pytest.mark.parametrize("scorer,kw", [case for case, _ in FLEX], ids=[i for _, i in FLEX])
def test_cuda_flex_forward_and_backward(scorer, kw):
    q, k, v, do = _inputs(200, 0, 64, device="cuda")
    flex = _run(kernels_flex.flex_attention, scorer, kw, q, k, v, do, torch.float32, 0)
    ref = _run(_ref, scorer, kw, q, k, v, do, torch.float64, 0)
    for f, r in zip(flex, ref):
        assert torch.isfinite(f).all() and _err(f, r) < 2e-3


@cuda
def test_cuda_memory_is_linear_in_sequence_length():
    peaks = []
    for T in (4096, 8192):
        q, k, v, do = _inputs(T, 0, 64, B=1, H=4, dtype=torch.bfloat16, device="cuda")
        q.requires_grad_()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        kernels.attention(q, k, v, "lssar").backward(do)
        peaks.append(torch.cuda.max_memory_allocated() - base)
    assert peaks[1] < 2.5 * peaks[0] and peaks[1] < 4 * T * 4 * 64 * 2 * 8  # a T x T matrix would be 256 MiB


# ----------------------------------------------------------------------------------------------------------------
# Benchmark (`python bench/attention.py`): a tiny CPU configuration through the same code as the H100 table

REPO = os.path.dirname(os.path.abspath(kernels.__file__))
BENCH = os.path.join(REPO, "bench", "attention.py")
_spec = importlib.util.spec_from_file_location("bench_attention", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_benchmark_writes_one_timed_row_per_configuration_csv_and_png(tmp_path):
    scorers, providers, modes = ["softmax", "lssar"], ["triton", "eager", "sdpa"], ["fwd", "fwd+bwd"]
    rows = bench.benchmark(Ts=[32], Ds=[16], scorers=scorers, providers=providers, tokens=32, heads=2,
                           dtype=torch.float32, device="cpu", out=tmp_path / "k")
    with open(tmp_path / "k.csv", newline="") as f:
        table = list(csv.DictReader(f))
    keys = sorted((r["scorer"], r["provider"], int(r["D"]), int(r["T"]), r["mode"]) for r in table)
    expected = [(s, p, 16, 32, m) for s in scorers for p in providers for m in modes if (s, p) != ("lssar", "sdpa")]
    assert keys == sorted(expected) and len(rows) == 10  # SDPA has no lssar
    for r in table:
        assert r["status"] == "ok" and r["device"] and r["peak_mib"] == ""  # no peak memory on CPU
        assert 0 < float(r["ms"]) < math.inf and 0 < float(r["tflops"]) < math.inf
    assert (tmp_path / "k.png").stat().st_size > 0


def _cpu_python(*args, cwd=REPO):
    """python *args as on a CPU machine (on a GPU one too): no CUDA device, no TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def test_triton_backend_on_cpu_without_interpreter_is_one_clear_error():
    # not Triton's 100-line "0 active drivers" traceback from deep in the launcher
    r = _cpu_python("-c", "import torch, model; q = torch.zeros(1, 1, 4, 16); "
                          "model.attention(q, q, q, 'lssar', backend='triton')")
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == f"RuntimeError: {kernels.NO_GPU}", r.stderr
    assert len(r.stderr.splitlines()) < 10 and "active drivers" not in r.stderr


def test_benchmark_script_on_cpu_exits_with_one_line_and_writes_nothing(tmp_path):
    r = _cpu_python(BENCH, "--T", "32", "--D", "16", cwd=tmp_path)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "CUDA GPU" in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())  # no stray bench/kernels.csv: files only under an explicit --out


def test_sdpa_peer_runs_the_backend_it_names():  # unpinned, torch may pick cuDNN over flash on Hopper
    q, k, v, _ = _inputs(40, 0, 16)
    torch.testing.assert_close(bench._sdpa(q, k, v, "softmax"), _ref(q, k, v, "softmax"), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError):  # no cuDNN attention on the CPU: the pin is applied, not a hint
        bench._sdpa(q, k, v, "softmax", backend=bench.SDPBackend.CUDNN_ATTENTION)


@cuda
@pytest.mark.parametrize("scorer", ["softmax", "ssmax", "ssa", "lssar", "sigmoid", "stickbreaking"])
def test_cuda_162M_model_forward_at_20000_tokens(scorer):
    """The issue's bar for the fused path: the paper's 162M model scores a 20,000-token sequence on one GPU."""
    torch.manual_seed(0)
    gpt = model.GPT(model.GPTConfig(scorer=scorer)).cuda().eval()
    idx = torch.randint(0, gpt.config.vocab_size, (1, 20_000), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        _, loss = gpt(idx, idx, reduction="none")
    assert loss.shape == (1, 20_000) and torch.isfinite(loss).all()
    assert abs(loss.mean().item() - math.log(gpt.config.vocab_size)) < 1.0  # an untrained model: ~uniform
