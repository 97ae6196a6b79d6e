"""
Retrieval in long contexts: needle-in-a-haystack (SSMax paper, Nakanishi 2025, Fig. 6), passkey retrieval (LSSAR
paper, Gao & Spratling 2025, Fig. 3), per-head needle scores (SSMax Figs. 7-8) and retrieval fine-tuning data.

    python needle.py needle  --ckpt out-softmax/ckpt.pt out-ssmax/ckpt.pt --data data/shakespeare
    python needle.py passkey --ckpt out-softmax/ckpt.pt out-lssar/ckpt.pt --labels softmax lssar
    python needle.py score   --ckpt out-softmax/ckpt.pt out-ssmax/ckpt.pt --context 8000 --trials 100
    python needle.py sft_data [--squad 'squad/*.parquet']  # SQuAD 2.0 (hub or local) -> out-needle/sft_squad.jsonl
    python needle.py sft_data --synthetic 20000 --data data/shakespeare --sft_length 1024

retrieval.py holds the tasks (prompts in --data's codec: shorter ones for characters, answer grading, the needle score,
fine-tuning sets); this script runs the models and writes CSV, JSON, PNG. Answers are greedy over tokens other than
<|endoftext|>. RoPE is extended as in eval_long.py: θ x 50 by default (the SSMax paper's 10,000 -> 500,000). Each
JSON's models name the CSV's model: checkpoint, iteration, the RoPE each context ran with (NoPE: none), data read.
"""
import argparse, itertools, json, math, os, sys

import numpy as np
import torch
from tqdm import tqdm

from lib import compare, figures, folders, sft, tracking, vocab
from lib.checkpoint import CheckpointError, load_checkpoint, run_info, trained_on
from lib.dataset import DataError  # bad input, printed by main as one line
from lib.retrieval import cells, load_hay, ranked_heads, score_answer, score_trials, sft_examples, trials, with_lead
from lib.vocab import EOT
from model import BACKENDS, ROPE_METHODS
from rope import applied, unread_options

MODES = ("sft_data", "needle", "passkey", "score")
DEFAULT_CONTEXTS = {"needle": [1024, 2048, 4096, 6144, 8192, 10240], "passkey": [1024, 1536, 2048, 4096, 8192]}
FIELDS = ["model", "trial", "context", "depth", "actual_depth", "city", "number", "output", "score", "top_score",
          "top_layer", "top_head", "mean_score", "control_top_score", "control_mean_score", "uniform", "span_start",
          "span_tokens", "control_start", "keys"]  # CSV columns a mode has; depth: asked, top = the best head
MARKERS = {"exact": "o", "first_digit": "^", "wrong": "x"}  # Fig. 8: fully correct, first digit only, wrong
# the score summary, points on a log axis (a bar's length there is only its distance from an arbitrary bottom):
# (label, column, colour, marker)
POINTS = [("needle, best head", "top_score", "tab:red", "o"),
          ("control, best head", "control_top_score", "tab:gray", "o"),
          ("needle, mean head", "mean_score", "tab:red", "s"),
          ("control, mean head", "control_mean_score", "tab:gray", "s"),
          ("uniform", "uniform", "black", "_")]

# ----------------------------------------------------------------------------------------------------------------
# The model side

@torch.no_grad()
def greedy(model, idx, max_new_tokens, eot=EOT):
    """The most probable token other than <|endoftext|> (eot) at each step (the SSMax paper's rule), KV-cached."""
    cache, out = [{} for _ in model.transformer.h], []
    logits = model(idx, cache=cache)[0]
    while len(out) < max_new_tokens:
        logits = logits[:, -1].float()
        logits[:, eot] = float("-inf")
        out.append(logits.argmax(-1, keepdim=True))
        logits = model(out[-1], cache=cache)[0]
    return torch.cat(out, 1)

def last_row_weights(model, idx):
    """(n_layer, B, n_head, T): every head's weights of the last row (score: of prompt + lead, retrieval.with_lead)."""
    return model.attention_rows(idx, rows=(-1,))[:, :, :, 0].float()  # O(T), never T x T

def evaluate(model, label, prompts, args, enc, bar):
    rows = []
    while batch := list(itertools.islice(prompts, args.batch_size)):  # equal lengths: no padding
        idx = torch.tensor(np.stack([t.pop("ids") for t in batch]), device=args.device)
        with torch.autocast(idx.device.type, torch.bfloat16, enabled=idx.device.type == "cuda"):  # bf16 as the paper
            out = [enc.decode(o) for o in greedy(model, idx, args.max_new_tokens, enc.eot_token).tolist()]
            scores = score_trials(last_row_weights(model, with_lead(idx, batch)).cpu(), [t["span"] for t in batch],
                                  [t["control"] for t in batch]) if args.mode == "score" else [{}] * len(batch)
        for b, t in enumerate(batch):
            t.update(model=label, output=out[b], score=score_answer(out[b], t["number"], enc), **scores[b])
        rows += batch
        bar.update(len(batch))
    return rows

# ----------------------------------------------------------------------------------------------------------------
# Outputs: CSV, JSON, PNG

def save(args, folder, name, rows=None, fields=FIELDS, fig=None, **results):
    if rows:
        compare.write_csv(os.path.join(folder, f"{name}.csv"), rows, [k for k in fields if k in rows[0]])
    folders.write_json(os.path.join(folder, f"{name}.json"), dict(run_info=run_info(args.seed), args=vars(args),
                                                                   **results), indent=1)  # NaN as null: strict JSON
    if fig is not None:
        fig.savefig(os.path.join(folder, f"{name}.png"), dpi=120)

def report(args, folder, rows, models, labels, seen):
    palette = figures.colors(len(models))
    if args.mode == "needle":  # Fig. 6: depth x context, a panel per model
        acc = cells(rows, ["model", "context", "depth"])
        fig = figures.needle_grid(acc, models, labels, args.context_sizes, args.depths)
        return save(args, folder, "needle", rows, FIELDS, fig, cells=acc, models=seen)
    if args.mode == "passkey":  # LSSAR Fig. 3: accuracy vs length
        acc, (fig, (ax,)) = cells(rows, ["model", "context"]), figures.panels()
        for m, label, color in zip(models, labels, palette):
            ax.plot(args.context_sizes, [c["accuracy"] for c in acc if c["model"] == m], "o-", color=color, label=label)
        ax.set(xlabel="context length (tokens)", ylabel="passkey accuracy", ylim=(-0.05, 1.05))
        ax.legend(**figures.LEGEND)
        return save(args, folder, "passkey", rows, FIELDS, fig, cells=acc, models=seen)
    fig7, fig8 = [r for r in rows if r["trial"] == 0], [r for r in rows if r["trial"] > 0]
    heads = ranked_heads(fig7)
    trials_of = {m: [r for r in fig8 if r["model"] == m] for m in models}
    summary = [dict(model=m, n=len(rs), **{k: float(np.mean([r[k] for r in rs])) for _, k, _, _ in POINTS})
               for m, rs in trials_of.items()]  # per model: the means over its trials
    n_heads = max(r["heads"].numel() for r in fig7)  # n_layer x n_head
    shown = min(n_heads, 25)  # Fig. 7: the strongest heads, at most 25 of them
    (f7, (ax7,)), (f8, (ax8, ax)) = figures.panels(), figures.panels(2, size=(max(5, 0.7 * len(models)), 4))
    for m, label, color in zip(models, labels, palette):
        top = [h["score"] for h in heads if h["model"] == m][:shown]
        ax7.plot(range(1, len(top) + 1), top, "o-", color=color, label=label)
        ranked = sorted(trials_of[m], key=lambda r: -r["top_score"])
        ax8.plot([], [], "o", color=color, label=label)  # the legend names the colours, the title the markers
        for outcome, marker in MARKERS.items():
            pts = [(k + 1, r["top_score"]) for k, r in enumerate(ranked) if r["score"] == outcome]
            if pts:
                ax8.scatter(*zip(*pts), marker=marker, color=color)
    ax7.axhline(fig7[0]["uniform"], ls="--", color="gray", label="uniform attention")  # every model: the same prompt
    ax7.set(xlabel=f"head rank (all {n_heads} heads)" if shown == n_heads else f"head rank (top {shown} of {n_heads})",
            ylabel="needle score (weight on the number)", title=f"context {args.context}, depth {args.depth}%")
    ax8.set(xlabel="trial rank", ylabel="best head's score", title=f"context {args.context}, {args.trials} trials: "
            + ", ".join(f"{marker} {outcome}" for outcome, marker in MARKERS.items()))
    for j, (name, k, color, marker) in enumerate(POINTS):  # side by side in 0.8 of a model's slot
        ax.plot(np.arange(len(models)) - 0.32 + j * 0.16, [s[k] for s in summary], marker, color=color, ms=7, ls="",
                label=name)
    ax.set(yscale="log", title="needle vs control span vs uniform", ylabel=f"weight on the span, mean of {args.trials}")
    ax.set_xticks(range(len(models)), labels, rotation=30, ha="right")  # long names side by side
    ax7.legend(**figures.LEGEND), ax8.legend(**figures.LEGEND), ax.legend(**figures.LEGEND)
    s = summary[-1]  # after each model: its line
    print(f"{labels[-1]}: needle score {s['top_score']:.3f} best head, {s['mean_score']:.4f} mean head; "
          f"control span {s['control_top_score']:.3f}, {s['control_mean_score']:.4f}; uniform {s['uniform']:.4f}")
    save(args, folder, "needle_score_heads", heads, ["model", "rank", "layer", "head", "score"], f7,
         fig7=[{k: r[k] for k in FIELDS} for r in fig7], models=seen)
    save(args, folder, "needle_score_trials", fig8, FIELDS, f8, cells=cells(fig8, ["model"]), scores=summary,
         models=seen)

# ----------------------------------------------------------------------------------------------------------------

def outputs(args):  # a mode's files, the "finished" one last (reproduce.py)
    sft = "sft_synthetic" if args.synthetic else "sft_squad"  # as retrieval.sft_examples names it
    stems = {"score": ["needle_score_heads", "needle_score_trials"], "sft_data": [sft]}.get(args.mode, [args.mode])
    return [f"{stem}.{ext}" for stem in stems for ext in ("csv", "png", "json", "jsonl")]

def run(args, folder):  # the results to folder; returns the wandb table and the line that says where
    squad = args.mode == "sft_data" and not args.synthetic  # text only: no dataset read, none recorded
    args.data = None if squad else vocab.data_folder(args.data) or trained_on(args.ckpt, "data/shakespeare")
    enc = None if squad else vocab.codec(args.data)  # characters for a character dataset (retrieval.PROMPTS)
    if args.mode == "sft_data":
        name, examples = sft_examples(args, enc)
        examples = list(tqdm(examples, desc=name, unit="ex", total=args.synthetic or None))
        save(args, folder, name, examples=len(examples), jsonl=os.path.join(args.out_dir, f"{name}.jsonl"),
             codec=sft.sidecar_codec(enc) if args.synthetic else None)  # train.py: a model of it alone
        with open(os.path.join(folder, f"{name}.jsonl"), "w") as f:
            f.writelines(json.dumps(ex) + "\n" for ex in examples)
        return [], f"{os.path.join(args.out_dir, name)}.jsonl: {len(examples):,} examples"
    if not args.ckpt:
        raise DataError(f"mode {args.mode} needs --ckpt")
    ckpts, provenance = vocab.evaluated(args.ckpt, args.data)  # every checkpoint checked before any model runs
    vocabs = [c["model_args"]["vocab_size"] for c in ckpts]
    hay = None if args.mode == "passkey" else load_hay(args.data, "val", min(vocabs))
    contexts = [args.context] if args.mode == "score" else args.context_sizes
    prompts = lambda L: trials(args, enc, hay, L, np.random.default_rng([args.seed, L]))  # the same for every model
    for L in contexts:
        next(prompts(L))  # a too-short context fails before any model loads
    n = 1 + args.trials if args.mode == "score" else args.samples * (len(args.depths) if args.mode == "needle" else 1)
    models = args.labels or [os.path.dirname(c) or c if os.path.basename(c) == "ckpt.pt" else c for c in args.ckpt]
    rows, models = [], compare.unique_labels(models, args.ckpt)  # one checkpoint twice: rows told apart
    labels = [os.path.basename(m.rstrip("/\\")) or m for m in models]  # titles and legends: the run folder's name
    labels = labels if len(set(labels)) == len(labels) else models  # unless two share it
    seen = [dict(model=m, checkpoint=p, iter_num=c.get("iter_num"), rope=[],  # rope: what each context ran with
                 **applied(c["model_args"].get("pos", "rope"), args.rope_method, args.rope_scale),
                 **d) for m, p, c, d in zip(models, args.ckpt, ckpts, provenance)]
    for k, (path, label) in enumerate(zip(args.ckpt, models)):
        model = load_checkpoint(path, args.device, backend=args.backend)[0].eval()
        with tqdm(total=n * len(contexts), desc=label, unit="prompt") as bar:
            for L in contexts:
                seen[k]["rope"].append(dict(context=L, **model.extend_rope(args.rope_method, args.rope_scale, L)))
                rows += evaluate(model, label, prompts(L), args, enc, bar)
        report(args, folder, rows, models[:k + 1], labels[:k + 1], seen[:k + 1])  # after every model: progress
    return [{k: r[k] for k in FIELDS if k in r} for r in rows], f"results in {args.out_dir}"  # a tensor is no cell

def main(argv=None):
    p = argparse.ArgumentParser(description="Needle-in-a-haystack, passkey, needle scores, retrieval SFT data.")
    p.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    p.add_argument("mode", nargs="?", choices=MODES)
    p.add_argument("--mode", dest="mode_opt", choices=MODES, help="the same as the positional mode")
    p.add_argument("--ckpt", nargs="+", default=[], help="one or more checkpoints, compared in every plot")
    p.add_argument("--labels", nargs="+", help="a name for each --ckpt (the CSV's model; default: its "
                   "folder's path, the figures its name)")
    p.add_argument("--data", help="val: haystacks, train: SFT's (default: the first --ckpt's, else data/shakespeare)")
    p.add_argument("--out_dir", default="out-needle")
    p.add_argument("--context_sizes", type=int, nargs="+", help=f"needle, passkey (default {DEFAULT_CONTEXTS})")
    p.add_argument("--depths", type=int, nargs="+", default=[10, 30, 50, 70, 90], help="needle depths in %%")
    p.add_argument("--samples", type=int, default=100, help="prompts per cell (the SSMax paper: 1000)")
    p.add_argument("--context", type=int, default=8000, help="score: context size of Figs. 7 and 8")
    p.add_argument("--depth", type=int, default=50, help="score: Fig. 7's depth in %%")
    p.add_argument("--trials", type=int, default=100, help="score: Fig. 8's random trials")
    p.add_argument("--rope_method", choices=ROPE_METHODS, default="theta")
    p.add_argument("--rope_scale", type=float, help="default 50: θ x 50 = 500,000")
    p.add_argument("--max_new_tokens", type=int, default=10)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: model.auto_backend")
    p.add_argument("--squad", default="rajpurkar/squad_v2", help="sft_data: hub name or .json/.jsonl/.parquet glob")
    p.add_argument("--synthetic", type=int, default=0, help="sft_data: write N synthetic needle examples instead")
    p.add_argument("--sft_length", type=int, default=1024, help="sft_data: tokens per synthetic example")
    p.add_argument("--seed", type=int, default=1337)
    tracking.add_args(p)
    args = p.parse_args(argv)
    given = sorted({m for m in (args.mode, args.mode_opt) if m})  # `passkey --mode needle` ran passkey unsaid
    args.mode = given[0] if len(given) == 1 else p.error(f"give one mode of {', '.join(MODES)}; got {given}")
    hay = ("ckpt", "data", "seed")  # synthetic SFT reads --ckpt only for --data's default; SQuAD none of them
    model = (*hay, "labels", "rope_method", "rope_scale", "max_new_tokens", "batch_size", "device", "backend",
             "wandb", "wandb_project")  # the modes that run a model
    reads = {"needle": ("context_sizes", "depths", "samples", *model), "passkey": ("context_sizes", "samples", *model),
             "score": ("context", "depth", "trials", *model), "sft_data --synthetic": ("synthetic", "sft_length", *hay),
             "sft_data without --synthetic": ("squad",)}
    sft = "sft_data --synthetic" if args.synthetic else "sft_data without --synthetic"  # its two paths' options
    mode = sft if args.mode == "sft_data" else args.mode
    unread = [f"--{k}" for k in dict.fromkeys(sum(reads.values(), ())) if getattr(args, k) != p.get_default(k)
              and k not in reads[mode]]  # recorded in its JSON as if it had run
    if unread:
        p.error(f"{', '.join(unread)}: mode {mode} does not read it (it reads {', '.join(reads[mode])})")
    args.context_sizes = args.context_sizes or DEFAULT_CONTEXTS.get(args.mode, [])  # score, sft_data: none
    bad = [f"--{k} {getattr(args, k)}" for k in ("samples", "trials", "batch_size", "max_new_tokens", "context",
                                                  "sft_length") if getattr(args, k) < 1]
    bad += [f"--synthetic {args.synthetic}"] * (args.synthetic < 0) + [f"--seed {args.seed}"] * (args.seed < 0)
    bad += [f"--rope_scale {args.rope_scale}"] * (args.rope_scale is not None and not 0 < args.rope_scale < math.inf)
    bad += [f"--context_sizes {' '.join(map(str, args.context_sizes))}"] * any(L < 1 for L in args.context_sizes)
    if bad or not all(0 <= d <= 100 for d in args.depths + [args.depth]):
        p.error(f"{' '.join(bad) or '--depths/--depth'}: counts and sizes must be >= 1, --synthetic and --seed >= 0, "
                "--rope_scale > 0 and finite, depths in 0..100")
    unread = unread_options(args.rope_method, args.rope_scale) + tracking.unread_options(p, args)  # given, unread
    if unread:
        p.error("; ".join(unread))
    args.rope_scale = 50.0 if args.rope_scale is None else args.rope_scale  # the default, after the refusal
    if args.labels and (len(args.labels) != len(args.ckpt) or len(set(args.labels)) < len(args.labels)):
        p.error(f"--labels {' '.join(args.labels)}: give one distinct name per --ckpt ({len(args.ckpt)} checkpoints)")
    try:
        with folders.results_dir(args.out_dir, outputs(args)) as folder:
            table, done = run(args, folder)
        print(done)  # after the move into --out_dir: a move that fails printed success, then error
        if args.wandb and table:
            tracking.log_table(args.wandb_project, f"needle {args.mode}", table, args.out_dir)
    except (DataError, CheckpointError, OSError, tracking.TrackingError, folders.FolderError) as e:  # OSError: a
        sys.exit(f"error: {tracking.error_text(e)}")  # missing file, a full disk, an unwritable folder

if __name__ == "__main__":
    main()
