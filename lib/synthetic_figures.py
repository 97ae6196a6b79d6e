"""
The synthetic suite's figures, drawn from synthetic_report.summarize's numbers (the CSV/JSON beside them):

- horizons.png, the headline: per task, each seed's horizon by setting (log axis), accuracy vs L/N (every seed and
  the mean), and each setting minus softmax paired by seed (mean, 95 % t interval, each seed's difference);
- accuracy.png: every task, condition and RoPE evaluation: the mean over seeds with its 95 % t band;
- attention.png: the retrieval head's mass on the target and its row's entropy vs L/N (attention.csv), each seed
  faint beside the mean;
- sweep.png: a learning-rate sweep's accuracy at N and at the longest length against the rate, seeds as dots.

Every setting has its own colour (a name off the table takes a spare one no other setting of the figure has), the
legend sits outside the axes, a setting with one seed says "no interval" instead of a zero-width one, and nan values
are left out and counted in the panel, never drawn as 0.
"""
import math, os, re

import numpy as np

from lib import figures
from lib.runs import remove
from lib.synthetic_suite import SETTINGS
from scorers import SCORERS

COLORS = {"softmax": "black", "ssmax": "tab:red", "ssmax-fixed-s": "tab:orange", "ssa": "tab:blue",
          "lssa": "tab:green", "lssar": "tab:purple", "sigmoid": "tab:brown", "softmax-logN": "tab:gray",
          "ssmax-s0.5": "gold", "ssmax-s2": "darkred", "softmax-wd0": "tab:cyan", "ssmax-wd0": "tab:pink",
          "softmax-p3": "olive", "softpick": "teal", "stickbreaking": "navy", "fox": "darkgreen",
          "softmax-qwen": "silver", "softmax-yarn": "peru", "softmax-llama4": "slateblue",
          "softmax-x2": "magenta", "softmax-x3": "yellowgreen"}
NO_INTERVAL = "1 seed: no interval"


def palette(names):
    """{name: colour}: the table's, then for the others figures.colors' (tab20's strong, then light shades) that no
    name of this figure has, then turbo's."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex
    names = list(dict.fromkeys(names))
    out = {s: COLORS[s] for s in names if s in COLORS}
    used = {to_hex(c) for c in out.values()}
    spare = [c for c in figures.colors(20) if to_hex(c) not in used]
    new = [s for s in names if s not in out]
    spare += list(colormaps["turbo"](np.linspace(0, 1, max(0, len(new) - len(spare)))))
    return {s: out.get(s) or spare[new.index(s)] for s in names}


def _legend(fig, colors, extra=()):
    """One legend for the figure, right of every panel: it covers no data."""
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=c, marker="o", ms=3, label=s) for s, c in colors.items()] + list(extra)
    fig.legend(handles=handles, loc="outside right upper", fontsize=7)


def _note(ax, lines):
    """What a panel leaves out, said in it (lower right)."""
    if lines:
        ax.text(0.99, 0.02, "\n".join(lines), transform=ax.transAxes, ha="right", va="bottom", fontsize=7,
                color="tab:red", bbox=dict(fc="white", ec="none", alpha=0.8))


def _nan(values, what="seed value"):
    k = int(np.isnan(np.asarray(values, dtype=float)).sum())
    return [f"{k} {what}{'s' * (k > 1)} nan: left out"] if k else []


def _side(i, n):
    """The x factor of the i-th of n settings drawn side by side on a log2 axis: within a quarter octave either way,
    so that every length's group stays inside its own octave whatever n."""
    return 2 ** (0.5 * (i / (n - 1) - 0.5)) if n > 1 else 1.0


def _natural(s):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]  # sigma=3 before sigma=10


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
    fig = Figure(figsize=(18, 3.6 * len(rows)), layout="constrained")
    axes = fig.subplots(len(rows), 3, squeeze=False, gridspec_kw=dict(width_ratios=[1.3, 1, 1]))
    color = palette(c["setting"] for task, *_ in rows for c in summary[task]["cells"])
    rng = np.random.default_rng(0)  # jitter only
    for (task, cond, rope), (ax_h, ax_a, ax_d) in zip(rows, axes):
        cells = [c for c in summary[task]["cells"] if (c["condition"], c["rope"]) == (cond, rope)]
        settings = list(dict.fromkeys(c["setting"] for c in cells))
        paired = [s for s in settings if any("vs_softmax" in c for c in cells if c["setting"] == s)]
        ms = sorted({c["multiple"] for c in cells})
        hz = summary[task]["horizons"].get(f"{cond}|{rope}", {})
        nan_a, nan_d, one = [], [], False
        for i, s in enumerate(settings):
            h = np.array(list(hz.get(s, {}).values()), dtype=float)
            ax_h.scatter(i + rng.uniform(-0.18, 0.18, len(h)), h, s=14, color=color[s], alpha=0.8)
            if len(h):
                ax_h.hlines(np.median(h), i - 0.3, i + 0.3, color=color[s], lw=2)
            cs = sorted((c for c in cells if c["setting"] == s), key=lambda c: c["multiple"])
            x = [c["multiple"] for c in cs]
            by_seed = [dict(zip(c["seeds"], c["per_seed"])) for c in cs]
            for seed in sorted({k for b in by_seed for k in b}):  # a seed missing at a length: a gap, its own line
                ax_a.plot(x, [b.get(seed, np.nan) for b in by_seed], color=color[s], lw=0.5, alpha=0.3)
            ax_a.plot(x, [c["mean"] for c in cs], "o-", ms=3, color=color[s], lw=1.6)
            nan_a += [v for c in cs for v in c["per_seed"]]
            d = [c for c in cs if "vs_softmax" in c]
            if d:
                v = [c["vs_softmax"] for c in d]
                xs = np.array([c["multiple"] * _side(paired.index(s), len(paired)) for c in d])
                mean, lo, hi = (np.array([e[k] for e in v], dtype=float) for k in ("mean_diff", "ci_lo", "ci_hi"))
                ax_d.plot(xs, mean, "o-", ms=3, lw=1, color=color[s])
                ok = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(mean)  # 1 seed: no bar rather than a 0 one
                ax_d.errorbar(xs[ok], mean[ok], yerr=[mean[ok] - lo[ok], hi[ok] - mean[ok]], fmt="none", lw=1,
                              capsize=2, color=color[s])
                one |= bool(np.any(np.isfinite(mean) & ~ok))
                for xx, e in zip(xs, v):
                    ax_d.scatter([xx] * len(e["diffs"]), e["diffs"], s=4, color=color[s], alpha=0.35)
                nan_d += [y for e in v for y in e["diffs"]]
        ax_h.set_xticks(range(len(settings)), settings, rotation=35, ha="right", fontsize=7)
        _ticks(ax_h, [below_n, *ms], "y")
        ax_h.set(ylabel="horizon L/N (acc >= 0.95 up to L)", title=f"{task} {cond} {rope}: each seed's horizon")
        _ticks(ax_a, ms)
        ax_a.set(xlabel="L / N", ylabel="accuracy", ylim=(-0.02, 1.02), title="accuracy: seeds (thin), mean")
        _note(ax_a, _nan(nan_a))
        _ticks(ax_d, ms)
        ax_d.axhline(0, color="k", lw=0.6)
        ax_d.set(xlabel="L / N", ylabel="setting − softmax", title="paired by seed: mean, 95% t CI, seeds")
        _note(ax_d, [NO_INTERVAL] * one + _nan(nan_d, "seed difference"))
    _legend(fig, color)
    fig.savefig(path, dpi=100)


def accuracy(summary, path):
    panels = [(task, *p) for task, t in summary.items()
              for p in sorted({(c["condition"], c["rope"]) for c in t["cells"]}, key=lambda p: [*map(_natural, p)])]
    from matplotlib.figure import Figure
    cols = min(5, len(panels))
    fig = Figure(figsize=(3.4 * max(cols, 2) + 1.4, 3.0 * math.ceil(len(panels) / cols)), layout="constrained")
    axes = fig.subplots(math.ceil(len(panels) / cols), cols, squeeze=False).ravel()
    color = palette(c["setting"] for t in summary.values() for c in t["cells"])
    for ax, (task, cond, rope) in zip(axes, panels):
        cells = [c for c in summary[task]["cells"] if (c["condition"], c["rope"]) == (cond, rope)]
        one = False
        for s in dict.fromkeys(c["setting"] for c in cells):
            cs = sorted((c for c in cells if c["setting"] == s), key=lambda c: c["multiple"])
            x = [c["multiple"] for c in cs]
            ax.plot(x, [c["mean"] for c in cs], "o-", ms=3, color=color[s], lw=1.2)
            ax.fill_between(x, [c["ci_lo"] for c in cs], [c["ci_hi"] for c in cs], color=color[s], alpha=0.12, lw=0)
            one |= any(len(c["per_seed"]) == 1 for c in cs)
        mse = cells[0]["metric"] == "mse"
        _ticks(ax, sorted({c["multiple"] for c in cells}))
        ax.set(xlabel="L / N", ylabel="MSE (eq. 2)" if mse else "accuracy", yscale="log" if mse else "linear",
               title=" ".join(filter(None, [task, cond, "(NoPE)" if rope == "nope" else rope])))
        if not mse:
            ax.set_ylim(-0.02, 1.02)
        _note(ax, [NO_INTERVAL] * one + _nan([v for c in cells for v in c["per_seed"]]))
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    _legend(fig, color)
    fig.suptitle("Accuracy vs length: mean of the seeds, band: 95% t interval over seeds", fontsize=10)
    fig.savefig(path, dpi=100)


def attention(att, path):
    """The head with the most target mass at the shortest length, per run: its mass and entropy vs L/N, each seed
    (thin) and their mean; uniform attention for reference."""
    from matplotlib.figure import Figure
    names = list(dict.fromkeys(r["task"] for r in att))
    fig = Figure(figsize=(3.8 * len(names) + 1.4, 6.0), layout="constrained")
    axes = fig.subplots(2, len(names), squeeze=False)
    color = palette(r["setting"] for r in att)
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
            # before row_mass was written, a row not summing to 1 had -sum w log w of its raw weights: no entropy
            scorer = dict(o.split("=") for o in SETTINGS[s])["scorer"]
            entropy = SCORERS[scorer].sums_to_one or all(r.get("row_mass") for run in by_run.values() for r in run)
            for ax, ys in ((axes[0, j], mass), (axes[1, j], ent))[:1 + entropy]:
                for y in ys:  # each seed's run, faint
                    ax.plot(x, y, color=color[s], lw=0.5, alpha=0.3)
                ax.plot(x, np.mean(ys, 0), "o-", ms=3, color=color[s], label=s)
        axes[0, j].plot(x, [1 / L for L in lengths], ":", color="gray", label="uniform 1/L")
        axes[1, j].plot(x, [math.log(L) for L in lengths], ":", color="gray", label="uniform: log L")
        axes[0, j].set(xscale="log", yscale="log", title=f"{task}: best head's mass on target", xlabel="L / N")
        axes[1, j].set(xscale="log", title=f"{task}: its entropy (nats)", xlabel="L / N")
    from matplotlib.lines import Line2D
    _legend(fig, color, [Line2D([], [], ls=":", color="gray", label="uniform: 1/L, log L"),
                         Line2D([], [], lw=0.5, color="gray", label="each seed (thin)")])
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
    fig = Figure(figsize=(12.4, 3.8 * len(tasks)), layout="constrained")
    axes = fig.subplots(len(tasks), 2, squeeze=False)
    color = palette(k[1] for k in acc)
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
                               color=color[s])
                ax.plot(x, [np.mean(by_lr[lr]) for lr in lrs], "-", color=color[s], lw=1.2)
                pick = chosen.get(t, {}).get(s)
                if pick in lrs:
                    ax.scatter([x[lrs.index(pick)]], [np.mean(by_lr[pick])], s=90, facecolors="none",
                               edgecolors=color[s], lw=1.5)
            if m == 1:
                ax.axhline(gate, color="k", lw=0.6, ls=":")
            ax.set(xscale="log", xlabel="learning rate", ylabel="accuracy", ylim=(-0.02, 1.02),
                   title=f"{t}, {m} N" + (" (the gate)" if m == 1 else " (the primary endpoint)"))
    _legend(fig, color)
    fig.suptitle("Learning-rate sweep: every seed (dots), the mean (line), the rate the rule chose (ring)", fontsize=10)
    fig.savefig(path, dpi=100)
