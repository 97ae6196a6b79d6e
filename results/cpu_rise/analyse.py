"""Issue #32 item 5, "explain the rise": the seed as the unit. Reads out-rise/rows/s<seed>/ (eval_rows.py, 512 windows
drawn with seed 0: the first 256 are the committed gate's windows, the next 256 fresh ones) and writes
results/cpu_rise/{rise_by_seed.csv, rise_paired.csv, rise_summary.json, rise.png}.

    .venv/bin/python results/cpu_rise/analyse.py [--rows out-rise/rows] [--out results/cpu_rise]
    .venv/bin/python results/cpu_rise/analyse.py --rows results/cpu_rise --out /tmp/rise   # from the committed copies

A = positions 17-32, B = 33-128. rise = mean loss over B - mean over A. Split exactly:
rise = text + context, text = mean loss_c32 over B - mean loss over A (the B tokens predicted from their last 32
tokens only, a fresh window), context = mean (loss - loss_c32) over B (what the context beyond 32 tokens adds).
"""
import argparse, csv, glob, gzip, json, os, sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from lib import compare, figures  # noqa: E402

A, B = (17, 32), (33, 128)
GATE = 256  # the committed gate's windows: the first 256 of default_rng(0)'s draws


def read_csv(path):  # path or path.gz (the committed copies are gzipped)
    if not os.path.exists(path):
        with gzip.open(path + ".gz", "rt", newline="") as f:
            return list(csv.DictReader(f))
    return compare.read_csv(path)


def mean_over(v, win):
    return float(np.nanmean(v[win[0] - 1:win[1]]))


def per_position(path):
    """{model: {stat: (L,) layers averaged; loss, loss_c*: (L,)}}."""
    rows = read_csv(path)
    out = {}
    for m in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == m]
        L = max(int(r["position"]) for r in mine)
        layers = sorted({int(r["layer"]) for r in mine})
        get = lambda k: np.array([[float(r[k]) for r in mine if int(r["layer"]) == l] for l in layers])
        cur = {k: get(k)[0] for k in mine[0] if k.startswith("loss")}
        cur.update({k: get(k).mean(0) for k in ("entropy", "entropy_norm", "sink", "local8")})
        cur["by_layer"] = {k: get(k) for k in ("entropy", "local8", "sink")}
        assert all(len(v) == L for k, v in cur.items() if k != "by_layer")
        out[m] = cur
    return out


def window_rises(path, what="rise"):
    """{model: (num_seqs,) per-window rise} from per_sequence.csv's bins; what="context": the per-window mean over B
    of loss - loss_c32 (the same tokens, full context vs their last 32 tokens)."""
    rows = read_csv(path)
    out = {}
    for m in dict.fromkeys(r["model"] for r in rows):
        seqs = {}
        for r in rows:
            if r["model"] == m:
                seqs.setdefault(int(r["sequence"]), {})[(int(r["first"]), int(r["last"]))] = r
        B_of = lambda s, k: (float(s[(33, 64)][k]) * 32 + float(s[(65, 128)][k]) * 64) / 96
        out[m] = np.array([B_of(s, "loss") - (float(s[(17, 32)]["loss"]) if what == "rise" else B_of(s, "loss_c32"))
                           for _, s in sorted(seqs.items())])
    return out


def bigram_rise(data_dir, starts, L=128, lam=0.7):
    """Model-free text difficulty: per window, the rise of an interpolated bigram model's surprisal (train counts,
    lam * bigram + (1 - lam) * add-half unigram), the same tokens and positions as the models' loss."""
    train = np.fromfile(os.path.join(data_dir, "train.bin"), dtype=np.uint16).astype(np.int64)
    val = np.fromfile(os.path.join(data_dir, "val.bin"), dtype=np.uint16).astype(np.int64)
    V = int(max(train.max(), val.max())) + 1
    uni = np.bincount(train, minlength=V) + 0.5
    keys, counts = np.unique(train[:-1] * V + train[1:], return_counts=True)
    x = np.stack([val[s:s + L + 1] for s in starts])  # (n, L+1): position t predicts x[:, t] from x[:, t-1]
    prev, tgt = x[:, :-1], x[:, 1:]
    idx = np.clip(np.searchsorted(keys, prev * V + tgt), 0, len(keys) - 1)
    pair = np.where(keys[idx] == prev * V + tgt, counts[idx], 0)
    p = lam * pair / (uni[prev] - 0.5).clip(1) + (1 - lam) * uni[tgt] / uni.sum()
    sur = -np.log(p)
    return sur[:, B[0] - 1:B[1]].mean(1) - sur[:, A[0] - 1:A[1]].mean(1)


def ci(d):  # 95 % percentile bootstrap over windows: the text's sampling noise, one model
    _, lo, hi = compare.bootstrap_ci(d)
    return f"[{lo:+.3f}, {hi:+.3f}]"


def corr(x, y):
    return float(np.corrcoef(x, y)[0, 1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="out-rise/rows")
    p.add_argument("--out", default="results/cpu_rise")
    a = p.parse_args()
    seeds = sorted(int(os.path.basename(d)[1:]) for d in glob.glob(os.path.join(a.rows, "s*"))
                   if os.path.isfile(os.path.join(d, "summary.json")))
    if not seeds:
        sys.exit(f"error: --rows {a.rows}: no s<seed>/summary.json of eval_rows.py in it")
    rows_summary = json.load(open(os.path.join(a.rows, f"s{seeds[0]}", "summary.json")))
    data = rows_summary["sequences"]["data"]  # checked before anything is written: the bigram baseline reads it
    if not os.path.isfile(os.path.join(data, "train.bin")):
        sys.exit(f"error: {data}/train.bin is not there: run `python prepare_data.py {os.path.basename(data)}` first")
    table, curves = [], {}
    for seed in seeds:
        pp = per_position(os.path.join(a.rows, f"s{seed}", "per_position.csv"))
        wr = window_rises(os.path.join(a.rows, f"s{seed}", "per_sequence.csv"))
        wc = window_rises(os.path.join(a.rows, f"s{seed}", "per_sequence.csv"), "context")
        for m, c in pp.items():
            curves[seed, m] = c
            t = np.arange(1, len(c["loss"]) + 1)
            ctx = c["loss"] - c["loss_c32"]  # nan up to 32
            inB = (t >= B[0]) & (t <= B[1])
            inAB = (t >= A[0]) & (t <= B[1])
            row = dict(seed=seed, model=m,
                       rise=mean_over(c["loss"], B) - mean_over(c["loss"], A),
                       rise_gate=float(wr[m][:GATE].mean()), rise_fresh=float(wr[m][GATE:].mean()),
                       text=mean_over(c["loss_c32"], B) - mean_over(c["loss"], A),
                       context=mean_over(ctx, B),
                       context_window_ci=ci(wc[m]), rise_gate_window_ci=ci(wr[m][:GATE]), rise_window_ci=ci(wr[m]),
                       context_c16=mean_over(c["loss"] - c["loss_c16"], B) if "loss_c16" in c else np.nan)
            for k in ("entropy", "entropy_norm", "sink", "local8"):
                row[f"d_{k}"] = mean_over(c[k], B) - mean_over(c[k], A)
                row[f"r_loss_{k}"] = corr(c["loss"][inAB], c[k][inAB])  # across positions 17..128
            # fading's prediction, text held fixed: where the local mass has fallen most (vs its value at t = 32),
            # the context beyond 32 should cost most
            row["r_context_dlocal8"] = corr(ctx[inB], c["local8"][inB] - c["local8"][31])
            row["local8_at_32"], row["local8_B"] = float(c["local8"][31]), mean_over(c["local8"], B)
            table.append(row)
    os.makedirs(a.out, exist_ok=True)
    cols = list(table[0])
    compare.write_csv(os.path.join(a.out, "rise_by_seed.csv"), table, cols)
    stats = [k for k in cols if k not in ("seed", "model") and not k.endswith("_ci")]
    summary, paired = {}, []
    models = list(dict.fromkeys(r["model"] for r in table))
    for m in models:
        summary[m] = {k: dict(zip(("mean", "sd", "lo", "hi"), compare.seed_interval(
            [r[k] for r in table if r["model"] == m]))) for k in stats}
        summary[m]["seeds_with_rise_gt_0"] = sum(r["rise"] > 0 for r in table if r["model"] == m)
        summary[m]["seeds_with_context_gt_0"] = sum(r["context"] > 0 for r in table if r["model"] == m)
    for m in models[1:]:
        for k in stats:
            pb = compare.paired_by_seed({r["seed"]: r[k] for r in table if r["model"] == m},
                                        {r["seed"]: r[k] for r in table if r["model"] == models[0]})
            paired.append(dict(model=m, baseline=models[0], stat=k, n=pb["n"], mean_diff=pb["mean_diff"],
                               ci_lo=pb["ci_lo"], ci_hi=pb["ci_hi"], sign_flip_p=pb["sign_flip_p"]))
    compare.write_csv(os.path.join(a.out, "rise_paired.csv"), paired,
                      ["model", "baseline", "stat", "n", "mean_diff", "ci_lo", "ci_hi", "sign_flip_p"])
    # window-sampling noise: the per-window rise's bootstrap CI over windows, per window set (first model, seed)
    wr = window_rises(os.path.join(a.rows, f"s{seeds[0]}", "per_sequence.csv"))[models[0]]
    noise = {name: compare.bootstrap_ci(d) for name, d in (("gate", wr[:GATE]), ("fresh", wr[GATE:])) if len(d)}
    # across every (seed, model): does a larger fall of the local mass go with a larger rise / context cost?
    units = {k: np.array([r[k] for r in table]) for k in ("d_local8", "d_entropy_norm", "rise", "context", "text")}
    across_units = {f"r_{x}_{y}": corr(units[x], units[y]) for x in ("d_local8", "d_entropy_norm")
                    for y in ("rise", "context", "text")} if len(table) > 2 else {}
    # the per-window rise is a property of the window's text: correlated across seeds and models
    per_window = np.array([d for seed in seeds for d in window_rises(
        os.path.join(a.rows, f"s{seed}", "per_sequence.csv")).values()])
    cc = np.corrcoef(per_window)
    window_corr = float(cc[np.triu_indices(len(cc), 1)].mean()) if len(cc) > 1 else np.nan
    starts = np.array(rows_summary["sequences"]["starts"])
    bg = bigram_rise(data, starts)
    bigram = dict(gate=compare.bootstrap_ci(bg[:GATE]), fresh=compare.bootstrap_ci(bg[GATE:]),
                  r_with_model_rise=corr(bg, per_window.mean(0)))
    with open(os.path.join(a.out, "rise_summary.json"), "w") as f:
        json.dump(dict(seeds=seeds, windows=dict(A=A, B=B, gate=f"windows 0..{GATE - 1}", fresh=f"{GATE}..511"),
                       doc=__doc__, across_seeds=summary, paired=paired, across_units=across_units,
                       per_window_rise=dict(mean_pairwise_r_across_units=window_corr, bigram_rise=bigram),
                       window_noise=dict(seed=seeds[0], model=models[0], bootstrap_95=noise)), f, indent=1)
    plot(os.path.join(a.out, "rise.png"), curves, seeds, models, a.rows)
    for r in table:
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    for m in models:
        print(m, {k: f"{v['mean']:+.3f} [{v['lo']:+.3f}, {v['hi']:+.3f}]" for k, v in summary[m].items()
                  if isinstance(v, dict) and k in ("rise", "rise_gate", "rise_fresh", "text", "context", "d_local8",
                                                   "d_entropy", "d_sink", "r_context_dlocal8")})
    for r in paired:
        if r["stat"] in ("rise", "rise_gate", "rise_fresh", "text", "context", "d_local8", "d_entropy", "d_sink"):
            print(f"{r['model']}-{r['baseline']} {r['stat']}: {r['mean_diff']:+.4f} [{r['ci_lo']:+.4f}, "
                  f"{r['ci_hi']:+.4f}] p={r['sign_flip_p']:.3f}")
    print("window noise", noise)
    print("across (seed, model) units", {k: round(v, 3) for k, v in across_units.items()})
    print("per-window rise: mean pairwise r across units", round(window_corr, 3), "bigram", bigram)


def bin_curves(path, model):
    """(bin centres, mean loss per bin over the gate windows, over the fresh windows) from per_sequence.csv."""
    cells = {}
    for r in read_csv(path):
        if r["model"] == model:
            key = (int(r["first"]), int(r["last"]))
            cells.setdefault(key, ([], []))[int(r["sequence"]) >= GATE].append(float(r["loss"]))
    keys = sorted(cells)
    return (np.array([np.sqrt(lo * hi) for lo, hi in keys]), np.array([np.mean(cells[k][0]) for k in keys]),
            np.array([np.mean(cells[k][1]) for k in keys]))


def plot(path, curves, seeds, models, rows_dir):
    fig, axes = figures.figure(4)
    t = np.arange(1, 129)
    smooth = lambda y, w=8: figures.moving_average(y, w)
    for (seed, m), c in curves.items():
        col = f"C{models.index(m)}"
        lab = m if seed == seeds[0] else None
        x, gate, fresh = bin_curves(os.path.join(rows_dir, f"s{seed}", "per_sequence.csv"), m)
        axes[0].plot(x, gate, "o-", color=col, lw=0.8, ms=3, alpha=0.7, label=f"{m}, gate's 256 windows" * bool(lab))
        axes[0].plot(x, fresh, "s--", color=col, lw=0.8, ms=3, alpha=0.7, label=f"{m}, 256 fresh windows" * bool(lab))
        ctx = c["loss"] - c["loss_c32"]
        axes[1].plot(smooth(t[32:]), smooth(ctx[32:]), color=col, lw=0.8, alpha=0.7, label=lab)
        axes[2].plot(t, c["local8"], color=col, lw=0.7, alpha=0.6, label=lab)
        axes[3].plot(t, c["entropy"], color=col, lw=0.7, alpha=0.6, label=lab)
    axes[3].plot(t, np.log(t), color="gray", ls=":", lw=1, label="log t")
    axes[1].axhline(0, color="gray", lw=0.8)
    for ax in axes:
        ax.axvspan(*A, color="gray", alpha=0.1)
        ax.set(xscale="log", xlabel="query position t")
        ax.legend(fontsize=7)
    axes[0].set(ylabel="val loss by bin 1, 2, 3-4, ..., 65-128", title="one line per seed; A = 17-32 shaded")
    axes[1].set(ylabel="loss - loss from the last 32 tokens only (8-pos. avg)", title="what the context beyond 32 adds")
    axes[2].set(ylabel="attention on the last 8 keys (layers, heads avg.)")
    axes[3].set(ylabel="row entropy (layers, heads avg.)")
    fig.savefig(path, dpi=130)


if __name__ == "__main__":
    main()
