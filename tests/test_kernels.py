"""Fused Triton kernels (kernels.py) against the float64 reference (model.attention, backend="torch"): forward and
every gradient at odd lengths and after a cache, fp32, fp16 and bf16, under the GPU's tf32x3 dots and approximate
log2/exp2, decoding, strided inputs, a row-template scorer with no branch of its own, FoX's dc; the case tables and
helpers that tests/test_kernels_*.py share (edge rows, block shapes, FlexAttention, CUDA, benchmark).
On CPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1): small shapes only.
Errors are max|fused - ref64| / max|ref64| per tensor, bounded by a multiple of the reference's own error when it
runs in the same precision (fp32, fp16, bf16) plus a small atol: a well-conditioned case is then held to ~1e-4,
while re-weighting, whose dP carries p n / (n P - o), is allowed the reference's own fp32 sensitivity."""
import functools
import math

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
FLEX = list(zip(cases("flex", lambda prm: [prm.default - 0.3, prm.default + 0.5]),  # one without a kernel too
                ids(cases("flex"))))
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


def _check(scorer, kw, Tq, offset, D, dtype=torch.float32, factor=3.0, atol=3e-5, param_atol=None, **inp):
    """The fused path's error against float64 within factor x the fp32 reference's own error + atol (param_atol for
    the gradients of s, b, n, c where given)."""
    q, k, v, do = _inputs(Tq, offset, D, **inp)
    q, k, v = (x.to(dtype) for x in (q, k, v))  # both paths see the same rounded inputs
    ref64 = _run(_ref, scorer, kw, q, k, v, do, torch.float64, offset)
    ref_lp = _run(_ref, scorer, kw, q, k, v, do, dtype, offset)
    fused = _run(triton_attention, scorer, kw, q, k, v, do, dtype, offset)
    names = ["out", "dq", "dk", "dv"] + [n for n in kw if n != "p"]
    for i, (name, f, r, lp) in enumerate(zip(names, fused, ref64, ref_lp)):
        assert f.dtype == lp.dtype and f.shape == r.shape, name
        assert torch.isfinite(f).all(), f"{name} has NaN/Inf"
        err, own, tol = _err(f, r), _err(lp, r), atol if i < 4 or param_atol is None else param_atol
        assert err <= factor * own + tol, f"{scorer} {kw} {name}: error {err:.2e}, reference's own {own:.2e}"
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
    fp32 bounds, huge logits too. A per-head parameter's gradient sums every score's term, and its terms cancel: ssa
    p = 3 at offset 23 has b 8.4e-5 and n 9.3e-5 here (3.4e-5 and 1.3e-5 with exact functions; lg2.approx's 2^-22 is
    absolute, large beside log2(1 + b|z|) near 0), where the fp32 reference's own error is 1.6e-5 / 1.4e-5 with
    AVX-512 matmuls and 5.7e-5 / 3.1e-5 with AVX2: a bound of 3x that + 3e-5 was a draw of the machine. Those
    gradients get 1e-4 (a wrong gradient is off by far more); outputs and dq, dk, dv keep 3e-5."""
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_log2", _gpu_lg2)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_exp2", _gpu_ex2)
    _check(scorer, kw, 63, 0, 32, param_atol=1e-4)
    _check(scorer, kw, 40, 23, 32, param_atol=1e-4)
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
