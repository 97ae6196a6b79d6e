"""
nanoscorer model: one Llama-style GPT (RoPE, RMSNorm, SwiGLU, no biases, untied head) whose attention has a
`scorer` switch. The reference path below reads like the papers' equations; kernels.py holds the fused path.

Scorers (exact definitions and contracts in SCORERS.md):
- softmax: the baseline.
- ssmax: Scalable-Softmax, Nakanishi 2025 "Scalable-Softmax Is Superior for Attention" (eq. 2, 4, 11): the logits
  of query row i are *multiplied* by s*log(n_i) + b, n_i = number of keys that row attends to.
- ssa: Scaled Signed Averaging, Naim et al. 2025 "Improving in-context learning with a better scoring function"
  (eq. 5): weights (1 + b|z|)^(sgn(z) n), normalised.
- lssa / lssar: Gao & Spratling 2025 "Softplus Attention with Re-weighting Boosts Length Extrapolation" (eq. 4, 5):
  softplus of log(d)*log(N)-scaled cosine scores, l1-normalised; then ReLU(N*A - O)^p, l1-normalised again.
"""
import importlib.metadata
import importlib.util
import math
import os
import subprocess
import zipfile
from dataclasses import asdict, dataclass, fields
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

SCORERS = ("softmax", "ssmax", "ssa", "lssa", "lssar")
BACKENDS = ("auto", "torch", "sdpa", "cpu", "triton", "flex")
POS = ("rope", "nope")
LSSAR_DEFAULT_P = 15.0

@dataclass
class GPTConfig:
    block_size: int = 1024  # training length N
    vocab_size: int = 50257  # GPT-2 tokenizer
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    ffn_hidden: int = 2048  # SwiGLU hidden size (the SSMax paper's 162M model)
    dropout: float = 0.0
    rope_theta: float = 10000.0
    pos: str = "rope"  # rope | nope: no positional encoding (Kazemnejad et al. 2023), order only from the causal mask
    scorer: str = "softmax"
    ssmax_s_init: float = 1.0
    ssmax_learn_s: bool = True  # False: paper variant (c), s fixed
    ssmax_bias: bool = False  # True: paper variant (d), learnable b per head
    ssa_b_init: float = 1.0
    ssa_n: float = 1.5
    ssa_learn_n: bool = False
    reweight_p: Optional[float] = None  # re-weighting on top of any scorer; lssar uses 15 when None
    backend: str = "auto"  # auto: model.auto_backend (softmax, ssmax: SDPA; others: Triton on CUDA, kernels_cpu on CPU)

    def __post_init__(self):
        if self.scorer not in SCORERS:
            raise ValueError(f"unknown scorer {self.scorer!r}; allowed: {', '.join(SCORERS)}")
        if self.backend not in BACKENDS or self.pos not in POS:
            raise ValueError(f"unknown backend {self.backend!r} or pos {self.pos!r}; allowed: {', '.join(BACKENDS)}; "
                             f"{', '.join(POS)}")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise ValueError(f"n_embd={self.n_embd} must split into n_head={self.n_head} heads of even size (RoPE)")
        # An option that the chosen scorer ignores is almost always a typo'd experiment: refuse it.
        for f in fields(self):
            owner = f.name.split("_")[0]  # ssmax_* options belong to ssmax, ssa_* to ssa
            if owner in ("ssmax", "ssa") and getattr(self, f.name) != f.default and self.scorer != owner:
                raise ValueError(f"option {f.name}={getattr(self, f.name)!r} does not apply to "
                                 f"scorer={self.scorer!r} (only to {owner})")
        if self.scorer == "ssa" and not (self.ssa_b_init > 0 and self.ssa_n > 1):
            raise ValueError(f"ssa needs ssa_b_init > 0 and ssa_n > 1, got {self.ssa_b_init}, {self.ssa_n}")
        if self.backend == "sdpa" and (self.scorer not in ("softmax", "ssmax") or self.reweight_p is not None):
            raise ValueError("backend='sdpa' runs softmax and ssmax without re-weighting only; use backend='auto'")
        if self.reweight_p is not None and not self.reweight_p > 0:
            raise ValueError(f"reweight_p={self.reweight_p} must be > 0 (or None for no re-weighting)")

    @property
    def p(self):  # the re-weighting exponent that actually applies
        return LSSAR_DEFAULT_P if self.scorer == "lssar" and self.reweight_p is None else self.reweight_p

# ----------------------------------------------------------------------------------------------------------------
# Scorers: reference path. Each returns the weights P (B, H, Tq, Tk) with masked (future) entries exactly 0.

def _rows(Tq, Tk, offset, device):
    """n_i = offset + t + 1 for query t, as (Tq, 1), and the causal mask (Tq, Tk)."""
    assert Tk == offset + Tq, f"k has {Tk} keys but offset + Tq = {offset} + {Tq}"
    i = torch.arange(offset, offset + Tq, device=device)
    mask = torch.arange(Tk, device=device)[None, :] <= i[:, None]
    return (i + 1)[:, None], mask

def _per_head(x, default, H, like):
    x = torch.full((H,), default, device=like.device) if x is None else x  # on the device: no sync per call
    return x.to(like.device, like.dtype).view(H, 1, 1)  # broadcast over (Tq, Tk)

def _masked_softmax(logits, mask):
    return torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)

def _z(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk) raw scaled logits

def score_softmax(q, k, n_i, mask, **_):
    return _masked_softmax(_z(q, k), mask)

def score_ssmax(q, k, n_i, mask, s=None, b=None, **_):
    z = _z(q, k)
    scale = _per_head(s, 1.0, q.size(1), z) * torch.log(n_i.to(z.dtype)) + _per_head(b, 0.0, q.size(1), z)
    return _masked_softmax(scale * z, mask)  # (H, Tq, 1) scale multiplies the logits: not a (no-op) shift

def score_ssa(q, k, n_i, mask, b=None, n=None, **_):
    z = _z(q, k)
    b, n = _per_head(b, 1.0, q.size(1), z), _per_head(n, 1.5, q.size(1), z)
    # w = (1 + b|z|)^(sgn(z) n), normalised = softmax of its log: no pow on negative bases, no overflow. Not
    # sgn(z) log1p(b|z|): autograd's slope at z = 0 is then 0, the true one n b (clamps: the unused side stays finite)
    logw = torch.where(z >= 0, torch.log1p(b * z.clamp(min=0)), -torch.log1p(-b * z.clamp(max=0)))
    return _masked_softmax(n * logw, mask)

def score_lssa(q, k, n_i, mask, **_):
    d = q.size(-1)
    cos = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)  # no 1/sqrt(d)
    A = F.softplus(math.log(d) * torch.log(n_i.to(cos.dtype)) * cos) * mask
    return A / A.sum(-1, keepdim=True)

SCORE_FNS = {"softmax": score_softmax, "ssmax": score_ssmax, "ssa": score_ssa, "lssa": score_lssa, "lssar": score_lssa}

def reweight(P, n_i, p):
    """LSSAR eq. 5: R = ReLU(n_i P - o_i)^p, P' = R / sum R; o_i = 0 for rows i < 3, else 1.
    Computed as a softmax of p*log(n P - o) over the positive entries, since (nP)^p overflows fp32.
    "Positive" means above 8 n_i eps (eps of P's dtype; kernels.TIE, the same rule): a row with no such entry keeps
    P. Only an exactly uniform row has none, and there n P - 1 is rounding of either sign (exp, log, a sum of n
    terms: up to ~n eps / 2), which must not pick the branch; below 8 n eps re-weighting would amplify that noise."""
    n = n_i.to(P.dtype)
    x = n * P - (n_i > 3).to(P.dtype)  # row i has n_i = i + 1, so i < 3 <=> n_i <= 3
    pos = x > 8 * n * torch.finfo(P.dtype).eps
    logR = torch.where(pos, p * torch.log(torch.where(pos, x, torch.ones_like(x))), float("-inf"))
    has = pos.any(-1, keepdim=True)
    return torch.where(has, torch.softmax(logR.masked_fill(~has, 0.0), dim=-1), P)

def attention_weights(q, k, scorer, *, s=None, b=None, n=None, p=None, offset=0):
    """The attention weights P (B, H, Tq, Tk) of SCORERS.md; q at absolute positions offset..offset+Tq-1."""
    if scorer not in SCORE_FNS:
        raise ValueError(f"unknown scorer {scorer!r}; allowed: {', '.join(SCORERS)}")
    dtype = torch.promote_types(q.dtype, torch.float32)  # half inputs are scored in fp32, under autocast too
    q, k = q.to(dtype), k.to(dtype)
    n_i, mask = _rows(q.size(-2), k.size(-2), offset, q.device)
    with torch.autocast(q.device.type, enabled=False):  # else autocast runs q @ k.T in bf16 again
        P = SCORE_FNS[scorer](q, k, n_i, mask, s=s, b=b, n=n)
        p = LSSAR_DEFAULT_P if scorer == "lssar" and p is None else p
        return P if p is None else reweight(P, n_i, p)

def attention(q, k, v, scorer, *, s=None, b=None, n=None, p=None, offset=0, backend="torch", chunk=1024):
    """Causal attention (B, H, Tq, D) for every scorer. backend: torch (the reference below), sdpa (softmax, ssmax),
    cpu (kernels_cpu.py), triton (kernels.py), flex; auto: the fastest exact one for the device (auto_backend).
    The reference scores at most `chunk` query rows at a time, so its memory is O(chunk * Tk), not O(T^2)."""
    kw = dict(s=s, b=b, n=n, p=p, offset=offset)
    backend = auto_backend(scorer, p, q.device) if backend == "auto" else backend
    if backend == "sdpa":
        return sdpa_attention(q, k, v, scorer, **kw)
    if backend == "cpu":
        import kernels_cpu
        return kernels_cpu.attention(q, k, v, scorer, **kw)
    if backend in ("triton", "flex"):
        import kernels
        return (kernels.attention if backend == "triton" else kernels.flex_attention)(q, k, v, scorer, **kw)
    if backend != "torch":
        raise ValueError(f"unknown attention backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if q.size(-2) > chunk:
        return torch.cat([attention(q[:, :, t:t + chunk], k[:, :, :offset + t + chunk], v[:, :, :offset + t + chunk],
                                    scorer, **{**kw, "offset": offset + t}, chunk=chunk)
                          for t in range(0, q.size(-2), chunk)], dim=2)
    P = attention_weights(q, k, scorer, **kw)
    return (P @ v.to(P.dtype)).to(q.dtype)

def auto_backend(scorer, p, device):
    """softmax and ssmax (no re-weighting): SDPA, exact (ssmax scales q); others: Triton on CUDA, else kernels_cpu."""
    if scorer in ("softmax", "ssmax") and p is None:
        return "sdpa"
    return "triton" if torch.device(device).type == "cuda" else "cpu"

def sdpa_attention(q, k, v, scorer, *, s=None, b=None, n=None, p=None, offset=0):
    """softmax and ssmax on torch's SDPA (flash, cuDNN, efficient or CPU flash: torch chooses). SSMax multiplies row
    i's logits by s log n_i + b, which is q_i scaled by it (Qwen's log-n attention runs so). SDPA's default scale
    1/sqrt(d) is z's. Causal mask: is_causal at offset 0 (top-left), bottom-right after a cache, none for one row."""
    if scorer not in ("softmax", "ssmax") or p is not None:
        raise ValueError(f"backend='sdpa' runs softmax and ssmax without re-weighting, not scorer={scorer!r} with "
                         f"p={p}; use backend='auto' (cpu or triton for the others)")
    Tq, Tk = q.size(-2), k.size(-2)
    assert Tk == offset + Tq, f"k has {Tk} keys but offset + Tq = {offset} + {Tq}"
    if scorer == "ssmax":  # the scale in fp32 (or fp64) and q rounded once to its dtype, as under bf16 autocast
        dtype = torch.promote_types(q.dtype, torch.float32)
        ln_n = torch.arange(offset + 1, offset + Tq + 1, device=q.device, dtype=dtype).log()[:, None]  # (Tq, 1)
        H = q.size(1)
        q = (q.to(dtype) * (_per_head(s, 1.0, H, ln_n) * ln_n + _per_head(b, 0.0, H, ln_n))).to(q.dtype)
    mask = None
    if offset and Tq > 1:  # a chunk after a cache: row t sees keys 0..offset + t, the bottom-right triangle
        from torch.nn.attention.bias import causal_lower_right  # torch >= 2.2
        mask = causal_lower_right(Tq, Tk)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=offset == 0 and Tq > 1)

def ssmax_s_for_switch(N):
    """s0 = 1 / mean_{n=1..N} log n: keeps the average logit scale at a softmax->SSMax switch (0.168 at N=1024)."""
    return 1.0 / (math.lgamma(N + 1) / N)

# ----------------------------------------------------------------------------------------------------------------
# RoPE as pure functions (real cos/sin); the model's tables are non-persistent buffers, so θ can change on load.

def rope_inv_freq(head_dim, theta):
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)

def precompute_rope(T, head_dim, theta=10000.0, inv_freq=None):
    inv_freq = rope_inv_freq(head_dim, theta) if inv_freq is None else inv_freq
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq.to(torch.float64))  # (T, hs/2)
    return angles.cos().float(), angles.sin().float()

ROPE_METHODS = ("none", "theta", "pi", "ntk", "dynamic_ntk", "yarn")

def rope_extension(method, head_dim, theta, scale, train_len, seq_len):
    """Inverse frequencies and cos/sin multiplier (mscale) to run a model trained at length train_len with base θ
    on seq_len tokens. none: unchanged; theta: θ*scale (the SSMax paper: 10,000 -> 500,000); pi: positions/scale
    (Chen et al. 2023); ntk: θ*scale^(d/(d-2)) (NTK-aware); dynamic_ntk: ntk with the factor grown to the actual
    length, scale*seq_len/train_len - (scale-1), none below train_len (the LSSAR paper's choice); yarn: per-frequency
    ramp between interpolation and extrapolation, beta_fast=32, beta_slow=1, mscale 0.1*ln(scale)+1 (Peng et al.)."""
    d = head_dim
    base = rope_inv_freq(d, theta)
    if method == "none":
        return base, 1.0
    if method == "theta":
        return rope_inv_freq(d, theta * scale), 1.0
    if method == "pi":
        return base / scale, 1.0
    if method in ("ntk", "dynamic_ntk"):
        factor = scale if method == "ntk" else max(1.0, scale * seq_len / train_len - (scale - 1))
        return rope_inv_freq(d, theta * factor ** (d / (d - 2))), 1.0
    if method == "yarn":
        def dim_of(rotations):  # the dimension whose wavelength fits `rotations` turns in train_len
            return d * math.log(train_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))
        low, high = max(math.floor(dim_of(32)), 0), min(math.ceil(dim_of(1)), d - 1)
        ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
        return base / scale * ramp + base * (1 - ramp), 0.1 * math.log(scale) + 1.0
    raise ValueError(f"unknown RoPE extension method {method!r}; allowed: {', '.join(ROPE_METHODS)}")

def apply_rope(x, cos, sin):
    """x (B, nh, T, hs); rotates pairs (x[..., :hs/2], x[..., hs/2:]) by the position angles."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)

# ----------------------------------------------------------------------------------------------------------------
# The model

class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight

class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        C, H = config.n_embd, config.n_head
        self.n_head, self.scorer, self.p, self.backend = H, config.scorer, config.p, config.backend
        self.rope = config.pos == "rope"
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C, bias=False), nn.Linear(C, C, bias=False)
        # Scorer parameters, per head; a fixed one is a buffer, so it is still saved with the weights.
        # b and n of SSA are stored through softplus so that b > 0 and n > 1 always.
        def add(name, value, learn=True):
            value = torch.full((H,), float(value))
            setattr(self, name, nn.Parameter(value)) if learn else self.register_buffer(name, value)
        if config.scorer == "ssmax":
            add("ssmax_s", config.ssmax_s_init, config.ssmax_learn_s)
            if config.ssmax_bias:
                add("ssmax_b", 0.0)
        if config.scorer == "ssa":
            add("ssa_b_raw", math.log(math.expm1(config.ssa_b_init)))
            add("ssa_n_raw", math.log(math.expm1(config.ssa_n - 1.0)), config.ssa_learn_n)

    def scorer_params(self):
        """s, b, n as (H,) tensors (or None), in the form the equations use."""
        if self.scorer == "ssmax":
            return dict(s=self.ssmax_s, b=getattr(self, "ssmax_b", None))
        if self.scorer == "ssa":
            return dict(b=F.softplus(self.ssa_b_raw), n=1.0 + F.softplus(self.ssa_n_raw))
        return {}

    def forward(self, x, cos, sin, cache=None, capture=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        offset = 0 if cache is None or "k" not in cache else cache["k"].size(2)
        if self.rope:  # pos="nope": no rotation, the causal mask alone carries the order
            cos, sin = cos[offset:offset + T], sin[offset:offset + T]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:  # KV cache: keys before `offset` come from earlier calls
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        params = self.scorer_params()
        backend = auto_backend(self.scorer, self.p, x.device) if self.backend == "auto" else self.backend
        y = attention(q, k, v, self.scorer, p=self.p, offset=offset, backend=backend, **params)
        if capture is not None:  # attention analysis: weights of chosen query rows only, never a T x T matrix
            rows = [r % (offset + T) - offset for r in capture["rows"]]
            capture["weights"].append(torch.cat([F.pad(attention_weights(
                q[:, :, t:t + 1], k[:, :, :offset + t + 1], self.scorer, p=self.p, offset=offset + t, **params),
                (0, T - t - 1)) for t in rows], dim=2).detach())  # (B, nh, len(rows), offset + T)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

class MLP(nn.Module):  # SwiGLU
    def __init__(self, config):
        super().__init__()
        self.w_gate = nn.Linear(config.n_embd, config.ffn_hidden, bias=False)
        self.w_up = nn.Linear(config.n_embd, config.ffn_hidden, bias=False)
        self.c_proj = nn.Linear(config.ffn_hidden, config.n_embd, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.silu(self.w_gate(x)) * self.w_up(x)))

class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.attn = RMSNorm(config.n_embd), CausalSelfAttention(config)
        self.ln_2, self.mlp = RMSNorm(config.n_embd), MLP(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, cos, sin, cache=None, capture=None):
        x = x + self.dropout(self.attn(self.ln_1(x), cos, sin, cache, capture))
        return x + self.mlp(self.ln_2(x))

class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=RMSNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)  # untied, as the SSMax paper
        self.set_rope(config.rope_theta)
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if pn.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())

    def set_rope(self, theta=None, inv_freq=None, length=None, mscale=1.0):
        """(Re)build the rotary tables: a new θ (or inverse frequencies from an extension method) on the same
        weights. mscale multiplies cos and sin (YaRN's attention temperature). Tables grow on demand."""
        hs = self.config.n_embd // self.config.n_head
        self.rope_theta = self.config.rope_theta if theta is None else theta
        self.rope_inv_freq = rope_inv_freq(hs, self.rope_theta) if inv_freq is None else inv_freq
        self.rope_mscale = mscale
        cos, sin = precompute_rope(length or self.config.block_size, hs, inv_freq=self.rope_inv_freq)
        self.register_buffer("rope_cos", (cos * mscale).to(self.lm_head.weight.device), persistent=False)
        self.register_buffer("rope_sin", (sin * mscale).to(self.lm_head.weight.device), persistent=False)

    def extend_rope(self, method, scale, L):
        """Rotary tables for L tokens by rope_extension(method), weights untouched; returns θ, effective θ, mscale."""
        cfg, hs = self.config, self.config.n_embd // self.config.n_head
        inv_freq, mscale = rope_extension(method, hs, cfg.rope_theta, scale, cfg.block_size, L)
        self.set_rope(cfg.rope_theta * scale if method == "theta" else cfg.rope_theta, inv_freq, L, mscale)
        # theta, ntk and dynamic_ntk are plain RoPE with another base: report it (pi and yarn have none)
        theta_eff = float(inv_freq[1]) ** (-hs / 2) if hs > 2 else None
        plain = theta_eff is not None and torch.allclose(rope_inv_freq(hs, theta_eff), inv_freq.double(), rtol=1e-9)
        return dict(rope_theta=self.rope_theta, rope_theta_effective=theta_eff if plain else None, mscale=mscale)

    def forward(self, idx, targets=None, cache=None, capture=None, reduction="mean"):
        """idx (B, T). With targets: logits for every position and the loss (ignore_index -1; reduction
        "mean", "sum" or "none" for per-token losses (B, T)). Without: logits of the last position only.
        cache: a list of n_layer dicts (KV cache). capture: {"rows": [...], "weights": []} (attention_rows)."""
        B, T = idx.shape[:2]  # (B, T) token ids, or (B, T, n_in) reals for a model with a linear input (tasks.py)
        offset = 0 if cache is None or "k" not in cache[0] else cache[0]["k"].size(2)
        if offset + T > self.rope_cos.size(0):  # longer than the tables: extend with the same frequencies
            self.set_rope(self.rope_theta, self.rope_inv_freq, 2 * (offset + T), self.rope_mscale)
        x = self.transformer.drop(self.transformer.wte(idx))
        for l, block in enumerate(self.transformer.h):
            x = block(x, self.rope_cos, self.rope_sin, None if cache is None else cache[l], capture)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        return logits, self.loss(logits, targets, reduction)

    def loss(self, logits, targets, reduction="mean"):  # a model of tasks.py with a scalar head overrides it
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.reshape(-1), ignore_index=-1, reduction=reduction)
        return loss.view(targets.shape) if reduction == "none" else loss

    @torch.no_grad()
    def attention_rows(self, idx, rows=(-1,)):
        """Every layer's and head's attention weights of the chosen query rows over all keys:
        (n_layer, B, n_head, len(rows), T), scored in fp32 (under autocast too: attention_weights turns it off).
        Memory O(T) per row: works at 20,000 tokens."""
        capture = {"rows": list(rows), "weights": []}
        self(idx, capture=capture)
        return torch.stack(capture["weights"])

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        # Decay only matrices (rank >= 2): norms and the per-head scorer parameters (s, b, n) are never decayed.
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")

    def flops_per_token(self, T):
        cfg = self.config  # 6N for the matmuls with parameters, plus attention (nanoGPT / PaLM appendix B)
        return 6 * self.get_num_params() + 12 * cfg.n_layer * cfg.n_embd * T

    def estimate_mfu(self, tokens_per_s, T, device=None):
        """Model FLOPs utilisation against the detected device's bf16 dense peak; None when unknown (CPU)."""
        peak = device_peak_flops(device)
        return None if peak is None else self.flops_per_token(T) * tokens_per_s / peak

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        """Sample continuations; with the KV cache each step feeds one token (greedy when temperature == 0)."""
        cache = [{} for _ in self.transformer.h] if use_cache else None
        logits, _ = self(idx, cache=cache)
        for _ in range(max_new_tokens):
            logits = logits[:, -1, :]
            if temperature == 0:
                idx_next = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("inf")
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
            logits, _ = self(idx_next if use_cache else idx, cache=cache)
        return idx

def convert_scorer(model, **changes):
    """A new GPT with changed config fields (e.g. scorer="ssmax") and every shared weight kept: the softmax->SSMax
    switch of the SSMax paper (variants e, f) when ssmax_s_init = ssmax_s_for_switch(block_size)."""
    config = GPTConfig(**{**asdict(model.config), **changes})
    new = GPT(config).to(model.lm_head.weight.device)
    missing, unexpected = new.load_state_dict(model.state_dict(), strict=False)
    bad = [k for k in missing + unexpected if not k.endswith(("ssmax_s", "ssmax_b", "ssa_b_raw", "ssa_n_raw"))]
    assert not bad, f"convert_scorer: weights that do not carry over: {bad}"
    return new

# ----------------------------------------------------------------------------------------------------------------
# Devices and provenance

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "H800": 989e12, "GH200": 989e12, "B200": 2250e12,
                   "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L4": 121e12, "A10G": 125e12, "A10": 125e12,
                   "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12, "T4": 65e12}

def device_peak_flops(device=None):
    if not torch.cuda.is_available() or (device is not None and torch.device(device).type != "cuda"):
        return None
    name = torch.cuda.get_device_name(device)  # dict order: "A100" is tried before "A10", "L40S" before "L4"
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)

def run_info(seed=None):
    """What every checkpoint and result file records: git SHA, versions, device, seed."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        sha = None
    triton = importlib.util.find_spec("triton") and importlib.metadata.version("triton")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    # str(): torch.__version__ is a TorchVersion, a class weights_only loading refuses unless allowed by name
    return dict(git_sha=sha, torch=str(torch.__version__), triton=triton or None, device=device, seed=seed)

def save_checkpoint(obj, path):
    """Atomic (temp file + rename): a crash mid-write leaves the previous checkpoint intact."""
    tmp = f"{path}.tmp"
    try:
        torch.save(obj, tmp)
    except BaseException:  # a full disk (or Ctrl-C) mid-write: no partial file is left beside the intact one
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, path)

class CheckpointError(ValueError):
    """A file that is not a checkpoint this code loads safely; the message is one line naming the file."""

def read_checkpoint(path, device="cpu", mmap=False):
    """The dict train.py saved, read with weights_only=True (tensors and plain containers: a file that carries code
    is refused, never run); mmap=True maps the tensors instead of reading them, a cheap check of a file."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path!r} is a directory, expected a checkpoint file" if os.path.isdir(path)
                              else f"checkpoint {path!r} does not exist")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip: empty, text, truncated and legacy files stop here
        raise CheckpointError(f"{path!r} is not a checkpoint: not a torch.save zip archive ({os.path.getsize(path):,} "
                              "bytes: empty, truncated or another kind of file)")
    try:  # checkpoints written before run_info stored str(torch.__version__) hold a TorchVersion: allow just that
        with torch.serialization.safe_globals([torch.torch_version.TorchVersion]):
            ckpt = torch.load(path, map_location=device, weights_only=True, mmap=mmap)
    except Exception as e:  # weights_only refused a global (a function or class: code could run), or a bad archive
        refused = str(e).partition("GLOBAL ")[2].split(" ")[0]
        why = (f"it refers to {refused}, which weights_only=True refuses (tensors and plain values only)" if refused
               else f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}")
        raise CheckpointError(f"checkpoint {path!r} cannot be loaded safely: {why}") from None
    if not isinstance(ckpt, dict) or not {"model", "model_args"} <= ckpt.keys():
        raise CheckpointError(f"{path!r} is not a nanoscorer checkpoint (no model or model_args)")
    return ckpt

def load_checkpoint(path, device="cpu", **overrides):
    """GPT from a checkpoint written by train.py (read_checkpoint); overrides change config fields (e.g. backend)."""
    ckpt = read_checkpoint(path, device)
    try:
        model = GPT(GPTConfig(**{**ckpt["model_args"], **overrides}))
        model.load_state_dict(ckpt["model"])
    except (TypeError, ValueError, RuntimeError) as e:  # model_args or weights that this model.py does not take
        why = " ".join(l.strip() for l in str(e).splitlines())[:300]  # load_state_dict: a line per kind of mismatch
        raise CheckpointError(f"{path!r} does not fit this model: {type(e).__name__}: {why}") from None
    return model.to(device), ckpt
