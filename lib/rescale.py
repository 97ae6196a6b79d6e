"""
Training-free logit rescalings of a trained softmax model: a factor on each query row's logits, applied as q times
the factor (CausalSelfAttention.q_scale), for --logit_scale in eval_tasks.py, eval_long.py and eval_copy.py.
n_i = i + 1 is row i's key count (its 1-based position), N the training length, L the evaluated length (SCORERS.md).

- qwen: max(1, log n_i / log N): Qwen's log-n attention scaling;
- yarn: (0.1 ln(L/N) + 1)^2 for L > N, else 1: YaRN's attention temperature (on q and k; here all on q);
- llama4: 1 + 0.1 log(floor(n_i / F) + 1): Llama 4's attention temperature tuning, floor scale F = 8,192. Below
  F tokens it is 1, so at N = 32 (tested to 4,096 tokens) it does nothing with Llama 4's F; the suite sets F = N;
- a number 1e-6 <= c <= 1e6 (e.g. "2"): every row's logits times c, a constant temperature (the control for "is it the
  scale or its growth with n": SSMax at s = 1 multiplies by log n_i, which grows past N; c does not).
"""
import argparse
import math

import torch

KINDS = ("qwen", "yarn", "llama4")
LLAMA4_FLOOR = 8192


def constant(kind):
    """The factor c of a constant kind ("2": logits times 2), None for one of KINDS; ValueError for anything else."""
    if kind in KINDS:
        return None
    try:
        c = float(kind)
    except (TypeError, ValueError):
        c = math.nan
    if not 1e-6 <= c <= 1e6:  # bounds of our choosing: 1e300 is inf as float32 (every row nan), 1e-300 is 0
        raise ValueError(f"--logit_scale {kind!r}: one of {', '.join(KINDS)}, or a factor c in [1e-6, 1e6]")
    return c


def kind(text):
    """--logit_scale's argparse type: one of KINDS or a factor 1e-6 <= c <= 1e6 (its shortest exact name: "2" for
    "2.0", 1.0000001 kept whole), else one error line."""
    try:
        c = constant(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text if c is None else f"{c:g}" if float(f"{c:g}") == c else repr(c)


def factors(kind, L, N, floor=LLAMA4_FLOOR):
    """The (L,) factors of rows 0..L-1 for sequences of L tokens from a model trained at length N."""
    n = torch.arange(1, L + 1, dtype=torch.float64)
    if kind == "qwen" and N < 2:  # log N = 0
        raise ValueError(f"--logit_scale qwen divides by log N: it needs a model trained at N >= 2, this one at {N}")
    if kind == "qwen":
        f = (n.log() / math.log(N)).clamp(min=1.0)
    elif kind == "yarn":
        f = torch.full_like(n, (0.1 * math.log(L / N) + 1.0) ** 2 if L > N else 1.0)
    elif kind == "llama4":
        f = 1.0 + 0.1 * torch.log(torch.floor(n / floor) + 1.0)
    else:
        f = torch.full_like(n, constant(kind))
    return f.float()


def check(scorers, kind, rope_method=None, floor=LLAMA4_FLOOR, scalings=()):
    """One error for a rescaling asked of a model that is not softmax (its logits already carry their own scale),
    for YaRN's temperature asked twice (--rope_method yarn already multiplies cos and sin by its mscale), for a
    llama4 floor given without llama4 (it was ignored), and for qwen or yarn on a model whose RoPE was already
    extended (scalings: each model's rope_scaling; an imported Llama 3.1's 131,072 positions over 8,192 trained:
    which is N? With N = block_size both factors were 1 at every length that can be run)."""
    if floor != LLAMA4_FLOOR and kind != "llama4":
        raise ValueError(f"--llama4_floor {floor} sets --logit_scale llama4's F; it does nothing with "
                         f"--logit_scale {kind}")
    bad = [s for s in scorers if kind is not None and s != "softmax"]
    if bad:
        raise ValueError(f"--logit_scale {kind} rescales softmax models; got one with scorer={bad[0]!r}")
    extended = next((s for s in scalings if s), None)
    if kind in ("qwen", "yarn") and extended:
        raise ValueError(f"--logit_scale {kind} needs the training length N; a model's RoPE was already extended "
                         f"(rope_scaling {extended['rope_type']}): ambiguous, so not applied")
    if kind == "yarn" and rope_method == "yarn":
        raise ValueError("--logit_scale yarn with --rope_method yarn applies YaRN's temperature twice (the RoPE "
                         "method's mscale already scales the logits): use one of them")


def apply(model, kind, L, floor=LLAMA4_FLOOR):
    """Every layer's q_scale for sequences of L tokens (kind None: none)."""
    check([model.config.scorer], kind, scalings=[getattr(model.config, "rope_scaling", None)])
    table = None
    if kind is not None:
        table = factors(kind, L, model.config.block_size, floor).to(model.lm_head.weight.device)
    for block in model.transformer.h:
        block.attn.q_scale = table
