"""
Attention rows by position: what a language model's attention does at each query position of its window, beside its
loss there (issue #32: why the CPU scale's val loss rises after position ~32).

    python eval_rows.py --ckpt out-softmax/ckpt.pt out-ssmax/ckpt.pt --labels softmax ssmax --data data/english
    python eval_rows.py --ckpt out-char/ckpt.pt --data data/english_char --context 16 32 --out_dir out-rows-char

Position t (1-based) is the loss of predicting token t+1 from tokens 1..t (eval_long.py's rule); its attention row
has t keys. Per model, position and layer (heads averaged; rows from model.attention_rows): the loss; the row's
entropy -sum p log p (the row normalised to sum 1) and entropy_norm = entropy / log t (1 for a uniform row, nan at
t = 1); sink, the weight on key 1 (the first token); local8, the weight on the last 8 keys t-7..t without key 1, so
sink + local8 never exceed the row's mass; mass, the row's total weight (1 for softmax and SSMax).
--context c adds loss_c<c>: the same token predicted from its last c tokens only, read as a fresh window (positions
1..c): the text held fixed, only the context length changed; nan up to t = c, where it would equal loss.
Every model reads the same --num_seqs windows of L+1 tokens, starts drawn with --seed (dataset.draw_starts, as in
eval_long.py).
Outputs: per_position.csv, per_sequence.csv (each window's losses by bin of positions 1, 2, 3-4, 5-8, ...), rows.png,
summary.json (the bins' means; per model, as the CSVs' label names it: checkpoint, iteration, its trained θ);
written to --out_dir only whole.
"""
import argparse, math, sys

import numpy as np
import torch
import torch.nn.functional as F

from lib import compare, dataset, figures, folders, progress, tracking, vocab
from lib.checkpoint import load_checkpoint, pick_device, run_info, trained_on
from model import BACKENDS
from rope import applied

OUTPUTS = ("per_position.csv", "per_sequence.csv", "rows.png", "summary.json")  # summary.json last: results whole
RULE = ("position t = the loss of predicting token t+1 from tokens 1..t, its row has t keys; heads averaged; "
        "entropy of the row normalised to sum 1, entropy_norm = entropy / log t; sink = weight on key 1; local<k> = "
        "weight on keys max(2, t-k+1)..t; loss_c<c> = the loss from the last c tokens only (a fresh window)")
STATS = ("entropy", "entropy_norm", "sink", "local", "mass")  # per layer; "local" is written local<k>

# ----------------------------------------------------------------------------------------------------------------
# Row statistics

ROW_ELEMENTS = 2**26  # attention weights held at once: ~30 bytes each with row_stats' float64 copies, ~2 GB

def local_mask(rows, L, k):
    """(R, L) bool: row r (position r+1) keeps keys max(1, r-k+1)..r, its last k keys without the first token."""
    r, key = rows[:, None], torch.arange(L)[None, :]
    return (key <= r) & (key > r - k) & (key >= 1)

def row_stats(W, k, first=0):
    """W (n_layer, B, nh, R, L): rows first..first+R-1, zero beyond the causal keys -> {stat: (n_layer, B, R)}, heads
    averaged."""
    W = W.double()
    rows = torch.arange(first, first + W.size(-2))
    mass = W.sum(-1)
    P = W / mass.clamp_min(1e-300).unsqueeze(-1)
    entropy = -torch.special.xlogy(P, P).sum(-1)
    log_t = torch.log((rows + 1).double())
    out = dict(entropy=entropy, entropy_norm=entropy / torch.where(log_t > 0, log_t, math.nan), sink=W[..., 0],
               local=(W * local_mask(rows, W.size(-1), k).to(W.device)).sum(-1), mass=mass)
    return {s: v.mean(2) for s, v in out.items()}

@torch.no_grad()
def attention_stats(model, x, k):
    """row_stats of every row of x (B, L), a block of rows at a time: O(block * L) weights held, never each layer's
    L x L (16 windows of 1,800 tokens, 4 layers x 4 heads: 24 GiB); each block's rows are the full forward's."""
    B, L = x.shape
    block = max(1, ROW_ELEMENTS // (model.config.n_layer * B * model.config.n_head * L))
    parts = [row_stats(model.attention_rows(x, rows=range(lo, min(lo + block, L))), k, lo)
             for lo in range(0, L, block)]
    return {s: torch.cat([part[s] for part in parts], dim=-1) for s in parts[0]}

@torch.no_grad()
def truncated_loss(model, x, c, batch_size):
    """x (B, L+1) tokens -> (B, L) float64: at position t > c the loss of token t+1 from tokens t-c+1..t alone, read
    as a fresh window; nan up to c (where it equals the full-context loss)."""
    B, L = x.size(0), x.size(1) - 1
    out = torch.full((B, L), math.nan, dtype=torch.float64)
    if c >= L:
        return out
    win = x.unfold(1, c + 1, 1)[:, 1:].reshape(-1, c + 1)  # window j: tokens j..j+c, position t = j + c
    losses, step = [], max(1, batch_size * L // (c + 1))  # ~batch_size * L tokens a forward, as the full context's
    for i in range(0, len(win), step):
        chunk = win[i:i + step]
        logits, _ = model(chunk[:, :-1])  # the last position's logits only
        losses.append(F.cross_entropy(logits[:, -1].float(), chunk[:, -1], reduction="none").double().cpu())
    out[:, c:] = torch.cat(losses).view(B, L - c)
    return out

@torch.no_grad()
def evaluate(model, data, starts, L, args, bar):
    """Means over sequences: loss (L,), each --context's loss (L,), each statistic (n_layer, L); and each
    sequence's mean losses over each bin of positions (rows of per_sequence.csv)."""
    device = model.lm_head.weight.device
    sums, per_seq = {}, []
    def add(name, v):
        sums[name] = sums.get(name, 0) + v.sum(-2 if v.dim() == 3 else 0).double().cpu()
    for i in range(0, len(starts), args.batch_size):
        xy = torch.from_numpy(np.stack([np.asarray(data[s:s + L + 1], dtype=np.int64)
                                        for s in starts[i:i + args.batch_size]])).to(device)
        # one precision for both: loss_c - loss must be the context's effect, not bf16's
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            _, loss = model(xy[:, :-1], xy[:, 1:], reduction="none")  # (B, L)
            losses = {"loss": loss.double().cpu()}
            for c in args.context:
                losses[f"loss_c{c}"] = truncated_loss(model, xy, c, args.batch_size)
        for name, v in losses.items():
            add(name, v)
        per_seq += [dict(sequence=i + j, start=int(starts[i + j]), first=lo, last=hi,
                         **{n: float(v[j, lo - 1:hi].mean()) for n, v in losses.items()})
                    for j in range(len(xy)) for lo, hi in bins(L)]
        for s, v in attention_stats(model, xy[:, :-1], args.local).items():
            add(s, v)
        bar.update(1)
    return {name: (v / len(starts)).numpy() for name, v in sums.items()}, per_seq

def bins(L):
    """Position bins (first, last), 1-based: 1, 2, 3-4, 5-8, ... up to L."""
    out, lo = [], 1
    while lo <= L:
        hi = min(L, 2 * (lo - 1) if lo > 1 else 1)  # (2^(k-1), 2^k]
        out.append((lo, hi))
        lo = hi + 1
    return out

def bin_means(curves, L):
    """{'first-last': {stat: mean over the bin's positions (and layers); stat_by_layer: [...]}}."""
    out = {}
    for lo, hi in bins(L):
        cell = {}
        for name, v in curves.items():
            part = v[..., lo - 1:hi]  # loss_c is nan up to c: a bin partly there would mean other positions than loss's
            if np.all(np.isnan(part)) or (name.startswith("loss_c") and np.isnan(part).any()):
                continue
            cell[name] = float(np.nanmean(part))
            if v.ndim == 2:
                cell[f"{name}_by_layer"] = np.nanmean(part, axis=1).tolist()
        out[f"{lo}-{hi}"] = cell
    return out

# ----------------------------------------------------------------------------------------------------------------

def write_results(args, folder, results, per_seq, models, starts, L):
    local = f"local{args.local}"
    columns = ["model", "position", "layer", "loss", *(f"loss_c{c}" for c in args.context),
               "entropy", "entropy_norm", "sink", local, "mass"]
    rows = [dict(model=label, position=t + 1, layer=layer, **{n: float(cur[n][t]) for n in cur if cur[n].ndim == 1},
                 **{(local if s == "local" else s): float(cur[s][layer, t]) for s in STATS})
            for label, cur in results.items() for layer in range(cur["entropy"].shape[0]) for t in range(L)]
    compare.write_csv(f"{folder}/per_position.csv", rows, columns)
    compare.write_csv(f"{folder}/per_sequence.csv", [dict(model=label, **r) for label, seqs in per_seq.items()
                                                     for r in seqs],
                      ["model", "sequence", "start", "first", "last", "loss", *(f"loss_c{c}" for c in args.context)])
    plot(f"{folder}/rows.png", results, args, L)
    folders.write_json(f"{folder}/summary.json", dict(  # a layer's NaN as null: strict JSON
        models=[dict(m, bins=bin_means(results[m["label"]], L)) for m in models], rule=RULE, sequences=dict(
            data=args.data, split=args.split, length=L, disjoint=args.disjoint,
            overlapping_pairs=dataset.overlapping_pairs(starts, L), starts=starts.tolist()),
        run_info=run_info(args.seed), args=vars(args)), indent=1)

def plot(path, results, args, L):
    fig, axes = figures.figure(4)
    pos = np.arange(1, L + 1)
    names = ("loss", "entropy", "sink", "local")
    for i, (label, cur) in enumerate(results.items()):
        for ax, name in zip(axes, names):
            y = cur[name] if cur[name].ndim == 1 else cur[name].mean(0)  # layers averaged
            ax.plot(pos, y, color=f"C{i}", lw=1.2, label=label)
        for j, c in enumerate(args.context):
            axes[0].plot(pos, cur[f"loss_c{c}"], color=f"C{i}", lw=0.9, ls=("--", ":", "-.")[j % 3],
                         label=f"{label}, last {c} tokens only")
    axes[1].plot(pos, np.log(pos), color="gray", ls=":", lw=1, label="log t (uniform)")
    ylabels = ("loss (nats/token)", "row entropy (nats)", "weight on key 1 (sink)",
               f"weight on the last {args.local} keys")
    for ax, ylabel in zip(axes, ylabels):
        ax.set(xscale="log", xlabel="query position t", ylabel=ylabel)
        ax.legend(fontsize=7)
    axes[0].set_title(f"{args.num_seqs} windows of {L} tokens ({args.split}); heads and layers averaged", fontsize=8)
    fig.savefig(path, dpi=130)

def run(args, folder):
    # every checkpoint must read the data's vocabulary (by content), checked before any model runs
    args.data = vocab.data_folder(args.data) or trained_on(args.ckpt, "data/shakespeare")  # a given one must exist
    ckpts, seen = vocab.evaluated(args.ckpt, args.data)  # seen: data_provenance's record (it warns)
    model_args = [c["model_args"] for c in ckpts]
    L = args.length or model_args[0]["block_size"]
    if any(c >= L for c in args.context):
        raise ValueError(f"--context {max(args.context)} must be shorter than the length {L}")
    if args.local >= L:  # a longer local<k> counts the same keys: every row's mass but its sink
        raise ValueError(f"--local {args.local} must be in 1..{L - 1}: the longest row (position {L}) has {L - 1} "
                         f"keys besides the first")
    labels = compare.unique_labels(args.labels or [a.get("scorer", "softmax") for a in model_args], args.ckpt)
    data = dataset.load_tokens(args.data, args.split, L, min(a["vocab_size"] for a in model_args))
    starts = dataset.draw_starts(len(data), L, args.num_seqs, args.seed, args.disjoint)  # the same for every model
    results, per_seq, models = {}, {}, []
    bar = progress.bar(math.ceil(args.num_seqs / args.batch_size) * len(args.ckpt))  # a log: a line every 30 s
    for label, path, data_seen in zip(labels, args.ckpt, seen):
        bar.set_description(label)
        model, ckpt = load_checkpoint(path, args.device, backend=args.backend)
        model.eval()
        rope = dict(applied(model.config.pos, "none", 1.0), **model.extend_rope("none", 1.0, L))  # its trained θ
        results[label], per_seq[label] = evaluate(model, data, starts, L, args, bar)
        models.append(dict(label=label, checkpoint=path, scorer=model.config.scorer, block_size=model.config.block_size,
                           iter_num=ckpt.get("iter_num"), **rope, **data_seen))
        b = bin_means(results[label], L)
        print(f"{label}: loss by positions " + ", ".join(f"{k} {v.get('loss', math.nan):.3f}"  # all NaN: no mean
                                                         for k, v in b.items()))
    bar.close()
    write_results(args, folder, results, per_seq, models, starts, L)

def main(argv=None):
    p = argparse.ArgumentParser(description="Loss, attention entropy, sink and local mass by query position.")
    p.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    p.add_argument("--ckpt", nargs="+", required=True, help="language-model checkpoints")
    p.add_argument("--labels", nargs="+", help="names in the CSV and legend (default: scorer)")
    p.add_argument("--data", help="prepared dataset folder (prepare_data.py; default: the first checkpoint's "
                   "own, where it is here, else data/shakespeare)")
    p.add_argument("--split", default="val", choices=dataset.SPLITS)
    p.add_argument("--length", type=int, help="positions per window L >= 2 (default: the first block_size)")
    p.add_argument("--num_seqs", type=int, default=256, help="windows averaged")
    p.add_argument("--disjoint", action="store_true", help="windows that share no token (default: with replacement)")
    p.add_argument("--seed", type=int, default=0, help="draws the windows' starts")
    p.add_argument("--local", type=int, default=8, help="the last k keys of the local mass (1..L-1)")
    p.add_argument("--context", type=int, nargs="+", default=[], help="also the loss from the last c tokens only")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--out_dir", default="out-eval-rows")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: model.auto_backend")
    args = p.parse_args(argv)
    bad = [f"--{k} {v}" for k, low in (("num_seqs", 1), ("length", 2), ("local", 1), ("batch_size", 1))
           if (v := getattr(args, k)) is not None and v < low] + [f"--context {c}" for c in args.context if c < 1]
    bad += [f"--seed {args.seed}"] * (not 0 <= args.seed < 2**64)
    if bad:  # --length 1: one row, of the first token alone (sink 1, entropy 0): no position to compare
        p.error(f"{', '.join(bad)}: counts and lengths must be >= 1, --length >= 2, --seed in 0..2**64-1")
    if args.labels and len(args.labels) != len(args.ckpt):
        p.error(f"--labels has {len(args.labels)} names for {len(args.ckpt)} checkpoints")
    args.context = sorted(set(args.context))
    try:
        args.device = str(pick_device(args.device))
        with folders.results_dir(args.out_dir, OUTPUTS) as folder:
            run(args, folder)
        print(f"wrote {args.out_dir}/per_position.csv, per_sequence.csv, rows.png, summary.json")  # after the move
    except (ValueError, OSError, dataset.DataError, folders.FolderError, RuntimeError, MemoryError) as e:  # OSError:
        sys.exit(f"error: {tracking.error_text(e, '--length or --batch_size')}")  # a full disk...; out of memory

if __name__ == "__main__":
    main()
