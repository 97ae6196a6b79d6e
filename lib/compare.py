"""
Comparing models scored on the same sequences: per-sequence losses over windows ending at k x the training length
(eval_long.py's per_sequence.csv) under labels no two models or settings share, each model's paired difference to a
baseline model with a percentile bootstrap CI over sequences (Efron & Tibshirani 1993, ch. 13), and seed-level
statistics (exact t intervals, sign-flip p, Holm's step-down correction, ceilings). Their figures are
lib/figures.py's.

Paired: the difference is taken sequence by sequence, so text that is hard for every model cancels out.
"""
import csv, math, os
from collections import defaultdict

import numpy as np

PER_SEQUENCE_COLUMNS = ("model", "ckpt", "rope", "rope_method", "rope_scale", "theta", "sequence", "start", "window",
                        "tokens", "loss")
DIFFERENCE_COLUMNS = ("model", "baseline", "rope", "window", "k", "tokens", "baseline_tokens", "n_seqs", "mean_diff",
                      "ci_lo", "ci_hi")  # tokens: the model's window; baseline_tokens: the baseline's (its own N)
WINDOW_MULTIPLES = (1, 2, 4, 8, 10, 16, 20)  # a window ends at k x the training length N
LEVEL = 0.95
RESAMPLE_CELLS = 2**22  # sequences x resamples per draw: bounds memory

# ----------------------------------------------------------------------------------------------------------------
# Statistics

def bootstrap_ci(d, n_boot=2000, level=LEVEL, seed=0):
    """(mean, lo, hi) of d, one value per sequence: the mean and its percentile bootstrap CI, resampling sequences
    with replacement. One seed for every call, so that every model's difference is resampled the same way."""
    d = np.asarray(d, dtype=np.float64)
    rng = np.random.default_rng(seed)
    step = max(1, RESAMPLE_CELLS // len(d))
    means = np.concatenate([d[rng.integers(0, len(d), (min(step, n_boot - i), len(d)))].mean(1)
                            for i in range(0, n_boot, step)])
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(d.mean()), float(lo), float(hi)

def t975(df):
    """The exact Student-t 97.5 % quantile with df degrees of freedom (seeds - 1): scipy.stats.t.ppf, or where scipy
    is missing (the lent GPU's image) _t975, which agrees with it to 1e-11."""
    try:
        from scipy import stats  # imported when first needed: ~1 s
    except ImportError:
        return _t975(df)
    return float(stats.t.ppf(0.975, df))

def _t975(df, p=0.975):
    """Newton's method on the t CDF, 1/2 + the density's integral from 0 (200-point Gauss-Legendre). From t = 1 the
    iterates rise to the root: the CDF is concave for t > 0."""
    x, w = np.polynomial.legendre.leggauss(200)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - math.log(df * math.pi) / 2
    pdf = lambda u: np.exp(log_c - (df + 1) / 2 * np.log1p(u * u / df))
    t = 1.0
    for _ in range(200):
        step = (p - 0.5 - t / 2 * np.dot(w, pdf(t / 2 * (x + 1)))) / pdf(t)
        t += step
        if step < 1e-13 * t:
            break
    return float(t)

def seed_interval(values):
    """(mean, sd, lo, hi) of one value per training seed: the mean, the sample sd and the 95 % Student-t interval of
    the mean. Seeds, not sequences, are the unit here: a second training run varies more than a second test text."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2:
        return float(v.mean()), math.nan, math.nan, math.nan
    sd = float(v.std(ddof=1))
    half = t975(len(v) - 1) * sd / math.sqrt(len(v))
    return float(v.mean()), sd, float(v.mean() - half), float(v.mean() + half)

def holm(pvalues):
    """Holm's step-down adjusted p-values, in the order given: sort the m p-values, the k-th smallest times
    (m - k + 1), a running maximum, capped at 1. H_(k) is rejected at level a iff every p_(j), j <= k, is below
    a / (m - j + 1), that is iff its adjusted p is below a (Holm 1979). A nan p stays nan and is not in the family."""
    p = np.asarray(pvalues, dtype=np.float64)
    out, idx = np.full(len(p), math.nan), np.flatnonzero(~np.isnan(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    m = len(order)
    out[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    return [float(x) for x in out]

def at_bound(a, b, bounds):
    """The bound (accuracy 1.0 or 0.0, a horizon at the longest length tested) where both settings sit on every seed,
    else None: their difference is then 0 by construction, which shows no equivalence, only the test's ceiling."""
    v = {float(x) for x in (*a, *b)}
    return v.pop() if len(v) == 1 and v <= {float(x) for x in bounds} and len(a) and len(b) else None

def sign_flip_p(d, draws=2**16):
    """Two-sided sign-flip (paired permutation) p-value of the mean of d, one paired difference per training seed:
    under H0 each sign is exchangeable, so p = the share of the 2^n sign assignments (the observed one included)
    whose |mean| is at least the observed one. Exact for n <= 20, else Monte Carlo. Needs 6 seeds to reach < 0.05."""
    d = np.asarray(d, dtype=np.float64)
    if len(d) == 0:
        return math.nan
    # floating-point ties count as ties: a tolerance on the scale of |d|, not of the sum, which may be 0 (+ rounding)
    obs = abs(d.sum()) - 1e-9 * np.abs(d).sum()
    if len(d) <= 20:
        sums = np.zeros(1)
        for x in d:  # all 2^n sums, without a (2^n, n) matrix
            sums = np.concatenate([sums + x, sums - x])
        return float(np.mean(np.abs(sums) >= obs))
    signs = np.random.default_rng(0).integers(0, 2, (draws, len(d)), dtype=np.int8) * 2 - 1
    return float((1 + np.sum(np.abs(signs @ d) >= obs)) / (1 + draws))

def horizon(lengths, accuracies, threshold=0.95):
    """The longest tested length up to which every tested length reaches `threshold` (0 if the shortest fails): the
    lengths a run solves. A recovery after a failure does not count."""
    h = 0
    for length, acc in sorted(zip(lengths, accuracies)):
        if not acc >= threshold:  # nan fails too
            break
        h = length
    return h

def paired(values, base):
    """values minus base, one pair per training seed (same order): [mean, sd, lo, hi] (seed_interval), sign-flip p."""
    d = np.subtract(values, base)
    return [*seed_interval(d), sign_flip_p(d)]

def paired_by_seed(a, b, bounds=()):
    """a, b: {seed: value}, e.g. a setting's and the baseline's accuracy per training seed. The differences a - b over
    the seeds both have, their mean, sd and t interval (seed_interval) and sign-flip p-value; at_bound: the bound of
    `bounds` where both sit on every seed (at_bound), else None."""
    seeds = sorted(a.keys() & b.keys())
    d = [float(a[s] - b[s]) for s in seeds]
    mean, sd, lo, hi = seed_interval(d) if d else (math.nan,) * 4
    return dict(seeds=seeds, diffs=d, n=len(d), mean_diff=mean, sd=sd, ci_lo=lo, ci_hi=hi, sign_flip_p=sign_flip_p(d),
                at_bound=at_bound([a[s] for s in seeds], [b[s] for s in seeds], bounds))

def across_seeds(per_seed):
    """Each seed's paired_differences (a list per seed) -> one row per (model, rope, window): the mean over seeds of
    the per-seed mean difference, its sd and t interval (ci_lo, ci_hi), and each seed's own bootstrap CI."""
    cells = defaultdict(list)
    for diffs in per_seed:
        for d in diffs:
            cells[d["model"], d["rope"], d["window"]].append(d)
    out = []
    for ds in cells.values():
        mean, sd, lo, hi = seed_interval([d["mean_diff"] for d in ds])
        out.append(dict({k: ds[0][k] for k in ("model", "baseline", "rope", "window", "k", "tokens")}, n_seeds=len(ds),
                        n_seqs=ds[0]["n_seqs"], mean_diff=mean, sd=sd, ci_lo=lo, ci_hi=hi,
                        per_seed=[[d["mean_diff"], d["ci_lo"], d["ci_hi"]] for d in ds]))
    return out

def window_bounds(N, L):
    """{window: (first, last) position, 1-based} of every window that ends by position L (eval_long.py's)."""
    out = {}
    for k in (k for k in WINDOW_MULTIPLES if k * N <= L):
        out[f"{k}x"], out[f"prefix_{k}x"] = (k * N - N + 1, k * N), (1, k * N)
    return out

def window_multiple(window):
    """'prefix_4x' or '4x' -> 4: the window's end in units of the training length N."""
    return int(window.removeprefix("prefix_").removesuffix("x"))

def paired_differences(rows, baseline, n_boot=2000, seed=0):
    """Every model minus `baseline`, per RoPE setting and window, over the sequences both have: DIFFERENCE_COLUMNS
    dicts. rows: per-sequence dicts with PER_SEQUENCE_COLUMNS (values as written or as read back from the CSV). A
    window is matched by its label, k x each model's own N: where the N differ, the two windows are other positions
    of the same sequences (tokens and baseline_tokens differ)."""
    loss = defaultdict(dict)  # (model, rope, window) -> {sequence: loss}
    tokens = {}
    for r in rows:
        loss[r["model"], r["rope"], r["window"]][int(r["sequence"])] = float(r["loss"])
        tokens[r["model"], r["window"]] = int(r["tokens"])  # per model: kN differs when N differs
    out = []
    for (model, rope, window), mine in loss.items():
        base = loss.get((baseline, rope, window))
        if model == baseline or base is None:
            continue
        seqs = sorted(mine.keys() & base.keys())
        mean, lo, hi = bootstrap_ci([mine[s] - base[s] for s in seqs], n_boot, seed=seed)
        out.append(dict(model=model, baseline=baseline, rope=rope, window=window, k=window_multiple(window),
                        tokens=tokens[model, window], baseline_tokens=tokens[baseline, window], n_seqs=len(seqs),
                        mean_diff=mean, ci_lo=lo, ci_hi=hi))
    return out

def wilson(k, n, z=1.96):
    """95% Wilson score interval of k successes in n trials, within [0, 1] (k = 0 gave -2.8e-17 in floats)."""
    p, d = k / n, 1 + z * z / n
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, (p + z * z / (2 * n)) / d - half), min(1.0, (p + z * z / (2 * n)) / d + half)

def setting(c):
    """The scorer setting a run trained (c: its checkpoint's config): its scorer, what sets it apart from its default
    (ssmax's fixed-s, s<v>, b<v>, bias; learn-n; p<v>; any other registry option: field less "<scorer>_" and value,
    e.g. s_init2, a_init3, learn_a, no_learn_a; wd0). Runs that differ in an option never share a label."""
    from model import SCORERS, GPTConfig  # torch: only where a config is labelled
    fixed_s, fixed_b = c["scorer"] == "ssmax" and not c["ssmax_learn_s"], not c.get("ssmax_learn_b", True)
    extra = (["fixed-s" if c["ssmax_s_init"] == 1 else f"s{c['ssmax_s_init']:g}"] if fixed_s else []) + (
        [f"b{c['ssmax_b_init']:.3g}" if fixed_b else "bias"] if c["ssmax_bias"] else []) + (
        ["learn-n"] if c["ssa_learn_n"] else []) + ([f"p{c['reweight_p']:g}"] if c["reweight_p"] is not None else [])
    named = {"ssa_learn_n", "ssmax_learn_s", "ssmax_bias", "ssmax_learn_b",  # the labels above (kept as they were)
             *["ssmax_s_init"] * fixed_s, *["ssmax_b_init"] * (fixed_b and c["ssmax_bias"])}
    for f in dict.fromkeys(f for prm in SCORERS[c["scorer"]].params for f in prm.fields()):  # only_if off: at default
        name, default = f.removeprefix(c["scorer"] + "_"), GPTConfig.__dataclass_fields__[f].default
        v = c.get(f, default)  # a field newer than the run: the run had its default
        if v != default and f not in named:  # a number by :g where that keeps it apart from others, else as repr
            value = f"{v:g}" if isinstance(v, float | int) and float(f"{v:g}") == v else repr(v)
            extra.append(name if v is True else f"no_{name}" if v is False else f"{name}{value}")
    return "-".join([c["scorer"], *extra, *(["wd0"] if c.get("weight_decay") == 0 else [])])

def rescaled(label, logit_scale):
    """A softmax model's name with the training-free rescaling it ran with (eval_tasks' "softmax-qwen"): rows with
    and without --logit_scale never share a label."""
    return f"{label}-{logit_scale}" if logit_scale else label

def unique_labels(labels, paths):
    """Each checkpoint's label, a repeated one told apart by its place, run folder and file (one scorer twice, or a
    run's ckpt.pt beside its best.pt): rows that cannot be told apart are never written."""
    out = []
    for i, (label, path) in enumerate(zip(labels, paths)):
        if label in out:
            run, file = os.path.split(os.path.abspath(path))
            label = f"{label} #{i + 1} ({os.path.basename(run)}{'' if file == 'ckpt.pt' else '/' + file})"
        out.append(label)
    return out

def write_csv(path, rows, columns):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)

def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
