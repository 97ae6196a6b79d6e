"""
Causal attention for softmax, ssmax and fox through torch's scaled_dot_product_attention (torch picks the kernel:
flash, cuDNN, memory-efficient): model.attention(backend="sdpa"), and backend="auto" where it runs the scorer
(SCORERS.md; the registry's `backends`). ssmax is SDPA on q scaled row-wise by s log n_i + b; fox's c_i - c_j is a
float mask.
"""
import math

import torch
import torch.nn.functional as F

import scorers

MASK_ROWS = 256  # query rows per SDPA call with fox's float mask
# the kernel flags (scorers.Scorer.kernel_flags) and forget run here, and the parameters each reads: softmax's, ssmax's
# (row logn: q scaled by s log n + b), fox's (forget: c_i - c_j a float mask); any other entry would run as softmax
FLAGS = {("plain", "linear", True, True, True, False): set(), ("logn", "linear", True, True, True, False): {"s", "b"},
         ("forget", "forget", True, True, True, True): set()}


def check(scorer, entry):
    """One error line for an entry that lists 'sdpa' with kernel flags this file does not run (never softmax for it):
    its flags are ones the Triton interpreter tests check against the reference."""
    flags = (*entry.kernel_flags().values(), entry.forget)
    names = {prm.name for prm in entry.params} | dict(entry.fixed).keys()
    if "sdpa" in entry.backends and FLAGS.get(flags) != names:  # a parameter of its own: softmax had run, unread
        raise ValueError(f"scorer {scorer!r} lists backend 'sdpa', which runs only softmax's, ssmax's and fox's "
                         f"kernel flags and parameters (kernels_sdpa.FLAGS), not {flags} with parameters "
                         f"{sorted(names) or 'none'}: leave 'sdpa' out")


for name, e in scorers.SCORERS.items():  # the registry's, at import; an entry added later, when called
    check(name, e)


def sdpa_attention(q, k, v, scorer, *, p=None, offset=0, **params):
    """softmax, ssmax and fox on torch's SDPA (torch picks the kernel). SSMax's factor s log n_i + b scales q_i, as
    Qwen's log-n attention does; SDPA's default scale is z's 1/sqrt(d). FoX's c_i - c_j is a float mask, the
    differences taken in fp32 (c itself grows with length). Causal mask: is_causal at offset 0, bottom-right after a
    cache, none for one row."""
    entry, p, params = scorers.get(scorer, p, params, "sdpa")
    check(scorer, entry)
    if p is not None:
        raise ValueError(f"backend='sdpa' runs no re-weighting (p={p}); use backend='auto' (cpu or triton)")
    Tq, Tk = q.size(-2), k.size(-2)
    assert Tk == offset + Tq, f"k has {Tk} keys but offset + Tq = {offset} + {Tq}"
    if entry.forget and Tq > MASK_ROWS:  # fox's mask is (Tq, Tk) a head: by row blocks, memory O(rows * Tk)
        ends = [(t, offset + t + MASK_ROWS) for t in range(0, Tq, MASK_ROWS)]
        return torch.cat([sdpa_attention(q[:, :, t:t + MASK_ROWS], k[:, :, :end], v[:, :, :end], scorer,
                                         offset=offset + t, **scorers.upto(params, end)) for t, end in ends], dim=2)
    if entry.row == "logn":  # ssmax: scale in fp32, q rounded once, as bf16 autocast would
        dtype = torch.promote_types(q.dtype, torch.float32)
        ln_n = torch.arange(offset + 1, offset + Tq + 1, device=q.device, dtype=dtype).log()[:, None]  # (Tq, 1)
        prm = scorers.per_head(entry, params, q.size(1), ln_n)
        q = (q.to(dtype) * (prm["s"] * ln_n + prm["b"])).to(q.dtype)
    mask = None
    if entry.forget:
        c = params["c"].to(torch.promote_types(q.dtype, torch.float32))
        bias = c[..., offset:, None] - c[..., None, :]  # (B, H, Tq, Tk)
        mask = bias.masked_fill(~scorers._rows(Tq, Tk, offset, q.device)[1], -math.inf).to(q.dtype)
    elif offset and Tq > 1:  # a chunk after a cache: bottom-right causal
        from torch.nn.attention.bias import causal_lower_right  # torch >= 2.2
        mask = causal_lower_right(Tq, Tk)
    gqa = {"enable_gqa": True} if k.size(1) != q.size(1) else {}  # fewer KV heads (torch >= 2.5)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and offset == 0 and Tq > 1,
                                          **gqa)
