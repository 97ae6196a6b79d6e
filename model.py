"""
nanoscorer model: one Llama-style GPT (RoPE, RMSNorm, SwiGLU, no biases, untied head; an import's q, k, v biases
(Qwen2) or q, k norms and own head size (Qwen3)) whose attention has a `scorer` switch. The scorers are one registry
in scorers.py (SCORERS, each with its paper), with the reference path that reads like the papers' equations
(definitions: SCORERS.md); attention() below dispatches to it or to a fast path (kernels_sdpa.py, kernels.py and
kernels_stick.py on a GPU, kernels_cpu.py, kernels_flex.py). RoPE is rope.py's. Beside the GPT: the softmax -> SSMax
switch (convert_scorer). Checkpoints, and the synthetic tasks' real-valued model RealGPT, are lib/checkpoint.py's.
"""
import math
from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import rope
import scorers
from kernels_sdpa import sdpa_attention
from rope import ROPE_METHODS, apply_rope, precompute_rope, rope_extension, rope_inv_freq  # noqa: F401
from scorers import LSSAR_DEFAULT_P, SCORERS, attention_weights, reweight  # noqa: F401

# ----------------------------------------------------------------------------------------------------------------
# attention(): every layer's call, reference or fused

BACKENDS = ("auto", "torch", "sdpa", "cpu", "triton", "flex")
TRITON_HEAD_DIMS = (16, 32, 64, 128)  # the fused kernels' tiles (kernels.py, kernels_stick.py)

def attention(q, k, v, scorer, *, p=None, offset=0, backend="torch", chunk=1024, **params):
    """Causal attention (B, H, Tq, D) for every scorer; params: the scorer's per-head parameters by their registry
    names (ssmax: s, b). backend: torch (scorers.py's reference), sdpa (kernels_sdpa.py), cpu (kernels_cpu.py),
    triton (kernels.py; kernels_stick.py), flex (kernels_flex.py); auto: the fastest exact one for the device.
    The reference scores at most `chunk` query rows at a time, so its memory is O(chunk * Tk), not O(T^2)."""
    assert q.size(-2) > 0, "q has no rows (Tq = 0): at least one query expected"  # else each backend fails its own way
    kw = dict(p=p, offset=offset, **params)
    backend = auto_backend(scorer, p, q.device, q.size(-1)) if backend == "auto" else backend
    if backend == "sdpa":
        return sdpa_attention(q, k, v, scorer, **kw)
    if backend == "cpu":
        import kernels_cpu
        return kernels_cpu.attention(q, k, v, scorer, **kw)
    if backend == "triton" and scorer in SCORERS and SCORERS[scorer].kernel_logit == "stickbreaking":
        import kernels_stick  # no row template: kernels of its own
        return kernels_stick.attention(q, k, v, scorer, **kw)
    if backend == "triton":
        import kernels
        return kernels.attention(q, k, v, scorer, **kw)
    if backend == "flex":
        import kernels_flex
        return kernels_flex.flex_attention(q, k, v, scorer, **kw)
    if backend != "torch":
        raise ValueError(f"unknown attention backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if q.size(-2) > chunk:
        return torch.cat([attention(q[:, :, t:t + chunk], k[:, :, :offset + t + chunk], v[:, :, :offset + t + chunk],
                                    scorer, **scorers.upto(dict(kw, offset=offset + t), offset + t + chunk),
                                    chunk=chunk) for t in range(0, q.size(-2), chunk)], dim=2)
    P = attention_weights(q, k, scorer, **kw)
    return (P @ v.to(P.dtype)).to(q.dtype)

def auto_backend(scorer, p, device, head_dim=None):
    """SDPA where it runs the scorer (softmax, ssmax: exact, q scaled; fox) without re-weighting; else Triton on CUDA
    at a head size its tiles take (head_dim None: not asked); else kernels_cpu; else the reference (the registry's
    backends say which run it)."""
    ok = SCORERS[scorer].backends
    if "sdpa" in ok and p is None:
        return "sdpa"
    if "triton" in ok and torch.device(device).type == "cuda" and head_dim in (None, *TRITON_HEAD_DIMS):
        return "triton"
    return "cpu" if "cpu" in ok else "torch"

POS = ("rope", "nope")

def head_size(n_embd, n_head, head_dim=None):
    """Each head's q, k and v width: a model's own head_dim (Qwen3: 128 at any width), else n_embd / n_head. One
    definition for the config, the CPU-time guard and the Hugging Face export (which read plain config fields)."""
    return n_embd // n_head if head_dim is None else head_dim


@dataclass
class GPTConfig:
    block_size: int = 1024  # training length N
    vocab_size: int = 50257  # GPT-2 tokenizer
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: Optional[int] = None  # fewer: grouped-query attention (Ainslie et al. 2023); None: n_head
    n_embd: int = 768
    ffn_hidden: int = 2048  # SwiGLU width (the SSMax paper's 162M model)
    dropout: float = 0.0
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None  # a pretrained model's frequency scaling (rope.py: linear, llama3)
    norm_eps: float = 1e-6  # RMSNorm's (Llama: 1e-5 or 1e-6, as its config says)
    tie_embeddings: bool = False  # lm_head shares wte's weight (SmolLM2); the SSMax paper's is untied
    qkv_bias: bool = False  # q, k, v projections with a bias (Qwen2's, imported); the paper's have none
    head_dim: Optional[int] = None  # None: n_embd / n_head; a pretrained model's own (Qwen3: 128 at any width)
    qk_norm: bool = False  # RMSNorm of each head's q and k before RoPE (Qwen3's, imported)
    pos: str = "rope"  # or nope: no positions (Kazemnejad et al. 2023)
    scorer: str = "softmax"
    ssmax_s_init: float = 1.0
    ssmax_learn_s: bool = True  # False: paper variant (c), s fixed
    ssmax_bias: bool = False  # True: paper variant (d), learnable b per head
    ssmax_b_init: float = 0.0  # s = 0, b = log N: SSMax's scale at N, no growth
    ssmax_learn_b: bool = True
    ssa_b_init: float = 1.0
    ssa_n: float = 1.5
    ssa_learn_n: bool = False
    reweight_p: Optional[float] = None  # on any normalised scorer; None: lssar's 15
    fgate_bias_init: float = 0.0  # fox: the forget gate's bias at start (0, the paper's: f = 1/2; 4: f = 0.98)
    backend: str = "auto"  # auto: see auto_backend

    def __post_init__(self):
        if self.scorer not in SCORERS:
            raise ValueError(f"unknown scorer {self.scorer!r}; allowed: {', '.join(SCORERS)}")
        if self.backend not in BACKENDS or self.pos not in POS:
            raise ValueError(f"unknown backend {self.backend!r} or pos {self.pos!r}; allowed: {', '.join(BACKENDS)}; "
                             f"{', '.join(POS)}")
        if self.head_dim is not None and (self.head_dim <= 0 or self.head_dim % 2):
            raise ValueError(f"head_dim={self.head_dim} must be even and > 0 (RoPE), or None (n_embd / n_head)")
        if self.head_dim is None and (self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2):
            raise ValueError(f"n_embd={self.n_embd} must split into n_head={self.n_head} heads of even size (RoPE)")
        if self.n_kv_head is not None and not (0 < self.n_kv_head <= self.n_head and self.n_head % self.n_kv_head == 0):
            raise ValueError(f"n_kv_head={self.n_kv_head} must divide n_head={self.n_head} (or be None: n_head)")
        scorers.check_options(self)
        rope.check_scaling(self.rope_scaling)
        if self.backend not in ("auto", *SCORERS[self.scorer].backends):
            raise ValueError(f"backend={self.backend!r} does not run scorer={self.scorer!r}; its backends: "
                             f"{', '.join(SCORERS[self.scorer].backends)} (or auto)")
        if self.backend == "triton" and self.head_size not in TRITON_HEAD_DIMS:
            raise ValueError(f"backend='triton' runs head sizes {', '.join(map(str, TRITON_HEAD_DIMS))}, not "
                             f"{self.head_size} (n_embd / n_head or head_dim); backend='auto' picks another")
        if self.backend == "sdpa" and self.reweight_p is not None:
            raise ValueError("backend='sdpa' runs no re-weighting; use backend='auto'")
        if self.fgate_bias_init and not (SCORERS[self.scorer].forget and math.isfinite(self.fgate_bias_init)):
            raise ValueError(f"option fgate_bias_init={self.fgate_bias_init!r} applies only to a scorer with a "
                             f"forget gate (fox), finite; scorer={self.scorer!r}")
        if self.reweight_p is not None and not 0 < self.reweight_p <= 100:  # Triton's backward: fp32's p log2 y
            raise ValueError(f"reweight_p={self.reweight_p} must be in (0, 100] (or None for no re-weighting)")
        bad = [f"{k}={v!r}" for k, v in asdict(self).items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:  # the command line refuses them (lib/config); a config built in code, convert_scorer's, too
            raise ValueError(f"{', '.join(bad)}: must be finite")

    @property
    def head_size(self):
        return head_size(self.n_embd, self.n_head, self.head_dim)

    @property
    def p(self):  # the exponent that applies (lssar: 15 when None)
        return SCORERS[self.scorer].p if self.reweight_p is None else self.reweight_p

# ----------------------------------------------------------------------------------------------------------------
# The model

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight

def param_name(scorer, prm):  # checkpoint names: ssmax_s, ssa_b_raw, ...
    return f"{scorer}_{prm.name}" + ("_raw" if prm.low is not None else "")

class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        C, H, self.n_kv_head = config.n_embd, config.n_head, config.n_kv_head or config.n_head
        self.n_head, self.scorer, self.p, self.backend = H, config.scorer, config.p, config.backend
        self.rope = config.pos == "rope"
        self.q_scale = None  # (L,) factors on row i's logits: lib/rescale.py's, evaluation only (not saved)
        self.hs = config.head_size
        self.q_size, self.kv_size = H * self.hs, self.n_kv_head * self.hs  # k and v: n_kv_head heads each
        self.c_attn = nn.Linear(C, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.c_proj = nn.Linear(self.q_size, C, bias=False)
        if config.qk_norm:  # one weight per head dimension, shared by the heads (Qwen3)
            self.q_norm, self.k_norm = RMSNorm(self.hs, config.norm_eps), RMSNorm(self.hs, config.norm_eps)
        if config.qkv_bias:  # starts at 0
            nn.init.zeros_(self.c_attn.bias)
        if SCORERS[config.scorer].forget:  # FoX: f = w_f x + b_f per head (b_f starts at fgate_bias_init: 0, f = 1/2)
            self.fgate = nn.Linear(C, H, bias=True)
            nn.init.constant_(self.fgate.bias, config.fgate_bias_init)
        # the scorer's parameters (scorers.Param: ssmax's s, b; ssa's b, n), one value per head, from the config
        self.params = [prm for prm in SCORERS[config.scorer].params if not prm.only_if or getattr(config, prm.only_if)]
        for prm in self.params:
            value = getattr(config, prm.init) if prm.init else prm.default
            if prm.low is not None:  # kept > low: stored raw, used as low + softplus(raw) (scorer_params)
                value = math.log(math.expm1(value - prm.low))  # softplus^-1
            value = torch.full((H,), float(value))
            if not prm.learn or getattr(config, prm.learn):  # else fixed: a buffer, so still saved
                setattr(self, param_name(self.scorer, prm), nn.Parameter(value))
            else:
                self.register_buffer(param_name(self.scorer, prm), value)

    def scorer_params(self):
        """The scorer's parameters as (H,) tensors, in the form the equations use: {"s": ..., "b": ...}."""
        values = {prm.name: getattr(self, param_name(self.scorer, prm)) for prm in self.params}
        return {prm.name: values[prm.name] if prm.low is None else prm.low + F.softplus(values[prm.name])
                for prm in self.params}

    def forward(self, x, cos, sin, cache=None, capture=None):
        B, T = x.shape[:2]
        q, k, v = self.c_attn(x).split([self.q_size, self.kv_size, self.kv_size], dim=2)
        q, k, v = (t.view(B, T, -1, self.hs) for t in (q, k, v))
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, nh or n_kv, T, hs)
        offset = 0 if cache is None or "k" not in cache else cache["k"].size(2)
        if self.rope:  # nope: the causal mask alone carries the order
            cos, sin = cos[offset:offset + T], sin[offset:offset + T]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.q_scale is not None:  # sized to the evaluated length: a short table would broadcast its last row
            assert self.q_scale.size(0) >= offset + T, f"q_scale has {self.q_scale.size(0)} rows, not {offset + T}"
            wide = torch.promote_types(q.dtype, torch.float32)  # bf16 q: the factor unrounded, q rounded once
            q = (q.to(wide) * self.q_scale[offset:offset + T, None].to(wide)).to(q.dtype)
        params = self.scorer_params()
        if hasattr(self, "fgate"):  # FoX's c (B, nh, T): prefix sums of log sigmoid(f), fp32 at least, cache-continued
            c = F.logsigmoid(self.fgate(x).to(torch.promote_types(x.dtype, torch.float32))).transpose(1, 2).cumsum(-1)
            if cache is not None:
                cache["c"] = c = torch.cat([cache["c"], cache["c"][..., -1:] + c], dim=-1) if "c" in cache else c
            params["c"] = c
        if cache is not None:  # keys before offset come from earlier calls
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        backend = auto_backend(self.scorer, self.p, x.device, q.size(-1)) if self.backend == "auto" else self.backend
        groups = self.n_head // self.n_kv_head  # each KV head serves `groups` query heads (the cache keeps n_kv)
        repeat = lambda t: t.repeat_interleave(groups, dim=1) if groups > 1 else t
        y = attention(q, *((k, v) if backend == "sdpa" else map(repeat, (k, v))), self.scorer, p=self.p,
                      offset=offset, backend=backend, **params)  # SDPA: its own GQA
        if capture is not None:  # chosen rows only: never a T x T matrix
            k = repeat(k)
            rows = [r % (offset + T) - offset for r in capture["rows"]]
            capture["weights"].append(torch.cat([F.pad(attention_weights(
                q[:, :, t:t + 1], k[:, :, :offset + t + 1], self.scorer, p=self.p, offset=offset + t,
                **scorers.upto(params, offset + t + 1)),
                (0, T - t - 1)) for t in rows], dim=2).detach())  # (B, nh, len(rows), offset + T)
        y = y.transpose(1, 2).contiguous().view(B, T, self.q_size)
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
        self.ln_1, self.attn = RMSNorm(config.n_embd, config.norm_eps), CausalSelfAttention(config)
        self.ln_2, self.mlp = RMSNorm(config.n_embd, config.norm_eps), MLP(config)
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
            ln_f=RMSNorm(config.n_embd, config.norm_eps),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)  # untied, as the SSMax paper
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
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
        hs = self.config.head_size
        self.rope_theta = self.config.rope_theta if theta is None else theta
        scaling = self.config.rope_scaling
        self.rope_inv_freq = rope_inv_freq(hs, self.rope_theta, scaling) if inv_freq is None else inv_freq
        self.rope_mscale = mscale
        cos, sin = precompute_rope(length or self.config.block_size, hs, inv_freq=self.rope_inv_freq)
        self.register_buffer("rope_cos", (cos * mscale).to(self.lm_head.weight.device), persistent=False)
        self.register_buffer("rope_sin", (sin * mscale).to(self.lm_head.weight.device), persistent=False)

    def extend_rope(self, method, scale, L):
        """Rotary tables for L tokens by rope_extension(method), weights untouched; returns θ, effective θ, mscale
        (NoPE: None, None, 1: no table is read, nothing extended)."""
        cfg, hs = self.config, self.config.head_size
        if cfg.pos == "nope":  # its tables are never read: a method it could not take (ntk at head size 2) is moot
            return dict(rope_theta=None, rope_theta_effective=None, mscale=1.0)
        inv_freq, mscale = rope_extension(method, hs, cfg.rope_theta, scale, cfg.block_size, L, cfg.rope_scaling)
        self.set_rope(cfg.rope_theta * scale if method == "theta" else cfg.rope_theta, inv_freq, L, mscale)
        theta_eff = rope.effective_theta(inv_freq, hs, cfg.rope_scaling)  # None: pi, yarn (no θ gives them)
        return dict(rope_theta=self.rope_theta, rope_theta_effective=theta_eff, mscale=mscale)

    def forward(self, idx, targets=None, cache=None, capture=None, reduction="mean"):
        """idx (B, T). With targets: logits for every position and the loss (ignore_index -1; reduction
        "mean", "sum", or "none": None and per-token losses (B, T)). Without: logits of the last position only.
        cache: a list of n_layer dicts (KV cache). capture: {"rows": [...], "weights": []} (attention_rows)."""
        B, T = idx.shape[:2]  # or (B, T, n_in) reals (RealGPT)
        offset = 0 if cache is None or "k" not in cache[0] else cache[0]["k"].size(2)
        if offset + T > self.rope_cos.size(0):  # grow the tables, same frequencies
            self.set_rope(self.rope_theta, self.rope_inv_freq, 2 * (offset + T), self.rope_mscale)
        x = self.transformer.drop(self.transformer.wte(idx))
        for l, block in enumerate(self.transformer.h):
            x = block(x, self.rope_cos, self.rope_sin, None if cache is None else cache[l], capture)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        if reduction == "none":  # ~1,024 tokens' logits at a time, never B x T x vocab (the evaluations' long contexts)
            n = max(1, 1024 // B)
            return None, torch.cat([self.loss(self.lm_head(x[:, i:i + n]), targets[:, i:i + n], "none")
                                    for i in range(0, T, n)], 1)
        logits = self.lm_head(x)
        return logits, self.loss(logits, targets, reduction)

    def loss(self, logits, targets, reduction="mean"):  # RealGPT overrides it
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.reshape(-1), ignore_index=-1, reduction=reduction)
        return loss.view(targets.shape) if reduction == "none" else loss

    @torch.no_grad()
    def attention_rows(self, idx, rows=(-1,)):
        """Every layer's and head's attention weights of the chosen query rows over all keys:
        (n_layer, B, n_head, len(rows), T), scored in fp32 (under autocast too: attention_weights turns it off).
        Memory O(T) per row."""
        bad = [r for r in rows if not -idx.size(1) <= r < idx.size(1)]  # r % T took row 25 of 20 for row 5
        assert not bad, f"rows {bad} are outside the {idx.size(1)} positions (-{idx.size(1)} .. {idx.size(1) - 1})"
        capture = {"rows": list(rows), "weights": []}
        self(idx, capture=capture)
        return torch.stack(capture["weights"])

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        # no decay on norms and scorer params (rank < 2)
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")

    def param_names(self, optimizer):  # state_dict order: resume maps AdamW state by name
        name = {id(p): n for n, p in self.named_parameters()}
        return [name[id(p)] for group in optimizer.param_groups for p in group["params"]]

    def flops_per_token(self, T):  # MFU against a device's peak: lib/tracking.mfu
        cfg = self.config  # 6N + attention (PaLM appendix B); N without a lookup table, which does no matmul
        wte = self.transformer.wte
        lookup = wte.weight.numel() if isinstance(wte, nn.Embedding) and not cfg.tie_embeddings else 0
        return 6 * (self.get_num_params() - lookup) + 12 * cfg.n_layer * cfg.n_head * cfg.head_size * T

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, vocab=None):
        """Sample continuations; with the KV cache each step feeds one token (greedy when temperature == 0). vocab:
        sample only ids below it (a padded vocabulary's extra ids decode to nothing)."""
        cache = [{} for _ in self.transformer.h] if use_cache else None
        logits, _ = self(idx, cache=cache)
        for _ in range(max_new_tokens):
            logits = logits[:, -1, :vocab]
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

def ssmax_s_for_switch(N):
    """s0 = 1 / mean_{n=1..N} log n: keeps the average logit scale at a softmax->SSMax switch (0.168 at N=1024)."""
    return 1.0 / (math.lgamma(N + 1) / N)

def convert_scorer(model, build=GPT, **changes):
    """A new model with changed config fields (e.g. scorer="ssmax") and every shared weight kept: the softmax->SSMax
    switch of the SSMax paper (variants e, f) when ssmax_s_init = ssmax_s_for_switch(block_size). build: config ->
    a model of model's kind (lib/checkpoint.build_model's RealGPT for a real-valued task)."""
    config = GPTConfig(**{**asdict(model.config), **changes})
    new = build(config).to(model.lm_head.weight.device)
    missing, unexpected = new.load_state_dict(model.state_dict(), strict=False)
    own = (*(param_name(name, prm) for name, entry in SCORERS.items() for prm in entry.params),
           "fgate.weight", "fgate.bias")  # fox's forget gate comes and goes with its scorer too
    bad = [k for k in missing + unexpected if not k.endswith(own)]
    assert not bad, f"convert_scorer: weights that do not carry over: {bad}"
    return new
