"""
Causal attention for every scorer (SCORERS.md) through torch's FlexAttention: the peer the fused kernels (kernels.py)
are timed against (bench/attention.py), and model.attention(backend="flex"). Each scorer's stage-1 logit is its
registry entry's `logit` (scorers.SCORERS) used as the score_mod; re-weighting is a second pass.
"""
import math

import torch
import torch.nn.functional as F

import scorers


_flex_compiled = None


def _flex_pass(q, k, v, block_mask, scale, stage1, pos0, params, ln_d, lse1, p):
    """One FlexAttention pass: stage-1 scores (lse1 None) or the re-weighting pass over stage-1 lse1."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention as flex  # AuxRequest: torch >= 2.9

    dt = torch.promote_types(q.dtype, torch.float32)  # flex scores half in fp32; a float64 model keeps float64

    # fox: + c_i - c_j, c_i from its own tensor: compiled backward refuses a score_mod that indexes one tensor
    # needing gradients twice
    c, c_rows = params.get("c"), params.get("c_rows")

    def logit(score, bb, h, q_idx, kv_idx):  # the registry's stage-1 logit, natural log
        ln_n = torch.log((q_idx + pos0 + 1).to(dt))
        x = stage1(score, ln_n, ln_d, **{name: x[h] for name, x in params.items() if name not in ("c", "c_rows")})
        return x if c is None else x + (c_rows[bb, h, q_idx] - c[bb, h, kv_idx])

    def reweight(score, bb, h, q_idx, kv_idx):  # p log(n P - o) where above the tie tolerance, else -inf
        n_i, lse = (q_idx + pos0 + 1).to(dt), lse1[bb, h, q_idx]
        y = n_i * torch.exp(logit(score, bb, h, q_idx, kv_idx) - lse) - (n_i > 3).to(dt)
        pos = y > scorers.tie_tolerance(n_i, lse, torch.finfo(dt).eps)  # fp32 below float64, as kernels.py
        return torch.where(pos, p * torch.log(torch.where(pos, y, torch.ones_like(y))), -math.inf)

    mod = logit if lse1 is None else reweight
    out, aux = flex(q, k, v, score_mod=mod, block_mask=block_mask, scale=scale, return_aux=AuxRequest(lse=True))
    return out, aux.lse


def flex_attention(q, k, v, scorer, *, p=None, offset=0, **params):
    """model.attention's contract through torch's FlexAttention: the registry's logit as score_mod, a causal block
    mask shifted by offset. lssa is a softmax over log(softplus(u)), sigmoid one over log(w) times sum_j w = exp(lse);
    another divisor L = sum_j exp(den_logit) + eps (the row template) rescales by exp(lse) / L, den_logit's lse from
    one more pass; re-weighting is a second pass over the first pass's lse. q, k, v are padded to multiples of 128
    (other lengths gave NaN gradients); lssa's run in fp32. Compiled on CUDA; eager on CPU, forward only."""
    from torch.nn.attention.flex_attention import create_block_mask
    global _flex_compiled
    entry, p, params = scorers.prepare(q, k, v, scorer, p, offset, backend="flex", **params)
    B, H, Tq, D = q.shape
    Tk = k.size(2)
    dtype = q.dtype
    if entry.cosine:  # in fp32: bf16 unit vectors round cos, which log(d) log(n_i) scales (outputs 10x off)
        q, k, v = (x.to(torch.promote_types(dtype, torch.float32)) for x in (q, k, v))
        q, k, scale = F.normalize(q, dim=-1), F.normalize(k, dim=-1), 1.0
    else:
        scale = 1.0 / math.sqrt(D)
    pad_q, pad_k = -Tq % 128, -Tk % 128
    q, k, v = F.pad(q, (0, 0, 0, pad_q)), F.pad(k, (0, 0, 0, pad_k)), F.pad(v, (0, 0, 0, pad_k))
    if "c" in params:  # indexed at padded positions too; c_rows: the query rows' c_i
        c = params["c"].to(torch.promote_types(q.dtype, torch.float32))
        params["c"], params["c_rows"] = F.pad(c, (0, pad_k)), F.pad(c[..., offset:], (0, pad_q))
    block_mask = create_block_mask(lambda bb, h, q_idx, kv_idx: (kv_idx <= q_idx + offset) & (kv_idx < Tk),
                                   None, None, Tq + pad_q, Tk + pad_k, device=q.device)
    pos0 = torch.tensor(offset, device=q.device)  # a tensor, so a new offset does not recompile
    run = _flex_pass
    if q.is_cuda:
        _flex_compiled = _flex_compiled or torch.compile(_flex_pass)
        run = _flex_compiled
    out, lse1 = run(q, k, v, block_mask, scale, entry.logit, pos0, params, math.log(D), None, p)
    if p is not None:
        out2, lse2 = run(q, k, v, block_mask, scale, entry.logit, pos0, params, math.log(D), lse1, p)
        out = torch.where(torch.isinf(lse2).unsqueeze(-1), out, out2)  # fallback rows keep stage 1
    if not entry.row_sum:  # sigmoid: flex divided by sum_j w = exp(lse); undo it
        out = out * torch.exp(lse1).unsqueeze(-1).to(out.dtype)
    elif not entry.sums_to_one:  # the divisor is sum exp(den_logit) + eps
        den = lse1 if entry.den_logit is None else \
            run(q, k, v, block_mask, scale, entry.den_logit, pos0, params, math.log(D), None, None)[1]
        ratio = torch.exp(lse1 - torch.logaddexp(den, torch.full_like(den, entry.eps).log()))
        out = torch.where(torch.isinf(lse1).unsqueeze(-1), 0.0, out * ratio.unsqueeze(-1).to(out.dtype))
    return out[:, :, :Tq].to(dtype)
