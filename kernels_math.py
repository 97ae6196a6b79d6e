"""
The scorers' math in the fused Triton kernels (kernels.py), on a tile of dot products qk: where a new scorer adds its
branches (SCORERS.md, "Adding a scorer"). The kernels compile each helper from the scorer's registry flags
(kernels.FLAGS): _row_setup and _keys (ROW), _logit (LOGIT: the stage-1 score; _prob: its weights), _terms (the row
template's numerator and divisor terms) and _grad_factor (the backward's factor); KERNELS lists the flag
combinations they implement. Also what every Triton kernel file shares: INTERPRET, _dot_types, _log1p.
"""
import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # CPU: kernels run in Triton's interpreter

# by the first four flags: SUMS_TO_ONE is generic
KERNELS = {("plain", "linear", True, True), ("logn", "linear", True, True), ("plain", "ssa", True, True),
           ("norm", "softplus", False, True), ("bias", "sigmoid", False, False), ("plain", "softpick", True, True),
           ("forget", "forget", True, True)}
LOG2E = tl.constexpr(1.4426950408889634)


def _dot_types(dtype):
    # the interpreter's bf16 is wrong: dot in fp32 there
    # fp32: tf32x3, ~fp32 accuracy on tensor cores ("ieee" spills)
    if dtype == torch.float32 or (INTERPRET and dtype == torch.bfloat16):
        return tl.float32, "tf32x3"
    return (tl.float16 if dtype == torch.float16 else tl.bfloat16), "tf32"


@triton.jit
def _log1p(t):
    # no log1p in Triton: series for 0 <= t < 1/8 (6e-7 relative),
    # so lssa rows with all u << 0 keep tiny non-zero weights
    series = t * (1 - t * (1 / 2 - t * (1 / 3 - t * (1 / 4 - t * (1 / 5 - t * (1 / 6 - t * (1 / 7)))))))
    return tl.where(t < 0.125, series, tl.log(1.0 + t))


@triton.jit
def _softplus(u):
    return tl.maximum(u, 0.0) + _log1p(tl.exp(-tl.abs(u)))


@triton.jit
def _row_setup(QS, rows, row_ok, t, offset, s_h, b_h, sm_scale, ROW: tl.constexpr):
    """Query rows t: n_i (keys the row attends to), the re-weighting offset o_i (0 for absolute rows i < 3) and
    the multiplier c of q.k: the base-2 logit scale, or for lssa the exponent log(d) log(n_i) / |q_i|; for fox
    the row's forget sum c_i instead (its scale is the plain one, in _logit)."""
    n_i = (offset + t + 1).to(tl.float32)
    ln_n = tl.log(n_i)
    if ROW == "logn":  # ssmax: s log n_i + b folds into the scale: free
        c = (s_h * ln_n + b_h) * (sm_scale * LOG2E)
    elif ROW == "norm":  # lssa: sm_scale carries log(d)
        c = ln_n * sm_scale * tl.load(QS + rows, mask=row_ok, other=0.0)
    elif ROW == "forget":  # fox: QS holds c of the query rows
        c = tl.load(QS + rows, mask=row_ok, other=0.0)
    else:  # plain; bias subtracts log n_i in _logit
        c = ln_n * 0.0 + sm_scale * LOG2E
    return n_i, tl.where(n_i > 3.0, 1.0, 0.0), c


@triton.jit
def _keys(KS, cols, Tk, ROW: tl.constexpr):
    """The row setup's per-key values (KS): lssa's inverse key norms |k_j|^-1, fox's c_j; else zeros."""
    ks = cols * 0.0
    if ROW == "norm" or ROW == "forget":
        ks = tl.load(KS + cols, mask=cols < Tk, other=0.0)
    return ks


@triton.jit
def _logit(qk, c, ks, n_i, sm_scale, b_h, n_h, LOGIT: tl.constexpr):
    """Stage-1 score: a base-2 logit x (ONLINE_MAX: P = exp2(x - M)), or the weight itself (lssa's A: P = A
    exp2(-M); sigmoid's w: P = w)."""
    if LOGIT == "ssa":  # log domain: no pow of negatives; sgn(0) moot (log 1 = 0)
        z = qk * sm_scale
        x = tl.where(z < 0, -n_h, n_h) * tl.log2(1.0 + b_h * tl.abs(z))
    elif LOGIT == "softplus":
        x = _softplus(qk * c[:, None] * ks[None, :])
    elif LOGIT == "sigmoid":  # exp2 overflow gives w = 0, never NaN
        x = 1.0 / (1.0 + tl.exp2(tl.log2(n_i)[:, None] - qk * c[:, None]))
    elif LOGIT == "forget":  # fox: z + c_i - c_j, the difference in fp32 (c grows with length)
        x = qk * (sm_scale * LOG2E) + (c[:, None] - ks[None, :]) * LOG2E
    else:  # "linear", "softpick"
        x = qk * c[:, None]
    return x


@triton.jit
def _terms(a, m, LOGIT: tl.constexpr):
    """The row template's terms of base-2 logits x from a = 2^(x - m), both times 2^-m: P = num / L with
    L = sum den + eps. num = den = a unless a branch says otherwise: L is the weights' own sum."""
    num, den = a, a
    if LOGIT == "softpick":  # e^z - 1 = 2^m (2^(x - m) - 2^-m)
        u = a - tl.exp2(-m)
        num, den = tl.maximum(u, 0.0), tl.abs(u)
    return num, den


@triton.jit
def _prob(x, m1, LOGIT: tl.constexpr, ONLINE_MAX: tl.constexpr, NORMALISE: tl.constexpr):
    """Stage-1 weights P from _logit's x and the row statistic m1 (log2 of the row's divisor L)."""
    if ONLINE_MAX:
        P, _ = _terms(tl.exp2(x - m1[:, None]), m1[:, None], LOGIT)
    elif NORMALISE:
        P = x * tl.exp2(-m1)[:, None]
    else:
        P = x
    return P


@triton.jit
def _grad_factor(qk, x, P, dP, keep, c, ks, m1, sm_scale, b_h, n_h, LOGIT: tl.constexpr, MASK: tl.constexpr):
    """dL/dqk = (dP num'/den' - sigma_i) W, W = den'/L (' = d/dqk), sigma_i = sum_j P dP (0 without L). Returns
    dP num'/den' (dP while den = num) and W, 0 where masked (MASK: not keep): most W carry P, already 0 there."""
    if LOGIT == "softplus":  # 1/l_i sigmoid(u) c_i ks_j; sigmoid(u) = exp(u - x)
        u = qk * c[:, None] * ks[None, :]
        W = (c * tl.exp2(-m1))[:, None] * ks[None, :] * tl.exp(u - x)
        if MASK:
            W = tl.where(keep, W, 0.0)
    elif LOGIT == "ssa":  # dlogit/dz = n b / (1 + b|z|)
        W = P * (n_h * b_h * sm_scale) / (1.0 + b_h * tl.abs(qk * sm_scale))
    elif LOGIT == "sigmoid":  # dw/dz = w (1 - w)
        W = P * (1.0 - P) * sm_scale
    elif LOGIT == "softpick":  # u = e^z - 1: gate [u > 0], W = sgn(u) e^z / L
        E = tl.exp2(x - m1[:, None])
        dP = tl.where(P > 0, dP, 0.0)
        W = tl.where(P > 0, E, tl.where(E < tl.exp2(-m1)[:, None], -E, 0.0)) * sm_scale
        if MASK:
            W = tl.where(keep, W, 0.0)
    elif LOGIT == "forget":  # dlogit/dqk = 1/sqrt(d); c_i - c_j is a bias
        W = P * sm_scale
    else:  # softmax, ssmax: dlogit/dqk = c_i / log2(e)
        W = P * (c / LOG2E)[:, None]
    return dP, W
