"""The model variants the tests run, read from the scorer registry: each scorer at its defaults, each option that
adds or freezes a parameter, and re-weighting on the first scorer that has none by default."""
import dataclasses

from model import GPTConfig
from scorers import SCORERS

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
