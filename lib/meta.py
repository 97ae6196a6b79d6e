"""
A prepared dataset's record, data/<name>/meta.json (lib/dataset.py writes it), read and checked before anything
reads the dataset's splits: a malformed meta.json (not an object, an unknown tokenizer, char without its characters,
hf without its tokenizer.json, an unknown dtype) or a .bin whose size disagrees with it (truncated, a cut id, empty)
is one DataError naming the file and the command that re-prepares it, never a traceback or a silent guess.
"""
import json, os, shlex

import numpy as np

from lib.corpora import EMBEDDED, NAMED, DataError

SPLITS = ("train", "val")
KINDS = ("gpt2", "char", "hf")  # the tokenizers a meta.json names; none named: gpt2 (older datasets)
DTYPES = ("uint16", "uint32")  # the ids' types prepare writes

def remedy(data_dir, source=None):
    """The command that re-prepares data_dir (source: meta.json's, where known)."""
    data_dir = os.path.normpath(data_dir)
    name = os.path.basename(data_dir)
    source = name if name in NAMED else source or (name if name in EMBEDDED else "SOURCE")
    return (f"re-prepare it with `python prepare_data.py {shlex.quote(source)} --name {name} "
            f"--out_dir {os.path.dirname(data_dir) or '.'}`")

def read_meta(data_dir):
    """data_dir's meta.json, checked, or None where there is none (another tool's .bin files: GPT-2's, as
    nanoGPT's); else DataError."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is unreadable ({type(e).__name__}); {remedy(data_dir)}")
    if not isinstance(meta, dict):
        raise DataError(f"{path} holds a JSON {type(meta).__name__}, not an object; {remedy(data_dir)}")
    problem = meta_problem(data_dir, meta)
    if problem:
        raise DataError(f"{path} {problem}; {remedy(data_dir, meta.get('source'))}")
    return meta

def id_dtype(meta):
    """The ids' type on disk: meta.json's (uint32 for a vocabulary past 65,535 ids), else uint16 (nanoGPT's)."""
    return np.dtype((meta or {}).get("dtype", DTYPES[0]))

def meta_problem(data_dir, meta):
    """What of meta.json its readers cannot take (each read would fail deep inside, or guess GPT-2), else None."""
    kind, dtype = meta.get("tokenizer", KINDS[0]), meta.get("dtype", DTYPES[0])
    if kind not in KINDS:
        return f"names tokenizer {kind!r}, which this code does not read ({', '.join(KINDS)})"
    if kind == "char" and not (isinstance(meta.get("itos"), list) and meta["itos"]):
        return "names tokenizer 'char' but holds no character list (itos)"
    if kind == "hf" and not all(isinstance(meta.get(k), int) for k in ("vocab_size", "eot_token")):
        return "names tokenizer 'hf' but holds no vocab_size or eot_token"
    if kind == "hf" and not os.path.isfile(os.path.join(data_dir, "tokenizer.json")):
        return "names tokenizer 'hf', but no tokenizer.json is beside it"
    if dtype not in DTYPES:
        return f"names dtype {dtype!r}, not one of {', '.join(DTYPES)}"
    tokens = meta.get("tokens")  # an older or hand-made meta.json may lack it (check_prepared needs it)
    if tokens is not None and not (isinstance(tokens, dict) and all(isinstance(tokens.get(s), int) for s in SPLITS)):
        return f"records tokens {tokens!r}, not a count of each split's ({', '.join(SPLITS)})"
    return None

def check_split(data_dir, split, meta):
    """DataError unless split's .bin (it exists) fits meta.json (read_meta's; None: GPT-2's uint16 ids): the tokens
    it records, else a whole number of ids, at least one. A truncated or cut file is never read in part."""
    path = os.path.join(data_dir, f"{split}.bin")
    width, size = id_dtype(meta).itemsize, os.path.getsize(path)
    tokens = ((meta or {}).get("tokens") or {}).get(split)
    if tokens is not None and size != width * tokens:
        problem = (f"is {'truncated' if size < width * tokens else 'too long'}: {size // width:,} tokens on disk vs "
                   f"{tokens:,} in meta.json")
    elif size == 0 or size % width:
        problem = "is empty" if size == 0 else f"is {size:,} bytes, not a whole number of {width}-byte ids"
    else:
        return
    raise DataError(f"{path} {problem}; {remedy(data_dir, (meta or {}).get('source'))}")

def check_prepared(data_dir):
    """None if train.bin and val.bin have the sizes meta.json records, else DataError: the file, what is wrong, the
    command that re-prepares it. train.py calls it before training, and re-prepares a dataset named in EMBEDDED."""
    data_dir = os.path.normpath(data_dir)
    for f in ("train.bin", "val.bin", "meta.json"):  # meta.json is last: without it, unfinished
        if not os.path.isfile(os.path.join(data_dir, f)):
            raise DataError(f"{os.path.join(data_dir, f)} is missing; {remedy(data_dir)}")
    meta = read_meta(data_dir)
    if "tokens" not in meta:
        raise DataError(f"{os.path.join(data_dir, 'meta.json')} records no tokens of its splits; "
                        f"{remedy(data_dir, meta.get('source'))}")
    for s in SPLITS:
        check_split(data_dir, s, meta)
