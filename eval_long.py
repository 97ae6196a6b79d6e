"""
Long-context evaluation: per-position test loss far beyond the training length, with RoPE extended and no further
training. The SSMax paper (Nakanishi 2025, Fig. 5: θ 10,000 -> 500,000, 20,000-token test sequences) and the LSSAR
paper (Gao & Spratling 2025, Table 4: validation loss at 1K/2K/4K/8K with Dynamic NTK). --fading draws the SSMax
paper's Fig. 1 (attention fading: the largest softmax output vs SSMax's as n grows) and Fig. 3 (z_max sweep).

    python eval_long.py out-softmax/ckpt.pt out-ssmax/ckpt.pt --data data/shakespeare   # L = 10 x block_size
    python eval_long.py out-softmax/ckpt.pt out-lssar/ckpt.pt --rope_method dynamic_ntk --rope_scale 1 --length 8192
    python eval_long.py --fading

Position t (1-based) is the loss of predicting token t+1 from the t tokens before it, so a model trained at length
N has seen positions 1..N. Every checkpoint is scored on the same --num_seqs windows of L+1 contiguous tokens of the
split, their starts drawn uniformly with numpy's default_rng(seed) and recorded in summary.json. Every checkpoint is
read (weights_only) before the first model runs, and the outputs are rewritten as each model finishes.
"""
import argparse, csv, json, math, os, sys

import numpy as np
import torch
from tqdm import tqdm

import prepare_data
import tracking
from model import BACKENDS, ROPE_METHODS, load_checkpoint, read_checkpoint, run_info

WINDOW_MULTIPLES = (1, 2, 4, 8, 10, 16, 20)  # k x the training length N
WINDOW_RULE = ("window kx: mean loss over positions (k*N - N, k*N], the last N positions up to k times the "
               "training length N; prefix_kx: mean over positions 1..k*N, the loss of a k*N-token sequence "
               "(LSSAR Table 4's validation loss at that length); only k*N <= L")
POSITION_RULE = "position t = the loss of predicting token t+1 from tokens 1..t; trained positions are 1..N"
FADING_S = 0.43  # the SSMax paper's Fig. 1
FADING_ZMAX_N, FADING_ZMAX_S = (10, 1000, 100000), (0.43, 1.0)  # Fig. 3: a few sizes, two s

# ----------------------------------------------------------------------------------------------------------------
# Sequences and RoPE

def load_tokens(data_dir, split, L):
    path = os.path.join(data_dir, f"{split}.bin")
    if not os.path.isfile(path):
        raise ValueError(f"dataset {data_dir!r} has no {split}.bin: prepare one (python prepare_data.py shakespeare)")
    data = prepare_data.load_split(data_dir, split)
    if len(data) < L + 1:
        raise ValueError(f"{path} has {len(data):,} tokens, fewer than the --length + 1 = {L + 1:,} one sequence needs")
    return data

def draw_starts(n_tokens, L, num_seqs, seed):
    """Start offsets of num_seqs windows of L+1 tokens; the same for every checkpoint of a run."""
    return np.random.default_rng(seed).integers(0, n_tokens - L, size=num_seqs)

@torch.no_grad()
def per_position_loss(model, data, starts, L, batch_size, bar=None):
    """Mean per-token loss at each position 1..L over the sequences at `starts`, as float64 (L,)."""
    device = model.lm_head.weight.device
    total = torch.zeros(L, dtype=torch.float64, device=device)
    for i in range(0, len(starts), batch_size):
        chunk = np.stack([np.asarray(data[s:s + L + 1], dtype=np.int64) for s in starts[i:i + batch_size]])
        xy = torch.from_numpy(chunk).to(device)
        # bf16 on CUDA as the paper (and so that 20,000 tokens fit); CPU runs the reference path in fp32
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            _, loss = model(xy[:, :-1], xy[:, 1:], reduction="none")  # (B, L)
        total += loss.double().sum(0)
        if bar is not None:
            bar.update(1)
    return (total / len(starts)).cpu().numpy()

def windows(loss, N):
    out = {}
    for k in WINDOW_MULTIPLES:
        if k * N <= len(loss):
            out[f"{k}x"] = dict(positions=[k * N - N + 1, k * N], mean_loss=float(loss[k * N - N:k * N].mean()))
            out[f"prefix_{k}x"] = dict(positions=[1, k * N], mean_loss=float(loss[:k * N].mean()))
    return out

# ----------------------------------------------------------------------------------------------------------------
# Figures: matplotlib's Figure without pyplot (no global state, no display)

def figure(n=1):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(5.5 * n + 1, 4.2), layout="tight")
    return fig, fig.subplots(1, n, squeeze=False)[0]

def moving_average(y, w):
    return np.convolve(y, np.ones(w) / w, mode="valid")  # point j = mean of y[j : j + w]

def plot_per_position(path, loss, models, L, w, logx, title):
    fig, (ax,) = figure()
    pos = np.arange(1, L + 1)
    for c, m in enumerate(models):
        theta = m["rope_theta_effective"] or m["rope_theta"]
        method = "" if m["rope_method"] in ("none", "theta") else f", {m['rope_method']} x{m['rope_scale']:g}"
        ax.plot(moving_average(pos, w), moving_average(loss[m["label"]], w), color=f"C{c}", lw=1.2,
                label=f"{m['label']} ({m['scorer']}, θ={theta:,.0f}{method})")
    for N in sorted({m["train_len"] for m in models}):
        ax.axvline(N, color="gray", ls=":", lw=1.2)  # the training length, as the paper's grey dotted line
    ax.set(xlabel="context size (position)", ylabel=f"test loss (moving average of {w} positions)",
           xscale="log" if logx else "linear")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=130)

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
    colors = {"softmax": "C0", **{f"ssmax_s{s:g}": c for s, c in zip(FADING_ZMAX_S, ("C3", "C1"))}}
    for key, y in sweep.items():
        name, k = key.rsplit("_n", 1)
        ax3.plot(zmax, y, color=colors[name], ls=styles[int(k)], label=f"{name.replace('_s', ' s=')}, n={int(k):,}")
    ax3.set(xlabel="z_max", ylabel="output at z_max", title="Fig. 3: logits (0, 1/(n-2), ..., 1, z_max)")
    ax1.legend(), ax3.legend(fontsize=7)
    fig.savefig(os.path.join(out_dir, "fading.png"), dpi=130)
    print(f"fading: n = 10^6: softmax max {soft[-1]:.2e}, SSMax max {ssmax[-1]:.4f} -> {out_dir}/fading.png")

# ----------------------------------------------------------------------------------------------------------------

def write_results(args, loss, models, starts):
    """Rewritten after every model: a later checkpoint that fails leaves the finished ones' results on disk."""
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "per_position.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["position", *loss])
        w.writerows(zip(range(1, args.length + 1), *(map(float, v) for v in loss.values())))
    note = (f"{args.num_seqs} sequences of {args.length:,} tokens ({args.split}), "
            f"RoPE {args.rope_method} x{args.rope_scale:g}")
    with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
        json.dump(dict(models=models, window_rule=WINDOW_RULE, position_rule=POSITION_RULE,
                       smoothing=f"moving average over {args.smooth} positions (plot only; the CSV is unsmoothed)",
                       sequences=dict(split=args.split, length=args.length, starts=starts.tolist()),
                       run_info=run_info(args.seed), args=vars(args)), f, indent=1)
    plot_per_position(os.path.join(args.out_dir, "per_position.png"), loss, models, args.length, args.smooth,
                      args.logx, note)

def run(args):
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):  # now, not after the models ran
        raise ValueError(f"--out_dir {args.out_dir!r} is a file, expected a folder for the results")
    if args.fading:
        fading(args.out_dir)
    if not args.ckpt:
        return
    # every checkpoint is read (its pickle; tensors mapped, not read) and checked before the first model runs
    model_args = [read_checkpoint(path, mmap=True)["model_args"] for path in args.ckpt]
    args.length = args.length or 10 * model_args[0]["block_size"]  # the first checkpoint fixes L
    N, path = max((a["block_size"], path) for a, path in zip(model_args, args.ckpt))
    if args.length < N:
        raise ValueError(f"--length {args.length} is shorter than the training length {N} of {path!r}: "
                         f"no window to report; use --length >= {N}")
    data = load_tokens(args.data, args.split, args.length)
    starts = draw_starts(len(data), args.length, args.num_seqs, args.seed)  # the same sequences for every model
    args.smooth = min(args.smooth or max(1, args.length // 200), args.length)
    device = torch.device(args.device)
    models, loss = [], {}
    bar = tqdm(total=math.ceil(args.num_seqs / args.batch_size) * len(args.ckpt), unit="batch", disable=None)
    for i, path in enumerate(args.ckpt):
        model, ckpt = load_checkpoint(path, device, backend=args.backend)
        model.eval()
        cfg = model.config
        label = args.labels[i] if args.labels else cfg.scorer
        if label in loss:  # two checkpoints of one scorer: tell them apart by their folders
            label = f"{label} #{i + 1} ({os.path.basename(os.path.dirname(os.path.abspath(path)))})"
        rope = model.extend_rope(args.rope_method, args.rope_scale, args.length)
        bar.set_description(f"{label} L={args.length:,}")
        loss[label] = per_position_loss(model, data, starts, args.length, args.batch_size, bar)
        models.append(dict(label=label, checkpoint=os.path.abspath(path), scorer=cfg.scorer,
                           train_len=cfg.block_size, iter_num=ckpt.get("iter_num"), rope_method=args.rope_method,
                           rope_scale=args.rope_scale, **rope, mean_loss=float(loss[label].mean()),
                           windows=windows(loss[label], cfg.block_size), model_args=ckpt["model_args"],
                           train_run_info=ckpt.get("run_info")))
        print(f"{label}: " + ", ".join(f"{k} {v['mean_loss']:.4f}" for k, v in models[-1]["windows"].items()
                                      if not k.startswith("prefix")) + f", all {models[-1]['mean_loss']:.4f}")
        write_results(args, loss, models, starts)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    bar.close()
    if args.wandb:
        tracking.log_table(args.wandb_project, f"eval_long {args.rope_method} x{args.rope_scale:g}", [
            dict(model=m["label"], scorer=m["scorer"], window=k, mean_loss=v["mean_loss"]) for m in models
            for k, v in m["windows"].items()], args.out_dir)
    print(f"wrote {args.out_dir}/per_position.csv, summary.json, per_position.png")

def main(argv=None):
    p = argparse.ArgumentParser(description="Per-position loss of long sequences with RoPE extended (SSMax Fig. 5).")
    p.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    p.add_argument("ckpt", nargs="*", help="checkpoints, compared in one figure")
    p.add_argument("--data", default="data/shakespeare", help="prepared dataset folder (prepare_data.py)")
    p.add_argument("--split", default="val", choices=prepare_data.SPLITS)
    p.add_argument("--length", type=int, help="tokens per sequence L (default: 10 x the first block_size)")
    p.add_argument("--rope_method", choices=ROPE_METHODS, default="theta")
    p.add_argument("--rope_scale", type=float, default=50.0, help="the SSMax paper: θ x 50 = 500,000")
    p.add_argument("--num_seqs", type=int, default=64, help="sequences averaged (the SSMax paper: 100,000)")
    p.add_argument("--seed", type=int, default=0)
    tracking.add_args(p)
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--labels", nargs="+", help="names of the checkpoints in the legend and CSV (default: scorer)")
    p.add_argument("--smooth", type=int, help="moving-average window of the plot (default: L / 200)")
    p.add_argument("--logx", action="store_true", help="log-scale position axis")
    p.add_argument("--fading", action="store_true", help="also write fading.png/csv: SSMax paper Figs. 1 and 3")
    p.add_argument("--out_dir", default="out-eval-long")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: model.auto_backend")
    args = p.parse_args(argv)
    if not args.ckpt and not args.fading:
        p.error("give one or more checkpoints, or --fading")
    bad = [f"--{k} {getattr(args, k)}" for k in ("num_seqs", "batch_size", "length", "smooth")
           if getattr(args, k) is not None and getattr(args, k) < 1]
    bad += [f"--rope_scale {args.rope_scale}"] * (not 0 < args.rope_scale < math.inf)  # `not <` refuses nan too
    bad += [f"--seed {args.seed}"] * (not 0 <= args.seed < 2**64)
    if bad:
        p.error(f"{', '.join(bad)}: counts and sizes must be >= 1, --rope_scale > 0 and finite, --seed in 0..2**64-1")
    if args.labels and len(args.labels) != len(args.ckpt):
        p.error(f"--labels has {len(args.labels)} names for {len(args.ckpt)} checkpoints")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        torch.device(args.device)
    except RuntimeError:
        p.error(f"--device {args.device!r} is not a device: use auto, cpu, cuda or cuda:N")
    try:
        run(args)
    except (ValueError, FileNotFoundError, prepare_data.DataError, tracking.TrackingError) as e:
        sys.exit(f"error: {e}")

if __name__ == "__main__":
    main()
