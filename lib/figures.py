"""
The evaluations' figures (no pyplot: no global state): the panel grid, one colour per model however many (matplotlib's
"C{i}" repeats after 10: an 11th model took the first one's colour), legends beside the axes (never over the data),
eval_long's per-position curves and its paired differences by window length (each seed's difference beside the
mean), eval_copy's copy gate, needle.py's depth x context grid (SSMax Fig. 6), the SSMax paper's Figs. 1 and 3 in
closed form (eval_long.py --fading) and train.py --compare's curves. Each is drawn from the numbers its script
writes beside it (summary.json, CSVs), so results/redraw_figures.py, which imports lib alone, draws a committed
folder again the same way.
"""
import argparse, csv, math, os

import numpy as np

from lib import folders, longrange, tracking
from lib.compare import LEVEL, unique_labels

FADING_S = 0.43  # the SSMax paper's Fig. 1
FADING_ZMAX_N, FADING_ZMAX_S = (10, 1000, 100000), (0.43, 1.0)  # Fig. 3: a few sizes, two s
LEGEND = dict(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))  # beside the axes: room for many models


def figure(n=1, rows=1, sharey=False):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(5.5 * n + 1, 4.2 * rows), layout="tight")
    return fig, fig.subplots(rows, n, squeeze=False, sharey=sharey).ravel()

def panels(n=1, ncols=None, size=(5, 4)):
    """n panels, ncols (default: all) to a row, each about size inches: any number of models stays legible."""
    from matplotlib.figure import Figure
    ncols = ncols or n
    fig = Figure(figsize=(size[0] * ncols + 1, size[1] * math.ceil(n / ncols)), layout="constrained")
    axes = fig.subplots(math.ceil(n / ncols), ncols, squeeze=False).flatten()
    for ax in axes[n:]:  # the last row of a grid may have empty cells
        ax.set_axis_off()
    return fig, axes[:n]

def colors(n):
    """n distinct colours: tab20's 10 strong shades, then its 10 light ones; past 20, turbo's."""
    from matplotlib import colormaps
    if n > 20:
        return list(colormaps["turbo"](np.linspace(0, 1, n)))
    return [colormaps["tab20"](2 * i % 20 + i // 10) for i in range(n)]

def save(fig, path, dpi=130):
    fig.savefig(path, dpi=dpi, bbox_inches="tight")  # "tight": the legends beside the axes are kept whole

def moving_average(y, w):
    return np.convolve(y, np.ones(w) / w, mode="valid")  # point j = mean of y[j : j + w]

def plot_per_position(path, curves, train_lens, w, logx, title):
    """curves: (legend, loss per position, model index, line style); the native-θ curves are drawn dashed."""
    fig, (ax,) = figure()
    palette = colors(max((c for _, _, c, _ in curves), default=0) + 1)
    for legend, y, c, ls in curves:
        pos = np.arange(1, len(y) + 1)
        ax.plot(moving_average(pos, w), moving_average(y, w), color=palette[c], ls=ls, lw=1.2, label=legend)
    for N in sorted(set(train_lens)):
        ax.axvline(N, color="gray", ls=":", lw=1.2)  # training length, as in the SSMax paper
    ax.set(xlabel="context size (position)", ylabel=f"test loss (moving average of {w} positions)",
           xscale="log" if logx else "linear")
    ax.set_title(title, fontsize=9)
    ncol = 1 + len(curves) // 16  # past 15 curves in columns: no taller than the axes
    fig.set_size_inches(6.5 + 3 * ncol, 4.2)  # the legend's width beside the axes' own
    ax.legend(ncol=ncol, **LEGEND)
    save(fig, path)

def plot_differences(path, diffs, models, ropes, title):
    """One panel per RoPE setting (rows) and window kind (columns: prefix_kx = the loss of a kN-token sequence, LSSAR
    Table 4; kx = its last N positions): each model's mean difference to the baseline with its CI, by k on a log
    axis, and where the rows hold them (over seeds) each seed's own difference as a small dot beside it. ropes:
    {rope: its description}; models: labels in order (their colors). No differences (the baseline alone): no
    figure, and none of an earlier call's."""
    if not diffs:
        if os.path.exists(path):
            os.remove(path)
        return
    kinds = (("prefix_", "prefix_kx: loss of kN-token sequences"), ("", "kx: last N positions up to kN"))
    fig, axes = figure(len(kinds), len(ropes), sharey="col")  # shared y per column: extended vs native
    others, palette = [m for m in models if any(d["model"] == m for d in diffs)], colors(len(models))
    dodge = np.linspace(-0.06, 0.06, len(others)) if len(others) > 1 else [0.0]  # log-x offsets: CIs side by side
    for ax, (rope, (prefix, kind)) in zip(axes, ((r, k) for r in ropes for k in kinds)):
        for j, m in enumerate(others):
            ds = sorted((d for d in diffs if d["model"] == m and d["rope"] == rope
                         and d["window"].startswith("prefix_") == bool(prefix)), key=lambda d: d["k"])
            if not ds:
                continue
            x = np.array([d["k"] for d in ds]) * np.exp(dodge[j])
            y = np.array([d["mean_diff"] for d in ds])
            # clip at 0: a percentile CI may exclude the mean
            err = np.maximum(0, [y - [d["ci_lo"] for d in ds], [d["ci_hi"] for d in ds] - y])
            color = palette[models.index(m)]
            ax.errorbar(x, y, yerr=err, color=color, marker="o", ms=3.5, lw=1.2, capsize=2.5, label=m)
            seeds = [(xi * 1.02, s[0]) for xi, d in zip(x, ds) for s in d.get("per_seed", [])]
            if seeds:  # the seeds behind the mean, just right of it
                ax.scatter(*zip(*seeds), s=5, color=color, alpha=0.5, lw=0)
        ks = sorted({d["k"] for d in diffs})
        ax.axhline(0, color="gray", lw=0.8)
        ax.set(xscale="log", xlabel="window length / N (training length)", title=f"{ropes[rope]} | {kind}",
               ylabel="loss − baseline (nats/token)")
        ax.set_xticks(ks, [f"{k:g}" for k in ks])
        ax.minorticks_off()
        ax.title.set_fontsize(9)
    shown = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}  # every panel's models
    fig.legend(shown.values(), shown.keys(), title=f"minus {diffs[0]['baseline']}" + (", dots: seeds" if any(
        "per_seed" in d for d in diffs) else ""), **LEGEND)
    fig.suptitle(title, fontsize=9, wrap=True)
    save(fig, path)

def needle_grid(cells, models, labels, contexts, depths):
    """needle.py's Fig. 6 (SSMax paper): a depth x context panel per model, each cell's accuracy and, under it, where
    its needles went on average. cells: needle.json's (model, context, depth, accuracy, actual_depth)."""
    fig, axes = panels(len(models), math.ceil(math.sqrt(len(models))), size=(4.5, 3.5))
    a = {(c["model"], c["context"], c["depth"]): (c["accuracy"], c["actual_depth"]) for c in cells}
    for ax, m, label in zip(axes, models, labels):
        grid = np.array([[a[m, L, d] for L in contexts] for d in depths])  # (depth, context, 2)
        im = ax.imshow(grid[..., 0], vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set(title=label, xlabel="context size", ylabel="asked depth (%)", xticks=range(len(contexts)),
               xticklabels=contexts, yticks=range(len(depths)), yticklabels=depths)
        for (i, j), v in np.ndenumerate(grid[..., 0]):
            ax.text(j, i, f"{v:.2f}\nat {grid[i, j, 1]:.0f}%", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=list(axes), label="fraction of answers exactly right")
    return fig

def ropes(args, models=()):
    """{rope: description} of eval_long's passes (its args as a dict; rope.eval_passes): the requested method, then
    (if it extends RoPE) the trained θ, the checkpoint's where a run changed it; NoPE models alone: one pass, "NoPE"."""
    if models and all(m.get("model_args", {}).get("pos") == "nope" for m in models):
        return {"native": "NoPE"}
    ntk = ", per length" * (args["rope_method"] == "dynamic_ntk" and bool(args.get("ntk_per_length")))
    extended = {"extended": f"{args['rope_method']} x{args['rope_scale']:g}{ntk}"}
    moved = any("rope_theta" in (m.get("changed") or {}) for m in models)  # a run changed θ after training
    native = "checkpoint's θ" if moved else "native θ"
    return {**(extended if args["rope_method"] != "none" else {}), "native": native}

def eval_long(folder, summary, columns):
    """eval_long.py's per_position.png and differences.png from what it writes: its summary.json and per_position.csv's
    {column: loss per position} (a model's own column solid, its "[native]" one dashed). Also how
    results/redraw_figures.py draws a committed folder again."""
    args, models, curves = summary["args"], summary["models"], []
    for native in (False, True):  # the requested method's curves first
        for c, m in enumerate(models):
            name, info = (f"{m['label']} [native]", m.get("native")) if native else (m["label"], m)
            if name in columns and info:
                nope = m.get("model_args", {}).get("pos") == "nope"  # no θ (before 2026-11-29, its unread one shown)
                theta = None if nope else info["rope_theta_effective"] or info["rope_theta"]
                label = "NoPE" if theta is None else f"θ={theta:,.0f}" + (
                    f", trained at θ={info['rope_theta_trained']:,.0f}" if info.get("rope_theta_trained") else "")
                curves.append((f"{name} ({label})", np.asarray(columns[name]), c, "--" if native else "-"))
    scale, passes = args.get("logit_scale"), ropes(args, models)  # two scales must not look alike, nor two floors
    note = f"{args['num_seqs']} sequences of {args['length']:,} tokens ({args['split']})" + (
        f", logits {scale}" if scale else "") + (f" F={args['llama4_floor']:,}" if scale == "llama4" else "")
    rope = "NoPE" if passes == {"native": "NoPE"} else "RoPE " + "; dashed: ".join(passes.values())
    plot_per_position(os.path.join(folder, "per_position.png"), curves, [m["train_len"] for m in models],
                      args["smooth"], args["logx"], f"{note}, {rope}")
    if summary["differences"]:  # from the second model on
        plot_differences(os.path.join(folder, "differences.png"), summary["differences"], [m["label"] for m in models],
                         passes, f"{note}: paired difference to {summary['baseline']}, {LEVEL:.0%} bootstrap CI")

def copy_gate(path, models, args):
    """eval_copy.py's copy.png from its models' summaries and args (as its summary.json holds them)."""
    span, scale, fig, (ax, bx) = args["span"], args.get("logit_scale"), *figure(2)
    for m, color in zip(models, colors(len(models))):
        ks = [float(k) for k in m["by_distance"]]
        ax.plot(ks, [r["ratio"] for r in m["by_distance"].values()], "o-", color=color, label=m["label"])
        bx.plot(range(1, span), m["by_offset"]["second"], "-", color=color)
        bx.plot(range(1, span), m["by_offset"]["control"], ":", color=color)
    ax.axhline(longrange.GATE_RATIO, color="gray", ls="--", lw=0.8)
    ax.axvline(1, color="gray", lw=0.8)
    ax.set(xscale="log", xlabel="distance between the copies (x N)", ylabel="loss on 2nd copy / on the control span",
           title=f"copy gate: 2nd/control <= {longrange.GATE_RATIO} at {longrange.GATE_DISTANCE} N (dashed)")
    bx.set(xlabel="offset inside the span", ylabel="loss (nats/token)",
           title=f"loss by offset at {longrange.GATE_DISTANCE} N (solid: 2nd copy, dotted: control)")
    bx.legend(*ax.get_legend_handles_labels(), **LEGEND)  # one colour a model in both panels
    nope = [m["label"] for m in models if m.get("pos") == "nope"]  # RoPE's options do not reach them
    rope = [f"RoPE {args['rope_method']} x{args['rope_scale']:g}"] * (len(nope) < len(models))
    fig.suptitle(f"{args['num_seqs']} sequences per distance, {args['kind']} span of {span} tokens, "
                 + ", ".join(rope + [f"NoPE: {', '.join(nope)}"] * bool(nope)) + (f", logits {scale}" if scale else "")
                 + (f" F={args['llama4_floor']:,}" if scale == "llama4" else ""), fontsize=9)
    save(fig, path, dpi=120)

# ----------------------------------------------------------------------------------------------------------------
# SSMax Figs. 1 and 3 in closed form (eval_long --fading)

def fading(out_dir):
    """Fig. 1 in closed form: n-1 logits at -2 and one at +3. Softmax's largest output is
    e^3 / (e^3 + (n-1) e^-2); SSMax multiplies the logits by s*log n, so its largest is 1 / (1 + (n-1) n^(-5s)).
    Fig. 3: logits (0, 1/(n-2), ..., 1, z_max): the output at z_max as z_max varies, for a few n."""
    n = np.unique(np.round(np.logspace(0, 6, 181)))  # 1 .. 10^6, 30 per decade
    soft = 1 / (1 + (n - 1) * np.exp(-5.0))
    ssmax = 1 / (1 + (n - 1) * n ** (-5 * FADING_S))
    zmax = np.linspace(0, 15, 301)
    sweep = {}
    for k in FADING_ZMAX_N:
        grid = np.linspace(0, 1, k - 1)  # the other n-1 logits
        for name, c in [("softmax", 1.0)] + [(f"ssmax_s{s:g}", s * math.log(k)) for s in FADING_ZMAX_S]:
            sweep[f"{name}_n{k}"] = np.exp(c * zmax) / (np.exp(c * grid).sum() + np.exp(c * zmax))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "fading.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["n", "softmax_max", f"ssmax_max_s{FADING_S:g}"])
        w.writerows(zip(n.astype(int), soft, ssmax))
    with open(os.path.join(out_dir, "fading_zmax.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["z_max", *sweep])
        w.writerows(zip(zmax, *sweep.values()))
    fig, (ax1, ax3) = figure(2)
    ax1.plot(n, soft, color="C0", label="softmax")
    ax1.plot(n, ssmax, color="C3", label=f"SSMax (s = {FADING_S})")
    ax1.set(xscale="log", xlabel="input size n", ylabel="largest output", ylim=(-0.03, 1.03),
            title="Fig. 1: logits (-2, ..., -2, +3)")
    styles = dict(zip(FADING_ZMAX_N, ("-", "--", ":")))
    hue = {"softmax": "C0", **{f"ssmax_s{s:g}": c for s, c in zip(FADING_ZMAX_S, ("C3", "C1"))}}
    for key, y in sweep.items():
        name, k = key.rsplit("_n", 1)
        ax3.plot(zmax, y, color=hue[name], ls=styles[int(k)], label=f"{name.replace('_s', ' s=')}, n={int(k):,}")
    ax3.set(xlabel="z_max", ylabel="output at z_max", title="Fig. 3: logits (0, 1/(n-2), ..., 1, z_max)")
    ax1.legend(), ax3.legend(fontsize=7)
    fig.savefig(os.path.join(out_dir, "fading.png"), dpi=130)
    print(f"fading: n = 10^6: softmax max {soft[-1]:.2e}, SSMax max {ssmax[-1]:.4f}")  # out_dir: a temporary folder

# ----------------------------------------------------------------------------------------------------------------
# train.py --compare: several runs' log.jsonl in one figure, no wandb

def compare_runs(out_dirs, out=None):
    """Per-step train loss (moving average over ~1/50 of each run, drawn at each window's last step) and eval val
    loss of every run, one color per run, in out (default ./compare.png, which an earlier figure keeps: a new one
    replaces a file only where out names it)."""
    if out is None and os.path.exists("compare.png"):
        raise tracking.TrackingError("./compare.png holds an earlier comparison: name this one with --out "
                                     "(--out compare.png replaces it)")
    out = out or "compare.png"
    from matplotlib.backend_bases import FigureCanvasBase
    from matplotlib.figure import Figure  # not pyplot: no GUI backend, no global figure
    kinds = FigureCanvasBase.get_supported_filetypes()  # fail now, not at savefig after drawing
    if os.path.splitext(out)[1][1:].lower() not in kinds:
        raise tracking.TrackingError(f"--out {out!r} is not an image name: end it in one of "
                                     f"{', '.join(sorted(kinds))}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise tracking.TrackingError(f"--out {out!r}: its folder does not exist")
    runs = [tracking.read_run(d) for d in out_dirs]  # every folder checked before drawing
    labels = unique_labels([label for label, _, _ in runs], out_dirs)  # two folders of one name told apart
    ax = Figure(figsize=(8, 4.5)).subplots()
    for (_, steps, evals), label, color in zip(runs, labels, colors(len(runs))):
        it, w = sorted(steps), max(1, math.ceil(len(steps) / 50))
        if steps:  # max_iters=0: evals only
            ax.plot(it[w - 1:], moving_average([steps[k] for k in it], w), "-", color=color, lw=1,
                    label=f"{label}: train" + (f" (mean of {w})" if w > 1 else ""))
        ax.plot(sorted(evals), [evals[k] for k in sorted(evals)], "o--", color=color, ms=4, label=f"{label}: val")
    ax.set(xlabel="iteration", ylabel="loss (nats)", title=f"{len(runs)} runs")
    ax.legend(**LEGEND)
    with folders.whole(out) as tmp:  # never a cut figure under out's name
        ax.figure.savefig(tmp, format=os.path.splitext(out)[1][1:].lower(), dpi=120, bbox_inches="tight")
    print(f"wrote {out}")
    return out

def compare_main(argv):
    p = argparse.ArgumentParser(prog="train.py --compare", description="Overlay runs' log.jsonl curves in one PNG.")
    p.add_argument("out_dirs", nargs="+", help="train.py out_dir folders, each with its log.jsonl")
    p.add_argument("--out", help="the PNG to write (default ./compare.png, refused if there: named, replaced)")
    return compare_runs(**vars(p.parse_args(argv)))
