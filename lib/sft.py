"""
Supervised fine-tuning's data in training (train.py's sft_data): the {"prompt", "answer"} lines that needle.py sft_data
(lib/retrieval.py) or anyone writes, read back as token ids, split into training and held-out examples, batched with
the loss on the answer only, drawn in seeded epochs, and the schedule in epochs; the file's sha256 a resume checks,
and the codec needle.py wrote it in (its sidecar) against the model's.
"""
import json, math, os, sys
from dataclasses import replace

import numpy as np
import torch

from lib import vocab
from lib.dataset import DataError, sha256  # DataError: bad input, shown in one line
from lib.provenance import kept_identity, splits_kept


def check_sft_path(path):  # train.py asks first: its CPU cost check would count the default max_iters; "": no SFT
    if path and not os.path.isfile(path):
        raise DataError(f"sft_data {path!r} " + ("is a directory, expected a .jsonl file" if os.path.isdir(path) else
                        "does not exist") + " (`python needle.py sft_data` writes one)")

def load_sft(path, block_size, enc=None):
    """{"prompt", "answer"} lines -> [(ids, n_prompt)]: prompt + answer + <|endoftext|> in at most block_size + 1
    tokens of enc (default GPT-2's BPE; a character model's codec for its own), the prompt cropped on the left so
    that the answer stays (an over-long answer keeps its beginning), after the model's start of text (vocab.bos: an
    import's <s>, as its evaluation prompts have it)."""
    check_sft_path(path)
    try:
        rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
        prompts, answers = [r["prompt"] for r in rows], [r["answer"] for r in rows]
        assert rows and all(isinstance(s, str) for s in prompts + answers)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise DataError(f"{path}: every line must be a JSON object {{\"prompt\": str, \"answer\": str}}")
    enc, examples, cropped = enc or vocab.get_tokenizer(), [], []
    answers = ([vocab.continuation(enc, a) for a in answers] if isinstance(enc, vocab.HFCodec) else
               enc.encode_ordinary_batch(answers))  # an answer continues its prompt: no "▁" of a text's own start
    first = vocab.bos(enc)
    for p, a in zip(enc.encode_ordinary_batch(prompts), answers):
        a = (a + [enc.eot_token])[:block_size + 1 - len(first)]
        cut = max(0, len(p) - (block_size + 1 - len(first) - len(a)))
        cropped += [cut] * (cut > 0)
        p = first + p[cut:]
        examples.append((np.array(p + a, dtype=np.int64), len(p)))
    if cropped:  # the crop may take the passage or the needle the answer comes from: never silently
        print(f"warning: {path}: {len(cropped):,} of {len(examples):,} SFT prompts do not fit block_size {block_size} "
              f"with their answer and lose up to {max(cropped):,} tokens on the left (the text the answer may come "
              f"from); write them at this length (needle.py sft_data --sft_length {block_size})", file=sys.stderr)
    return examples


def sft_data(cfg, ckpt, resuming):
    """train.py's SFT data: (train, val) examples in the model's codec (its checkpoint's; none: GPT-2's BPE), that
    codec's record (None from scratch), and what data_state keeps: the file's sha256 (sft_identity) and the splits'
    its model was pretrained on (the dataset its config records: the evals' data_provenance)."""
    enc = vocab.checkpoint_codec(ckpt) if ckpt else None
    record = vocab.record(enc)  # enc None: GPT-2's (an HF codec's hashes its tokenizer.json: once)
    check_codec(cfg.sft_data, record)
    examples = split_sft(load_sft(cfg.sft_data, cfg.block_size, enc), cfg.sft_val_frac, cfg.seed)
    state = {**splits_kept((ckpt or {}).get("data_state")),  # the splits it was pretrained on
             "sft_sha256": sft_identity(cfg.sft_data, ckpt if resuming else None)}
    return examples, record if enc else None, state


def sidecar_codec(enc):
    """What needle.py sft_data's sidecar (<stem>.json beside the .jsonl) records of the codec it wrote in: its
    record, less the characters or tokenizer.json (the sha256 names them)."""
    return {k: v for k, v in vocab.record(enc).items() if k not in ("itos", "json")}


def check_codec(path, model):
    """DataError where needle.py sft_data wrote path for a dataset of another codec than the model's (model: its
    record): a character set's synthetic needles, their numbers spelled in its symbols, would train a model of another
    as other tokens. The sidecar names that codec (sidecar_codec; an older one, only its --data: that folder's); a
    file without one (one's own .jsonl) or of SQuAD's text (no codec's) is read as it is."""
    side = os.path.splitext(path)[0] + ".json"
    try:
        with open(side, encoding="utf-8") as f:
            meta = json.load(f)
        data = meta["args"]["data"] if meta["args"]["mode"] == "sft_data" and meta["args"]["synthetic"] else None
    except (OSError, ValueError, KeyError, TypeError):  # not needle.py's sidecar
        return
    data_rec = data and (meta.get("codec") or (vocab.data_record(data) if os.path.isdir(data) else None))
    if data_rec and data_rec.get("sha256") != model["sha256"]:
        raise DataError(f"sft_data {path!r} was written by needle.py sft_data for --data {data} (its {side}) in "
                        f"another vocabulary than the model's: the file's is {vocab.describe(data_rec)}, the "
                        f"model's {vocab.describe(model)}; write it again with --data <the model's dataset>")


def sft_identity(path, ckpt=None):
    """The sha256 of the SFT file a run trains on, checked against a resume's checkpoint (kept_identity): a file
    changed since (block_size, sft_val_frac and seed, the rest of what makes its examples, are in the config) would
    train it on other examples and judge best.pt on another val set."""
    return kept_identity(sha256(path), ckpt, "sft_sha256", (
        f"sft_data {path!r} changed since this run trained on it (its sha256 differs from the checkpoint's): resuming "
        f"would train on other examples and judge best.pt on another val set; restore the file as it was; a new run "
        f"from the checkpoint (init_from=<its ckpt.pt>) is no clean way out: its val examples would be the new "
        f"file's, some maybe trained on"))


def held_out(n, frac):
    """How many of n SFT examples split_sft holds out for val: a share frac, at least one; frac 0: none."""
    return max(1, round(frac * n)) if frac > 0 else 0


def split_sft(examples, frac, seed):
    """(train, val), each in file order: a seeded share frac of the examples held out for val; frac 0 holds out none,
    and val is the training examples (their loss, no held-out one: the first eval said so only by equal losses)."""
    n_val = held_out(len(examples), frac)
    if n_val >= len(examples) > 0:
        raise DataError(f"sft_val_frac={frac} holds out all {len(examples)} SFT example(s): give more, or "
                        f"sft_val_frac=0 (val is then the training examples)")
    val = set(np.random.default_rng(seed).permutation(len(examples))[:n_val].tolist())
    if not val:
        return examples, examples
    return [e for i, e in enumerate(examples) if i not in val], [e for i, e in enumerate(examples) if i in val]


def sft_schedule(cfg, n_examples):
    """SFT with sft_epochs > 0: the paper's schedule is in epochs of the n training examples, so max_iters =
    lr_decay_iters = that many epochs and warmup_iters = one epoch, in iterations of gradient_accumulation_steps x
    batch_size examples."""
    if cfg.sft_epochs <= 0:
        return cfg
    epoch = math.ceil(n_examples / (cfg.gradient_accumulation_steps * cfg.batch_size))
    return replace(cfg, max_iters=cfg.sft_epochs * epoch, lr_decay_iters=cfg.sft_epochs * epoch, warmup_iters=epoch)


def planned_iters(cfg):
    """The max_iters a run will have: an SFT run in epochs (its file there) counts them from its held-in examples."""
    if not (cfg.sft_data and cfg.sft_epochs > 0 and os.path.isfile(cfg.sft_data)):
        return cfg.max_iters
    examples = sum(1 for line in open(cfg.sft_data, encoding="utf-8") if line.strip())
    return sft_schedule(cfg, examples - held_out(examples, cfg.sft_val_frac)).max_iters


def sft_batch(examples, ix, T):
    x = torch.zeros((len(ix), T), dtype=torch.long)  # padding (any id: it follows the example), targets -1
    y = torch.full((len(ix), T), -1, dtype=torch.long)
    for b, i in enumerate(ix.tolist()):
        ids, n_prompt = examples[i]
        x[b, :len(ids) - 1], y[b, :len(ids) - 1] = torch.from_numpy(ids[:-1]), torch.from_numpy(ids[1:])
        y[b, :max(n_prompt - 1, 0)] = -1  # t predicts t + 1: no loss on prompt tokens
    return x, y


def sft_order(seed, it, n, m):
    """The n example indices of training step it: epochs of seeded shuffles of the m examples (example k of the
    stream is in epoch k // m), so a resumed run draws what an unstopped one would."""
    k = torch.arange(it * n, (it + 1) * n)
    return torch.cat([torch.randperm(m, generator=torch.Generator().manual_seed(seed + int(e)))[k[k // m == e] % m]
                      for e in (k // m).unique()])
