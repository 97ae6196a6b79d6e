"""
Fused causal attention for every scorer of scorers.SCORERS (definitions: SCORERS.md), in Triton, laid out like
Triton's fused-attention tutorial (FlashAttention-2, Dao 2023): O(T) memory, per-row statistics, recompute-style
backward.

- Named compile-time flags from the scorer's registry entry (_prepare; scorers.Scorer says what each value means):
  ROW (the row setup), LOGIT (the stage-1 score), ONLINE_MAX (base-2 logits x, P = exp2(x - M) with M a running
  logsumexp; else bounded weights A in plain sums, P = A * exp2(-M) or P = A unnormalised), NORMALISE: rows are
  divided by a row sum L, so they have the row term sigma_i in the backward and merge split keys by weight, and
  SUMS_TO_ONE: L is the weights' own sum, so rows may be re-weighted; else (the row template) P = num / L with
  L = sum den + eps, num and den from _terms, and the running max starts at 0 (eps 2^-M stays finite).
  The scorer math is kernels_math.py's: _row_setup, _keys, _logit (with _prob), _terms, _grad_factor, and KERNELS.
- Stage 2 (re-weighting, p given): pass 1 keeps only each row's M and largest stage-1 logit, hence the row's
  largest y = n_i P - o_i; pass 2 recomputes P and sums (y / y_max)^p over y > 0: in [0, 1], so no overflow at
  p = 100, n = 1e5, and no running max. "y > 0" means above scorers.tie_tolerance, from the row's lse M1 (_tie):
  rows with none keep P.
- Backward: dq (row blocks) then dk/dv (key blocks), no atomics. With re-weighting or learning parameters the dq
  kernel takes sigma_i = sum_k P_ik dP_ik exactly, which dk/dv then read: 16-bit inputs sum it in dq's walk (dq and
  the parameters' sums are linear in sigma: taken with FA2's delta, then corrected), re-weighting adds one walk for
  its delta'; fp32 inputs walk for sigma first (one-hot rows cancel exactly). Scorer parameters get per-row partial
  sums, reduced in PyTorch.
- Decode (Tq <= 16): BLOCK_M = 16 and the keys split over programs (flash-decoding), merged in PyTorch.
- lssa takes raw q, k and per-row inverse norms (cos = q.k * |q|^-1 * |k|^-1), so bf16 q, k keep their precision.
- fox takes its forget sums c in the same per-row and per-key slots (QS: c_i, KS: c_j) and adds c_i - c_j in fp32 to
  the softmax logits; dc_j = -sum_i dS_ij is summed in the dk/dv kernel (its row sums vanish).
- The parameters' gradients are per-row (G) and per-key (GK) sums by ROW and LOGIT (_bwd_dq_inner, _param_grads).
- stickbreaking is no row template: model.attention hands it to kernels_stick.py.
Public: attention(...) (Triton, differentiable); kernels_flex.py holds the torch FlexAttention peer.
"""
import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

import scorers
from kernels_math import (INTERPRET, KERNELS, LN2, NO_GPU, _dot_types, _grad_factor, _keys, _log2, _logit, _prob,
                          _prob_bwd, _row_setup, _terms)

FLAGS = ("ROW", "LOGIT", "ONLINE_MAX", "NORMALISE", "SUMS_TO_ONE")
NEG = tl.constexpr(-1.0e30)  # finite "-inf": exp2(NEG - NEG) is not NaN
TIE = tl.constexpr(scorers.TIE * 2.0**-23)  # y = n P - o > TIE (n + |lse|) is positive (fp32)
LN_LN2 = tl.constexpr(math.log(math.log(2.0)))
DECODE_M = 16  # smallest tl.dot M: decode and short chunks
DECODE_N = 32 if INTERPRET else 64
SLOTS = ("s", "b", "n")  # registry names of the S, Bp, Np slots


# ----------------------------------------------------------------------------------------------------------------
# Tile helpers around the scorers' math (kernels_math.py)

@triton.jit
def _pow(r, p, P_INT: tl.constexpr):
    """r^p for 0 <= r <= 1: by repeated squaring when p is a small integer (plain multiplies, no special-function
    unit), else exp2(p log2 r)."""
    if P_INT > 0:
        w = tl.zeros_like(r) + 1.0
        for bit in tl.static_range(7):
            if (P_INT >> bit) & 1:
                w = w * r
            r = r * r
    else:
        w = tl.exp2(p * _log2(r))
    return w


@triton.jit
def _tie(n_i, m1, ONLINE_MAX: tl.constexpr):
    """scorers.tie_tolerance of rows whose base-2 lse is m1 (P = 2^(x - m1) carries ~|m1| ulps of rounding)."""
    lse = m1 * LN2
    if not ONLINE_MAX:  # lssa's plain sums: of A in units of 1/ln 2
        lse = lse + LN_LN2
    return (n_i + tl.abs(lse)) * TIE


@triton.jit
def _bwd_tile(q, kT, vT, do, ks, keep, c, m1, m2, fb, delta, n_i, o_i, sm_scale, b_h, n_h, p,
              LOGIT: tl.constexpr, ONLINE_MAX: tl.constexpr, NORMALISE: tl.constexpr, REWEIGHT: tl.constexpr,
              MASK: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    """Recompute a tile: final weights Pf, stage-1 P, g = dL/dPf, dP = dL/dP = h (g - delta_i) (fallback rows:
    h = 1, delta_i = 0), W with dL/dqk = (dP - sigma_i) W, and the base-2 logit x."""
    qk = tl.dot(q, kT, input_precision=PREC)
    x = _logit(qk, c, ks, n_i, sm_scale, b_h, n_h, LOGIT, DT)
    P, F = _prob_bwd(x, qk, m1, sm_scale, b_h, n_h, LOGIT, ONLINE_MAX, NORMALISE)
    if MASK:
        P = tl.where(keep, P, 0.0)
        F = tl.where(keep, F, 0.0)
    g = tl.dot(do, vT, input_precision=PREC)  # dL/dPf_ij = dO_i . v_j
    Pf, dP, h = P, g, 1.0
    if REWEIGHT:  # Pf = softmax of p log y over y > 0; fallback rows: P
        y = n_i[:, None] * P - o_i[:, None]
        pos = y > _tie(n_i, m1, ONLINE_MAX)[:, None]
        ys = tl.where(pos, y, 1.0)
        # Pf / y: Pf and h from one power; a flushed Pf < n 2^-126 is nothing
        Q = tl.where(pos, tl.exp2((p - 1.0) * _log2(ys) - m2[:, None]), 0.0)
        h = tl.where(fb[:, None], 1.0, Q * (p * n_i[:, None]))  # Pf dlog R / dP = Pf p n / y: softmax backward
        Pf = tl.where(fb[:, None], P, Q * ys)
        dP = h * (g - delta[:, None])
    dP, W = _grad_factor(qk, x, F, dP, keep, c, ks, m1, sm_scale, b_h, n_h, LOGIT, MASK)
    return Pf, P, dP, W, qk, g, h, x


# ----------------------------------------------------------------------------------------------------------------
# Autotune configs: one under the interpreter (more fail there)

def _configs(pairs):
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
            for m, n, w, s in dict.fromkeys(pairs)]  # a shape in two lists is timed once


# (BLOCK_M, BLOCK_N, warps, stages): few, to keep autotuning short;
# picked by register spills on sm_90 (bench/ptxas_sm90.csv)
FWD_TUNE = [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3)]
BWD_TUNE = [(64, 64, 8, 2), (128, 64, 8, 2), (128, 32, 8, 2), (32, 64, 4, 2)]
# fp32 doubles shared memory: these fit at every head dim
FWD_TUNE_FP32 = [(128, 32, 8, 2), (64, 32, 4, 3), (64, 64, 4, 2)]
BWD_TUNE_FP32 = [(64, 32, 8, 2), (32, 64, 4, 2), (32, 32, 4, 2)]
FWD_CONFIGS, BWD_CONFIGS = _configs(FWD_TUNE + FWD_TUNE_FP32), _configs(BWD_TUNE + BWD_TUNE_FP32)


def fits(kernel, shape, D):
    """Each fp32 accumulator of a (BLOCK_M, BLOCK_N, warps, stages) tile within 64 registers a thread: BLOCK_M x D,
    and dk/dv's two BLOCK_N x D. Past it dk/dv gave a wrong dk on an H100 (D = 128, 4 warps: (16, 64) and (32, 64);
    a different error each run; every other config right, bench/README.md 2026-11-27); past it the forward spills."""
    m, n, warps, _ = shape
    return max(m, 2 * n if kernel == "dkdv" else 0) * D <= 64 * 32 * warps


def _pick(tune, tune_fp32, kernel):
    """early_config_prune: the shapes of the dots' dtype that fit (above). Pass 2 of re-weighting runs the config
    pass 1 was timed with, and pass 1 has no accumulator, so timing alone would not rule those out."""
    def prune(configs, named_args, **kwargs):
        D = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
        shapes = tune_fp32 if named_args["Q"].dtype == torch.float32 or kwargs.get("DT") == tl.float32 else tune
        shape = lambda c: (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)  # noqa: E731
        return [c for c in configs if shape(c) in shapes and fits(kernel, shape(c), D)] or configs  # interpreter's
    return prune


# ----------------------------------------------------------------------------------------------------------------
# Kernels: (B*H, T, D) tensors, (B*H, T) row stats, contiguous

@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, KS, lo, hi, offs_m, offs_n, Tk, offset, c, m1, n_i, o_i, inv_ym, fb,
               sm_scale, b_h, n_h, p, ROW: tl.constexpr, LOGIT: tl.constexpr, ONLINE_MAX: tl.constexpr,
               NORMALISE: tl.constexpr, STAGE: tl.constexpr, MASK: tl.constexpr, P_INT: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if MASK:  # diagonal blocks, ragged end: j <= offset + t
            kT = tl.load(k_ptrs + start_n * HEAD_DIM, mask=cols[None, :] < Tk, other=0.0).to(DT)
            keep = cols[None, :] <= offset + offs_m[:, None]
        else:
            kT = tl.load(k_ptrs + start_n * HEAD_DIM).to(DT)
        ks = _keys(KS, cols, Tk, ROW)
        x = _logit(tl.dot(q, kT, input_precision=PREC), c, ks, n_i, sm_scale, b_h, n_h, LOGIT, DT)
        if STAGE == 2:  # (y / y_max)^p in [0, 1]: no overflow
            P = _prob(x, m1, LOGIT, ONLINE_MAX, NORMALISE)
            y = n_i[:, None] * P - o_i[:, None]
            pos = y > _tie(n_i, m1, ONLINE_MAX)[:, None]
            a = tl.where(fb[:, None], P, tl.where(pos, _pow(y * inv_ym[:, None], p, P_INT), 0.0))
            if MASK:
                a = tl.where(keep, a, 0.0)
            l_i += tl.sum(a, 1)
        elif not ONLINE_MAX:  # bounded weights: plain sums
            a = x
            if MASK:
                a = tl.where(keep, a, 0.0)
            l_i += tl.sum(a, 1)
            if STAGE == 0:
                m_i = tl.maximum(m_i, tl.max(a, 1))
        else:  # online: base-2 logits over a running max
            if MASK:
                x = tl.where(keep, x, NEG)
            m_new = tl.maximum(m_i, tl.max(x, 1))
            a, d = _terms(x, m_new[:, None], LOGIT)
            if MASK:  # a row may have no kept key yet (m_new = NEG)
                a = tl.where(keep, a, 0.0)
                d = tl.where(keep, d, 0.0)
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(d, 1)
            if STAGE == 1:
                acc = acc * alpha[:, None]
            m_i = m_new
        if STAGE != 0:  # pass 1 needs only the row statistics
            if MASK:
                v = tl.load(v_ptrs + start_n * HEAD_DIM, mask=cols[:, None] < Tk, other=0.0).to(DT)
            else:
                v = tl.load(v_ptrs + start_n * HEAD_DIM).to(DT)
            acc = tl.dot(a.to(DT), v, acc, input_precision=PREC)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, S, Bp, Np, QS, KS, M1, MX, O, LSE, FB, H, Tq, Tk, offset, sm_scale, p, eps, split_size,
              T_BUCKET, ROW: tl.constexpr, LOGIT: tl.constexpr, ONLINE_MAX: tl.constexpr, NORMALISE: tl.constexpr,
              SUMS_TO_ONE: tl.constexpr, STAGE: tl.constexpr, P_INT: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    """STAGE 1: the scorer's output and lse; with re-weighting STAGE 0 (pass 1): the rows' lse M1 and largest
    stage-1 logit MX, then STAGE 2 (pass 2): the re-weighted output, its lse and the fallback rows FB."""
    start_m = tl.program_id(0) * BLOCK_M
    off_hz = tl.program_id(1)
    split = tl.program_id(2)  # decode: this program's share of the keys
    off_h = off_hz % H
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < Tq
    rows = off_hz.to(tl.int64) * Tq + offs_m
    q = tl.load(Q + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0).to(DT)
    k_ptrs = K + off_hz.to(tl.int64) * Tk * HEAD_DIM + offs_n[None, :] * HEAD_DIM + offs_d[:, None]
    v_ptrs = V + off_hz.to(tl.int64) * Tk * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    b_h, n_h = tl.load(Bp + off_h), tl.load(Np + off_h)
    n_i, o_i, c = _row_setup(QS, rows, row_ok, offs_m, offset, tl.load(S + off_h), b_h, sm_scale, ROW)
    m1 = n_i * 0.0
    ym = n_i * 0.0 + 1.0
    fb = n_i < 0.0
    if STAGE == 2:  # y_max from pass 1's largest logit (P is monotone)
        m1 = tl.load(M1 + rows, mask=row_ok, other=0.0)
        mx = tl.load(MX + rows, mask=row_ok, other=0.0)
        ym = tl.sum(n_i[:, None] * _prob(mx[:, None], m1, LOGIT, ONLINE_MAX, NORMALISE) - o_i[:, None],
                    1)  # the tiles' arithmetic, so the same rounding
        fb = ym <= _tie(n_i, m1, ONLINE_MAX)  # no y above the tie tolerance: the row keeps P
        ym = tl.where(fb, 1.0, ym)
        tl.store(FB + rows, fb.to(tl.int8), mask=row_ok)  # every split writes the same
    inv_ym = 1.0 / ym
    m_i = tl.zeros([BLOCK_M], tl.float32)
    if ONLINE_MAX and SUMS_TO_ONE:  # else L may hold a constant: m >= 0
        m_i += NEG
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if not SUMS_TO_ONE:  # eps 2^-m, once a row: in split 0
        l_i += tl.where(split == 0, eps, 0.0)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    KSb = KS + off_hz.to(tl.int64) * Tk
    lo = split * split_size
    hi = lo + split_size
    diag = (offset + start_m + 1) // BLOCK_N * BLOCK_N  # keys below: seen by every row, no mask
    end = tl.minimum(offset + start_m + BLOCK_M, Tk)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, KSb, lo, tl.minimum(hi, diag), offs_m, offs_n,
                               Tk, offset, c, m1, n_i, o_i, inv_ym, fb, sm_scale, b_h, n_h, p,
                               ROW, LOGIT, ONLINE_MAX, NORMALISE, STAGE, False, P_INT, HEAD_DIM, BLOCK_N, DT, PREC)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, KSb, tl.maximum(lo, diag), tl.minimum(hi, end),
                               offs_m, offs_n, Tk, offset, c, m1, n_i, o_i, inv_ym, fb, sm_scale, b_h, n_h, p,
                               ROW, LOGIT, ONLINE_MAX, NORMALISE, STAGE, True, P_INT, HEAD_DIM, BLOCK_N, DT, PREC)
    ok = l_i > 0  # l_i = 0: no key in this split
    l_safe = tl.where(ok, l_i, 1.0)
    ref = m_i  # the base-2 logit the weights are relative to
    if not ONLINE_MAX:
        ref = m_i * 0.0
    if STAGE == 2:
        ref = tl.where(fb, 0.0, p * tl.log2(ym))
    rows_s = split.to(tl.int64) * tl.num_programs(1) * Tq + rows  # (splits, B*H, Tq) layout
    tl.store(LSE + rows_s, tl.where(ok, ref + tl.log2(l_safe), -float("inf")), mask=row_ok)
    if STAGE == 0:
        tl.store(MX + rows_s, m_i, mask=row_ok)
    else:
        out = acc
        if NORMALISE:  # sigmoid: sum_j w v as is; splits merge by adding
            out = acc / l_safe[:, None]
        tl.store(O + rows_s[:, None] * HEAD_DIM + offs_d[None, :], out.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _bwd_dq_inner(acc, acc2, g1, g2, c1, c2, s1, s2, q, do, k_ptrs, v_ptrs, KS, lo, hi, offs_m, offs_n, Tk, offset, c,
                  m1, m2, fb, delta, sigma, n_i, o_i, sm_scale, b_h, n_h, p, ROW: tl.constexpr, LOGIT: tl.constexpr,
                  ONLINE_MAX: tl.constexpr, NORMALISE: tl.constexpr, REWEIGHT: tl.constexpr, CORRECT: tl.constexpr,
                  PASS: tl.constexpr, MASK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                  DT: tl.constexpr, PREC: tl.constexpr):
    # PASS 0: sums of Pf g, Pf, P h (g1, g2, c2); 0, 1: of P, P dP (s1, s2). 2: dq, the parameters' g1, g2; CORRECT:
    # sigma is an estimate, so also sums of W k, of their terms (c1, c2), of P, P dP (dq and g are linear in sigma)
    if LOGIT == "ssa":  # b db = sum dl (t1 - n P) too (sum dl P = 0): exact at |z| ~ 1e4, but eps / (b|z|) off where
        # b|z| << 1 (66 % at b = 1e-6); each row's choice, once, by a lower bound of its b z_max: 2^((m1 - log2 n_i)
        big = (m1 - tl.log2(n_i) > n_h)[:, None]  # / n) - 1 (2^m1 = sum of weights)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        kT = tl.load(k_ptrs + start_n * HEAD_DIM, mask=cols[None, :] < Tk, other=0.0).to(DT)
        vT = tl.load(v_ptrs + start_n * HEAD_DIM, mask=cols[None, :] < Tk, other=0.0).to(DT)
        keep = cols[None, :] <= offset + offs_m[:, None]
        ks = _keys(KS, cols, Tk, ROW)
        Pf, P, dP, W, qk, g, h, x = _bwd_tile(q, kT, vT, do, ks, keep, c, m1, m2, fb, delta, n_i, o_i, sm_scale, b_h,
                                              n_h, p, LOGIT, ONLINE_MAX, NORMALISE, REWEIGHT, MASK, DT, PREC)
        if PASS != 2 or CORRECT:
            s1 += tl.sum(P, 1)
            s2 += tl.sum(P * dP, 1)
        if PASS == 0:
            g1 += tl.sum(Pf * g, 1)
            g2 += tl.sum(Pf, 1)
            c2 += tl.sum(P * h, 1)
        elif PASS == 2:
            dl = dP - sigma[:, None]  # softmax (or l1-normalisation) backward
            acc = tl.dot((dl * W).to(DT), tl.trans(kT), acc, input_precision=PREC)
            t1 = W * qk  # dL/dparam = sum dl t: ssa's b (* qk / b), lssa's |q|^-1 (* qk / |q|^-1, in PyTorch)
            if LOGIT == "ssa":  # the row's form (big: cancelling)
                t1 = W * tl.where(big, 2.0 * tl.minimum(qk, 0.0) - 1.0 / (b_h * sm_scale), qk)
            if ROW == "logn":  # ssmax: dL/dlogit qk, scaled later
                t1 = P * qk
            t2 = P * x  # ssa's n: sgn(z) log(1 + b|z|) = x ln 2 / n
            if ROW == "logn" or ROW == "norm" or LOGIT == "ssa":
                g1 += tl.sum(dl * t1, 1)
                c1 += tl.sum(t1, 1)
            if LOGIT == "ssa":
                g2 += tl.sum(dl * t2, 1)
                c2 += tl.sum(t2, 1)
            if CORRECT:
                acc2 = tl.dot(W.to(DT), tl.trans(kT), acc2, input_precision=PREC)
    return acc, acc2, g1, g2, c1, c2, s1, s2


@triton.jit
def _bwd_dq_pass(acc, acc2, g1, g2, c1, c2, s1, s2, q, do, k_ptrs, v_ptrs, KS, diag, end, offs_m, offs_n, Tk, offset,
                 c, m1, m2, fb, delta, sigma, n_i, o_i, sm_scale, b_h, n_h, p, ROW: tl.constexpr, LOGIT: tl.constexpr,
                 ONLINE_MAX: tl.constexpr, NORMALISE: tl.constexpr, REWEIGHT: tl.constexpr, CORRECT: tl.constexpr,
                 PASS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, DT: tl.constexpr,
                 PREC: tl.constexpr):
    """One walk over the keys of a row block: below the diagonal without a mask, then the diagonal blocks."""
    acc, acc2, g1, g2, c1, c2, s1, s2 = _bwd_dq_inner(
        acc, acc2, g1, g2, c1, c2, s1, s2, q, do, k_ptrs, v_ptrs, KS, 0, diag, offs_m, offs_n, Tk, offset, c, m1, m2,
        fb, delta, sigma, n_i, o_i, sm_scale, b_h, n_h, p, ROW, LOGIT, ONLINE_MAX, NORMALISE, REWEIGHT, CORRECT, PASS,
        False, HEAD_DIM, BLOCK_N, DT, PREC)
    return _bwd_dq_inner(acc, acc2, g1, g2, c1, c2, s1, s2, q, do, k_ptrs, v_ptrs, KS, diag, end, offs_m, offs_n, Tk,
                         offset, c, m1, m2, fb, delta, sigma, n_i, o_i, sm_scale, b_h, n_h, p, ROW, LOGIT, ONLINE_MAX,
                         NORMALISE, REWEIGHT, CORRECT, PASS, True, HEAD_DIM, BLOCK_N, DT, PREC)


@triton.jit
def _attn_bwd_dq(Q, K, V, DO, O, S, Bp, Np, QS, KS, M1, M2, DELTA, SIGMA, DQ, G, M2R, H, Tq, Tk, offset, sm_scale, p,
                 T_BUCKET, ROW: tl.constexpr, LOGIT: tl.constexpr, ONLINE_MAX: tl.constexpr, NORMALISE: tl.constexpr,
                 SUMS_TO_ONE: tl.constexpr, REWEIGHT: tl.constexpr, EXACT_SIGMA: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    off_hz = tl.program_id(1)
    off_h = off_hz % H
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < Tq
    rows = off_hz.to(tl.int64) * Tq + offs_m
    q = tl.load(Q + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0).to(DT)
    do = tl.load(DO + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0).to(DT)
    k_ptrs = K + off_hz.to(tl.int64) * Tk * HEAD_DIM + offs_n[None, :] * HEAD_DIM + offs_d[:, None]
    v_ptrs = V + off_hz.to(tl.int64) * Tk * HEAD_DIM + offs_n[None, :] * HEAD_DIM + offs_d[:, None]
    KSb = KS + off_hz.to(tl.int64) * Tk
    b_h, n_h = tl.load(Bp + off_h), tl.load(Np + off_h)
    n_i, o_i, c = _row_setup(QS, rows, row_ok, offs_m, offset, tl.load(S + off_h), b_h, sm_scale, ROW)
    m1 = tl.load(M1 + rows, mask=row_ok, other=0.0)
    zero = tl.zeros([BLOCK_M], tl.float32)
    delta = zero
    if NORMALISE and not REWEIGHT:  # FA2's delta_i = rowsum(dO * O): sigma_i (sigmoid: none)
        o = tl.load(O + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    m2 = tl.load(M2 + rows, mask=row_ok, other=0.0)
    fb = m2 == -float("inf")  # a fallback row: it kept P
    m2 = tl.where(fb, 0.0, m2)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    diag = (offset + start_m + 1) // BLOCK_N * BLOCK_N
    end = tl.minimum(offset + start_m + BLOCK_M, Tk)
    # sigma_i = sum_k P dP exactly: rowsum(dO * O) uses bf16 O, and s, b sum its error over rows. 16-bit inputs sum
    # it beside dq, taken with FA2's delta, and correct dq and g after: one walk less. fp32: sigma's walk first, so
    # that one-hot rows cancel exactly. Re-weighting: a walk for delta' = sum Pf g / sum Pf (one-hot rows get 0)
    ONE_WALK: tl.constexpr = Q.dtype.element_ty != tl.float32
    CORRECT: tl.constexpr = EXACT_SIGMA and ONE_WALK and not REWEIGHT
    sigma = delta
    if REWEIGHT:
        _, _, g1, g2, _, c2, s1, s2 = _bwd_dq_pass(acc, acc, zero, zero, zero, zero, zero, zero, q, do, k_ptrs, v_ptrs,
                                                   KSb, diag, end, offs_m, offs_n, Tk, offset, c, m1, m2, fb, zero,
                                                   zero, n_i, o_i, sm_scale, b_h, n_h, p, ROW, LOGIT, ONLINE_MAX,
                                                   NORMALISE, True, False, 0, HEAD_DIM, BLOCK_N, DT, PREC)
        lf = tl.where(fb, 1.0, g2)  # renormalise Pf: p n / y amplifies P's rounding, twice
        delta = tl.where(fb, 0.0, g1 / lf)  # fallback rows: dP = g
        sigma = (s2 - delta * c2) / lf / tl.where(s1 > 0, s1, 1.0)  # dP = h (g - delta) / lf
        m2 = m2 + tl.log2(lf)
        tl.store(M2R + rows, tl.where(fb, -float("inf"), m2), mask=row_ok)  # for dk, dv
    if EXACT_SIGMA and not ONE_WALK:
        _, _, _, _, _, _, s1, sigma = _bwd_dq_pass(acc, acc, zero, zero, zero, zero, zero, zero, q, do, k_ptrs, v_ptrs,
                                                   KSb, diag, end, offs_m, offs_n, Tk, offset, c, m1, m2, fb, delta,
                                                   zero, n_i, o_i, sm_scale, b_h, n_h, p, ROW, LOGIT, ONLINE_MAX,
                                                   NORMALISE, REWEIGHT, False, 1, HEAD_DIM, BLOCK_N, DT, PREC)
        if SUMS_TO_ONE:  # / recomputed sum P: rounded logits at large |z| cost a relative error only
            sigma = sigma / tl.where(s1 > 0, s1, 1.0)
    tl.store(DELTA + rows, delta, mask=row_ok)
    acc, acc2, g1, g2, c1, c2, s1, s2 = _bwd_dq_pass(acc, acc, zero, zero, zero, zero, zero, zero, q, do, k_ptrs,
                                                     v_ptrs, KSb, diag, end, offs_m, offs_n, Tk, offset, c, m1, m2, fb,
                                                     delta, sigma, n_i, o_i, sm_scale, b_h, n_h, p, ROW, LOGIT,
                                                     ONLINE_MAX, NORMALISE, REWEIGHT, CORRECT, 2, HEAD_DIM, BLOCK_N, DT,
                                                     PREC)
    if CORRECT:
        sigma = s2
        if SUMS_TO_ONE:
            sigma = s2 / tl.where(s1 > 0, s1, 1.0)
        acc += (delta - sigma)[:, None] * acc2
        g1 += (delta - sigma) * c1
        g2 += (delta - sigma) * c2
    if EXACT_SIGMA:
        tl.store(SIGMA + rows, sigma, mask=row_ok)
    tl.store(DQ + rows[:, None] * HEAD_DIM + offs_d[None, :], acc.to(DQ.dtype.element_ty), mask=row_ok[:, None])
    if ROW == "logn":
        g1 = g1 * sm_scale  # z = qk / sqrt(d)
    if LOGIT == "ssa":
        g1 = g1 / b_h
        g2 = g2 * (LN2 / n_h)
    tl.store(G + rows, g1, mask=row_ok)
    tl.store(G + tl.num_programs(1) * Tq + rows, g2, mask=row_ok)


@triton.jit
def _bwd_dkdv_inner(dk, dv, gk, kT, vT, ks, q_ptrs, do_ptrs, M1, M2, DELTA, SIGMA, QS, lo, hi, offs_m, offs_n, Tq,
                    offset, s_h, sm_scale, b_h, n_h, p, ROW: tl.constexpr, LOGIT: tl.constexpr,
                    ONLINE_MAX: tl.constexpr, NORMALISE: tl.constexpr, REWEIGHT: tl.constexpr, MASK: tl.constexpr,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    for start_m in range(lo, hi, BLOCK_M):
        t = start_m + offs_m
        row_ok = t < Tq
        q = tl.load(q_ptrs + start_m * HEAD_DIM, mask=row_ok[:, None], other=0.0).to(DT)
        do = tl.load(do_ptrs + start_m * HEAD_DIM, mask=row_ok[:, None], other=0.0).to(DT)
        m1 = tl.load(M1 + t, mask=row_ok, other=0.0)
        sigma = tl.load(SIGMA + t, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + t, mask=row_ok, other=0.0)
        m2 = tl.load(M2 + t, mask=row_ok, other=0.0)
        fb = m2 == -float("inf")
        m2 = tl.where(fb, 0.0, m2)
        n_i, o_i, c = _row_setup(QS, t, row_ok, t, offset, s_h, b_h, sm_scale, ROW)
        keep = (offs_n[None, :] <= offset + t[:, None]) & row_ok[:, None]
        Pf, P, dP, W, qk, g, _, _ = _bwd_tile(q, kT, vT, do, ks, keep, c, m1, m2, fb, delta, n_i, o_i, sm_scale, b_h,
                                              n_h, p, LOGIT, ONLINE_MAX, NORMALISE, REWEIGHT, MASK, DT, PREC)
        dv = tl.dot(tl.trans(Pf).to(DT), do, dv, input_precision=PREC)
        dqk = (dP - sigma[:, None]) * W
        dk = tl.dot(tl.trans(dqk).to(DT), q, dk, input_precision=PREC)
        if ROW == "norm":
            gk += tl.sum(dqk * qk, 0)
        elif ROW == "forget":  # dc_j = -sum_i dS_ij; the row sums sum_j dS_ij are 0 (softmax is shift-invariant)
            gk -= tl.sum(dqk, 0)
    return dk, dv, gk


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, S, Bp, Np, QS, KS, M1, M2, DELTA, SIGMA, DK, DV, GK, H, Tq, Tk, offset, sm_scale, p,
                   T_BUCKET, ROW: tl.constexpr, LOGIT: tl.constexpr, ONLINE_MAX: tl.constexpr, NORMALISE: tl.constexpr,
                   SUMS_TO_ONE: tl.constexpr, REWEIGHT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    off_hz = tl.program_id(1)
    off_h = off_hz % H
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < Tk
    cols = off_hz.to(tl.int64) * Tk + offs_n
    kT = tl.load(K + cols[None, :] * HEAD_DIM + offs_d[:, None], mask=col_ok[None, :], other=0.0).to(DT)
    vT = tl.load(V + cols[None, :] * HEAD_DIM + offs_d[:, None], mask=col_ok[None, :], other=0.0).to(DT)
    ks = _keys(KS + off_hz.to(tl.int64) * Tk, offs_n, Tk, ROW)
    row0 = off_hz.to(tl.int64) * Tq
    q_ptrs = Q + (row0 + offs_m[:, None]) * HEAD_DIM + offs_d[None, :]
    do_ptrs = DO + (row0 + offs_m[:, None]) * HEAD_DIM + offs_d[None, :]
    s_h, b_h, n_h = tl.load(S + off_h), tl.load(Bp + off_h), tl.load(Np + off_h)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    gk = tl.zeros([BLOCK_N], tl.float32)
    # row t sees key j iff offset + t >= j
    lo = tl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
    full = tl.maximum(start_n + BLOCK_N - 1 - offset, 0)
    mid = tl.minimum((full + BLOCK_M - 1) // BLOCK_M * BLOCK_M, (Tq + BLOCK_M - 1) // BLOCK_M * BLOCK_M)
    hi_full = Tq // BLOCK_M * BLOCK_M  # the ragged last block needs the mask
    M1, M2, DELTA, SIGMA, QS = M1 + row0, M2 + row0, DELTA + row0, SIGMA + row0, QS + row0  # this (b, h)'s rows
    dk, dv, gk = _bwd_dkdv_inner(dk, dv, gk, kT, vT, ks, q_ptrs, do_ptrs, M1, M2, DELTA, SIGMA, QS, lo, mid, offs_m,
                                 offs_n, Tq, offset, s_h, sm_scale, b_h, n_h, p, ROW, LOGIT, ONLINE_MAX, NORMALISE,
                                 REWEIGHT, True, HEAD_DIM, BLOCK_M, DT, PREC)
    dk, dv, gk = _bwd_dkdv_inner(dk, dv, gk, kT, vT, ks, q_ptrs, do_ptrs, M1, M2, DELTA, SIGMA, QS, mid, hi_full,
                                 offs_m, offs_n, Tq, offset, s_h, sm_scale, b_h, n_h, p, ROW, LOGIT, ONLINE_MAX,
                                 NORMALISE, REWEIGHT, False, HEAD_DIM, BLOCK_M, DT, PREC)
    dk, dv, gk = _bwd_dkdv_inner(dk, dv, gk, kT, vT, ks, q_ptrs, do_ptrs, M1, M2, DELTA, SIGMA, QS,
                                 tl.maximum(mid, hi_full), Tq, offs_m, offs_n, Tq, offset, s_h, sm_scale, b_h, n_h, p,
                                 ROW, LOGIT, ONLINE_MAX, NORMALISE, REWEIGHT, True, HEAD_DIM, BLOCK_M, DT, PREC)
    tl.store(DK + cols[:, None] * HEAD_DIM + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + cols[:, None] * HEAD_DIM + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=col_ok[:, None])
    tl.store(GK + cols, gk, mask=col_ok)


# STAGE not in the key: pass 2 runs pass 1's config, so it
# recomputes its logits bit for bit (dtypes key implicitly)
_attn_fwd_tuned = triton.autotune(FWD_CONFIGS, key=["T_BUCKET", "HEAD_DIM", *FLAGS],
                                  prune_configs_by={"early_config_prune": _pick(FWD_TUNE, FWD_TUNE_FP32, "fwd")})(
    _attn_fwd)
_attn_bwd_dq_tuned = triton.autotune(BWD_CONFIGS, key=["T_BUCKET", "HEAD_DIM", *FLAGS, "REWEIGHT", "EXACT_SIGMA"],
                                     prune_configs_by={"early_config_prune": _pick(BWD_TUNE, BWD_TUNE_FP32, "dq")})(
    _attn_bwd_dq)
_attn_bwd_dkdv_tuned = triton.autotune(BWD_CONFIGS, key=["T_BUCKET", "HEAD_DIM", *FLAGS, "REWEIGHT"],
                                       prune_configs_by={"early_config_prune": _pick(BWD_TUNE, BWD_TUNE_FP32, "dkdv")})(
    _attn_bwd_dkdv)


# ----------------------------------------------------------------------------------------------------------------
# Launchers

def _num_splits(BH, Tk, device):
    """Flash-decoding: enough programs to fill the GPU (about two per SM), each at least one key block."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(triton.cdiv(Tk, DECODE_N), triton.cdiv(2 * sms, BH)))


def _merge(o, lse, normalise=True):
    """Combine per-split outputs (None: only the lse) with their base-2 lse: normalised ones (each over its own keys)
    weighted by their share of the row's sum; unnormalised ones (sigmoid: sums of w v) by adding."""
    m = lse.amax(0)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp2(lse - m)  # 0 for splits that saw no key
    l = w.sum(0)
    lse = torch.where(l > 0, m + torch.log2(l), torch.full_like(l, -math.inf))
    if o is None:
        return None, lse
    if not normalise:
        return o.sum(0), lse
    return (w.unsqueeze(-1) * o).sum(0) / torch.where(l > 0, l, torch.ones_like(l)).unsqueeze(-1), lse


def _forward(q, k, v, s, b, n, qs, ks, flags, p, offset, sm_scale, eps):
    B, H, Tq, D = q.shape
    Tk, BH = k.shape[2], B * H
    DT, PREC = _dot_types(q.dtype)
    decode = Tq <= DECODE_M
    splits = _num_splits(BH, Tk, q.device) if decode else 1
    chunk = triton.cdiv(triton.cdiv(Tk, splits), DECODE_N) * DECODE_N if decode else Tk
    splits = triton.cdiv(Tk, chunk)
    P_INT = int(p) if p is not None and p == int(p) and 0 < p < 128 else 0  # r^p by repeated squaring

    def run(stage, M1=None, MX=None):
        f32 = dict(device=q.device, dtype=torch.float32)
        lse = torch.empty(*([splits] if splits > 1 else []), BH, Tq, **f32)
        mx = torch.empty_like(lse) if stage == 0 else MX
        o = None
        if stage != 0:  # fp32 partials when split, merged below
            o = torch.empty(splits, BH, Tq, D, **f32) if splits > 1 else q.new_empty(B, H, Tq, D)
        fb = torch.empty(BH, Tq, device=q.device, dtype=torch.int8) if stage == 2 else None
        args = (q, k, v, s, b, n, qs, ks, lse if M1 is None else M1, lse if mx is None else mx,
                lse if o is None else o, lse, lse if fb is None else fb, H, Tq, Tk, offset, sm_scale, p or 0.0,
                eps, chunk, triton.next_power_of_2(Tk))
        meta = dict(**flags, STAGE=stage, P_INT=P_INT if stage == 2 else 0, HEAD_DIM=D, DT=DT, PREC=PREC)
        if decode:
            _attn_fwd[(1, BH, splits)](*args, **meta, BLOCK_M=DECODE_M, BLOCK_N=DECODE_N, num_warps=4, num_stages=2)
        else:
            _attn_fwd_tuned[lambda META: (triton.cdiv(Tq, META["BLOCK_M"]), BH, 1)](*args, **meta)
        if splits > 1:
            o, lse = _merge(o, lse, flags["NORMALISE"])
            mx = mx.amax(0) if stage == 0 else mx
            o = None if o is None else o.view(B, H, Tq, D).to(q.dtype)
        return o, lse, mx, fb

    if p is None:
        out, M1, _, _ = run(1)
        return out, M1, M1
    _, M1, MX, _ = run(0)  # pass 1: row statistics only
    out, M2, _, fb = run(2, M1, MX)
    return out, M1, torch.where(fb.bool(), -math.inf, M2)  # M2 = -inf marks a fallback row for the backward


def _backward(do, q, k, v, out, M1, M2, s, b, n, qs, ks, flags, p, offset, sm_scale, exact_sigma):
    B, H, Tq, D = q.shape
    Tk, BH = k.shape[2], B * H
    # lssa's fp16 in tf32 dots (fp16's precision, fp32's range): a zero q or k's 1e12 |q|^-1 overflowed, inf * 0 NaN
    DT, PREC = (tl.float32, "tf32") if flags["ROW"] == "norm" and q.dtype == torch.float16 else _dot_types(q.dtype)
    do = do.contiguous()
    exact_sigma = (p is not None or exact_sigma) and flags["NORMALISE"]
    # exact: dq writes SIGMA; else sigma is delta (one buffer)
    delta = torch.empty(BH, Tq, device=q.device, dtype=torch.float32)
    sigma = torch.empty_like(delta) if exact_sigma else delta
    dq = torch.empty(B, H, Tq, D, device=q.device, dtype=q.dtype)
    dk = torch.empty(B, H, Tk, D, device=q.device, dtype=k.dtype)
    dv = torch.empty(B, H, Tk, D, device=q.device, dtype=v.dtype)
    G = torch.empty(2, BH, Tq, device=q.device, dtype=torch.float32)  # per-row parameter-gradient sums
    GK = torch.empty(BH, Tk, device=q.device, dtype=torch.float32)  # per-key sums (lssa's |k|^-1, fox's c_j)
    M2r = torch.empty_like(M2) if p is not None else M2  # dq's renormalised M2, for dk/dv
    params = (s, b, n, qs, ks, M1)
    scalars = (H, Tq, Tk, offset, sm_scale, p or 0.0, triton.next_power_of_2(Tk))
    meta = dict(**flags, REWEIGHT=p is not None, HEAD_DIM=D, DT=DT, PREC=PREC)
    dq_args = (q, k, v, do, out, *params, M2, delta, sigma, dq, G, M2r, *scalars)
    dkdv_args = (q, k, v, do, *params, M2r, delta, sigma, dk, dv, GK, *scalars)
    # dq first: dk/dv read its delta', sigma, M2r. Decode shapes too: with the forward's fixed 16 x 64 tiles, dk came
    # out wrong on an H100 (7 of 10 cases, differently each run; bench/README.md, 2026-11-26)
    _attn_bwd_dq_tuned[lambda META: (triton.cdiv(Tq, META["BLOCK_M"]), BH)](*dq_args, **meta, EXACT_SIGMA=exact_sigma)
    _attn_bwd_dkdv_tuned[lambda META: (triton.cdiv(Tk, META["BLOCK_N"]), BH)](*dkdv_args, **meta)
    return dq, dk, dv, G.view(2, B, H, Tq), GK.view(B, H, Tk)


def _param_grads(G, GK, flags, qs, ks, offset, sm_scale):
    """ds, db, dn, dqs, dks (None where the scorer has none) from the kernels' per-row (G) and per-key (GK) sums."""
    ds = db = dn = dqs = dks = None
    if flags["ROW"] == "logn":  # ds_h = sum dL * z * log n_i, db_h = sum dL * z
        ln_n = torch.log(torch.arange(offset + 1, offset + G.size(-1) + 1, device=G.device, dtype=torch.float32))
        ds, db = (G[0] * ln_n).sum((0, 2)), G[0].sum((0, 2))
    elif flags["LOGIT"] == "ssa":
        db, dn = G[0].sum((0, 2)), G[1].sum((0, 2))
    elif flags["ROW"] == "norm":  # cos = qk * qs_i * ks_j: dqs_i = sum_j dL/dqk * qk / qs_i
        dqs, dks = G[0] / qs, GK / ks
    elif flags["ROW"] == "forget":  # dL/dqk = dS / sqrt(d); c_i's row sums are 0: no dqs
        dks = GK / sm_scale
    return ds, db, dn, dqs, dks


# ----------------------------------------------------------------------------------------------------------------
# Custom operators: torch.compile keeps each as one node of its graph (fake: shapes only, Triton never traced)

@torch.library.custom_op("nanoscorer::attention_fwd", mutates_args=())
def _attention_fwd(q: Tensor, k: Tensor, v: Tensor, s: Tensor, b: Tensor, n: Tensor, qs: Tensor, ks: Tensor,
                   scorer: str, p: Optional[float], offset: int, sm_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """out (B, H, Tq, D) and the row statistics M1, M2 (B*H, Tq) that the backward reads."""
    entry = scorers.SCORERS[scorer]
    out, M1, M2 = _forward(q, k, v, s, b, n, qs, ks, entry.kernel_flags(), p, offset, sm_scale, entry.eps)
    return out, M1, M1.clone() if p is None else M2  # outputs may not alias each other


@_attention_fwd.register_fake
def _(q, k, v, s, b, n, qs, ks, scorer, p, offset, sm_scale):
    M = q.new_empty(q.size(0) * q.size(1), q.size(2), dtype=torch.float32)
    return torch.empty_like(q), M, torch.empty_like(M)


@torch.library.custom_op("nanoscorer::attention_bwd", mutates_args=())
def _attention_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, M1: Tensor, M2: Tensor, s: Tensor,
                   b: Tensor, n: Tensor, qs: Tensor, ks: Tensor, scorer: str, p: Optional[float], offset: int,
                   sm_scale: float, exact_sigma: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv and the parameters' per-row sums G (2, B, H, Tq) and per-key sums GK (B, H, Tk)."""
    flags = scorers.SCORERS[scorer].kernel_flags()
    return _backward(do, q, k, v, out, M1, M2, s, b, n, qs, ks, flags, p, offset, sm_scale, exact_sigma)


@_attention_bwd.register_fake
def _(do, q, k, v, out, M1, M2, s, b, n, qs, ks, scorer, p, offset, sm_scale, exact_sigma):
    f32 = dict(device=q.device, dtype=torch.float32)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty(2, *q.shape[:3], **f32),
            torch.empty(k.shape[:3], **f32))


def _setup_context(ctx, inputs, output):
    q, k, v, s, b, n, qs, ks, scorer, p, offset, sm_scale = inputs
    ctx.save_for_backward(q, k, v, s, b, n, qs, ks, *output)
    ctx.cfg = (scorer, p, offset, sm_scale, any(ctx.needs_input_grad[3:6]))  # exact sigma when s, b or n learn


def _attention_grads(ctx, do, *_):  # M1, M2 get no gradient
    q, k, v, s, b, n, qs, ks, out, M1, M2 = ctx.saved_tensors
    dq, dk, dv, G, GK = _attention_bwd(do, q, k, v, out, M1, M2, s, b, n, qs, ks, *ctx.cfg)
    scorer, _, offset, sm_scale, _ = ctx.cfg
    entry = scorers.SCORERS[scorer]
    grads = _param_grads(G, GK, entry.kernel_flags(), qs, ks, offset, sm_scale)
    learns = dict(zip(SLOTS, ctx.needs_input_grad[3:6]))  # the scorer's own slots: an unused one holds zeros
    lost = [prm.name for prm in entry.params if learns[prm.name] and grads[SLOTS.index(prm.name)] is None]
    if lost:  # else the parameter silently never learns on this backend
        raise RuntimeError(f"kernels.py sums no gradient for the learnable {lost[0]} of scorer {scorer!r}: add it "
                           f"to _bwd_dq_inner and _param_grads (SCORERS.md, Adding a scorer, step 4)")
    return dq, dk, dv, *grads, None, None, None, None


_attention_fwd.register_autograd(_attention_grads, setup_context=_setup_context)


# ----------------------------------------------------------------------------------------------------------------
# Public API

def _prepare(q, k, v, scorer, p, offset, params):
    """scorers.prepare's checks and defaults, then the kernels' own limits (head dim, dtype, known flags); puts
    the scorer's parameters in the kernels' per-head slots (S, Bp, Np), an unused slot holding zeros (fox's per-key
    c goes to the QS, KS slots: attention)."""
    entry, p, params = scorers.prepare(q, k, v, scorer, p, offset, backend="triton", **params)
    D = q.shape[3]
    assert D in (16, 32, 64, 128), f"head dim {D} not supported (16, 32, 64, 128)"
    assert q.dtype in (torch.float32, torch.float16, torch.bfloat16) and q.dtype == k.dtype == v.dtype, \
        f"q, k, v must share one of fp32/fp16/bf16, got {q.dtype}, {k.dtype}, {v.dtype}"
    flags = entry.kernel_flags()
    if tuple(flags.values())[:4] not in KERNELS or not set(params) <= {*SLOTS, "c"}:  # math no kernel helper has
        raise ValueError(f"kernels.py implements no kernel for scorer {scorer!r}: flags {flags}, parameters "
                         f"{list(params)} (known: {sorted(KERNELS)}, slots {SLOTS}; SCORERS.md, Adding a scorer)")
    zeros = q.new_zeros(q.shape[1], dtype=torch.float32)
    return entry, *(params.get(name, zeros) for name in SLOTS), p


def attention(q, k, v, scorer, *, p=None, offset=0, **params):
    """Causal attention (B, H, Tq, D) -> (B, H, Tq, D) for every scorer of SCORERS.md, fused in Triton.
    Query t sits at absolute position offset + t (KV cache); k, v hold offset + Tq keys. params: the scorer's, by
    name, differentiable when tensors; p (float) re-weights on top of any scorer (lssar: 15 if None)."""
    if not (q.is_cuda or INTERPRET):  # else Triton fails deep inside ("0 active drivers")
        raise RuntimeError(NO_GPU)
    entry, s, b, n, p = _prepare(q, k, v, scorer, p, offset, params)
    q, k, v = (x.contiguous() for x in (q, k, v))  # v is a view of qkv: copy once, simpler kernels
    D = q.size(-1)
    if entry.cosine:  # inverse norms, clamped as F.normalize
        qs = 1.0 / torch.linalg.vector_norm(q, dim=-1, dtype=torch.float32).clamp_min(1e-12)
        ks = 1.0 / torch.linalg.vector_norm(k, dim=-1, dtype=torch.float32).clamp_min(1e-12)
        sm_scale = math.log(D)
    elif entry.forget:  # fox: c_j of every key, c_i of the query rows, fp32
        ks = params["c"].float().contiguous()
        qs = ks[..., offset:].contiguous()
        sm_scale = 1.0 / math.sqrt(D)
    else:  # unused by the kernels: any fp32 buffer
        qs = ks = s
        sm_scale = 1.0 / math.sqrt(D)
    return _attention_fwd(q, k, v, s, b, n, qs, ks, scorer, p, offset, sm_scale)[0]
