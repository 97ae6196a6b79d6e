"""
Rotary position embeddings (Su et al. 2021) for model.py: the inverse frequencies of a base θ, with a pretrained
model's frequency scaling (GPTConfig.rope_scaling: linear, or Llama 3's), the cos/sin tables (not persisted, so θ can
change on load), the rotation, and the extension methods that run a model past its training length (eval_long.py,
eval_copy.py, needle.py: GPT.extend_rope).
"""
import math

import torch

# a pretrained model's scaling, as its config.json names it (convert_hf.py imports and exports it): its fields, each > 0
SCALINGS = {"linear": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}

def check_scaling(scaling):
    """ValueError, one line, for a rope_scaling other than None or {"rope_type": one of SCALINGS, its fields > 0}."""
    if scaling is None:
        return
    need = SCALINGS.get(scaling.get("rope_type")) if isinstance(scaling, dict) else None
    ok = need is not None and set(scaling) == {"rope_type", *need} and all(
        type(scaling[k]) in (int, float) and math.isfinite(scaling[k]) and scaling[k] > 0 for k in need)
    if not ok or (scaling["rope_type"] == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]):
        raise ValueError(f"rope_scaling={scaling!r}: need None or a rope_type with its fields > 0: "
                         + "; ".join(f"{kind}: {', '.join(f)}" for kind, f in SCALINGS.items())
                         + " (llama3: high_freq_factor > low_freq_factor)")

def effective_theta(inv_freq, head_dim, scaling=None):
    """The base θ giving these frequencies under a model's rope_scaling, else None (pi, yarn: no θ does); from a
    ratio, as linear scaling divides inv_freq[0] too and llama3 keeps the fastest two."""
    theta = float(inv_freq[1] / inv_freq[0]) ** (-head_dim / 2) if head_dim > 2 else None
    same = theta is not None and torch.allclose(rope_inv_freq(head_dim, theta, scaling), inv_freq.double(), rtol=1e-9)
    return theta if same else None

def rope_inv_freq(head_dim, theta, scaling=None):
    """θ^(-2i/d) for i < d/2. scaling linear: every frequency / factor (position interpolation); llama3: the
    frequencies that turn fewer than low_freq_factor times over the original context are / factor, those that turn
    more than high_freq_factor times are kept, and between the two a linear blend in the number of turns."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        return inv_freq / scaling["factor"]
    turns = scaling["original_max_position_embeddings"] * inv_freq / (2 * math.pi)  # context / wavelength
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    keep = ((turns - low) / (high - low)).clamp(0, 1)  # 0: interpolated, 1: kept
    return inv_freq / scaling["factor"] * (1 - keep) + inv_freq * keep

def precompute_rope(T, head_dim, theta=10000.0, inv_freq=None):
    inv_freq = rope_inv_freq(head_dim, theta) if inv_freq is None else inv_freq
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq.to(torch.float64))  # (T, hs/2)
    return angles.cos().float(), angles.sin().float()

def apply_rope(x, cos, sin):
    """x (B, nh, T, hs); rotates pairs (x[..., :hs/2], x[..., hs/2:]) by the position angles."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)

def correction_dim(inv_freq, train_len, rotations):
    """The fractional dim at which inv_freq (falling, >= 2 of them) turns `rotations` times in train_len tokens, by
    linear interpolation of log turns between neighbouring dims (beyond the ends, of the end pair). Plain RoPE's log
    turns are linear in the dim, so there it is YaRN's closed form exactly."""
    log_turns, t = (train_len * inv_freq.double() / (2 * math.pi)).log(), math.log(rotations)
    j = min(max(int((log_turns > t).sum()) - 1, 0), len(inv_freq) - 2)
    return j + float((log_turns[j] - t) / (log_turns[j] - log_turns[j + 1]))

ROPE_METHODS = ("none", "theta", "pi", "ntk", "dynamic_ntk", "yarn")

def rope_extension(method, head_dim, theta, scale, train_len, seq_len, scaling=None):
    """Inverse frequencies and cos/sin multiplier (mscale) to run a model trained at length train_len with base θ
    (and its rope_scaling) on seq_len tokens. none: unchanged; theta: θ*scale (the SSMax paper: 10,000 -> 500,000);
    pi: positions/scale (Chen et al. 2023); ntk: θ*scale^(d/(d-2)) (NTK-aware); dynamic_ntk: ntk with the factor
    grown to the actual length, scale*seq_len/train_len - (scale-1), none below train_len (the LSSAR paper's choice);
    yarn: per-frequency ramp between interpolation and extrapolation, beta_fast=32, beta_slow=1, mscale
    0.1*ln(scale)+1 past scale 1 (Peng et al.), the ramp linear in the dim between the correction dims, floored and
    ceiled (transformers'). On a rope_scaling model the correction dims are where its own (scaled) frequencies turn
    32 and 1 times (correction_dim): our definition, transformers never puts YaRN on top of another scaling."""
    d = head_dim
    base = rope_inv_freq(d, theta, scaling)
    if method == "none":
        return base, 1.0
    if method == "theta":
        return rope_inv_freq(d, theta * scale, scaling), 1.0
    if method == "pi":
        return base / scale, 1.0
    if method in ("ntk", "dynamic_ntk"):
        if d <= 2:  # the exponent d/(d-2) divides by zero
            raise ValueError(f"--rope_method {method} scales θ by scale^(d/(d-2)), undefined at head size d = {d}: "
                             "it needs d >= 4 (n_embd / n_head or head_dim); theta, pi or yarn extend any head size")
        factor = scale if method == "ntk" else max(1.0, scale * seq_len / train_len - (scale - 1))
        return rope_inv_freq(d, theta * factor ** (d / (d - 2)), scaling), 1.0
    if method == "yarn":
        def dim_of(rotations):  # dim with `rotations` turns in train_len
            if scaling is not None and d > 2:  # θ's closed form would place them at the unscaled frequencies
                return correction_dim(base, train_len, rotations)
            return d * math.log(train_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))
        low, high = max(math.floor(dim_of(32)), 0), min(math.ceil(dim_of(1)), d - 1)
        ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
        return base / scale * ramp + base * (1 - ramp), 0.1 * math.log(scale) + 1.0 if scale > 1 else 1.0
    raise ValueError(f"unknown RoPE extension method {method!r}; allowed: {', '.join(ROPE_METHODS)}")

# ----------------------------------------------------------------------------------------------------------------
# An evaluation's passes past the training length (eval_long.py; lib/figures.py's ropes names them in its figures)

def eval_passes(method, scale, rope=True):
    """(pass, method, scale) per pass: the method asked, then (if it extends RoPE) the trained θ, "native". Without
    RoPE (NoPE models alone) the native pass only: an extended one would repeat it."""
    return [("extended", method, scale)] * (method != "none" and rope) + [("native", "none", 1.0)]

def applied(pos, method, scale):
    """The RoPE method and scale an evaluation's model ran with, as its results record them: a NoPE model (pos
    "nope") reads no rotary table, and method none keeps the trained one, so none at 1.0 whatever scale was asked."""
    none = pos == "nope" or method == "none"
    return dict(rope_method="none", rope_scale=1.0) if none else dict(rope_method=method, rope_scale=scale)

def trained_theta(changed, theta):
    """What a native pass records where the checkpoint's runs changed θ (changed: its {field: [trained, now]}): the
    θ it ran is the checkpoint's, not the one its weights trained at; {} where θ is as trained."""
    if "rope_theta" not in changed:
        return {}
    trained = changed["rope_theta"][0]
    return dict(rope_theta_trained=trained, described=f"the checkpoint's θ={theta:,.0f}; its weights trained at "
                f"θ={trained:,.0f}")

def unread_options(method, scale, ntk_per_length=None, logit_scale=None):
    """The extension options given (None: not given) that a run would not read, each in words for one error line."""
    unread = []
    if method == "none" and scale is not None:
        unread.append(f"--rope_scale {scale:g} is not read: --rope_method none keeps the trained θ (give one of "
                      f"{', '.join(ROPE_METHODS[1:])})")
    if ntk_per_length is not None and method != "dynamic_ntk" and logit_scale != "yarn":
        unread.append(f"--{'' if ntk_per_length else 'no-'}ntk_per_length is not read: only --rope_method dynamic_ntk "
                      "and --logit_scale yarn are set by the length")
    return unread

def per_length(method, logit_scale, ntk_per_length):
    """Whether a pass runs window k at k*N tokens: Dynamic NTK's base and YaRN's logit temperature are set by the
    sequence's length (LSSAR Table 4), unless --no-ntk_per_length (one L-token pass with the factors for L)."""
    return bool(ntk_per_length) and (method == "dynamic_ntk" or logit_scale == "yarn")

def pass_lengths(bounds, L, method, logit_scale, ntk_per_length):
    """The sequence lengths one pass runs: per length (per_length) each window's end (bounds: {window: (first,
    last)}) and L, the curve's; else one pass of L."""
    if per_length(method, logit_scale, ntk_per_length):
        return sorted({last for _, last in bounds.values()} | {L})
    return [L]

def passes_rule(methods, logit_scale, ntk_per_length):
    """How the windows of the passes that ran (their methods) were read, in summary.json's words."""
    by_length = [per_length(m, logit_scale, ntk_per_length) for m in methods]
    if any(by_length):
        return ("Dynamic NTK or YaRN's logit temperature, per length: both from k*N-token passes with the factor for "
                "k*N" + "; the native pass: one L-token pass" * (not all(by_length)))
    set_by_length = "dynamic_ntk" in methods or logit_scale == "yarn"
    return "every window from one L-token pass" + (", Dynamic NTK or YaRN's logit temperature with the factor for L "
                                                   "(--no-ntk_per_length)") * set_by_length
