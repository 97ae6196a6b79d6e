"""
The scorers' math in the fused Triton kernels (kernels.py), on a tile of dot products qk: where a new scorer adds its
branches (SCORERS.md, "Adding a scorer"). The kernels compile each helper from the scorer's registry flags
(kernels.FLAGS), listed in KERNELS. Each ROW has its branch in _row_setup and _keys, each LOGIT in _logit (the stage-1
score; _prob, _prob_bwd: its weights) and _grad_factor (the backward's factor); a value without one fails at compile
time (tl.static_assert; tests/test_registry.py runs every helper with every registry scorer's flags). _terms (the row
template's numerator and divisor terms) and _prob_bwd's F have a default that a LOGIT may override. Also what every
Triton kernel file shares: INTERPRET, NO_GPU, _dot_types, _log2, _log2_1p.
Logs and exps are base 2 (ln 2 folded into the scales): on sm_90 tl.exp is ex2.approx after a multiply, and tl.log
and tl.log2 are a ~20-instruction software log, so _log2 issues the hardware's lg2.approx (bench/README.md).
"""
import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # CPU: kernels run in Triton's interpreter
NO_GPU = "the fused Triton kernels need a CUDA GPU (or TRITON_INTERPRET=1 for testing); use backend=torch"

# the flag combinations (ROW, LOGIT, ONLINE_MAX, NORMALISE) that the helpers implement: kernels._prepare refuses others
KERNELS = {("plain", "linear", True, True), ("logn", "linear", True, True), ("plain", "ssa", True, True),
           ("norm", "softplus", False, True), ("bias", "sigmoid", False, False), ("plain", "softpick", True, True),
           ("forget", "forget", True, True)}
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
ASM = tl.constexpr(not INTERPRET)  # inline PTX on the GPU; the interpreter runs the same math in plain ops


def _dot_types(dtype):
    # the interpreter's bf16 is wrong: dot in fp32 there
    # fp32: tf32x3, ~fp32 accuracy on tensor cores ("ieee" spills)
    if dtype == torch.float32 or (INTERPRET and dtype == torch.bfloat16):
        return tl.float32, "tf32x3"
    return (tl.float16 if dtype == torch.float16 else tl.bfloat16), "tf32"


@triton.jit
def _log2(x):
    # lg2.approx: absolute error <= 2^-22 on [1/2, 2], else 2 ulp (CUDA guide, __log2f)
    if ASM:
        y = tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        y = tl.log2(x)
    return y


@triton.jit
def _log2_1p(t):
    # log2(1 + t), no log1p in Triton: series for 0 <= t < 1/8 (truncated
    # at t^8/8 < 2^-24 relative), so rows of tiny weights keep them
    series = t * (LOG2E - t * (LOG2E / 2 - t * (LOG2E / 3 - t * (LOG2E / 4 - t * (LOG2E / 5 - t * (
        LOG2E / 6 - t * (LOG2E / 7)))))))
    return tl.where(t < 0.125, series, _log2(1.0 + t))


@triton.jit
def _softplus2(u):  # log2(1 + 2^u)
    return tl.maximum(u, 0.0) + _log2_1p(tl.exp2(-tl.abs(u)))


@triton.jit
def _sigmoid(qk, c, b, DT: tl.constexpr):
    """sigmoid((qk c - b) ln 2), c and b per row. 16-bit inputs on a GPU: FlashSigmoid's 1/2 + tanh(./2)/2, one
    tanh.approx (relative error 2^-11 documented, 1.1e-5 by NVIDIA's forum on sm_75, not measured here;
    bench/README.md); fp32 inputs and the interpreter: exact."""
    if ASM and DT != tl.float32:
        u = qk * (c * (LN2 / 2))[:, None] - (b * (LN2 / 2))[:, None]
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [u], dtype=tl.float32, is_pure=True, pack=1)
        w = 0.5 + 0.5 * t
    else:  # exp2 overflow gives w = 0, never NaN
        w = 1.0 / (1.0 + tl.exp2(b[:, None] - qk * c[:, None]))
    return w


@triton.jit
def _row_setup(QS, rows, row_ok, t, offset, s_h, b_h, sm_scale, ROW: tl.constexpr):
    """Query rows t: n_i (keys the row attends to), the re-weighting offset o_i (0 for absolute rows i < 3) and
    the multiplier c of q.k: the base-2 logit scale, or for lssa the base-2 exponent log(d) log(n_i) / |q_i| / ln 2;
    for fox the row's forget sum c_i instead (its scale is the plain one, in _logit)."""
    n_i = (offset + t + 1).to(tl.float32)
    if ROW == "logn":  # ssmax: s log n_i + b folds into the scale: free
        c = (s_h * tl.log(n_i) + b_h) * (sm_scale * LOG2E)
    elif ROW == "norm":  # lssa: sm_scale carries log(d); A in units of 1/ln 2 (P is scale-free)
        c = tl.log(n_i) * (sm_scale * LOG2E) * tl.load(QS + rows, mask=row_ok, other=0.0)
    elif ROW == "forget":  # fox: QS holds c of the query rows
        c = tl.load(QS + rows, mask=row_ok, other=0.0)
    elif ROW == "plain" or ROW == "bias":  # bias subtracts log n_i in _logit
        c = n_i * 0.0 + sm_scale * LOG2E
    else:
        tl.static_assert(False, "kernels_math._row_setup has no branch for this ROW (SCORERS.md)")
    return n_i, tl.where(n_i > 3.0, 1.0, 0.0), c


@triton.jit
def _keys(KS, cols, Tk, ROW: tl.constexpr):
    """The row setup's per-key values (KS): lssa's inverse key norms |k_j|^-1, fox's c_j; else zeros."""
    if ROW == "norm" or ROW == "forget":
        ks = tl.load(KS + cols, mask=cols < Tk, other=0.0)
    elif ROW == "plain" or ROW == "logn" or ROW == "bias":
        ks = cols * 0.0
    else:
        tl.static_assert(False, "kernels_math._keys has no branch for this ROW (SCORERS.md)")
    return ks


@triton.jit
def _logit(qk, c, ks, n_i, sm_scale, b_h, n_h, LOGIT: tl.constexpr, DT: tl.constexpr):
    """Stage-1 score: a base-2 logit x (ONLINE_MAX: P = exp2(x - M)), or the weight itself (lssa's A: P = A
    exp2(-M); sigmoid's w: P = w)."""
    if LOGIT == "ssa":  # log domain: no pow of negatives; sgn(0) moot (log 1 = 0); log1p: an fp32 1 + b|z| loses
        x = tl.where(qk < 0, -n_h, n_h) * _log2_1p((b_h * sm_scale) * tl.abs(qk))  # eps / (b|z|) of dn at small b
    elif LOGIT == "softplus":
        x = _softplus2(qk * c[:, None] * ks[None, :])
    elif LOGIT == "sigmoid":
        x = _sigmoid(qk, c, tl.log2(n_i), DT)
    elif LOGIT == "forget":  # fox: z + c_i - c_j, the difference in fp32 (c grows with length)
        x = qk * (sm_scale * LOG2E) + (c[:, None] - ks[None, :]) * LOG2E
    elif LOGIT == "linear" or LOGIT == "softpick":
        x = qk * c[:, None]
    else:
        tl.static_assert(False, "kernels_math._logit has no branch for this LOGIT (SCORERS.md)")
    return x


@triton.jit
def _terms(x, m, LOGIT: tl.constexpr):
    """The row template's terms of base-2 logits x, times 2^-m: P = num / L with L = sum den + eps. num = den =
    a = 2^(x - m) unless a branch says otherwise: L is the weights' own sum."""
    a = tl.exp2(x - m)
    num, den = a, a
    if LOGIT == "softpick":  # e^z - 1 = 2^m (2^(x - m) - 2^-m); near x = 0 2^-m expm1(x ln 2) by its series (to
        y = x * LN2          # y^5 / 120; 7e-9 relative at |x| = 1/8): the difference cancels there (eps / |x|)
        e1 = y * (1.0 + y * (0.5 + y * (1.0 / 6 + y * (1.0 / 24 + y * (1.0 / 120)))))
        e = tl.exp2(-m)
        u = tl.where(tl.abs(x) < 0.125, e * e1, a - e)
        num, den = tl.maximum(u, 0.0), tl.abs(u)
    return num, den


@triton.jit
def _prob(x, m1, LOGIT: tl.constexpr, ONLINE_MAX: tl.constexpr, NORMALISE: tl.constexpr):
    """Stage-1 weights P from _logit's x and the row statistic m1 (log2 of the row's divisor L)."""
    if ONLINE_MAX:
        P, _ = _terms(x, m1[:, None], LOGIT)
    elif NORMALISE:
        P = x * tl.exp2(-m1)[:, None]
    else:
        P = x
    return P


@triton.jit
def _prob_bwd(x, qk, m1, sm_scale, b_h, n_h, LOGIT: tl.constexpr, ONLINE_MAX: tl.constexpr, NORMALISE: tl.constexpr):
    """The backward's P and F, the P-like factor of _grad_factor's W: F = P, but for ssa one power gives F = P / (1
    + b|z|) and P = F (1 + b|z|), no divide. F < 2^-126 flushes to 0: a P < 2^-62 for b|z| < 2^64, below fp32's
    2^-24 of the row (its largest P >= 1/n)."""
    if LOGIT == "ssa":
        F = _prob(x - tl.abs(x) * (1.0 / n_h), m1, LOGIT, ONLINE_MAX, NORMALISE)  # |x| / n = log2(1 + b|z|)
        P = F * (1.0 + (b_h * sm_scale) * tl.abs(qk))  # _logit's base: computed once
    else:
        P = _prob(x, m1, LOGIT, ONLINE_MAX, NORMALISE)
        F = P
    return P, F


@triton.jit
def _grad_factor(qk, x, P, dP, keep, c, ks, m1, sm_scale, b_h, n_h, LOGIT: tl.constexpr, MASK: tl.constexpr):
    """dL/dqk = (dP num'/den' - sigma_i) W, W = den'/L (' = d/dqk), sigma_i = sum_j P dP (0 without L); P is
    _prob_bwd's F. Returns dP num'/den' (dP while den = num) and W, 0 where masked (MASK: not keep): most W carry P,
    already 0 there."""
    if LOGIT == "softplus":  # 1/l_i sigmoid(u) c_i ks_j; sigmoid(u) = 2^(u - x), base-2 u, x
        u = qk * c[:, None] * ks[None, :]
        W = (c * tl.exp2(-m1))[:, None] * ks[None, :] * tl.exp2(u - x)
        if MASK:
            W = tl.where(keep, W, 0.0)
    elif LOGIT == "ssa":  # dlogit/dz = n b / (1 + b|z|); P here is P / (1 + b|z|)
        W = P * (n_h * b_h * sm_scale)
    elif LOGIT == "sigmoid":  # dw/dz = w (1 - w)
        W = P * (1.0 - P) * sm_scale
    elif LOGIT == "softpick":  # u = e^z - 1: gate [u > 0], W = sgn(u) e^z / L
        E = tl.exp2(x - m1[:, None])
        dP = tl.where(P > 0, dP, 0.0)
        W = tl.where(P > 0, E, tl.where(x < 0, -E, 0.0)) * sm_scale  # sgn z from x: 2^x rounds to 1 near 0
        if MASK:
            W = tl.where(keep, W, 0.0)
    elif LOGIT == "forget":  # dlogit/dqk = 1/sqrt(d); c_i - c_j is a bias
        W = P * sm_scale
    elif LOGIT == "linear":  # softmax, ssmax: dlogit/dqk = c_i / log2(e)
        W = P * (c / LOG2E)[:, None]
    else:
        tl.static_assert(False, "kernels_math._grad_factor has no branch for this LOGIT (SCORERS.md)")
    return dP, W
