"""
The copy gate: does a language model use distant context? A span of val text is repeated d tokens later, and the
model's loss on the second copy is compared with its loss on a control span, other text at the same positions
(lib/longrange.py has the layout), at distances up to the training length N and beyond. A model that looks back d
tokens predicts the second copy almost for free; one that uses only the last few tokens scores both alike (ratio ~1).

    python eval_copy.py out-char-softmax/ckpt.pt out-char-ssmax/ckpt.pt --data data/english_char
    python eval_copy.py out-char-softmax/ckpt.pt --distances 0.5 1 2 4 --rope_method theta --rope_scale 50
    python eval_copy.py out-char-softmax/ckpt.pt --logit_scale qwen          # softmax rescaled, training-free

Per model and distance: the mean loss per token on the first copy, the second and the control (the span's first token
left out: nothing marks where a copy starts), second / control, and the loss by offset inside the span at the gate's
distance; each model's record names the RoPE and the --logit_scale it ran with (its label stays the scorer's). The
gate (longrange.py): at d = 0.5 N, second / control <= 0.5. Every model reads the same --num_seqs sequences per
distance (drawn with --seed). Outputs: per_sequence.csv, copy.png (ratio by distance; loss by offset), summary.json
last; written to --out_dir only whole.
"""
import argparse, math, os, sys

import torch

from lib import compare, dataset, figures, folders, longrange, progress, rescale, tracking, vocab
from lib.checkpoint import CheckpointError, load_checkpoint, pick_device, run_info, trained_on
from model import BACKENDS, ROPE_METHODS
from rope import unread_options

OUTPUTS = ("per_sequence.csv", "copy.png", "summary.json")  # summary.json last: it marks the results whole
COLUMNS = ("model", "checkpoint", "iter", "distance_x", "distance", "seq", "first", "second", "control")


@torch.no_grad()
def token_losses(model, x, batch_size, bar=None):
    """(num_seqs, len - 1) float64: column t is the loss of token t+1 given tokens 0..t."""
    device, out = model.lm_head.weight.device, []
    for i in range(0, len(x), batch_size):
        xy = torch.from_numpy(x[i:i + batch_size]).to(device)
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            out.append(model(xy[:, :-1], xy[:, 1:], reduction="none")[1].double().cpu())
        if bar is not None:
            bar.update(1)
    return torch.cat(out).numpy()


def distances(N, args, n_tokens):
    """({distance_x: d} measured on a model of training length N, d = round(k N); [what is skipped and why]): a d below
    the span (the copies would overlap) or one an earlier k rounds to. A d the split cannot hold: ValueError."""
    measured, skipped = {}, []
    for k in args.distances:
        d = round(k * N)
        same = [f"{j:g}" for j, seen in measured.items() if seen == d]
        why = f"d = {d} < --span {args.span}: the copies would overlap" if d < args.span else (
            f"d = {d}, measured at {same[0]} N" if same else None)
        if why:
            skipped.append(dict(distance_x=k, distance=d, why=why))
        elif longrange.LEAD + d + args.span > n_tokens:  # checked here: the message shows d in :g, not 300 digits
            raise ValueError(f"--distances {k:g}: d = {d:g} tokens; a sequence of it does not fit in --split "
                             f"{args.split}'s {n_tokens:,} tokens (N = {N})")
        else:
            measured[k] = d
    return measured, skipped


def evaluate(model, tokens, N, args, rope, bar=None):
    """{distance_x: (d, first, second, control)} for one model, each (num_seqs, L-1): the span's tokens 1..L-1 in the
    first copy, the second and the control span, at each distance measured (distances). RoPE (method, scale) is set
    for each sequence length."""
    out, L = {}, args.span
    for k, d in distances(N, args, len(tokens))[0].items():
        x, control, a, b = longrange.copy_sequences(tokens, d, L, args.num_seqs, args.seed, kind=args.kind)
        model.extend_rope(*rope, x.shape[1] - 1)  # "none": the trained θ, any length
        rescale.apply(model, args.logit_scale, x.shape[1] - 1, args.llama4_floor)  # None: no rescaling
        copy, ctl = token_losses(model, x, args.batch_size, bar), token_losses(model, control, args.batch_size, bar)
        out[k] = (d, copy[:, a:a + L - 1], copy[:, b:b + L - 1], ctl[:, b:b + L - 1])
    return out


def summarize(label, N, losses, args):
    """One model's summary: by distance the mean losses and second / control; the gate and the loss by offset."""
    rows = {f"{k:g}": dict(distance=d, first=float(f.mean()), second=float(s.mean()), control=float(c.mean()),
                           ratio=float(s.mean() / c.mean()))
            for k, (d, f, s, c) in losses.items()}
    _, f, s, c = losses[longrange.GATE_DISTANCE]
    gate = rows[f"{longrange.GATE_DISTANCE:g}"]["ratio"]
    return dict(label=label, block_size=N, by_distance=rows, gate_ratio=gate, gate=gate <= longrange.GATE_RATIO,
                by_offset=dict(first=f.mean(0).tolist(), second=s.mean(0).tolist(), control=c.mean(0).tolist()))


def run(args, folder):
    # every checkpoint must read the data's vocabulary (by content), checked before any model runs
    args.data = vocab.data_folder(args.data) or trained_on(args.ckpt, "data/english_char")  # a given one must exist
    ckpts, seen = vocab.evaluated(args.ckpt, args.data)  # seen: data_provenance's record (it warns)
    model_args = [c["model_args"] for c in ckpts]
    rescale.check([a.get("scorer", "softmax") for a in model_args], args.logit_scale, args.rope_method,
                  args.llama4_floor, [a.get("rope_scaling") for a in model_args])
    tokens = dataset.load_split(args.data, args.split)
    dataset.check_ids(args.data, args.split, min(a["vocab_size"] for a in model_args))  # a damaged file: one line
    if longrange.GATE_DISTANCE not in args.distances:  # the gate is always measured
        args.distances = sorted({*args.distances, longrange.GATE_DISTANCE})
    short = [a["block_size"] for a in model_args if round(longrange.GATE_DISTANCE * a["block_size"]) < args.span]
    if short:
        raise ValueError(f"--span {args.span} is longer than the copy gate's distance {longrange.GATE_DISTANCE:g} N "
                         f"of a model with N = {short[0]}: give --span <= {round(longrange.GATE_DISTANCE * short[0])}")
    models, rows = [], []
    batches = 2 * math.ceil(args.num_seqs / args.batch_size)  # a distance's: its copies', then its controls'
    bar = progress.bar(sum(batches * len(distances(a["block_size"], args, len(tokens))[0]) for a in model_args))
    labels = compare.unique_labels(args.labels or [f"{a.get('scorer', 'softmax')} #{i + 1}"
                                                   for i, a in enumerate(model_args)], args.ckpt)
    for path, a, label, data_seen in zip(args.ckpt, model_args, labels, seen):
        N = a["block_size"]
        if 2 * args.span + longrange.LEAD > N:
            raise ValueError(f"--span {args.span}: two copies and the lead of {longrange.LEAD} tokens must fit in the "
                             f"training length {N} of {path!r}")
        pos = a.get("pos", "rope")  # NoPE: no RoPE to extend, recorded as what ran (not the options given)
        rope = (args.rope_method, args.rope_scale) if pos == "rope" else ("none", 1.0)
        model, ckpt = load_checkpoint(path, args.device, backend=args.backend)
        skipped = distances(N, args, len(tokens))[1]  # in --distances, not in by_distance: said and recorded
        if skipped:
            print(f"note: {label}: skipped " + ", ".join(f"{s['distance_x']:g} N ({s['why']})" for s in skipped))
        bar.set_description(label)
        losses = evaluate(model.eval(), tokens, N, args, rope, bar)
        del model
        which = dict(checkpoint=os.path.abspath(path), iter=ckpt.get("iter_num"))  # every row names its model
        # what ran: a rescaled softmax keeps its label, by which report.copy_gate pairs it with the native softmax
        models.append(dict(summarize(label, N, losses, args), **which, pos=pos, rope_method=rope[0],
                           rope_scale=rope[1], logit_scale=args.logit_scale, skipped=skipped, **data_seen))
        rows += [dict(model=label, **which, distance_x=k, distance=d, seq=j, first=f[j].mean(), second=s[j].mean(),
                      control=c[j].mean()) for k, (d, f, s, c) in losses.items() for j in range(args.num_seqs)]
        print(f"{label}: " + ", ".join(f"{k} N {r['second']:.3f}/{r['control']:.3f} ({r['ratio']:.2f})"
                                       for k, r in models[-1]["by_distance"].items())
              + f"; gate {'passed' if models[-1]['gate'] else 'failed'}", flush=True)
    bar.close()
    compare.write_csv(f"{folder}/per_sequence.csv", rows, COLUMNS)
    figures.copy_gate(f"{folder}/copy.png", models, vars(args))
    folders.write_json(f"{folder}/summary.json", dict(  # a NaN loss as null: strict JSON
        models=models, gate_rule=f"second copy's loss / the control span's <= {longrange.GATE_RATIO} at distance "
        f"{longrange.GATE_DISTANCE} x N (per token, the span's first token left out)",
        layout=" ".join(longrange.__doc__.split("\n\n")[2:4]), run_info=run_info(args.seed), args=vars(args)), indent=1)


def main(argv=None):
    p = argparse.ArgumentParser(description="The copy gate: loss on a repeated span's second copy vs a control span.")
    p.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    p.add_argument("ckpt", nargs="+", help="language-model checkpoints")
    p.add_argument("--data", help="prepared dataset folder (prepare_data.py; default: the first checkpoint's "
                   "own, where it is here, else data/english_char)")
    p.add_argument("--split", default="val", choices=dataset.SPLITS)
    p.add_argument("--distances", type=float, nargs="+", default=list(longrange.DISTANCES),
                   help="distances between the copies, in multiples of each model's training length N (the gate's "
                   "0.5 is always added)")
    p.add_argument("--span", type=int, default=32, help="tokens per copy (train.py's copy_span)")
    p.add_argument("--kind", choices=longrange.KINDS, default="text",
                   help="the span: val text (the gate), or tokens drawn from the sequence at random")
    p.add_argument("--num_seqs", type=int, default=64)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rope_method", choices=ROPE_METHODS, default="none", help="none: the trained θ at any length")
    p.add_argument("--rope_scale", type=float, help="default 1")
    p.add_argument("--logit_scale", type=rescale.kind, metavar="KIND",
                  help=f"rescale softmax's logits, training-free: {', '.join(rescale.KINDS)} or a factor c")
    p.add_argument("--llama4_floor", type=int, default=rescale.LLAMA4_FLOOR, help="llama4's floor scale F")
    p.add_argument("--labels", nargs="+", help="names of the checkpoints (default: scorer #i)")
    p.add_argument("--out_dir", default="out-eval-copy")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    args = p.parse_args(argv)
    bad = [f"--{k} {getattr(args, k)}" for k in ("num_seqs", "batch_size", "llama4_floor") if getattr(args, k) < 1]
    bad += [f"--span {args.span}"] * (args.span < 2) + [f"--seed {args.seed}"] * (not 0 <= args.seed < 2**64)
    bad += [f"--distances {k:g}" for k in args.distances if not 0 < k < math.inf]
    bad += [f"--rope_scale {args.rope_scale}"] * (args.rope_scale is not None and not 0 < args.rope_scale < math.inf)
    if bad:
        p.error(f"{', '.join(bad)}: counts >= 1, --span >= 2, distances and --rope_scale > 0 and finite, --seed in "
                "0..2**64-1")
    unread = unread_options(args.rope_method, args.rope_scale)
    if unread:  # given, not read: refused, never recorded as applied
        p.error("; ".join(unread))
    args.rope_scale = 1.0 if args.rope_scale is None else args.rope_scale  # the default, after the refusal
    if args.labels and len(args.labels) != len(args.ckpt):
        p.error(f"--labels has {len(args.labels)} names for {len(args.ckpt)} checkpoints")
    try:
        args.device = str(pick_device(args.device))
        with folders.results_dir(args.out_dir, OUTPUTS) as folder:
            run(args, folder)
    except (ValueError, OSError, CheckpointError, dataset.DataError, tracking.TrackingError, folders.FolderError,
            RuntimeError, MemoryError) as e:  # OSError: a full disk, an unwritable folder; out of memory
        sys.exit(f"error: {tracking.error_text(e, '--distances or --batch_size')}")
    print(f"done: {args.out_dir}/summary.json")


if __name__ == "__main__":
    main()
