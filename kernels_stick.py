"""
Stick-breaking attention (Tan et al. 2024, "Scaling Stick-Breaking Attention", arXiv 2410.17980) fused in Triton:
model.attention(..., "stickbreaking", backend="triton") runs it. Definition: SCORERS.md. Over the keys j < i, with
a_ij = log sigmoid(z_ij), b_ij = log sigmoid(-z_ij), z = q.k / sqrt(d):

    log A_ij = a_ij + sum_{j<k<i} b_ik,    out_i = sum_j A_ij v_j    (not normalised; row 0 has no key: 0)

- Forward: one program per query block walks the key blocks from the diagonal backwards, each tile's keys loaded
  nearest first. The sum over the nearer keys is the row's running sum of b over the tiles passed plus an exclusive
  in-tile sum: b times a strictly triangular 0/1 matrix, in tf32x3 (~fp32). Exclusive, not an inclusive cumsum
  minus b_ij, which cancels when b_ij ~ -z_ij is large; not tl.associative_scan on pairs, which the interpreter runs
  element by element (20x slower). Nothing is saved but q, k, v.
- Backward: with G_ij = dL/dlog A_ij = A_ij dP_ij, dP_ij = dO_i . v_j, and da/dz = sigmoid(-z), db/dz = -sigmoid(z),

      dL/dz_ik = G_ik sigmoid(-z_ik) - sigmoid(z_ik) S_ik,    S_ik = sum_{j<k} G_ij   (z_ik: b_ik enters every j < k)

  S is a prefix sum, the walk goes backwards: S_ik = delta_i - sum_{j>=k} G_ij with delta_i = sum_j G_ij, which a
  first pass of the same program sums from its own A (not dO . O: a bf16 O would put 2^-9 |delta| on every key).
  dq is summed in the program; dk, dv go to fp32 buffers by atomic adds (a key block's rows need the row sums of b
  over every key after it, which only the row's own walk has).
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

import scorers
from kernels_math import INTERPRET, LOG2E, NO_GPU, _dot_types, _log2_1p

DECODE_M = 16  # smallest tl.dot M


def blocks(dtype, Tq=None):
    """(BLOCK_M, BLOCK_N, warps, stages): fixed, not tuned yet (bf16: no spill at D = 64 on sm_90, fp32: fits its
    shared memory at D = 128; bench/ptxas_report.py); 16 query rows for decoding and short chunks."""
    m, n, warps, stages = (32, 32, 4, 1) if INTERPRET or dtype == torch.float32 else (64, 32, 8, 2)
    return (DECODE_M if Tq is not None and Tq <= DECODE_M else m), n, warps, stages


@triton.jit
def _tile(q, K, V, offs_n, row_i, row_ok, carry, sm_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
          DT: tl.constexpr, PREC: tl.constexpr):
    """Keys offs_n (nearest first; < 0: none) against the rows: k, v, keep (key j < row i), log2 sigmoid(+-z) and
    A = exp2(a + carry + sum over the nearer keys of the tile): base 2, ln 2 folded into the scale."""
    offs_d = tl.arange(0, HEAD_DIM)
    key_ok = offs_n[:, None] >= 0
    k = tl.load(K + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=key_ok, other=0.0).to(DT)
    v = tl.load(V + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=key_ok, other=0.0).to(DT)
    keep = (offs_n[None, :] >= 0) & (offs_n[None, :] < row_i[:, None]) & row_ok[:, None]
    z = tl.dot(q, tl.trans(k), input_precision=PREC) * (sm_scale * LOG2E)
    l = _log2_1p(tl.exp2(-tl.abs(z)))  # log2 sigmoid(+-z) = min(+-z, 0) - l
    a = tl.minimum(z, 0.0) - l
    b = tl.where(keep, tl.minimum(-z, 0.0) - l, 0.0)
    cols = tl.arange(0, BLOCK_N)
    nearer = tl.dot(b, (cols[:, None] < cols[None, :]).to(tl.float32), input_precision="tf32x3")  # 0/1: exact in tf32
    A = tl.where(keep, tl.exp2(a + nearer + carry[:, None]), 0.0)
    return k, v, keep, a, b, A


@triton.jit
def _setup(Q, K, V, Tq, Tk, offset, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, DT: tl.constexpr):
    """The program's query rows, their offsets in Q, q, and the end of the keys they see."""
    start, bh = tl.program_id(0), tl.program_id(1)
    rows = start * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < Tq
    offs = bh * Tq * HEAD_DIM + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    q = tl.load(Q + offs, mask=row_ok[:, None], other=0.0).to(DT)
    hi = offset + tl.minimum((start + 1) * BLOCK_M, Tq) - 1  # the keys before the block's last row
    return rows, row_ok, offset + rows, offs, q, K + bh * Tk * HEAD_DIM, V + bh * Tk * HEAD_DIM, hi


@triton.jit
def _stick_fwd(Q, K, V, O, Tq, Tk, offset, sm_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    rows, row_ok, row_i, offs, q, K, V, hi = _setup(Q, K, V, Tq, Tk, offset, HEAD_DIM, BLOCK_M, DT)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    carry = tl.zeros((BLOCK_M,), dtype=tl.float32)  # sum of b over the keys passed
    for n in range(0, tl.cdiv(hi, BLOCK_N)):
        offs_n = hi - 1 - n * BLOCK_N - tl.arange(0, BLOCK_N)
        _, v, _, _, b, A = _tile(q, K, V, offs_n, row_i, row_ok, carry, sm_scale, HEAD_DIM, BLOCK_N, DT, PREC)
        acc = tl.dot(A.to(DT), v, acc, input_precision=PREC)
        carry += tl.sum(b, 1)
    tl.store(O + offs, acc.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _stick_bwd(Q, K, V, DO, DQ, DK32, DV32, Tq, Tk, offset, sm_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    rows, row_ok, row_i, offs, q, K, V, hi = _setup(Q, K, V, Tq, Tk, offset, HEAD_DIM, BLOCK_M, DT)
    do = tl.load(DO + offs, mask=row_ok[:, None], other=0.0).to(DT)
    DK32 += tl.program_id(1) * Tk * HEAD_DIM
    DV32 += tl.program_id(1) * Tk * HEAD_DIM
    offs_d = tl.arange(0, HEAD_DIM)
    delta = tl.zeros((BLOCK_M,), dtype=tl.float32)
    carry = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for n in range(0, tl.cdiv(hi, BLOCK_N)):  # pass 1: delta_i = sum_j G_ij
        offs_n = hi - 1 - n * BLOCK_N - tl.arange(0, BLOCK_N)
        _, v, _, _, b, A = _tile(q, K, V, offs_n, row_i, row_ok, carry, sm_scale, HEAD_DIM, BLOCK_N, DT, PREC)
        delta += tl.sum(A * tl.dot(do, tl.trans(v), input_precision=PREC), 1)
        carry += tl.sum(b, 1)
    dq = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    carry = tl.zeros((BLOCK_M,), dtype=tl.float32)
    later = delta  # S_ij + G_ij: delta less G over the nearer keys
    for n in range(0, tl.cdiv(hi, BLOCK_N)):  # pass 2: the same walk, the same A
        offs_n = hi - 1 - n * BLOCK_N - tl.arange(0, BLOCK_N)
        k, v, keep, a, b, A = _tile(q, K, V, offs_n, row_i, row_ok, carry, sm_scale, HEAD_DIM, BLOCK_N, DT, PREC)
        G = A * tl.dot(do, tl.trans(v), input_precision=PREC)
        S = later[:, None] - tl.cumsum(G, 1)  # sum_{j' < j} G_ij'
        ds = tl.where(keep, G * tl.exp2(b) - tl.exp2(a) * S, 0.0) * sm_scale  # dL/dqk; sigmoid(+-z) = 2^a, 2^b
        dq = tl.dot(ds.to(DT), k, dq, input_precision=PREC)
        dk = tl.dot(tl.trans(ds).to(DT), q, input_precision=PREC)
        dv = tl.dot(tl.trans(A).to(DT), do, input_precision=PREC)
        kv = offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        tl.atomic_add(DK32 + kv, dk, mask=offs_n[:, None] >= 0)
        tl.atomic_add(DV32 + kv, dv, mask=offs_n[:, None] >= 0)
        carry += tl.sum(b, 1)
        later -= tl.sum(G, 1)
    tl.store(DQ + offs, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


def _launch(kernel, q, k, *args, offset, sm_scale):
    B, H, Tq, D = q.shape
    DT, PREC = _dot_types(q.dtype)
    BLOCK_M, BLOCK_N, warps, stages = blocks(q.dtype, Tq)
    kernel[(triton.cdiv(Tq, BLOCK_M), B * H)](q, k, *args, Tq, k.size(2), offset, sm_scale, HEAD_DIM=D,
                                              BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, DT=DT, PREC=PREC, num_warps=warps,
                                              num_stages=stages)


# Custom operators, as kernels.py's: one node each in a compiled graph (fake: shapes only)

@torch.library.custom_op("nanoscorer::stick_fwd", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, offset: int, sm_scale: float) -> Tensor:
    out = torch.empty_like(q)
    _launch(_stick_fwd, q, k, v, out, offset=offset, sm_scale=sm_scale)
    return out


@_forward.register_fake
def _(q, k, v, offset, sm_scale):
    return torch.empty_like(q)


@torch.library.custom_op("nanoscorer::stick_bwd", mutates_args=())
def _backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, offset: int, sm_scale: float
              ) -> tuple[Tensor, Tensor, Tensor]:
    dq = torch.empty_like(q)
    dk, dv = (torch.zeros(k.shape, device=k.device, dtype=torch.float32) for _ in range(2))  # atomic sums
    _launch(_stick_bwd, q, k, v, do.contiguous(), dq, dk, dv, offset=offset, sm_scale=sm_scale)
    return dq, dk.to(k.dtype), dv.to(v.dtype)


@_backward.register_fake
def _(do, q, k, v, offset, sm_scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, offset, sm_scale = inputs
    ctx.save_for_backward(q, k, v)
    ctx.cfg = (offset, sm_scale)


def _grads(ctx, do):
    return *_backward(do, *ctx.saved_tensors, *ctx.cfg), None, None


_forward.register_autograd(_grads, setup_context=_setup_context)


def attention(q, k, v, scorer="stickbreaking", *, p=None, offset=0, **params):
    """Stick-breaking attention (B, H, Tq, D) -> (B, H, Tq, D), differentiable in q, k, v; query t at absolute
    position offset + t, k, v (B, H, offset + Tq, D). kernels.attention's contract; no parameters, no p."""
    if not (q.is_cuda or INTERPRET):  # else Triton fails deep inside ("0 active drivers")
        raise RuntimeError(NO_GPU)
    scorers.prepare(q, k, v, scorer, p, offset, backend="triton", **params)
    D = q.shape[3]
    assert D in (16, 32, 64, 128), f"head dim {D} not supported (16, 32, 64, 128)"
    assert q.dtype in (torch.float32, torch.float16, torch.bfloat16) and q.dtype == k.dtype == v.dtype, \
        f"q, k, v must share one of fp32/fp16/bf16, got {q.dtype}, {k.dtype}, {v.dtype}"
    q, k, v = (x.contiguous() for x in (q, k, v))
    return _forward(q, k, v, offset, D ** -0.5)
