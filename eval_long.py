"""
Long-context evaluation: per-position test loss far beyond the training length, with RoPE extended and no further
training, as in the SSMax paper's Fig. 5 (Nakanishi 2025: θ 10,000 -> 500,000) and the LSSAR paper's Table 4 (Gao &
Spratling 2025: Dynamic NTK). --fading draws SSMax Fig. 1 (attention fading as n grows) and Fig. 3 (z_max sweep).

    python eval_long.py out-softmax/ckpt.pt out-ssmax/ckpt.pt --data data/shakespeare   # L = 10 x block_size
    python eval_long.py out-softmax/ckpt.pt out-lssar/ckpt.pt --rope_method dynamic_ntk --rope_scale 1 --length 8192
    python eval_long.py --fading

Position t (1-based) is the loss of predicting token t+1 from the t tokens before it: a model trained at length N
has seen positions 1..N. Every checkpoint is scored on the same --num_seqs windows of L+1 tokens, their starts drawn
with default_rng(seed) (--disjoint: windows that share no token) and recorded in summary.json with the count of
overlapping pairs. All checkpoints are read (weights_only) before the first model runs; outputs reach --out_dir only
whole, never over earlier ones.

Dynamic NTK sets RoPE's base from the sequence length, so window k is read from kN-token sequences with the factor
for kN (LSSAR Table 4; prefix_1x = native RoPE), and so is YaRN's logit temperature (--logit_scale yarn, set by the
length too); --no-ntk_per_length: one L-token pass with the factors for L. Other settings need one pass of L tokens.
Each model also runs with its checkpoint's θ (rope "native"; the method: "extended"): the trained θ, unless a run
changed it after training (the checkpoint's "changed", recorded per model): then its native pass names the trained θ.
Outputs: per_sequence.csv (model x rope x sequence x window), differences.csv/png (each model minus --baseline,
paired over sequences, bootstrap 95% CI), per_position.csv/png (raw curves), summary.json. A model's label (scorer or
--labels) carries its --logit_scale, as eval_tasks names it: "softmax-qwen".
"""
import argparse, csv, math, os, sys, time

import numpy as np
import torch

from lib import compare, dataset, figures, folders, progress, rescale, tracking, vocab
from lib.checkpoint import load_checkpoint, pick_device, run_info, trained_on
from model import BACKENDS, ROPE_METHODS
from rope import applied, eval_passes, pass_lengths, passes_rule, trained_theta, unread_options

WINDOW_RULE = ("window kx: mean loss over positions (k*N - N, k*N], the last N positions up to k times the "
               "training length N; prefix_kx: over positions 1..k*N, the loss of a k*N-token sequence (LSSAR Table "
               "4); k*N <= L. ")  # then rope.passes_rule: the passes that ran
POSITION_RULE = "position t = the loss of predicting token t+1 from tokens 1..t; trained positions are 1..N"
OUTPUTS = ("per_position.csv", "per_position.png", "per_sequence.csv", "differences.csv", "differences.png",
           "fading.csv", "fading_zmax.csv", "fading.png", "summary.json")  # summary.json last: lm_suite.complete

# ----------------------------------------------------------------------------------------------------------------
# Sequences and RoPE

@torch.no_grad()
def per_position_loss(model, data, starts, L, batch_size, bounds, bar=None):
    """The first L positions of the sequences at `starts`: mean loss at each position, float64 (L,), and each
    sequence's mean loss over each window of `bounds` (all within L), {window: float64 (num_seqs,)}."""
    device = model.lm_head.weight.device
    total = torch.zeros(L, dtype=torch.float64, device=device)
    per_seq = {w: [] for w in bounds}
    for i in range(0, len(starts), batch_size):
        chunk = np.stack([np.asarray(data[s:s + L + 1], dtype=np.int64) for s in starts[i:i + batch_size]])
        xy = torch.from_numpy(chunk).to(device)
        # bf16 on CUDA as the paper, so long sequences fit
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            _, loss = model(xy[:, :-1], xy[:, 1:], reduction="none")  # (B, L)
        loss = loss.double()
        total += loss.sum(0)
        for w, (first, last) in bounds.items():
            per_seq[w].append(loss[:, first - 1:last].mean(1).cpu())
        if bar is not None:
            bar.update(1)
    return (total / len(starts)).cpu().numpy(), {w: torch.cat(v).numpy() for w, v in per_seq.items()}

def evaluate(model, data, starts, args, N, method, scale, bar):
    """One RoPE setting on every sequence: the L-position curve, its RoPE info, each window's per-sequence losses and
    the effective θ each window ran with (None for pi and yarn)."""
    bounds, per_seq, theta = compare.window_bounds(N, args.length), {}, {}
    lengths = pass_lengths(bounds, args.length, method, args.logit_scale, args.ntk_per_length)
    for n in lengths:  # the last, L, gives the curve and RoPE info
        rope = model.extend_rope(method, scale, n)
        rescale.apply(model, args.logit_scale, n, args.llama4_floor)  # None: no rescaling
        mine = {w: b for w, b in bounds.items() if b[1] == n or len(lengths) == 1}
        curve, losses = per_position_loss(model, data, starts, n, args.batch_size, mine, bar)
        per_seq.update(losses)
        theta.update(dict.fromkeys(mine, rope["rope_theta_effective"]))
    return curve, rope, per_seq, theta

# ----------------------------------------------------------------------------------------------------------------

def write_results(args, folder, settings, curves, models, rows, starts, baseline, draw=True):
    """Rewritten in `folder` after every model (main moves it to --out_dir when all are done); the figures (0.3-1 s
    each on a CPU) where `draw`: after the last model, and a model done tracking.PLOT_EVERY_S (30 s) or more
    after the last drawing (a long evaluation's progress to look at)."""
    out = lambda name: os.path.join(folder, name)
    names = sorted(curves, key=lambda n: curves[n][1])  # the requested method's columns first
    with open(out("per_position.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["position", *names])
        w.writerows(zip(range(1, args.length + 1), *(map(float, curves[n][0]) for n in names)))
    compare.write_csv(out("per_sequence.csv"), rows, compare.PER_SEQUENCE_COLUMNS)
    diffs = compare.paired_differences(rows, baseline, args.n_boot, args.seed)
    compare.write_csv(out("differences.csv"), diffs, compare.DIFFERENCE_COLUMNS)
    rule = WINDOW_RULE + passes_rule([m for _, m, _ in settings], args.logit_scale, args.ntk_per_length)
    summary = dict(models=models, baseline=baseline, differences=diffs, window_rule=rule,
                   position_rule=POSITION_RULE, ci=f"{compare.LEVEL:.0%} percentile bootstrap over sequences, "
                   f"paired, {args.n_boot} resamples", sequences=dict(split=args.split, length=args.length,
                   disjoint=args.disjoint, overlapping_pairs=dataset.overlapping_pairs(starts, args.length),
                   starts=starts.tolist()), smoothing=f"moving average over {args.smooth} positions (plot only)",
                   run_info=run_info(args.seed), args=vars(args))
    folders.write_json(out("summary.json"), summary, indent=1)  # a NaN loss as null: strict JSON
    if draw:  # from the numbers just written: a committed folder is redrawn the same way (results/redraw_figures.py)
        figures.eval_long(folder, summary, {n: curves[n][0] for n in names})

def run(args, folder):  # the results to folder; returns the wandb table
    if args.fading:
        figures.fading(folder)
    if not args.ckpt:
        return []
    # check all checkpoints (mmap'd, each against the data's vocabulary, by content) before any model runs
    args.data = vocab.data_folder(args.data) or trained_on(args.ckpt, "data/shakespeare")  # a given one must exist
    ckpts, seen = vocab.evaluated(args.ckpt, args.data)  # seen: data_provenance's record (it warns)
    model_args = [c["model_args"] for c in ckpts]
    rescale.check([a.get("scorer", "softmax") for a in model_args], args.logit_scale, args.rope_method,
                  args.llama4_floor, [a.get("rope_scaling") for a in model_args])  # every model before the first
    args.length = args.length or 10 * model_args[0]["block_size"]  # the first checkpoint fixes L
    N, path = max((a["block_size"], path) for a, path in zip(model_args, args.ckpt))
    if args.length < N:
        raise ValueError(f"--length {args.length} is shorter than the training length {N} of {path!r}: "
                         f"no window to report; use --length >= {N}")
    named = args.labels or [a.get("scorer", "softmax") for a in model_args]  # rescaled: "softmax-qwen"
    labels = compare.unique_labels([compare.rescaled(n, args.logit_scale) for n in named], args.ckpt)
    baseline = labels[0] if args.baseline is None else args.baseline
    baseline = baseline if baseline in labels else compare.rescaled(baseline, args.logit_scale)  # as --labels has it
    if baseline not in labels:
        raise ValueError(f"--baseline {args.baseline!r} is not one of the models: {', '.join(labels)}")
    data = dataset.load_tokens(args.data, args.split, args.length, min(a["vocab_size"] for a in model_args))
    starts = dataset.draw_starts(len(data), args.length, args.num_seqs, args.seed, args.disjoint)  # for every model
    args.smooth = min(args.smooth or max(1, args.length // 200), args.length)
    some_rope = any(a.get("pos", "rope") == "rope" for a in model_args)  # NoPE alone: the native pass only
    device, settings = torch.device(args.device), eval_passes(args.rope_method, args.rope_scale, some_rope)
    models, curves, rows, table, drawn = [], {}, [], [], time.time()
    n_pass = sum(len(pass_lengths(compare.window_bounds(a["block_size"], args.length), args.length, method,
                                  args.logit_scale, args.ntk_per_length))
                 for a in model_args for _, method, _ in settings)
    bar = progress.bar(math.ceil(args.num_seqs / args.batch_size) * n_pass)  # a log: a line every 30 s
    for label, path, data_seen in zip(labels, args.ckpt, seen):
        model, ckpt = load_checkpoint(path, device, backend=args.backend)
        model.eval()
        cfg, ckpt_path = model.config, os.path.abspath(path)
        changed = ckpt.get("changed") or {}  # what its weights trained with otherwise (older checkpoints: none)
        bounds = compare.window_bounds(cfg.block_size, args.length)
        models.append(dict(label=label, checkpoint=ckpt_path, scorer=cfg.scorer, train_len=cfg.block_size,
                           iter_num=ckpt.get("iter_num"), changed=changed,
                           **applied(cfg.pos, args.rope_method, args.rope_scale)))
        for i, (rope, method, scale) in enumerate(settings):
            bar.set_description(f"{label} {rope} L={args.length:,}")
            curve, info, per_seq, theta = evaluate(model, data, starts, args, cfg.block_size, method, scale, bar)
            name = label if i == 0 else f"{label} [native]"  # its column in per_position.csv, dashed if native
            curves[name] = (curve, i)
            windows = {w: dict(positions=list(b), rope_theta_effective=theta[w], mean_loss=float(per_seq[w].mean()))
                       for w, b in bounds.items()}
            note = trained_theta(changed, cfg.rope_theta) if rope == "native" and cfg.pos == "rope" else {}
            result = dict(**info, mean_loss=float(curve.mean()), windows=windows, **note)
            # a stable summary.json: native nests under "native"
            models[-1].update(result if i == 0 else dict(native=dict(rope_method="none", **result)))
            rows += [dict(model=label, ckpt=ckpt_path, rope=rope, **applied(cfg.pos, method, scale),  # NoPE: none
                          theta=theta[w] or "", sequence=j, start=int(starts[j]), window=w, tokens=b[1] - b[0] + 1,
                          loss=float(x)) for w, b in bounds.items() for j, x in enumerate(per_seq[w])]
            table += [dict(model=label, scorer=cfg.scorer, rope=rope, window=w, mean_loss=v["mean_loss"])
                      for w, v in windows.items()]
            print(f"{label} [{rope}]: " + ", ".join(f"{w} {v['mean_loss']:.4f}" for w, v in windows.items()
                                                   if not w.startswith("prefix")) + f", all {result['mean_loss']:.4f}"
                  + (f" ({note['described']})" if note else ""))
        models[-1].update(model_args=ckpt["model_args"], train_run_info=ckpt.get("run_info"), **data_seen)
        draw = len(models) == len(args.ckpt) or time.time() - drawn >= tracking.PLOT_EVERY_S
        write_results(args, folder, settings, curves, models, rows, starts, baseline, draw)
        drawn = time.time() if draw else drawn
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    bar.close()
    return table

def main(argv=None):
    p = argparse.ArgumentParser(description="Per-position loss of long sequences with RoPE extended (SSMax Fig. 5).")
    p.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    p.add_argument("ckpt", nargs="*", help="checkpoints, compared in one figure")
    p.add_argument("--data", help="prepared dataset folder (prepare_data.py; default: the first checkpoint's "
                   "own, where it is here, else data/shakespeare)")
    p.add_argument("--split", default="val", choices=dataset.SPLITS)
    p.add_argument("--length", type=int, help="tokens per sequence L (default: 10 x the first block_size)")
    p.add_argument("--rope_method", choices=ROPE_METHODS, default="theta")
    p.add_argument("--rope_scale", type=float, help="default 50, the SSMax paper: θ x 50 = 500,000")
    p.add_argument("--ntk_per_length", action=argparse.BooleanOptionalAction, help="on by default; dynamic_ntk, "
                   "--logit_scale yarn: window k from kN-token sequences with the factor for kN (LSSAR Table 4)")
    p.add_argument("--baseline", help="label of the model the others are compared to (default: the first model)")
    p.add_argument("--n_boot", type=int, default=2000, help="bootstrap resamples of the paired 95%% CIs")
    p.add_argument("--num_seqs", type=int, default=64, help="sequences averaged (the SSMax paper: 100,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--disjoint", action="store_true", help="windows that share no token (default: starts drawn "
                   "with replacement, as in committed results; summary.json counts overlapping pairs)")
    tracking.add_args(p)
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--labels", nargs="+", help="names of the checkpoints in the legend and CSV (default: scorer)")
    p.add_argument("--smooth", type=int, help="moving-average window of the plot (default: L / 200)")
    p.add_argument("--logx", action="store_true", help="log-scale position axis")
    p.add_argument("--fading", action="store_true", help="also write fading.png/csv: SSMax paper Figs. 1 and 3")
    p.add_argument("--out_dir", default="out-eval-long")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: model.auto_backend")
    p.add_argument("--logit_scale", type=rescale.kind, metavar="KIND",
                  help=f"rescale softmax's logits, training-free: {', '.join(rescale.KINDS)} or a factor c")
    p.add_argument("--llama4_floor", type=int, default=rescale.LLAMA4_FLOOR, help="llama4's floor scale F")
    args = p.parse_args(argv)
    if not args.ckpt and not args.fading:
        p.error("give one or more checkpoints, or --fading")
    given = [f"--{'no-' * (v is False)}{k}" for k, v in vars(args).items()
             if v != p.get_default(k) and k not in ("ckpt", "fading", "out_dir")]  # a default is never refused
    if not args.ckpt and given:  # --fading alone draws closed forms, reading none of them
        p.error(f"{', '.join(given)}: only checkpoints are evaluated with it; give one (--fading alone draws no model)")
    bad = [f"--{k} {getattr(args, k)}" for k in ("num_seqs", "batch_size", "length", "smooth", "n_boot", "llama4_floor")
           if getattr(args, k) is not None and getattr(args, k) < 1]
    bad += [f"--rope_scale {args.rope_scale}"] * (args.rope_scale is not None and not 0 < args.rope_scale < math.inf)
    bad += [f"--seed {args.seed}"] * (not 0 <= args.seed < 2**64)
    if bad:
        p.error(f"{', '.join(bad)}: counts and sizes must be >= 1, --rope_scale > 0 and finite, --seed in 0..2**64-1")
    unread = unread_options(args.rope_method, args.rope_scale, args.ntk_per_length, args.logit_scale)
    unread += tracking.unread_options(p, args)  # --wandb_project without --wandb
    if unread:  # given, not read: refused, never recorded as applied
        p.error("; ".join(unread))
    args.rope_scale = 50.0 if args.rope_scale is None else args.rope_scale  # the defaults, after the refusal
    args.ntk_per_length = args.ntk_per_length is not False
    if args.labels and len(args.labels) != len(args.ckpt):
        p.error(f"--labels has {len(args.labels)} names for {len(args.ckpt)} checkpoints")
    try:
        args.device = str(pick_device(args.device))
    except ValueError as e:
        p.error(str(e))
    try:
        with folders.results_dir(args.out_dir, OUTPUTS) as folder:
            table = run(args, folder)
        made = [n for n in OUTPUTS if os.path.isfile(os.path.join(args.out_dir, n))]  # none was there before
        print(f"wrote {args.out_dir}: {', '.join(made)}")  # one model: no differences.png; --fading: its files
        if args.wandb and table:  # into --out_dir, beside the results
            tracking.log_table(args.wandb_project, f"eval_long {args.rope_method} x{args.rope_scale:g}", table,
                               args.out_dir)
    except (ValueError, OSError, dataset.DataError, tracking.TrackingError, folders.FolderError, RuntimeError,
            MemoryError) as e:  # OSError: a missing file, a full disk, an unwritable folder; out of memory
        sys.exit(f"error: {tracking.error_text(e, '--length or --batch_size')}")

if __name__ == "__main__":
    main()
