"""
nanoscorer's attention scorers: the registry that every other place reads, and the reference path.

The exact definitions are SCORERS.md. One `Scorer` entry per scorer holds its reference function (below, like the
paper's equation), its per-head parameters, its row division and the flags the fused paths compile from; GPTConfig's
checks, the model's parameters, train.py's options and the tests' tables derive from it (tests/test_registry.py).
Adding a scorer, or a special case of one (special_case): SCORERS.md, "Adding a scorer".

- softmax: the baseline.
- ssmax: Scalable-Softmax, Nakanishi 2025 "Scalable-Softmax Is Superior for Attention" (eq. 2, 4, 11): the logits
  of query row i are *multiplied* by s*log(n_i) + b, n_i = number of keys that row attends to.
- ssa: Scaled Signed Averaging, Naim et al. 2025 "Improving in-context learning with a better scoring function"
  (eq. 5): weights (1 + b|z|)^(sgn(z) n), normalised.
- lssa / lssar: Gao & Spratling 2025 "Softplus Attention with Re-weighting Boosts Length Extrapolation" (eq. 4, 5):
  softplus of log(d) log(n_i)-scaled cosine scores, l1-normalised; then ReLU(n_i A - o_i)^p (N = n_i), l1-normalised.
- sigmoid: Ramapuram et al. 2024 "Theory, Analysis, and Best Practices for Sigmoid Self-Attention": weights
  sigmoid(z - log n_i), not normalised.
- softpick: Zuhri et al. 2025 "Softpick: No Attention Sink, No Massive Activations with Rectified Softmax"
  (arXiv 2504.20966, eq. 2): ReLU(e^z - 1) / (sum_j |e^z - 1| + eps): another sum, so rows sum below 1.
- stickbreaking: Tan et al. 2024 "Scaling Stick-Breaking Attention" (arXiv 2410.17980): over the keys before i,
  A_ij = sigmoid(z_ij) prod_{j<k<i} (1 - sigmoid(z_ik)); not a row template (torch, cpu, triton: kernels_stick.py).
- fox: Lin et al. 2025 "Forgetting Transformer" (arXiv 2503.02130): softmax of z_ij + c_i - c_j, c the prefix sums
  of per-head log forget gates log sigmoid(f_l), which the model computes from the layer input (attention's c=).
"""
import math
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch
import torch.nn.functional as F

LSSAR_DEFAULT_P = 15.0
SOFTPICK_EPS = 1e-6  # in the unscaled sum (SCORERS.md)

# ----------------------------------------------------------------------------------------------------------------
# Reference path: P (B, H, Tq, Tk), future entries exactly 0

def _rows(Tq, Tk, offset, device):
    """n_i = offset + t + 1 for query t, as (Tq, 1), and the causal mask (Tq, Tk)."""
    assert Tk == offset + Tq, f"k has {Tk} keys but offset + Tq = {offset} + {Tq}"
    i = torch.arange(offset, offset + Tq, device=device)
    mask = torch.arange(Tk, device=device)[None, :] <= i[:, None]
    return (i + 1)[:, None], mask

def per_head(entry, params, H, like):
    """The scorer's parameters as (H, 1, 1) tensors (broadcast over (Tq, Tk)), registry defaults where not given."""
    full = {name: torch.full((H,), default, device=like.device)  # no sync per call
            for name, default in [*((prm.name, prm.default) for prm in entry.params), *entry.fixed]}
    prm = {name: x if name == "c" else torch.as_tensor(x, device=like.device, dtype=like.dtype)  # a number: all heads
           for name, x in {**full, **params}.items()}
    if bad := [name for name, x in prm.items() if name != "c" and x.shape not in ((), (1,), (H,))]:
        raise ValueError(f"{bad[0]} has shape {tuple(prm[bad[0]].shape)}; allowed: one value a head ({H},) or one")
    return {name: x if name == "c" else x.expand(H).view(H, 1, 1) for name, x in prm.items()}  # c: per key

def upto(params, end):
    """The parameters for the first `end` keys: fox's per-key c cut there, the others as they are."""
    return {name: x[..., :end] if name == "c" else x for name, x in params.items()}

def _masked_softmax(logits, mask):
    return torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)

def _z(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)

def score_softmax(q, k, n_i, mask):
    return _masked_softmax(_z(q, k), mask)

def score_ssmax(q, k, n_i, mask, s, b):
    z = _z(q, k)
    return _masked_softmax((s * torch.log(n_i.to(z.dtype)) + b) * z, mask)  # multiplies: not a (no-op) shift

def score_ssa(q, k, n_i, mask, b, n):
    return _masked_softmax(_ssa_logit(_z(q, k), None, None, b, n), mask)  # softmax of log w: no pow, no overflow

def score_lssa(q, k, n_i, mask):
    d = q.size(-1)
    cos = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)  # no 1/sqrt(d)
    A = F.softplus(math.log(d) * torch.log(n_i.to(cos.dtype)) * cos) * mask
    return A / A.sum(-1, keepdim=True)

def score_sigmoid(q, k, n_i, mask):
    z = _z(q, k)
    return torch.sigmoid(z - torch.log(n_i.to(z.dtype))) * mask  # not normalised: the output is sum_j w_ij v_j

def score_softpick(q, k, n_i, mask):
    z = _z(q, k).masked_fill(~mask, float("-inf"))
    m = z.amax(-1, keepdim=True).clamp(min=0).detach()  # e^z - 1 = e^m (e^(z-m) - e^-m): no overflow
    e = torch.exp(-m)  # near z = 0 as e^-m expm1(z): e^(z-m) - e^-m cancels there (~eps/|z| relative)
    u = torch.where(z.abs() < 1, e * torch.expm1(z.clamp(-1, 1)), torch.exp(z - m) - e) * mask  # clamp: no inf unused
    return torch.relu(u) / (u.abs().sum(-1, keepdim=True) + SOFTPICK_EPS * e)  # relu: slope 0 at 0

def score_stickbreaking(q, k, n_i, mask):
    z = _z(q, k)
    before = mask & (torch.arange(mask.size(-1), device=z.device) < n_i - 1)  # keys j < i only
    log_rest = F.logsigmoid(-z).masked_fill(~before, 0.0)  # log(1 - beta_ik), in log space
    # sum over j < k < i: a reverse cumulative sum of the keys after j, exact (no total minus prefix)
    after = F.pad(log_rest[..., 1:], (0, 1)).flip(-1).cumsum(-1).flip(-1)
    return torch.exp(F.logsigmoid(z) + after).masked_fill(~before, 0.0)  # row 0 attends to nothing: 0

def score_fox(q, k, n_i, mask, c):
    z = _z(q, k)
    c = c.to(z.dtype)  # (B, H, Tk): the queries are the last Tq positions
    return _masked_softmax(z + (c[..., -z.size(-2):, None] - c[..., None, :]), mask)

TIE = 8  # re-weighting: n P - o > TIE eps (n + |lse|) counts as positive

def tie_tolerance(n_i, lse, eps):
    """Re-weighting's tie tolerance on y = n_i P - o_i: P's rounding is ~eps a term of the row sum (n_i) plus ~|lse|
    eps from the logits' own (exp(x - lse) at |x| ~ |lse|), so a uniform row's y is noise below it at any |logit|."""
    return TIE * eps * (n_i + lse.abs())

def reweight(P, n_i, p, lse):
    """LSSAR eq. 5: R = ReLU(n_i P - o_i)^p, P' = R / sum R; o_i = 0 for rows i < 3, else 1. A softmax of p log(n P - o)
    over the positive entries ((n P)^p overflows fp32); positive: above tie_tolerance (eps of P's dtype, lse: row_lse;
    the fused paths agree). A row with none keeps P: only a uniform row, whose n P - 1 is rounding noise, has none."""
    n = n_i.to(P.dtype)
    x = n * P - (n_i > 3).to(P.dtype)  # row i has n_i = i + 1, so i < 3 <=> n_i <= 3
    pos = x > tie_tolerance(n, lse, torch.finfo(P.dtype).eps)
    logR = torch.where(pos, p * torch.log(torch.where(pos, x, torch.ones_like(x))), float("-inf"))
    has = pos.any(-1, keepdim=True)
    return torch.where(has, torch.softmax(logR.masked_fill(~has, 0.0), dim=-1), P)

@torch.no_grad()
def row_lse(entry, q, k, n_i, mask, prm):
    """ln sum_j e^logit_ij of each row (B, H, Tq, 1) from the registry's logits (flex's score_mod; the kernels' M1):
    the scale of P's rounding in re-weighting's tie test."""
    s = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1) if entry.cosine else _z(q, k)
    kw = {name: x for name, x in prm.items() if name != "c"}  # fox's c: added below
    x = entry.logit(s, torch.log(n_i.to(s.dtype)), math.log(q.size(-1)), **kw)
    if entry.forget:  # fox: + c_i - c_j, as score_fox
        c = prm["c"].to(x.dtype)
        x = x + (c[..., -x.size(-2):, None] - c[..., None, :])  # one difference: c grows with length
    return torch.logsumexp(x.masked_fill(~mask, -math.inf), -1, keepdim=True)

# ----------------------------------------------------------------------------------------------------------------
# The registry

RESERVED = ("q", "k", "v", "scorer", "p", "offset", "backend", "chunk", "n_i", "mask", "c")  # taken by attention()

@dataclass(frozen=True)
class Param:
    """A per-head parameter of a scorer. `name` is the paper's symbol and attention()'s keyword (none of RESERVED)."""
    name: str
    default: float  # when attention() is not given it
    init: str = ""  # GPTConfig field of its start value ("": default)
    learn: str = ""  # GPTConfig field: does it learn ("": always)
    only_if: str = ""  # GPTConfig field that adds it ("": always)
    low: Optional[float] = None  # kept > low: low + softplus(raw)

    def fields(self):
        return [f for f in (self.init, self.learn, self.only_if) if f]

@dataclass(frozen=True)
class Scorer:
    weights: Callable  # the reference: P from (q, k, n_i, mask, **params)
    logit: Callable  # flex score_mod: ln logit of (score, ln n_i, ln d, **params)
    params: tuple = ()
    fixed: tuple = ()  # (name, value): a parent's parameters held fixed (special_case): no Param, never learnt
    row_sum: bool = True  # output divided by a row sum (kernels: NORMALISE)
    den_logit: Optional[Callable] = None  # ln of the divisor's terms, as logit (None: the weights)
    eps: float = 0.0  # a constant added to the divisor
    p: Optional[float] = None  # default re-weighting exponent (lssar)
    cosine: bool = False  # scores cos(q_i, k_j) (lssa), not z = q.k / sqrt(d)
    # the fused kernels' compile-time flags (kernels_math.py)
    stats: str = "online_max"  # or plain_sum: bounded weights, no running max
    row: str = "plain"  # or logn (ssmax), norm (lssa), bias (sigmoid), forget (fox: c_i, c_j)
    kernel_logit: Optional[str] = None  # linear (z), ssa, softplus, sigmoid, softpick, stickbreaking, forget
    forget: bool = False  # FoX: logits + c_i - c_j, c (B, H, Tk) given as c= (the model's forget gates)
    backends: tuple = ("torch", "cpu", "flex")  # model.attention's that run it; triton exactly with a kernel_logit

    def __post_init__(self):  # the flag-keyed paths (Triton, kernels_cpu.FAST) run only math tested on Triton
        if ("triton" in self.backends) != (self.kernel_logit is not None):  # kernels_cpu.FAST once ran softmax for one
            raise ValueError(f"the Scorer of {self.weights.__name__} has kernel_logit {self.kernel_logit!r}, backends "
                             f"{self.backends}: kernel_logit goes with triton (SCORERS.md, Adding a scorer, step 4)")
        if taken := [prm.name for prm in self.params if prm.name in RESERVED]:  # p=3.0 ran re-weighting; c: fox's
            raise ValueError(f"the Scorer of {self.weights.__name__} has a Param {taken[0]!r}, a name attention() "
                             f"takes itself ({', '.join(RESERVED)}): give it another symbol")

    @property
    def sums_to_one(self):  # divided by its weights' own sum: re-weighting applies
        return self.row_sum and self.den_logit is None and not self.eps

    def kernel_flags(self):  # named as kernels.FLAGS
        return dict(ROW=self.row, LOGIT=self.kernel_logit, ONLINE_MAX=self.stats == "online_max",
                    NORMALISE=self.row_sum, SUMS_TO_ONE=self.sums_to_one)

def special_case(parent, **values):
    """`parent` with some of its parameters held at `values`: one registry entry, its parent's math and kernels."""
    assert set(values) <= {prm.name for prm in parent.params}, f"{sorted(values)}: not all parameters of the parent"
    return replace(parent, params=tuple(prm for prm in parent.params if prm.name not in values),
                   fixed=parent.fixed + tuple(values.items()))

def _ssa_logit(z, ln_n, ln_d, b, n):  # n log w = n sgn(z) log1p(b |z|): no pow of negative bases, no overflow
    # two branches: slope n b at z = 0 (sgn(z) log1p gives 0); clamps: the unused branch finite (no NaN grads)
    return n * torch.where(z >= 0, torch.log1p(b * z.clamp(min=0)), -torch.log1p(-b * z.clamp(max=0)))

def _log_abs_expm1(z):  # log|e^z - 1| = max(z, 0) + log(1 - e^-|z|); -inf at 0, where its gradient is 0, as the
    nz = z != 0           # kernels' sgn(0) = 0: log 0's infinite one gave 0 x inf = NaN in flex's backward (q = 0 rows)
    z = torch.where(nz, z, torch.ones_like(z))
    return torch.where(nz, z.clamp(min=0) + torch.log(-torch.expm1(-z.abs())), -math.inf)

_FUSED, _SDPA = ("torch", "cpu", "triton", "flex"), ("torch", "sdpa", "cpu", "triton", "flex")
_lssa = dict(weights=score_lssa, cosine=True, stats="plain_sum", row="norm", kernel_logit="softplus", backends=_FUSED,
             logit=lambda cos, ln_n, ln_d: torch.log(F.softplus(ln_d * ln_n * cos)))  # A / sum A = softmax(log A)
SCORERS = {
    "softmax": Scorer(score_softmax, lambda z, ln_n, ln_d: z, kernel_logit="linear", backends=_SDPA),
    "ssmax": Scorer(score_ssmax, lambda z, ln_n, ln_d, s, b: z * (s * ln_n + b), row="logn", kernel_logit="linear",
                    backends=_SDPA,
                    params=(Param("s", 1.0, init="ssmax_s_init", learn="ssmax_learn_s"),  # (c): s fixed
                            Param("b", 0.0, init="ssmax_b_init", learn="ssmax_learn_b", only_if="ssmax_bias"))),  # (d)
    "ssa": Scorer(score_ssa, _ssa_logit, kernel_logit="ssa", backends=_FUSED,
                  params=(Param("b", 1.0, init="ssa_b_init", low=0.0),
                          Param("n", 1.5, init="ssa_n", learn="ssa_learn_n", low=1.0))),
    "lssa": Scorer(**_lssa),
    "lssar": Scorer(**_lssa, p=LSSAR_DEFAULT_P),
    "sigmoid": Scorer(score_sigmoid, lambda z, ln_n, ln_d: F.logsigmoid(z - ln_n), row_sum=False,
                      stats="plain_sum", row="bias", kernel_logit="sigmoid", backends=_FUSED),
    "softpick": Scorer(score_softpick, lambda z, ln_n, ln_d: torch.where(z > 0, _log_abs_expm1(z), -math.inf),
                       den_logit=lambda z, ln_n, ln_d: _log_abs_expm1(z), eps=SOFTPICK_EPS, kernel_logit="softpick",
                       backends=_FUSED),
    "stickbreaking": Scorer(score_stickbreaking, None, row_sum=False, stats="plain_sum",  # no row template, no logit
                            kernel_logit="stickbreaking", backends=("torch", "cpu", "triton")),
    "fox": Scorer(score_fox, lambda z, ln_n, ln_d: z, forget=True, row="forget", kernel_logit="forget",
                  backends=("torch", "sdpa", "triton", "flex")),
}

def check_options(config):
    """GPTConfig's scorer options against the registry: one clear error for an option the chosen scorer ignores
    (almost always a typo'd experiment), an initial value out of its bound, re-weighting on unnormalised rows."""
    for name, entry in SCORERS.items():
        for f in (f for prm in entry.params for f in prm.fields()):
            if not hasattr(config, f):  # else an AttributeError for every scorer's model
                raise ValueError(f"scorer {name!r} reads GPTConfig field {f}, which model.py's GPTConfig lacks: add "
                                 f"it (SCORERS.md, Adding a scorer, step 2)")
            owners = [n for n, e in SCORERS.items() if any(f in prm.fields() for prm in e.params)]  # + special cases
            if getattr(config, f) != type(config).__dataclass_fields__[f].default and config.scorer not in owners:
                raise ValueError(f"option {f}={getattr(config, f)!r} does not apply to scorer={config.scorer!r} "
                                 f"(only to {', '.join(owners)})")
    for prm in SCORERS[config.scorer].params:
        if off := [f for f in (prm.init, prm.learn) if prm.only_if and not getattr(config, prm.only_if)
                   and getattr(config, f) != type(config).__dataclass_fields__[f].default]:  # ssmax_b_init, no bias
            raise ValueError(f"option {off[0]}={getattr(config, off[0])!r} needs {prm.only_if}=True")
        if prm.low is not None and prm.init and not getattr(config, prm.init) > prm.low:
            raise ValueError(f"{config.scorer} needs {prm.init} > {prm.low:g}, got {getattr(config, prm.init)}")
    if config.reweight_p is not None and not SCORERS[config.scorer].sums_to_one:
        raise ValueError(f"reweight_p={config.reweight_p} needs normalised rows; scorer={config.scorer!r} has none")

def get(scorer, p=None, params=None, backend=None):
    """The scorer's entry, the re-weighting exponent that applies and the parameters given (None: its default), by
    the registry's names; one clear error for a bad scorer, p, parameter name or a backend that cannot run it."""
    if scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r}; allowed: {', '.join(SCORERS)}")
    entry = SCORERS[scorer]
    p = entry.p if p is None else p
    if p is not None and not (entry.sums_to_one and 0 < p <= 100):  # as GPTConfig: p = 0 or nan differed by backend
        raise ValueError(f"re-weighting p={p} must be in (0, 100]" if entry.sums_to_one else
                         f"re-weighting (p={p}) needs normalised rows; scorer={scorer!r} has none")
    if backend is not None and backend not in entry.backends:
        raise ValueError(f"scorer {scorer!r} runs on backends {', '.join(entry.backends)}, not {backend!r} (no kernel)")
    names = [prm.name for prm in entry.params] + ["c"] * entry.forget
    if unknown := [name for name in params or {} if name not in names]:
        raise ValueError(f"scorer {scorer!r} has no parameter {unknown[0]!r}; its parameters: {names or 'none'}")
    given = {name: x for name, x in (params or {}).items() if x is not None}
    if entry.forget and not (torch.is_tensor(c := given.get("c")) and c.dim() == 3):  # (H, Tk) ran on torch alone
        raise ValueError(f"scorer {scorer!r} needs c= (B, H, Tk): the prefix sums of its log forget gates; got "
                         f"{tuple(c.shape) if torch.is_tensor(c) else c}")
    for prm in [prm for prm in entry.params if prm.low is not None and not torch.compiler.is_compiling()]:
        x = torch.as_tensor(given.get(prm.name, prm.default))  # read on CPU only: on CUDA a sync, compiled a break
        if x.device.type == "cpu" and bool((x < prm.low).any()):  # b < 0: NaN on torch and flex; NaN: divergence
            raise ValueError(f"scorer {scorer!r} needs {prm.name} >= {prm.low:g} (SCORERS.md), got {x.tolist()}")
    return entry, None if p is None else float(p), given

def prepare(q, k, v, scorer, p=None, offset=0, backend=None, **params):
    """A fused path's inputs checked (shapes: the asserts): the registry entry, p, and each of the scorer's parameters
    by name as a per-head fp32 tensor on q's device (its default where not given; fox's c as given)."""
    entry, p, params = get(scorer, p, params, backend)
    assert q.dim() == 4 and k.shape == v.shape and k.shape[:2] == q.shape[:2] and k.shape[3] == q.shape[3], \
        f"q (B, H, Tq, D) and k, v (B, H, Tk, D) expected, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
    H, Tq = q.shape[1], q.shape[2]
    assert Tq > 0 and k.shape[2] == offset + Tq, \
        f"q has {Tq} rows (at least 1 expected) and k {k.shape[2]} keys, offset + Tq = {offset} + {Tq} expected"
    assert not entry.forget or params["c"].shape == k.shape[:3], \
        f"c (B, H, Tk) = {tuple(k.shape[:3])} expected, got {tuple(params['c'].shape)}"
    return entry, p, {name: x if name == "c" else x.view(H).contiguous()
                      for name, x in per_head(entry, params, H, q.new_empty(0, dtype=torch.float32)).items()}

# ----------------------------------------------------------------------------------------------------------------
# Reference weights

def attention_weights(q, k, scorer, *, p=None, offset=0, **params):
    """The attention weights P (B, H, Tq, Tk) of SCORERS.md; q at absolute positions offset..offset+Tq-1; params: the
    scorer's, by name (e.g. s=, b= for ssmax), per head."""
    entry, p, params = get(scorer, p, params)
    dtype = torch.promote_types(q.dtype, torch.float32)  # half inputs are scored in fp32, under autocast too
    q, k = q.to(dtype), k.to(dtype)
    n_i, mask = _rows(q.size(-2), k.size(-2), offset, q.device)
    with torch.autocast(q.device.type, enabled=False):  # else autocast runs q @ k.T in bf16 again
        prm = per_head(entry, params, q.size(1), q)
        P = entry.weights(q, k, n_i, mask, **prm)
        return P if p is None else reweight(P, n_i, p, row_lse(entry, q, k, n_i, mask, prm))
