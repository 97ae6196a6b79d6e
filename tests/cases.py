"""The model variants the tests run, read from the scorer registry: each scorer at its defaults, each option that
adds or freezes a parameter, and re-weighting on the first scorer that has none by default; and OFF_BY_ONE."""
import dataclasses
import math

import torch

from model import GPTConfig
from scorers import SCORERS, Param, Scorer

DEFAULTS = {f.name: f.default for f in dataclasses.fields(GPTConfig)}


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
    plain = next(name for name, e in SCORERS.items() if e.sums_to_one and e.p is None)
    variants[f"{plain}_p3"] = dict(scorer=plain, reweight_p=3.0)
    return variants


VARIANTS = model_variants()


def varied(prm, H):
    """H (<= 3) per-head values of a scorer parameter, all different and inside its bound, none but the third at the
    default: a head mixed up or a parameter dropped shows."""
    low = prm.default - 0.4 if prm.low is None else max(prm.default - 0.4, prm.low + 0.1)
    return [low, prm.default + 0.7, prm.default][:H]


def score_off_by_one(q, k, n_i, mask, s, b):
    """Miller 2023 ("Attention Is Off By One"), e^x / (1 + sum_j e^x), on ssmax's logits x = (s log n_i + b) z."""
    x = (s * torch.log(n_i.to(q.dtype)) + b) * (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    x = x.masked_fill(~mask, -math.inf)
    m = x.amax(-1, keepdim=True).clamp(min=0).detach()  # a shift of the ratio: no gradient
    w = torch.exp(x - m)
    return w / (w.sum(-1, keepdim=True) + torch.exp(-m))


# the row template with no backend branch (fixture off_by_one)
OFF_BY_ONE = Scorer(score_off_by_one, lambda z, ln_n, ln_d, s, b: z * (s * ln_n + b), row="logn", eps=1.0,
                    params=(Param("s", 1.0), Param("b", 0.0)))
