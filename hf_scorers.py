"""
nanoscorer's scorers inside transformers. `import hf_scorers` registers the attention function "nanoscorer" that a
model exported by `convert_hf.py export` with a scorer other than softmax names in its config.json:

    import hf_scorers  # registers attn_implementation="nanoscorer" with transformers
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained("hf-ssmax", attn_implementation="nanoscorer")

config.json's "nanoscorer" holds the scorer, its per-head parameters per layer and its GPTConfig options (for
convert_hf.py's import back): {"scorer": "ssmax", "params": {"s": [[s of each head] for each layer], "b": ...},
"options": {"ssmax_bias": true, ...}}. It also names the attention ("attn_implementation"), so without
this import from_pretrained refuses the folder instead of running softmax in its place. A folder saved again by
transformers drops that name and loads as "sdpa": with this import, "sdpa" runs the scorer of any config that names
one (attn_implementation="eager" asked by hand still runs softmax: transformers calls it directly). The mask function
sdpa_mask is registered for the name too, else a padded batch would arrive without a mask.

n_i, the keys query row i attends to (SCORERS.md), is counted from that mask: left padding is not counted, so a
padded row scores as the unpadded sequence does, with or without position_ids (RoPE is relative). ssmax runs on SDPA
with q_i scaled by s log n_i + b, as kernels_sdpa.sdpa_attention does; ssa, lssa, sigmoid and softpick on their
reference weights (scorers.py), in fp32, memory O(Tq Tk) a head: output_attentions=True returns these (ssmax's SDPA
none, as transformers' sdpa).
"""
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import sdpa_mask

import scorers

NAME = "nanoscorer"
# the row-template scorers (softmax, ssmax, ssa, lssa, sigmoid, softpick): their weights read only q, k, n_i, the mask
RUNS = tuple(name for name, e in scorers.SCORERS.items() if e.logit is not None and not e.forget and e.p is None)


def keys_attended(mask, Tq, Tk, device):
    """The bool mask (B or 1, 1, Tq, Tk) of the keys each query attends to; None: what SDPA then runs (below)."""
    if mask is None:  # as sdpa_attention_forward: is_causal = Tq > 1, aligned to the first key (an empty static
        # cache's prefill: Tk > Tq, its unwritten slots unseen); a single query sees every key
        return torch.ones(Tq, Tk, dtype=torch.bool, device=device).tril(0 if Tq > 1 else Tk)[None, None]
    if mask.dtype != torch.bool:  # a caller's additive float mask
        mask = mask > torch.finfo(mask.dtype).min / 2
    return mask | ~mask.any(-1, keepdim=True)  # a padding query sees no key: let it see all, finite


def check(spec, L, H):
    """config.json's nanoscorer block as convert_hf.py import takes it, else one ValueError naming the bad entry: a
    scorer hf_scorers runs, and each parameter one of its own, L layers x H heads of finite values above its bound."""
    scorer = spec.get("scorer") if isinstance(spec, dict) else spec
    if scorer not in RUNS:
        raise ValueError(f"hf_scorers runs {', '.join(RUNS)}, not scorer {scorer!r}")
    if not isinstance(spec.get("params"), dict):
        raise ValueError(f"config.json's nanoscorer block has no params dict: {spec!r}")
    own = {prm.name: prm for prm in scorers.SCORERS[scorer].params}
    for name, value in spec["params"].items():
        try:
            x = torch.tensor(value, dtype=torch.float64)
        except (TypeError, ValueError):
            x = torch.zeros(0)
        low = own[name].low if name in own else None
        if name not in own or x.shape != (L, H) or not x.isfinite().all() or (low is not None and (x <= low).any()):
            raise ValueError(f"config.json's nanoscorer params {name!r}: scorer {scorer!r} takes "
                             f"{', '.join(own) or 'none'}, each {L} layers x {H} heads of finite values"
                             + (f" > {low:g}" if low is not None else ""))


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention function: query (B, H, Tq, D), key and value (B, H_kv, Tk, D) -> (B, Tq, H, D)."""
    spec = getattr(module.config, "nanoscorer", None) or {"scorer": "softmax", "params": {}}
    if not getattr(module, "nanoscorer_checked", False):  # once a layer
        check(spec, module.config.num_hidden_layers, query.size(1))
        module.nanoscorer_checked = True
    if scaling is not None and abs(scaling * query.size(-1) ** 0.5 - 1) > 1e-6:
        raise ValueError(f"the scorers scale q.k by 1/sqrt(head_dim), not {scaling}")
    unread = [k for k in ("softcap", "s_aux", "sinks") if kwargs.get(k) is not None] + ["dropout"] * bool(
        dropout and module.training)  # Gemma 2's softcap, gpt-oss's sinks, training dropout: never run here
    if unread:
        raise ValueError(f"hf_scorers runs no attention {' or '.join(unread)}; this model asks for it")
    H, Tq = query.shape[1:3]
    groups = H // key.size(1)  # grouped KV heads serve `groups` query heads each
    k, v = (t.repeat_interleave(groups, dim=1) if groups > 1 else t for t in (key, value))
    allowed = keys_attended(attention_mask, Tq, k.size(2), query.device)
    dtype = torch.promote_types(query.dtype, torch.float32)  # scored in fp32, as model.py
    n_i = allowed.sum(-1, keepdim=True).to(dtype)  # (B, 1, Tq, 1): padding not counted
    entry = scorers.SCORERS[spec["scorer"]]
    layer = {name: torch.tensor(x[module.layer_idx]) for name, x in spec["params"].items()}  # (H,) each
    prm = scorers.per_head(entry, layer, H, n_i)  # (H, 1, 1) each, registry defaults where absent
    P = None  # the weights, where computed: output_attentions=True returns them (SDPA's: none, as transformers')
    if spec["scorer"] in ("softmax", "ssmax"):  # SDPA on q_i scaled by s log n_i + b: exact
        q = (query.to(dtype) * (prm["s"] * n_i.log() + prm["b"])).to(query.dtype) if prm else query
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    else:
        P = entry.weights(query.to(dtype), k.to(dtype), n_i, allowed, **prm)  # (B, H, Tq, Tk), masked entries 0
        y = (P @ v.to(dtype)).to(query.dtype)
    return y.transpose(1, 2).contiguous(), P


def sdpa_or_scorer(module, query, key, value, attention_mask, **kwargs):
    """transformers' "sdpa", unless the model's config.json names a scorer: a folder saved again by transformers loses
    attn_implementation (and loads as sdpa), never its "nanoscorer" block, so its scorer still runs, not softmax."""
    spec = getattr(module.config, "nanoscorer", None)
    run = attention if spec and spec.get("scorer", "softmax") != "softmax" else SDPA
    return run(module, query, key, value, attention_mask, **kwargs)


SDPA = AttentionInterface._global_mapping["sdpa"]
AttentionInterface.register(NAME, attention)
AttentionInterface.register("sdpa", sdpa_or_scorer)
AttentionMaskInterface.register(NAME, sdpa_mask)
