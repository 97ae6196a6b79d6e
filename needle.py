"""
Retrieval in long contexts: needle-in-a-haystack (SSMax paper, Nakanishi 2025, Fig. 6), passkey retrieval (LSSAR
paper, Gao & Spratling 2025, Fig. 3), per-head needle scores (SSMax Figs. 7-8) and retrieval fine-tuning data.

    python needle.py needle  --ckpt out-softmax/ckpt.pt out-ssmax/ckpt.pt --data data/shakespeare
    python needle.py passkey --ckpt out-softmax/ckpt.pt out-lssar/ckpt.pt
    python needle.py score   --ckpt out-softmax/ckpt.pt out-ssmax/ckpt.pt --context 8000 --trials 100
    python needle.py sft_data [--squad 'squad/*.parquet']  # SQuAD 2.0 (hub or local) -> out-needle/sft_squad.jsonl
    python needle.py sft_data --synthetic 20000 --data data/shakespeare --sft_length 1024

Prompts are built in token space from the templates below, each piece encoded on its own: the needle's ids decode
to exactly its text, a prompt is exactly the context size, and the needle (or pass key) sits right after the
sentence-end id nearest to depth % of the haystack (val-split text with <|endoftext|> dropped; passkey: the filler).
Answers are greedy over the tokens other than <|endoftext|>. RoPE is extended as in eval_long.py: θ x 50 by default
(the SSMax paper's 10,000 -> 500,000, no further training).
"""
import argparse, csv, functools, itertools, json, math, os, re, sys

import numpy as np
import torch
from tqdm import tqdm

import prepare_data
import tracking
from prepare_data import EOT, DataError  # DataError: bad input, printed by main as one line
from model import BACKENDS, ROPE_METHODS, CheckpointError, load_checkpoint, read_checkpoint, run_info

MODES = ("sft_data", "needle", "passkey", "score")
NEEDLE_HEAD, NEEDLE_TAIL = " The special magic {city} number is:", " {number}."  # the needle score's span: the tail
NEEDLE_QUESTION = "\nWhat is the special magic {city} number?\nThe special magic {city} number is:"
# Mohtashami & Jaggi 2023; k is uniform in 10000..99999
PASSKEY_INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
                 "I will quiz you about the important information there.")
PASSKEY_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY = " The pass key is {k}. Remember it. {k} is the pass key."
PASSKEY_QUESTION = " What is the pass key? The pass key is"
SQUAD_PROMPT = "{context}\n{question}\nAnswer:"  # answer: " " + the first answer text
# synthetic SFT data uses TRAIN_CITIES and odd numbers, evaluation EVAL_CITIES and even ones: nothing leaks
EVAL_CITIES = ("Tokyo", "Paris", "Cairo", "Lima", "Oslo", "Nairobi", "Toronto", "Mumbai", "Sydney", "Berlin",
               "Madrid", "Seoul", "Istanbul", "Chicago", "Bangkok", "Dublin", "Havana", "Jakarta", "Lagos", "Vienna")
TRAIN_CITIES = ("London", "Rome", "Moscow", "Beijing", "Delhi", "Lisbon", "Athens", "Prague", "Warsaw", "Boston",
                "Denver", "Manila", "Karachi", "Dhaka", "Tehran", "Riyadh", "Santiago", "Bogota", "Quebec", "Helsinki")
DEFAULT_CONTEXTS = {"needle": [1024, 2048, 4096, 6144, 8192, 10240], "passkey": [1024, 1536, 2048, 4096, 8192]}
FIELDS = ["model", "trial", "context", "depth", "city", "number", "output", "score", "top_score", "top_layer",
          "top_head"]  # of the CSV rows, where a mode has them
MARKERS = {"exact": "o", "first_digit": "^", "wrong": "x"}  # Fig. 8: fully correct, first digit only, wrong

# ----------------------------------------------------------------------------------------------------------------
# Prompts and scoring

def draw_number(rng, split):
    n = int(rng.integers(10**6, 10**7))  # 7 digits
    return n - n % 2 + (split == "train")  # odd for training, even for evaluation

def score_answer(text, number):
    """The first run of digits in text (single spaces inside allowed: " 8 1 0" reads 810) against the number."""
    m = re.search(r"\d(?: ?\d)*", text)
    digits = m.group().replace(" ", "") if m else ""
    return "exact" if digits == str(number) else "first_digit" if digits[:1] == str(number)[0] else "wrong"

@functools.cache
def sentence_ends(enc):
    # by decoding every id: a harness that looks for the id of "." alone silently puts the needle at depth 0
    return np.array([enc.decode_single_token_bytes(i).endswith((b".", b"!", b"?")) for i in range(enc.n_vocab)])

def build_prompt(enc, hay, insert, question, L, depth, prefix=()):
    """prefix + hay[:pos] + insert + hay[pos:n] + question, exactly L ids; pos is the boundary right after a
    sentence-end id nearest to depth % of the n haystack ids. Returns (ids, position of insert)."""
    n = L - len(prefix) - len(insert) - len(question)
    if n < 1:
        raise DataError(f"context size {L} is too short to hold the needle and the question: they take {L - n} "
                        f"tokens, so use at least {L - n + 1} (and more, for a haystack)")
    hay = np.asarray(hay[:n])
    if len(hay) < n:
        raise DataError(f"the haystack text has {len(hay)} tokens, fewer than the {n} that context {L} needs")
    cuts = np.flatnonzero(sentence_ends(enc)[hay]) + 1
    if len(cuts) == 0:
        raise DataError(f"no sentence end ('.', '!', '?') in a {n}-token haystack: nowhere to insert the needle")
    pos = int(cuts[np.abs(cuts - depth / 100 * n).argmin()])
    return np.concatenate([prefix, hay[:pos], insert, hay[pos:], question]).astype(np.int64), len(prefix) + pos

def needle_trial(enc, hay, L, depth, city, number):
    head, tail = enc.encode(NEEDLE_HEAD.format(city=city)), enc.encode(NEEDLE_TAIL.format(number=number))
    ids, pos = build_prompt(enc, hay, head + tail, enc.encode(NEEDLE_QUESTION.format(city=city)), L, depth)
    return dict(context=L, depth=depth, city=city, number=number, ids=ids, pos=pos,
                span=(pos + len(head), pos + len(head) + len(tail)))

def needle_in_window(enc, hay, L, depth, city, number, rng, tries=10):
    """needle_trial in a random stretch of hay; a stretch without a sentence end is redrawn (a few times)."""
    for i in range(tries):
        s = int(rng.integers(max(len(hay) - L, 0) + 1))
        try:
            return needle_trial(enc, hay[s:s + L], L, depth, city, number)
        except DataError:
            if i == tries - 1:
                raise

def trials(args, enc, hay, L, rng):
    """The prompts of one context size, made lazily (thousands of 10k-token prompts add up)."""
    needle = lambda depth: needle_in_window(enc, hay, L, depth, EVAL_CITIES[rng.integers(len(EVAL_CITIES))],
                                            draw_number(rng, "eval"), rng)
    if args.mode == "needle":
        yield from (dict(needle(d), trial=i) for d in args.depths for i in range(args.samples))
    elif args.mode == "passkey":
        filler = enc.encode(PASSKEY_FILLER)
        for i in range(args.samples):
            k, depth = int(rng.integers(10**4, 10**5)), int(rng.integers(0, 101))
            ids, pos = build_prompt(enc, filler * (L // len(filler) + 1), enc.encode(PASSKEY.format(k=k)),
                                    enc.encode(PASSKEY_QUESTION), L, depth, enc.encode(PASSKEY_INTRO))
            yield dict(trial=i, context=L, depth=depth, number=k, ids=ids, pos=pos)
    else:  # score: trial 0 is Fig. 7's fixed needle, then Fig. 8's random ones
        yield dict(needle_in_window(enc, hay, L, args.depth, "Tokyo", 8106422, rng), trial=0)  # the paper's needle
        yield from (dict(needle(int(rng.integers(0, 101))), trial=i) for i in range(1, args.trials + 1))

# ----------------------------------------------------------------------------------------------------------------
# Retrieval fine-tuning data

def squad_examples(source):
    """(prompt, answer) of the SQuAD 2.0 examples whose context, question and answer are all non-empty."""
    import datasets  # here: slow to import, and only this mode needs it
    ext = os.path.splitext(source)[1].lower()
    kw = dict(path=source) if ext not in (".json", ".jsonl", ".parquet") else dict(
        path="parquet" if ext == ".parquet" else "json", data_files=source)
    try:  # streaming: no copy in the datasets cache
        rows = iter(datasets.load_dataset(**kw, split="train", streaming=True))
        first = next(rows, None)
    except Exception as e:  # offline hub, unknown name, no such file: one line that says so
        raise DataError(f"cannot load SQuAD from {source!r}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}")
    if first is None or not {"context", "question", "answers"} <= set(first):
        raise DataError(f"{source!r} needs columns context, question, answers{{text}}; has {list(first or [])}")
    fields = (((ex["context"] or "").strip(), (ex["question"] or "").strip(),
               (((ex["answers"] or {}).get("text") or [""])[0] or "").strip()) for ex in itertools.chain([first], rows))
    return ({"prompt": SQUAD_PROMPT.format(context=c, question=q), "answer": " " + a}
            for c, q, a in fields if c and q and a)

def synthetic_examples(enc, hay, n, length, rng):
    """Needles in train-split text, the question at the end; prompt + answer = length tokens."""
    for _ in range(n):
        city, number = TRAIN_CITIES[rng.integers(len(TRAIN_CITIES))], draw_number(rng, "train")
        answer = NEEDLE_TAIL.format(number=number)
        n_answer = len(enc.encode(answer))
        try:
            t = needle_in_window(enc, hay, length - n_answer, int(rng.integers(0, 101)), city, number, rng)
        except DataError as e:  # say it in the option's words: the prompt's context is --sft_length minus the answer
            m = re.search(r"at least (\d+)", str(e))
            if not m:
                raise
            raise DataError(f"--sft_length {length} is too short for a synthetic example: its needle, question and "
                            f"answer take {int(m.group(1)) + n_answer - 1} tokens (more with a longer city name), "
                            f"and the haystack needs room too") from None
        yield {"prompt": enc.decode(t["ids"].tolist()), "answer": answer}

def load_hay(data_dir, split):
    if not os.path.isfile(os.path.join(data_dir, f"{split}.bin")):
        raise DataError(f"dataset {data_dir!r} has no {split}.bin: prepare one (python prepare_data.py shakespeare)")
    tokens = np.asarray(prepare_data.load_split(data_dir, split))
    return tokens[tokens != EOT]  # one running text

# ----------------------------------------------------------------------------------------------------------------
# The model side

@torch.no_grad()
def greedy(model, idx, max_new_tokens):
    """The most probable token other than <|endoftext|> at each step (the SSMax paper's rule), KV-cached."""
    cache, out = [{} for _ in model.transformer.h], []
    logits = model(idx, cache=cache)[0]
    while len(out) < max_new_tokens:
        logits = logits[:, -1].float()
        logits[:, EOT] = float("-inf")
        out.append(logits.argmax(-1, keepdim=True))
        logits = model(out[-1], cache=cache)[0]
    return torch.cat(out, 1)

def needle_scores(model, idx, spans):
    """(B, n_layer, n_head): weight of the last row (it generates the first answer token) on each span [a, e)."""
    w = model.attention_rows(idx, rows=(-1,))[:, :, :, 0].float()  # (n_layer, B, nh, T): O(T), never T x T
    return torch.stack([w[:, b, :, a:e].sum(-1) for b, (a, e) in enumerate(spans)])

def evaluate(model, label, prompts, args, enc, bar):
    rows = []
    while batch := list(itertools.islice(prompts, args.batch_size)):  # equal lengths: no padding
        idx = torch.tensor(np.stack([t.pop("ids") for t in batch]), device=args.device)
        with torch.autocast(idx.device.type, torch.bfloat16, enabled=idx.device.type == "cuda"):  # bf16 as the paper
            out = [enc.decode(o) for o in greedy(model, idx, args.max_new_tokens).tolist()]
            heads = needle_scores(model, idx, [t["span"] for t in batch]).cpu() if args.mode == "score" else None
        for b, t in enumerate(batch):
            t.update(model=label, output=out[b], score=score_answer(out[b], t["number"]))
            if heads is not None:  # Fig. 8 marks a trial by its top head
                top_layer, top_head = divmod(int(heads[b].argmax()), heads.size(2))
                t.update(heads=heads[b], top_score=heads[b].max().item(), top_layer=top_layer, top_head=top_head)
        rows += batch
        bar.update(len(batch))
    return rows

# ----------------------------------------------------------------------------------------------------------------
# Outputs: CSV (one row per trial or head), JSON (summary, run_info, args), PNG

def cells(rows, keys):
    """Accuracy = exact answers; first_digit = answers whose first digit is right (exact ones included)."""
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r["score"])
    return [dict(zip(keys, g), n=len(s), accuracy=s.count("exact") / len(s), first_digit=1 - s.count("wrong") / len(s))
            for g, s in groups.items()]

def save(args, name, rows=None, fields=FIELDS, fig=None, **results):
    os.makedirs(args.out_dir, exist_ok=True)
    if rows:
        with open(os.path.join(args.out_dir, f"{name}.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, [k for k in fields if k in rows[0]], extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
    with open(os.path.join(args.out_dir, f"{name}.json"), "w") as f:
        json.dump(dict(run_info=run_info(args.seed), args=vars(args), **results), f, indent=1)
    if fig is not None:
        fig.savefig(os.path.join(args.out_dir, f"{name}.png"), dpi=120)

def figure(n=1):
    from matplotlib.figure import Figure  # no pyplot: no global state, no display
    fig = Figure(figsize=(5 * n + 1, 4), layout="tight")
    return fig, fig.subplots(1, n, squeeze=False)[0]

def report(args, rows, models):
    if args.mode == "needle":  # Fig. 6: depth x context size, one panel per model
        acc, (fig, axes) = cells(rows, ["model", "context", "depth"]), figure(len(models))
        a = {(c["model"], c["context"], c["depth"]): c["accuracy"] for c in acc}
        for ax, m in zip(axes, models):
            grid = np.array([[a[m, L, d] for L in args.context_sizes] for d in args.depths])
            fig.colorbar(ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto"), ax=ax, label="accuracy")
            ax.set(title=m, xlabel="context size", ylabel="depth (%)", xticks=range(len(args.context_sizes)),
                   xticklabels=args.context_sizes, yticks=range(len(args.depths)), yticklabels=args.depths)
            for (i, j), v in np.ndenumerate(grid):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8)
        return save(args, "needle", rows, FIELDS, fig, cells=acc)
    if args.mode == "passkey":  # LSSAR Fig. 3: accuracy vs length
        acc, (fig, (ax,)) = cells(rows, ["model", "context"]), figure()
        for m in models:
            ax.plot(args.context_sizes, [c["accuracy"] for c in acc if c["model"] == m], "o-", label=m)
        ax.set(xlabel="context length (tokens)", ylabel="passkey accuracy", ylim=(-0.05, 1.05))
        ax.legend()
        return save(args, "passkey", rows, FIELDS, fig, cells=acc)
    fig7, fig8 = [r for r in rows if r["trial"] == 0], [r for r in rows if r["trial"] > 0]
    heads = [dict(model=r["model"], rank=i + 1, layer=j // r["heads"].size(1), head=j % r["heads"].size(1),
                  score=r["heads"].flatten()[j].item())
             for r in fig7 for i, j in enumerate(r["heads"].flatten().argsort(descending=True).tolist())]
    (f7, (ax7,)), (f8, (ax8,)) = figure(), figure()
    for c, m in enumerate(models):
        top = [h["score"] for h in heads if h["model"] == m][:25]
        ax7.plot(range(1, len(top) + 1), top, "o-", color=f"C{c}", label=m)
        ranked = sorted((r for r in fig8 if r["model"] == m), key=lambda r: -r["top_score"])
        for outcome, marker in MARKERS.items():
            pts = [(k + 1, r["top_score"]) for k, r in enumerate(ranked) if r["score"] == outcome]
            if pts:
                ax8.scatter(*zip(*pts), marker=marker, color=f"C{c}", label=f"{m}: {outcome}")
    ax7.set(xlabel="head rank (top 25)", ylabel="needle score", title=f"context {args.context}, depth {args.depth}%")
    ax8.set(xlabel="trial rank", ylabel="top needle score", title=f"context {args.context}, {args.trials} trials")
    ax7.legend(), ax8.legend(fontsize=7)
    save(args, "needle_score_heads", heads, ["model", "rank", "layer", "head", "score"], f7,
         fig7=[{k: r[k] for k in FIELDS} for r in fig7])
    save(args, "needle_score_trials", fig8, FIELDS, f8, cells=cells(fig8, ["model"]))

# ----------------------------------------------------------------------------------------------------------------

def run(args):
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):  # now, not after the models ran
        raise DataError(f"--out_dir {args.out_dir!r} is a file, expected a folder for the results")
    enc = prepare_data.get_tokenizer()
    if args.mode == "sft_data":
        name = "sft_synthetic" if args.synthetic else "sft_squad"
        rng = np.random.default_rng(args.seed)
        examples = (synthetic_examples(enc, load_hay(args.data, "train"), args.synthetic, args.sft_length, rng)
                    if args.synthetic else squad_examples(args.squad))
        examples = list(tqdm(examples, desc=name, unit="ex", total=args.synthetic or None))
        path = os.path.join(args.out_dir, f"{name}.jsonl")
        save(args, name, examples=len(examples), jsonl=path)
        with open(path, "w") as f:
            f.writelines(json.dumps(ex) + "\n" for ex in examples)
        return print(f"{path}: {len(examples):,} examples")
    if not args.ckpt:
        raise DataError(f"mode {args.mode} needs --ckpt")
    for path in args.ckpt:  # every checkpoint read (its pickle; tensors mapped, not read) before the first model runs
        read_checkpoint(path, mmap=True)
    hay = None if args.mode == "passkey" else load_hay(args.data, "val")
    contexts = [args.context] if args.mode == "score" else args.context_sizes
    prompts = lambda L: trials(args, enc, hay, L, np.random.default_rng([args.seed, L]))  # the same for every model
    for L in contexts:
        next(prompts(L))  # a context too short fails now, before any checkpoint is loaded
    n = 1 + args.trials if args.mode == "score" else args.samples * (len(args.depths) if args.mode == "needle" else 1)
    rows, models = [], [os.path.dirname(c) or c if os.path.basename(c) == "ckpt.pt" else c for c in args.ckpt]
    for k, (path, label) in enumerate(zip(args.ckpt, models)):
        model = load_checkpoint(path, args.device, backend=args.backend)[0].eval()
        with tqdm(total=n * len(contexts), desc=label, unit="prompt") as bar:
            for L in contexts:
                model.extend_rope(args.rope_method, args.rope_scale, L)
                rows += evaluate(model, label, prompts(L), args, enc, bar)
        report(args, rows, models[:k + 1])  # after every model: a later checkpoint that fails keeps these results
    if args.wandb:
        tracking.log_table(args.wandb_project, f"needle {args.mode}", rows, args.out_dir)
    print(f"results in {args.out_dir}")

def main(argv=None):
    p = argparse.ArgumentParser(description="Needle-in-a-haystack, passkey, needle scores, retrieval SFT data.")
    p.error = lambda message: sys.exit(f"error: {message}")  # one line, no usage dump
    p.add_argument("mode", nargs="?", choices=MODES)
    p.add_argument("--mode", dest="mode_opt", choices=MODES, help="the same as the positional mode")
    p.add_argument("--ckpt", nargs="+", default=[], help="one or more checkpoints, compared in every plot")
    p.add_argument("--data", default="data/shakespeare", help="prepared dataset: val = haystacks, train = SFT's")
    p.add_argument("--out_dir", default="out-needle")
    p.add_argument("--context_sizes", type=int, nargs="+", help=f"needle, passkey (default {DEFAULT_CONTEXTS})")
    p.add_argument("--depths", type=int, nargs="+", default=[10, 30, 50, 70, 90], help="needle depths in %%")
    p.add_argument("--samples", type=int, default=100, help="prompts per cell (the SSMax paper: 1000)")
    p.add_argument("--context", type=int, default=8000, help="score: context size of Figs. 7 and 8")
    p.add_argument("--depth", type=int, default=50, help="score: Fig. 7's depth in %%")
    p.add_argument("--trials", type=int, default=100, help="score: Fig. 8's random trials")
    p.add_argument("--rope_method", choices=ROPE_METHODS, default="theta")
    p.add_argument("--rope_scale", type=float, default=50.0)
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
    args.mode = args.mode or args.mode_opt or p.error(f"give a mode: one of {', '.join(MODES)}")
    args.context_sizes = args.context_sizes or DEFAULT_CONTEXTS.get(args.mode)
    bad = [f"--{k} {getattr(args, k)}" for k in ("samples", "trials", "batch_size", "max_new_tokens", "context",
                                                  "sft_length") if getattr(args, k) < 1]
    bad += [f"--synthetic {args.synthetic}"] * (args.synthetic < 0) + [f"--seed {args.seed}"] * (args.seed < 0)
    bad += [f"--rope_scale {args.rope_scale}"] * (not 0 < args.rope_scale < math.inf)  # `not <` refuses nan too
    if bad or not all(0 <= d <= 100 for d in args.depths + [args.depth]):
        p.error(f"{' '.join(bad) or '--depths/--depth'}: counts and sizes must be >= 1, --synthetic and --seed >= 0, "
                "--rope_scale > 0 and finite, depths in 0..100")
    try:
        run(args)
    except (DataError, CheckpointError, FileNotFoundError, tracking.TrackingError) as e:
        sys.exit(f"error: {e}")

if __name__ == "__main__":
    main()
