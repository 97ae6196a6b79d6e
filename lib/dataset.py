"""
The datasets' library: a corpus tokenized (GPT-2's BPE or characters: lib/vocab.py) into
data/<name>/{train,val}.bin + meta.json (prepare), a dataset made on first use (fetch), and its readers (load_split,
unigram_entropy; meta.py checks them). prepare_data.py is its command line; the sources are corpora.py's.
"""
import contextlib, glob, hashlib, itertools, json, os, random, sys, time

import numpy as np

from lib.corpora import (CHAR, EMBEDDED, FILE_BUILDERS, NAMED, SOURCES_HELP, DataError, default_name, stream_docs,
                         text_sha256)
from lib.folders import held, replace_synced, sync
from lib.meta import SPLITS, check_prepared, check_split, id_dtype, read_meta
from lib.vocab import EOT_TEXT, TOKENIZERS, CharCodec, HFCodec, data_record, get_tokenizer, hf_codec, record

# -----------------------------------------------------------------------------
# prepare: documents -> tokens -> train.bin / val.bin / meta.json

def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()

def load_split(data_dir, split, inode=None):
    """The split's ids, memory-mapped, its size checked against meta.json (meta.check_split); inode: the file's at a
    run's start, checked then (a file prepared anew since is DataError: a run reads one dataset, never a mix)."""
    assert split in SPLITS, f"split must be one of {SPLITS}, got {split!r}"
    path = os.path.join(data_dir, f"{split}.bin")
    if not os.path.isfile(path):
        raise DataError(f"dataset {data_dir!r} has no {split}.bin: prepare one (python prepare_data.py shakespeare)")
    if inode is not None and os.stat(path).st_ino != inode:
        raise DataError(f"{path} was prepared anew while this run read it: the run stops rather than train on two "
                        f"datasets (a resume would go on with the new one)")
    meta = read_meta(data_dir)  # DataError if malformed
    if inode is None:  # a run's batches (inode) read the file its start checked: not again at each batch
        check_split(data_dir, split, meta)  # never a truncated split read in part, nor numpy's ValueError
    return np.memmap(path, dtype=id_dtype(meta), mode="r")  # reads only the pages a batch touches

def load_tokens(data_dir, split, L, vocab_size):
    """A split that holds at least one evaluation window of L+1 tokens (eval_long.py, eval_rows.py), each id below
    vocab_size (the models' smallest vocabulary)."""
    data = load_split(data_dir, split)  # DataError if it is missing
    if len(data) < L + 1:
        raise ValueError(f"{os.path.join(data_dir, f'{split}.bin')} has {len(data):,} tokens, fewer than the "
                         f"--length + 1 = {L + 1:,} one sequence needs")
    check_ids(data_dir, split, vocab_size)
    return data

def check_ids(data_dir, split, vocab_size, chunk=1 << 24):
    """DataError if a split holds an id >= vocab_size (a damaged .bin, another tokenizer's, an edited meta.json), which
    the model's embedding would meet deep inside, mid-run. Reads the split once, a chunk at a time."""
    tokens = load_split(data_dir, split)
    for i in range(0, len(tokens), chunk):
        part = tokens[i:i + chunk]
        if len(part) and int(part.max()) >= vocab_size:
            at = i + int(np.argmax(part >= vocab_size))
            raise DataError(f"{os.path.join(data_dir, f'{split}.bin')} holds id {int(tokens[at]):,} at token {at:,}, "
                            f"not below the model's vocabulary of {vocab_size:,}: a damaged file or another "
                            f"tokenizer's; re-prepare the dataset")

def draw_starts(n_tokens, L, num_seqs, seed, disjoint=False):
    """Start offsets of num_seqs windows of L+1 tokens; the same for every checkpoint of a run. Drawn with
    replacement, windows may share tokens (overlapping_pairs counts them); disjoint: num_seqs distinct slots of L+1
    tokens (at one random shift), no token in two windows, so a sequence is an independent text for the statistics."""
    rng = np.random.default_rng(seed)
    if not disjoint:
        return rng.integers(0, n_tokens - L, size=num_seqs)
    slots = n_tokens // (L + 1)
    if num_seqs > slots:
        raise DataError(f"--disjoint: {num_seqs:,} windows of {L + 1:,} tokens need {num_seqs * (L + 1):,} tokens, the "
                        f"split holds {n_tokens:,} ({slots:,} windows): fewer --num_seqs or a shorter --length")
    return rng.choice(slots, num_seqs, replace=False) * (L + 1) + rng.integers(0, n_tokens - slots * (L + 1) + 1)

def overlapping_pairs(starts, L):
    """How many pairs of the windows of L+1 tokens at `starts` share a token (a repeated start is one too)."""
    s = np.sort(np.asarray(starts))
    return int((np.searchsorted(s, s + L, side="right") - np.arange(len(s)) - 1).sum())

def is_up_to_date(data_dir, args):
    try:
        check_prepared(data_dir)  # cheap size check before hashing
        with open(os.path.join(data_dir, "meta.json")) as f:
            meta = json.load(f)
        return meta["args"] == args and all(sha256(os.path.join(data_dir, f"{s}.bin")) == meta["sha256"][s]
                                            for s in SPLITS)
    except (DataError, OSError, ValueError, KeyError):  # missing, half-written or old-format: rebuild
        return False

def prepare(source="shakespeare", name=None, out_dir="data", text_field=None, hf_split="train",
            val_frac=None, seed=None, max_tokens=None, force=False, tokenizer=None):
    """Build data/<name>/{train,val}.bin unless they are up to date; returns the dataset folder. tokenizer: gpt2, or
    char (the default for an embedded NAME_char): every character of the corpus is one id, plus <|endoftext|>.
    seed: the documents' split (default 1337); one given for a single document, split by tokens, is DataError."""
    files = None  # local files only
    tokenizer = tokenizer or ("char" if source.endswith(CHAR) and source in EMBEDDED else "gpt2")
    if tokenizer not in TOKENIZERS and not os.path.exists(tokenizer):
        raise DataError(f"unknown tokenizer {tokenizer!r}: use one of {', '.join(TOKENIZERS)}, or the path of a "
                        f"tokenizer.json, a Hugging Face folder or a checkpoint (convert_hf.py) that holds one")
    hf = None if tokenizer in TOKENIZERS else hf_codec(tokenizer)
    if tokenizer == "char" and (source in NAMED or source.startswith("hf:")):  # its vocabulary needs all the text
        raise DataError(f"tokenizer char reads the whole corpus into memory first: use an embedded corpus or local "
                        f"files, not {source!r}")
    if source in NAMED:  # an explicit name or max_tokens wins
        name, max_tokens = name or source, NAMED[source][1] if max_tokens is None else max_tokens
        source = NAMED[source][0]
    if source not in EMBEDDED and not (source.startswith("hf:") and len(source) > 3):
        if os.path.splitext(source)[1].lower() not in FILE_BUILDERS:
            raise DataError(f"unknown source {source!r}: use {SOURCES_HELP}")
        files = sorted(glob.glob(source, recursive=True))
        if not files:
            raise DataError(f"no files match {source!r}")
    # a small corpus needs a larger val share
    small = source in EMBEDDED or (len(files or []) == 1 and files[0].lower().endswith(".txt"))
    val_frac = (0.1 if small else 0.005) if val_frac is None else val_frac
    if not 0 < val_frac < 1 or (max_tokens is not None and max_tokens < 2):
        raise DataError(f"need 0 < val_frac < 1 and max_tokens >= 2, got val_frac={val_frac}, max_tokens={max_tokens}")
    if name is not None and (name in ("", ".", "..") or "/" in name or os.sep in name):  # else outside out_dir
        raise DataError(f"--name {name!r}: a folder name (no '/'), made under --out_dir {out_dir!r}")
    data_dir = os.path.join(out_dir, name or default_name(source))
    # what decides the content; mtime catches edits
    args = dict(source=source, text_field=text_field, hf_split=hf_split, val_frac=val_frac,
                seed=1337 if seed is None else seed, max_tokens=max_tokens,  # 1337: as meta.json has always recorded
                files=[[os.path.abspath(f), os.path.getsize(f), os.path.getmtime(f)] for f in files or []],
                **({"text_sha256": text_sha256(source)} if source in EMBEDDED else {}),  # an edited corpus: made again
                **({"tokenizer": "char"} if tokenizer == "char" else {}),  # absent for gpt2: older datasets stay valid
                **({"tokenizer": "hf", "tokenizer_sha256": record(hf)["sha256"]} if hf else {}))
    with held(data_dir, "a dataset", wait=True):  # a second process waits, then finds it up to date
        if not force and is_up_to_date(data_dir, args):
            print(f"{data_dir} is up to date")
            return data_dir
        if not force and os.path.isfile(os.path.join(data_dir, "meta.json")):  # its runs' checkpoints may not read it
            print(f"{data_dir} holds a dataset made from other files or settings (meta.json's args): made again")
        try:
            return _build(data_dir, args, source, files, hf or tokenizer, text_field, hf_split, val_frac, seed,
                          max_tokens)
        except BaseException as e:  # a full disk, a bad row, Ctrl-C, any error: no .tmp is left behind ...
            meta = os.path.join(data_dir, "meta.json")
            for f in ("train.bin.tmp", "val.bin.tmp", *["meta.json.tmp"] * os.path.exists(meta)):
                with contextlib.suppress(OSError):  # ... but a cut build's meta.json.tmp, which fetch refuses
                    os.remove(os.path.join(data_dir, f))
            if not isinstance(e, OSError):
                raise
            raise DataError(f"cannot write {e.filename or data_dir}: {e.strerror or e}") from None


def _build(data_dir, args, source, files, tokenizer, text_field, hf_split, val_frac, seed, max_tokens):
    """prepare's work, in temp files until each is whole: the documents tokenized, split, written; meta.json last."""
    from tqdm import tqdm  # lazy: .bin readers need not have it
    t0, rng = time.time(), random.Random(args["seed"])
    if source in EMBEDDED:
        docs = [d for d in EMBEDDED[source]() if d.strip()]
        # whole documents to val, at least one
        val_docs = set(rng.sample(range(len(docs)), max(1, round(val_frac * len(docs))))) if docs else set()
        is_val, field, rule = (lambda i: i in val_docs), None, f"seeded shuffle of documents, {len(val_docs)} to val"
    else:  # unknown length: a coin flip per document
        docs, field = stream_docs(source, files, text_field, hf_split)
        docs = (d for d in docs if d.strip())
        is_val, rule = (lambda i: rng.random() < val_frac), "each document to val with probability val_frac"
    enc = tokenizer if isinstance(tokenizer, HFCodec) else get_tokenizer()  # an imported model's, or GPT-2's
    if tokenizer == "char":  # the corpus's characters, sorted (nanoGPT), then <|endoftext|>
        docs = list(docs)
        enc = CharCodec(sorted(set().union(*map(set, docs))) + [EOT_TEXT])
    dtype = np.uint16 if enc.n_vocab <= 1 << 16 else np.uint32  # Llama 3's 128,256 ids need 4 bytes

    made, d = [], data_dir  # folders made here, removed if no document
    while d and not os.path.isdir(d):
        made, d = made + [d], os.path.dirname(d)
    os.makedirs(data_dir, exist_ok=True)
    paths = {s: os.path.join(data_dir, f"{s}.bin") for s in SPLITS}
    tokens, n_docs = dict.fromkeys(SPLITS, 0), dict.fromkeys(SPLITS, 0)
    pending, used, i = None, 0, 0  # held back: the last may fill an empty split
    # .tmp until complete: no partial .bin looks whole
    with (open(paths["train"] + ".tmp", "wb") as f_train, open(paths["val"] + ".tmp", "wb") as f_val,
          tqdm(total=max_tokens, unit="tok", unit_scale=True, desc=f"tokenizing {source}", disable=None) as bar):
        def write(split, ids):
            np.asarray(ids, dtype=dtype).tofile(f_train if split == "train" else f_val)
            tokens[split] += len(ids)
            n_docs[split] += 1
        docs = iter(docs)
        batches = iter(lambda: list(itertools.islice(docs, 256)), [])  # batches let tiktoken use its threads
        # a literal "<|endoftext|>" in text is no separator
        for ids in itertools.chain.from_iterable(enc.encode_ordinary_batch(b) for b in batches):
            ids.append(enc.eot_token)
            full = max_tokens is not None and used + len(ids) >= max_tokens
            if full:  # cut the last document: the budget is exact
                ids = ids[:max_tokens - used - 1] + [enc.eot_token]
            if len(ids) == 1:  # no room left for any text, or a document the tokenizer drops whole: skip it
                if full:
                    break
                continue
            if pending:
                write(*pending)
            pending = ("val" if is_val(i) else "train", ids)
            used, i = used + len(ids), i + 1
            bar.update(len(ids))
            if full:
                break
        if i == 1:  # one document (a .txt file, a one-row .jsonl): split by tokens
            body = pending[1][:-1][:None if max_tokens is None else max_tokens - 2]  # two <|endoftext|>: exact
            n_val = round(val_frac * len(body))
            if 0 < n_val < len(body):
                write("train", body[:-n_val] + [enc.eot_token])
                write("val", body[-n_val:] + [enc.eot_token])
                rule = f"one document, split by tokens: its last {n_val:,} tokens (val_frac) to val"
        elif pending:  # the last document fills an empty split
            write("val" if n_docs["val"] == 0 else "train" if n_docs["train"] == 0 else pending[0], pending[1])
            if source in EMBEDDED:  # what was written: a token budget keeps only the first documents
                rule = f"seeded shuffle of documents, {n_docs['val']} of {i} to val"
    if n_docs["train"] == 0 or (i == 1 and seed is not None):  # a seed given for one document drew nothing
        for p in paths.values():
            os.remove(p + ".tmp")
        for d in made:
            os.rmdir(d)
        if n_docs["train"]:
            raise DataError(f"--seed {seed}: not read ({source!r} is one document, split by tokens, its last val_frac "
                            f"to val, not shuffled)")
        raise DataError(f"{source!r} is one document of {len(body)} tokens, too short to split by tokens into train "
                        f"and val (val_frac={val_frac})" if i else f"{source!r} gave 0 non-empty documents")

    vocab = dict(itos=enc.itos, stoi=enc.stoi) if tokenizer == "char" else {}
    kind = "hf" if isinstance(enc, HFCodec) else tokenizer
    meta = dict(tokenizer=kind, vocab_size=enc.n_vocab, eot_token=enc.eot_token, dtype=np.dtype(dtype).name,
                source=source, text_field=field, split_rule=rule, seed=args["seed"], val_frac=val_frac, tokens=tokens,
                documents=n_docs, sha256={s: sha256(p + ".tmp") for s, p in paths.items()},
                created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), command=" ".join(sys.argv), args=args, **vocab)
    # everything written and hashed before the first rename: a kill or a full disk leaves meta.json.tmp, which fetch
    # refuses, never .bin files without meta.json that it would take for another tool's GPT-2 files
    with open(os.path.join(data_dir, "meta.json.tmp"), "w") as f:
        json.dump(meta, f, indent=1)
    if os.path.exists(os.path.join(data_dir, "meta.json")):  # an old meta.json must not vouch for new files
        os.remove(os.path.join(data_dir, "meta.json"))
    if isinstance(enc, HFCodec):  # beside the data: its meta.json stays small
        with open(os.path.join(data_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(enc.text)
        sync(os.path.join(data_dir, "tokenizer.json"))
    names = [*paths.values(), os.path.join(data_dir, "meta.json")]  # meta.json last: it vouches for the rest
    replace_synced([name + ".tmp" for name in names], names)  # a power loss never leaves it over unwritten data
    print(f"{data_dir}: train {tokens['train']:,} tokens ({n_docs['train']} docs), "
          f"val {tokens['val']:,} tokens ({n_docs['val']} docs) in {time.time() - t0:.1f}s")
    return data_dir

def fetch(name, out_dir="data", make=True):
    """train.py's dataset=NAME -> its folder, both splits whole as meta.json records them (a truncated train.bin is
    never trained on silently). One of EMBEDDED or NAMED is prepared on first use, and again when broken (a killed
    fetch starts over), where make is set (DDP: rank 0 makes it, the others wait for it)."""
    data_dir = os.path.join(out_dir, name)
    if make and name in EMBEDDED:  # up to date with its text, not only whole (nor a folder of another source's)
        return prepare(name, out_dir=out_dir)
    try:
        check_prepared(data_dir)
    except DataError:
        if name in NAMED or name in EMBEDDED:
            if make:  # NAMED: an EMBEDDED one was made above
                print(f"{name}: first use, streaming {NAMED[name][1]:,} tokens of {NAMED[name][0]} into {data_dir}")
                prepare(name, out_dir=out_dir)
        elif not os.path.isdir(data_dir):
            raise DataError(f"dataset {data_dir!r} not found: prepare it with `python prepare_data.py SOURCE --name "
                            f"{name} --out_dir {out_dir}`")
        elif any(os.path.exists(os.path.join(data_dir, m)) for m in ("meta.json", "meta.json.tmp")) or not all(
                os.path.isfile(os.path.join(data_dir, f"{s}.bin")) for s in SPLITS):
            raise  # meta.json.tmp: this tool's build, cut short
        else:  # another tool's .bin files, unchecked (nanoGPT's meta.pkl is refused)
            data_record(data_dir)
    return data_dir

def unigram_entropy(data_dir, max_tokens=10_000_000):
    """Entropy (nats) of train's token frequencies over its first max_tokens: the loss of a model that ignores the
    context."""
    ids = load_split(data_dir, "train")[:max_tokens]
    prob = np.bincount(ids) / len(ids)
    return float(-(prob[prob > 0] * np.log(prob[prob > 0])).sum())
