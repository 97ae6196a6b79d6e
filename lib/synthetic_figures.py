"""
The synthetic suite's figures, drawn from synthetic_report.summarize's numbers (the CSV/JSON beside them):

- horizons.png, the headline: per task, each seed's horizon by setting (log axis), accuracy vs L/N (every seed and
  the mean), and each setting minus softmax paired by seed (mean, 95 % t interval, each seed's difference);
- accuracy.png: every task, condition and RoPE evaluation: the mean over seeds with its 95 % t band;
- attention.png: the retrieval head's mass on the target and its row's entropy vs L/N (attention.csv);
- sweep.png: a learning-rate sweep's accuracy at N and at the longest length against the rate, seeds as dots.
"""
import math, os

import numpy as np

from lib.runs import remove
from lib.synthetic_suite import SETTINGS
from scorers import SCORERS

COLORS = {"softmax": "black", "ssmax": "tab:red", "ssmax-fixed-s": "tab:orange", "ssa": "tab:blue",
          "lssa": "tab:green", "lssar": "tab:purple", "sigmoid": "tab:brown", "softmax-logN": "tab:gray",
          "ssmax-s0.5": "gold", "ssmax-s2": "darkred", "softmax-wd0": "tab:cyan", "ssmax-wd0": "tab:pink",
          "softmax-p3": "olive", "softpick": "teal", "stickbreaking": "navy", "fox": "darkgreen",
          "softmax-qwen": "silver", "softmax-yarn": "peru", "softmax-llama4": "slateblue"}


def _ticks(ax, ms, axis="x"):
    getattr(ax, f"set_{axis}scale")("log", base=2)
    getattr(ax, f"set_{axis}ticks")(ms, [f"{m:g}" if m >= 1 else "<1" for m in ms])


def horizons(summary, path, primary, below_n):
    """primary: {task: [(condition, rope, multiple)]}, a row per entry; below_n: where a run failing at N sits."""
    rows = [(task, cond, rope) for task, t in summary.items() for cond, rope, _ in primary.get(task, [])
            if any(c["metric"] == "accuracy" and (c["condition"], c["rope"]) == (cond, rope) for c in t["cells"])]
    if not rows:  # no task with a verdict endpoint (flipflop alone): no figure, and none of an earlier call's
        return remove(path)
    from matplotlib.figure import Figure
    fig = Figure(figsize=(17, 3.6 * len(rows)), layout="constrained")
    axes = fig.subplots(len(rows), 3, squeeze=False, gridspec_kw=dict(width_ratios=[1.3, 1, 1]))
    rng = np.random.default_rng(0)  # jitter only
    for (task, cond, rope), (ax_h, ax_a, ax_d) in zip(rows, axes):
        cells = [c for c in summary[task]["cells"] if (c["condition"], c["rope"]) == (cond, rope)]
        settings = list(dict.fromkeys(c["setting"] for c in cells))
        ms = sorted({c["multiple"] for c in cells})
        hz = summary[task]["horizons"].get(f"{cond}|{rope}", {})
        for i, s in enumerate(settings):
            h = np.array(list(hz.get(s, {}).values()), dtype=float)
            ax_h.scatter(i + rng.uniform(-0.18, 0.18, len(h)), h, s=14, color=COLORS.get(s, "k"), alpha=0.8)
            if len(h):
                ax_h.hlines(np.median(h), i - 0.3, i + 0.3, color=COLORS.get(s, "k"), lw=2)
            cs = sorted((c for c in cells if c["setting"] == s), key=lambda c: c["multiple"])
            x = [c["multiple"] for c in cs]
            for k in range(len(cs[0]["per_seed"]) if cs else 0):
                ax_a.plot(x, [c["per_seed"][k] if k < len(c["per_seed"]) else np.nan for c in cs],
                          color=COLORS.get(s, "k"), lw=0.5, alpha=0.3)
            ax_a.plot(x, [c["mean"] for c in cs], "o-", ms=3, color=COLORS.get(s, "k"), lw=1.6, label=s)
            d = [c for c in cs if "vs_softmax" in c]
            if d:
                off = 1 + 0.04 * (i - len(settings) / 2)  # side by side on the log axis
                xs = [c["multiple"] * off for c in d]
                mean = np.array([c["vs_softmax"]["mean_diff"] for c in d])
                err = [mean - [c["vs_softmax"]["ci_lo"] for c in d], [c["vs_softmax"]["ci_hi"] for c in d] - mean]
                ax_d.errorbar(xs, mean, yerr=np.nan_to_num(err), fmt="o-", ms=3, lw=1, capsize=2,
                              color=COLORS.get(s, "k"), label=s)
                for xx, c in zip(xs, d):
                    ax_d.scatter([xx] * len(c["vs_softmax"]["diffs"]), c["vs_softmax"]["diffs"], s=4,
                                 color=COLORS.get(s, "k"), alpha=0.35)
        ax_h.set_xticks(range(len(settings)), settings, rotation=35, ha="right", fontsize=7)
        _ticks(ax_h, [below_n, *ms], "y")
        ax_h.set(ylabel="horizon L/N (acc >= 0.95 up to L)", title=f"{task} {cond} {rope}: each seed's horizon")
        _ticks(ax_a, ms)
        ax_a.set(xlabel="L / N", ylabel="accuracy", ylim=(-0.02, 1.02), title="accuracy: seeds (thin), mean")
        _ticks(ax_d, ms)
        ax_d.axhline(0, color="k", lw=0.6)
        ax_d.set(xlabel="L / N", ylabel="setting − softmax", title="paired by seed: mean, 95% t CI, seeds")
    axes[0, 1].legend(fontsize=6, ncol=2, loc="lower left")
    fig.savefig(path, dpi=100)


def accuracy(summary, path):
    panels = sorted({(task, c["condition"], c["rope"]) for task, t in summary.items() for c in t["cells"]},
                    key=lambda p: list(summary).index(p[0]))
    from matplotlib.figure import Figure
    cols = min(5, len(panels))
    fig = Figure(figsize=(3.4 * cols, 3.0 * math.ceil(len(panels) / cols)), layout="constrained")
    axes = fig.subplots(math.ceil(len(panels) / cols), cols, squeeze=False).ravel()
    for ax, (task, cond, rope) in zip(axes, panels):
        cells = [c for c in summary[task]["cells"] if (c["condition"], c["rope"]) == (cond, rope)]
        for s in dict.fromkeys(c["setting"] for c in cells):
            cs = sorted((c for c in cells if c["setting"] == s), key=lambda c: c["multiple"])
            x = [c["multiple"] for c in cs]
            ax.plot(x, [c["mean"] for c in cs], "o-", ms=3, color=COLORS.get(s, "k"), label=s, lw=1.2)
            ax.fill_between(x, [c["ci_lo"] for c in cs], [c["ci_hi"] for c in cs], color=COLORS.get(s, "k"),
                            alpha=0.12, lw=0)
        mse = cells[0]["metric"] == "mse"
        _ticks(ax, sorted({c["multiple"] for c in cells}))
        ax.set(xlabel="L / N", ylabel="MSE (eq. 2)" if mse else "accuracy", yscale="log" if mse else "linear",
               title=" ".join(filter(None, [task, cond, "(NoPE)" if rope == "nope" else rope])))
        if not mse:
            ax.set_ylim(-0.02, 1.02)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=6, loc="lower left")
    fig.suptitle("Accuracy vs length: mean of the seeds, band: 95% t interval over seeds", fontsize=10)
    fig.savefig(path, dpi=100)


def attention(att, path):
    """The head with the most target mass at the shortest length, per run: its mass and entropy vs L/N, mean over
    seeds; uniform attention for reference."""
    from matplotlib.figure import Figure
    names = list(dict.fromkeys(r["task"] for r in att))
    fig = Figure(figsize=(3.8 * len(names), 6.0), layout="constrained")
    axes = fig.subplots(2, len(names), squeeze=False)
    for j, task in enumerate(names):
        rows = [r for r in att if r["task"] == task]
        lengths = sorted({int(r["length"]) for r in rows})
        x = [L / lengths[0] for L in lengths]
        for s in dict.fromkeys(r["setting"] for r in rows):
            by_run = {}
            for r in rows:
                if r["setting"] == s:
                    by_run.setdefault(r["model"], []).append(r)
            mass, ent = [], []
            for run in by_run.values():
                best = max((r for r in run if int(r["length"]) == lengths[0]), key=lambda r: float(r["target_mass"]))
                head = sorted((r for r in run if (r["layer"], r["head"]) == (best["layer"], best["head"])),
                              key=lambda r: int(r["length"]))
                mass.append([float(r["target_mass"]) for r in head])
                ent.append([float(r["entropy"]) for r in head])
            axes[0, j].plot(x, np.mean(mass, 0), "o-", ms=3, color=COLORS.get(s, "k"), label=s)
            # before row_mass was written, a row not summing to 1 had -sum w log w of its raw weights: no entropy
            scorer = dict(o.split("=") for o in SETTINGS[s])["scorer"]
            if SCORERS[scorer].sums_to_one or all(r.get("row_mass") for run in by_run.values() for r in run):
                axes[1, j].plot(x, np.mean(ent, 0), "o-", ms=3, color=COLORS.get(s, "k"), label=s)
        axes[0, j].plot(x, [1 / L for L in lengths], ":", color="gray", label="uniform 1/L")
        axes[1, j].plot(x, [math.log(L) for L in lengths], ":", color="gray", label="uniform: log L")
        axes[0, j].set(xscale="log", yscale="log", title=f"{task}: best head's mass on target", xlabel="L / N")
        axes[1, j].set(xscale="log", title=f"{task}: its entropy (nats)", xlabel="L / N")
    axes[0, 0].legend(fontsize=6)
    fig.savefig(path, dpi=100)


def draw(summary, att, results, primary, below_n):
    horizons(summary, os.path.join(results, "horizons.png"), primary, below_n)
    accuracy(summary, os.path.join(results, "accuracy.png"))
    if att:
        attention(att, os.path.join(results, "attention.png"))


def sweep(cells, chosen, path, gate=0.95):
    """sweep.png: a learning-rate sweep (synthetic_suite.sweep_accuracy's cells), per task its accuracy at L = N (the
    gate) and at the longest length against the rate, every seed a dot, the mean a line; a ring marks the rate the
    rule chose."""
    acc = {}
    for (task, setting, lr, m), seeds in cells.items():
        acc.setdefault((task, setting, m), {})[lr] = seeds
    tasks = list(dict.fromkeys(k[0] for k in acc))
    top = {t: max(k[2] for k in acc if k[0] == t) for t in tasks}
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 3.8 * len(tasks)), layout="constrained")
    axes = fig.subplots(len(tasks), 2, squeeze=False)
    rng = np.random.default_rng(0)  # jitter only
    for t, row in zip(tasks, axes):
        settings = list(dict.fromkeys(k[1] for k in acc if k[0] == t))
        for ax, m in zip(row, (1, top[t])):
            for i, s in enumerate(settings):
                by_lr = acc.get((t, s, m), {})
                lrs = sorted(by_lr)
                x = np.array(lrs) * 2 ** ((i - len(settings) / 2) * 0.06)  # settings side by side
                for xi, lr in zip(x, lrs):
                    ax.scatter(xi * 2 ** rng.uniform(-0.03, 0.03, len(by_lr[lr])), by_lr[lr], s=9, alpha=0.6,
                               color=COLORS.get(s, "k"))
                ax.plot(x, [np.mean(by_lr[lr]) for lr in lrs], "-", color=COLORS.get(s, "k"), label=s, lw=1.2)
                pick = chosen.get(t, {}).get(s)
                if pick in lrs:
                    ax.scatter([x[lrs.index(pick)]], [np.mean(by_lr[pick])], s=90, facecolors="none",
                               edgecolors=COLORS.get(s, "k"), lw=1.5)
            if m == 1:
                ax.axhline(gate, color="k", lw=0.6, ls=":")
            ax.set(xscale="log", xlabel="learning rate", ylabel="accuracy", ylim=(-0.02, 1.02),
                   title=f"{t}, {m} N" + (" (the gate)" if m == 1 else " (the primary endpoint)"))
        row[0].legend(fontsize=7, loc="lower left")
    fig.suptitle("Learning-rate sweep: every seed (dots), the mean (line), the rate the rule chose (ring)", fontsize=10)
    fig.savefig(path, dpi=100)
