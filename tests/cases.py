"""The scorer cases the tests run, read from the scorer registry: each scorer with its parameters off their defaults
and, where its rows sum to one, re-weighted (cases); the model variants, each option that adds or freezes a
parameter included (model_variants); two test-only scorers, OFF_BY_ONE (a row template with no branch anywhere) and
STABLEMAX (a special case of ssa). tests/test_registry.py checks that every table covers every scorer."""
import dataclasses
import math

import torch

from model import GPTConfig
from scorers import SCORERS, Param, Scorer, special_case

DEFAULTS = {f.name: f.default for f in dataclasses.fields(GPTConfig)}
P = 3.0  # the re-weighting exponent of the cases (lssar keeps its own)


def varied(prm, H):
    """H (<= 3) per-head values of a scorer parameter, all different and inside its bound, none but the third at the
    default: a head mixed up or a parameter dropped shows."""
    low = prm.default - 0.4 if prm.low is None else max(prm.default - 0.4, prm.low + 0.1)
    return [low, prm.default + 0.7, prm.default][:H]


def cases(backend=None, values=lambda prm: varied(prm, 2)):
    """(scorer, kw) for every registry scorer that `backend` runs (None: every one): its parameters per head
    (values(prm)), fox's c ("gates": made for the keys' shape), and each again re-weighted (p = P) where its rows sum
    to one without a p of its own."""
    out = [(name, {**{prm.name: values(prm) for prm in e.params}, **({"c": "gates"} if e.forget else {})})
           for name, e in SCORERS.items() if backend is None or backend in e.backends]
    return out + [(name, dict(kw, p=P)) for name, kw in out if SCORERS[name].sums_to_one and SCORERS[name].p is None]


def ids(table):
    return [name + (f"_p{kw['p']:g}" if "p" in kw else "") for name, kw in table]


def model_variants():
    variants = {name: dict(scorer=name) for name in SCORERS}
    for name, entry in SCORERS.items():
        for prm in entry.params:
            add = {prm.only_if: True} if prm.only_if else {}
            if add:
                variants[prm.only_if] = dict(scorer=name, **add)
            if prm.learn:
                variants[f"{prm.learn}={not DEFAULTS[prm.learn]}"] = dict(scorer=name, **add,
                                                                         **{prm.learn: not DEFAULTS[prm.learn]})
    for name, kw in cases():
        if "p" in kw:
            variants[f"{name}_p{P:g}"] = dict(scorer=name, reweight_p=P)
    return variants


VARIANTS = model_variants()


def score_off_by_one(q, k, n_i, mask, s, b):
    """Miller 2023 ("Attention Is Off By One"), e^x / (1 + sum_j e^x), on ssmax's logits x = (s log n_i + b) z."""
    x = (s * torch.log(n_i.to(q.dtype)) + b) * (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    x = x.masked_fill(~mask, -math.inf)
    m = x.amax(-1, keepdim=True).clamp(min=0).detach()  # a shift of the ratio: no gradient
    w = torch.exp(x - m)
    return w / (w.sum(-1, keepdim=True) + torch.exp(-m))


# the row template with no backend branch (fixture off_by_one)
OFF_BY_ONE = Scorer(score_off_by_one, lambda z, ln_n, ln_d, s, b: z * (s * ln_n + b), row="logn", eps=1.0,
                    kernel_logit="linear", backends=("torch", "cpu", "triton", "flex"),
                    params=(Param("s", 1.0), Param("b", 0.0)))
# StableMax (Prieto et al. 2025, "Grokking at the Edge of Numerical Stability"): s(z) = z + 1 (z >= 0), 1 / (1 - z)
# (z < 0), normalised: ssa at b = n = 1, one entry with no branch of its own (fixture stablemax)
STABLEMAX = special_case(SCORERS["ssa"], b=1.0, n=1.0)
