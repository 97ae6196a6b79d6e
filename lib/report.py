"""
Reading a reproduction back (reproduce.py writes, this reads): the training-loss figure over seeds, the validity
gates RESULTS.md states before its results, and summary.json, where every number is a mean over the training seeds
with its sample sd and 95 % Student-t interval (compare.seed_interval).

The layout it reads: <results>/s<seed>/train_log.csv.gz (lib/runs.py), <results>/s<seed>/eval_long_<method>/ and
<results>/s<seed>/gate/ (eval_long.py) and <results>/needle/ (needle.py, the first seed's fine-tuned models) or,
without fine-tuning, <results>/s<seed>/needle/ (every seed's).
"""
import json, os

import numpy as np

from lib import compare, figures, folders, longrange


def read_json(*path):
    path = os.path.join(*path)
    return json.load(open(path)) if os.path.isfile(path) else None


def loss_curves(logs, results, variants, switch_iter, max_iters, kept=()):
    """SSMax Fig. 4: every variant's training loss (moving average), the mean over seeds with their range as a band;
    train_loss.csv: every eval of every seed. logs: {seed: {variant: records}} (runs.read_train_logs); variants:
    {name: legend}. Returns the CSV's rows. The (f) variant's log starts at the switch: the softmax run's steps before
    it are its first part. A seed whose log kept only the evaluations adds rows, not a curve; so do `kept`'s rows."""
    rows, curves = [], {}
    for v in variants:
        for seed, by in logs.items():
            log = by.get(v, [])
            if v == "ssmax_f" and log:
                log = [r for r in by["softmax"] if r["iter"] < switch_iter] + log
            curve = dict(sorted((r["iter"], r["loss"]) for r in log if "loss" in r))
            if curve:
                curves.setdefault(v, []).append(curve)
            rows += [dict(variant=v, seed=seed, iter=r["iter"], train_loss=r["train_loss"], val_loss=r["val_loss"])
                     for r in log if "val_loss" in r]
    rows, w = rows + list(kept), max(1, max_iters // 20)
    from matplotlib.figure import Figure  # no pyplot: no global state
    fig, palette = Figure(figsize=(9, 5), layout="tight"), figures.colors(len(curves))
    ax = fig.subplots()
    for c, (v, runs) in enumerate(curves.items()):
        x = sorted(set.intersection(*(set(r) for r in runs)))
        if len(x) > w:
            y = np.array([figures.moving_average([r[i] for i in x], w) for r in runs])  # (seeds, points)
            ax.plot(x[w - 1:], y.mean(0), color=palette[c], label=f"{variants[v]} ({len(runs)} seeds)")
            ax.fill_between(x[w - 1:], y.min(0), y.max(0), color=palette[c], alpha=0.15, lw=0)
    ax.axvline(switch_iter, color="gray", ls=":", lw=0.8)
    ax.set(xlabel="iteration", ylabel=f"training loss (moving average of {w} steps)",
           title="Training loss (SSMax paper Fig. 4): mean over each variant's seeds (their number in the legend), "
                 "band = their range; dotted: the (f) switch")
    ax.title.set_fontsize(9)
    ax.legend(**figures.LEGEND)
    figures.save(fig, os.path.join(results, "train_loss.png"), dpi=120)
    compare.write_csv(os.path.join(results, "train_loss.csv"), rows, ("variant", "seed", "iter", "train_loss",
                                                                      "val_loss"))
    return rows


def context_gates(curve, N):
    """The gates, from one model's per-position loss at its trained θ (positions 1..N, 1-based): context use = the
    loss at position 1 minus the mean over N/2+1..N; distant context = positions 9-16 minus N/2+1..N, i.e. what the
    second half of the window adds beyond the last 16 tokens."""
    far = float(np.mean(curve[N // 2:N]))
    return dict(context_gain=float(curve[0]) - far, distant_gain=float(np.mean(curve[8:16])) - far)


def loss_table(rows, variants, seeds, baseline="softmax"):
    """Each variant's last eval: train and val loss over seeds, and its val loss minus the baseline's, paired by
    seed (the same data order and initial draw)."""
    last = {(r["variant"], r["seed"]): r for r in rows}  # iteration order: the last eval wins
    have = lambda *vs: [s for s in seeds if all((v, s) in last for v in vs)]  # a lost training log: no rows
    return {v: dict(per_seed={s: last[v, s] for s in have(v)},
                    train=compare.seed_interval([last[v, s]["train_loss"] for s in have(v)]),
                    val=compare.seed_interval([last[v, s]["val_loss"] for s in have(v)]),
                    val_minus_baseline=compare.seed_interval([last[v, s]["val_loss"] - last[baseline, s]["val_loss"]
                                                              for s in have(v, baseline)])) for v in variants}


def long_context(results, seeds, variants, method, read=read_json):
    """One eval_long method over seeds: every model's windows (extended RoPE and native θ) and its paired
    differences to the baseline, with the figure eval_long_<method>_differences.png. None if a seed lacks it."""
    per_seed = [read(results, f"s{s}", f"eval_long_{method}", "summary.json") for s in seeds]
    if not all(per_seed):  # and no figure of earlier models (plot_differences of nothing removes it)
        figures.plot_differences(os.path.join(results, f"eval_long_{method}_differences.png"), [], [], {}, "")
        return None
    models = {m["label"]: [next(x for x in p["models"] if x["label"] == m["label"]) for p in per_seed]
              for m in per_seed[0]["models"]}  # label -> its results, one per seed
    windows, cost = {"extended": {}, "native": {}}, {}
    over = lambda f, loss: {w: compare.seed_interval([f(*x) for x in pairs]) for w, pairs in loss.items()}
    for label, got in models.items():
        loss = {w: [(g["windows"][w]["mean_loss"], g["native"]["windows"][w]["mean_loss"]) for g in got]
                for w in got[0]["windows"]}  # window -> (extended, native) per seed
        windows["extended"][label] = over(lambda ext, native: ext, loss)
        windows["native"][label] = over(lambda ext, native: native, loss)
        # the extension's cost: extended minus native θ
        cost[label] = over(lambda ext, native: ext - native, loss)
    diffs = compare.across_seeds([p["differences"] for p in per_seed])
    figures.plot_differences(os.path.join(results, f"eval_long_{method}_differences.png"), diffs, list(variants),
                             {"extended": f"{method} (RoPE extended)", "native": "native θ"},
                             f"{method}: mean over {len(seeds)} seeds of each model's paired difference to "
                             f"{per_seed[0]['baseline']}, 95% t interval over seeds")
    return dict(windows=windows, differences=diffs, extended_minus_native=cost)


def copy_gate(per_seed, baseline=None):
    """The copy gate over seeds (eval_copy.py's summary.json per seed): each model's ratio (2nd copy / control) by
    distance, its gate (longrange.gate on the per-seed ratios at the gate's distance), and minus the baseline's,
    paired by seed with the sign-flip p. baseline: {distance: per-seed ratios}; default this evaluation's softmax
    (a rescaled softmax is compared with the native one's)."""
    by = {m["label"]: [next(x for x in p["models"] if x["label"] == m["label"]) for p in per_seed]
          for m in per_seed[0]["models"]}  # label -> one summary per seed
    ratios = {v: {k: [g["by_distance"][k]["ratio"] for g in got] for k in got[0]["by_distance"]}
              for v, got in by.items()}
    base = baseline or ratios.get("softmax")
    out = {v: dict(ratio={k: compare.seed_interval(r) for k, r in rs.items()}, ratio_per_seed=rs,
                   gate_ratio_per_seed=[g["gate_ratio"] for g in by[v]],
                   gate=longrange.gate([g["gate_ratio"] for g in by[v]])) for v, rs in ratios.items()}
    for v, rs in ratios.items():
        if base is not None and (baseline is not None or v != "softmax"):
            out[v]["minus_softmax"] = {k: compare.paired(r, base[k]) for k, r in rs.items() if k in base}
    return out


def pool_cells(cells, *keys):
    """needle.py's cells (one per model, context, depth) pooled by (model, context): each key's mean weighted by n."""
    sums = {}
    for c in cells:
        p = sums.setdefault((c["model"], c["context"]), [0.0] * (len(keys) + 1))
        for i, k in enumerate(keys):
            p[i] += c[k] * c["n"]
        p[-1] += c["n"]
    return {mc: [x / p[-1] for x in p[:-1]] for mc, p in sums.items()}


SCORE_KEYS = ("top_score", "control_top_score", "mean_score", "control_mean_score", "uniform")


def by_seed(values):
    """{(model, key): one value per seed} -> {model: {key: per_seed, interval, minus_softmax (paired, sign-flip p)}}."""
    out = {}
    for (m, k), v in values.items():
        cell = out.setdefault(m, {})[str(k)] = dict(per_seed=v, interval=compare.seed_interval(v))
        if m != "softmax" and ("softmax", k) in values:
            cell["minus_softmax"] = compare.paired(v, values["softmax", k])
    return out


def retrieval(results, seeds, folder="needle", read=read_json):
    """Retrieval on every seed's models (a scale without fine-tuning, results/s<seed>/<folder>/): the share of exact
    answers per model and context (the needle's pooled over depths within a seed) and the needle score with its
    baselines (top_minus_control: the best head's weight on the needle minus on a control span), over seeds."""
    out = {}
    for name in ("needle", "passkey"):
        got, acc = [read(results, f"s{s}", folder, f"{name}.json") for s in seeds], {}
        for g in got if all(got) else ():
            for key, (a,) in pool_cells(g["cells"], "accuracy").items():
                acc.setdefault(key, []).append(a)
        if acc:
            out[name] = by_seed(acc)
    got, scores = [read(results, f"s{s}", folder, "needle_score_trials.json") for s in seeds], {}
    for g in got if all(got) else ():
        for r in g["scores"]:
            for k in SCORE_KEYS:
                scores.setdefault((r["model"], k), []).append(r[k])
            scores.setdefault((r["model"], "top_minus_control"), []).append(r["top_score"] - r["control_top_score"])
    if scores:
        out["needle_scores"] = by_seed(scores)
    return out


def summarize(results, roots, variants, N, rows, copy_runs=("copy",), left_out=(), **head):
    """summary.json: what RESULTS.md quotes, read back from the steps' own outputs but those in left_out (a skipped
    step's made with other training than the summary reports: runs.Steps.skip). head: scale, config, skipped, ..."""
    seeds = list(roots)
    def read(*path):  # an output left out reads as one not made
        return None if os.path.normpath(os.path.join(*path)) in left_out else read_json(*path)
    summary = dict(head, seeds=seeds, variants=variants, losses=loss_table(rows, variants, seeds),
                   interval="mean, sample sd and 95% Student-t interval over training seeds (compare.seed_interval)")
    for method in ("theta", "dynamic_ntk"):
        got = long_context(results, seeds, variants, method, read)
        if got:
            summary[f"eval_long_{method}"] = got
    curves = [read_csv_if(os.path.join(results, f"s{s}", "gate", "per_position.csv")) for s in seeds]
    if all(curves):  # gates: per-position loss at trained θ
        gates = {v: [context_gates([float(r[v]) for r in c], N) for c in curves] for v in variants
                 if all(v in c[0] for c in curves)}
        summary["gates"] = {v: {g: compare.seed_interval([x[g] for x in gs]) for g in gs[0]} for v, gs in gates.items()}
        # paired with softmax's: does a scorer change them?
        summary["gates_minus_softmax"] = {v: {g: compare.seed_interval([x[g] - b[g] for x, b in zip(gs, gates[
            "softmax"])]) for g in gs[0]} for v, gs in gates.items() if v != "softmax" and "softmax" in gates}
    for name in copy_runs:  # "copy" first: the others are paired with its softmax
        copies = [read(results, f"s{s}", name, "summary.json") for s in seeds]
        native = summary.get("copy_gate", {}).get("softmax", {}).get("ratio_per_seed")
        if all(copies) and (name == "copy" or native):
            summary["copy_gate" + name[4:]] = copy_gate(copies, None if name == "copy" else native)
    for folder in ("needle", "needle_native"):  # every seed's (characters), else the first seed's (below)
        found = retrieval(results, seeds, folder, read)
        if found:
            summary["retrieval" + folder[6:]] = found
    for name in ("needle", "passkey", "needle_score_trials"):
        s = read(results, "needle", f"{name}.json")
        if s:
            summary[name] = s["cells"]
            if "scores" in s:  # with control-span and uniform baselines
                summary["needle_scores"] = s["scores"]
    with open(os.path.join(results, "tables.md"), "w") as f:
        f.write(tables(summary))
    folders.write_json(os.path.join(results, "summary.json"), summary, indent=1)  # last, whole: what RESULTS.md reads
    return summary


def read_csv_if(path):
    return compare.read_csv(path) if os.path.isfile(path) else None


# ----------------------------------------------------------------------------------------------------------------
# tables.md: the Markdown tables RESULTS.md quotes

def _pm(x, digits=3):  # a one-seed run's sd (and _ci's interval) is nan: "–", as in the synthetic suite's tables
    return f"{x[0]:.{digits}f} ± " + ("–" if np.isnan(x[1]) else f"{x[1]:.{digits}f}")


def _ci(x, digits=3):
    lo, hi = ("–" if np.isnan(v) else f"{v:+.{digits}f}" for v in x[2:4])
    return f"{x[0]:+.{digits}f} [{lo}, {hi}]"


def _table(head, rows):
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] +
                     ["| " + " | ".join(map(str, r)) + " |" for r in rows]) + "\n"


def tables(s):
    seeds, out = len(s["seeds"]), []
    out.append(f"### Validity gates ({seeds} seeds, mean ± sd; s<seed>/gate: trained θ, positions 1..N)\n\n" + _table(
        ["variant", "context use: loss(1) − mean loss(N/2+1..N)", "distant context: mean(9..16) − mean(N/2+1..N)"],
        [[v, _pm(g["context_gain"]), _pm(g["distant_gain"])] for v, g in s.get("gates", {}).items()]))
    out.append("### The same minus softmax's, paired by seed (mean [95% t interval])\n\n" + _table(
        ["variant", "context use − softmax's", "distant context − softmax's"],
        [[v, _ci(g["context_gain"]), _ci(g["distant_gain"])] for v, g in s.get("gates_minus_softmax", {}).items()]))
    out.append("### Final losses (mean ± sd over the seeds whose training log was kept; val − softmax paired by "
               "seed, 95% t interval)\n\n" + _table(["variant", "seeds", "train loss", "val loss", "val − softmax"],
        [[s["variants"][v], len(x["per_seed"]), _pm(x["train"], 4), _pm(x["val"], 4), _ci(x["val_minus_baseline"], 4)]
         for v, x in s["losses"].items()]))
    for method in ("theta", "dynamic_ntk"):
        got = s.get(f"eval_long_{method}")
        if not got:
            continue
        for rope, windows in got["windows"].items():
            cols = sorted(next(iter(windows.values())), key=lambda w: (not w.startswith("prefix"), window_k(w)))
            out.append(f"### eval_long {method}, RoPE {rope}: mean loss per window ({seeds} seeds, mean ± sd)\n\n"
                       + _table(["variant", *cols], [[v, *(_pm(w[c]) for c in cols)] for v, w in windows.items()]))
            if rope == "extended":
                out.append(f"### eval_long {method}: extended minus native θ, same model and sequences (mean over "
                           "seeds [95% t interval])\n\n" + _table(["variant", *cols], [[v, *(_ci(c[w]) for w in cols)]
                                                                    for v, c in got["extended_minus_native"].items()]))
            diffs = [d for d in got["differences"] if d["rope"] == rope]
            cols = sorted({d["window"] for d in diffs}, key=lambda w: (not w.startswith("prefix"), window_k(w)))
            cell = {(d["model"], d["window"]): d for d in diffs}
            out.append(f"### eval_long {method}, RoPE {rope}: minus softmax, paired (mean over seeds [95% t "
                       "interval])\n\n" + _table(["variant", *cols], [[v, *(_ci(
                           (cell[v, c]["mean_diff"], 0, cell[v, c]["ci_lo"], cell[v, c]["ci_hi"])) for c in cols)]
                           for v in s["variants"] if (v, cols[0]) in cell]))
    for key in (k for k in s if k.startswith("copy_gate")):
        cols, how = list(next(iter(s[key].values()))["ratio"]), key[len("copy_gate_"):] or "native θ"
        out.append(f"### Copy gate ({how}): loss on the 2nd copy / on the control span, by distance (x N) ({seeds} "
                   "seeds, mean ± sd); gate: <= 0.5 at 0.5 N\n\n" + _table(["variant", *cols, "gate"], [
                       [v, *(_pm(g["ratio"][c], 2) for c in cols), "passed" if g["gate"] else "failed"]
                       for v, g in s[key].items()]))
        out.append(f"### Copy gate ({how}) minus softmax's at native θ, paired by seed (mean [95% t interval], "
                   "sign-flip p)\n\n" + _table(["variant", *cols], [
                       [v, *(f"{_ci(g['minus_softmax'][c], 2)} p={g['minus_softmax'][c][4]:.3f}" for c in cols)]
                       for v, g in s[key].items() if "minus_softmax" in g]))
    if "needle_scores" in s:
        out.append("### Needle scores (first seed)\n\n" + _table(
            ["variant", "best head", "control span, best head", "mean head", "control, mean head", "uniform"],
            [[r["model"], *(f"{r[k]:.4f}" for k in ("top_score", "control_top_score", "mean_score",
                                                    "control_mean_score", "uniform"))] for r in s["needle_scores"]]))
    for key, name, got in ((k, n, g) for k in s if k.startswith("retrieval") for n, g in s[k].items()):
        cols, how = list(next(iter(got.values()))), "native θ" if key.endswith("native") else "θ x 50"
        out.append(f"### {name} ({how}), every seed's models ({seeds} seeds, mean ± sd)\n\n" + _table(
            ["variant", *cols], [[v, *(_pm(c[k]["interval"]) for k in cols)] for v, c in got.items()]))
        out.append(f"### {name} ({how}) minus softmax's, paired by seed (mean [95% t interval], sign-flip p)\n\n"
                   + _table(["variant", *cols], [[v, *(f"{_ci(c[k]['minus_softmax'])} p={c[k]['minus_softmax'][4]:.3f}"
                                                      for k in cols)] for v, c in got.items() if v != "softmax"]))
    for name in ("needle", "passkey"):
        if name in s:
            acc = pool_cells(s[name], "accuracy", "first_digit")
            ctx = sorted({k[1] for k in acc})
            out.append(f"### {name}: exact / first-digit accuracy per context (first seed)\n\n" + _table(
                ["variant", *map(str, ctx)], [[m, *(f"{acc[m, c][0]:.2f} / {acc[m, c][1]:.2f}" for c in ctx)]
                                              for m in dict.fromkeys(k[0] for k in acc)]))
    return "\n".join(out)


def window_k(window):
    return compare.window_multiple(window)

