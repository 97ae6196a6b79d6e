"""prepare_data.py: the offline GPT-2 tokenizer, the embedded corpus (whole documents split, idempotence), the sources'
texts (Gutenberg markers, a KJV book's verses) and default names, and the helpers test_prepare_data_files.py and
test_prepare_data_checks.py import."""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import prepare_data
from lib import corpora
from lib import dataset as pdata
from lib import vocab

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EOT = 50256

def split_docs(tokens):
    """uint16 tokens -> list of documents (tuples of ids), each of which must end with <|endoftext|>."""
    assert len(tokens) > 0 and tokens[-1] == EOT
    ends = np.flatnonzero(tokens == EOT)
    return [tuple(d) for d in np.split(np.asarray(tokens), ends + 1)[:-1]]

def read_all(data_dir):
    with open(os.path.join(data_dir, "meta.json")) as f:
        meta = json.load(f)
    return meta, {s: np.fromfile(os.path.join(data_dir, f"{s}.bin"), dtype=np.uint16) for s in pdata.SPLITS}

def mtimes(data_dir):
    return {f: os.stat(os.path.join(data_dir, f)).st_mtime_ns for f in ("train.bin", "val.bin", "meta.json")}

def write_jsonl(path, n=60):
    with open(path, "w") as f:
        for i in range(n):  # "url" is the first string column; "content" must still be chosen
            row = {"url": f"https://example.org/{i}", "id": i, "content": f"Document {i}: " + "words " * (i % 7 + 3)}
            f.write(json.dumps(row) + "\n")

# -----------------------------------------------------------------------------
# tokenizer

def test_tokenizer_is_gpt2_offline(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError("network disabled in this test")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty_cache"))
    enc = vocab.get_tokenizer.__wrapped__()  # built afresh, not the process-wide cached one
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.eot_token == EOT and enc.n_vocab == 50257
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT]
    text = "To be, or not to be, that is the question:\n\tWhether 'tis nobler in the mind — 1603 ünïcödé 🎭\n\n"
    assert enc.decode(enc.encode_ordinary(text)) == text
    assert vocab.get_tokenizer().encode("Hello world") == [15496, 995]

def test_import_has_no_side_effects(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"}
    code = (f"import sys, os; sys.path.insert(0, {REPO_DIR!r}); import prepare_data; "
            "assert 'TIKTOKEN_CACHE_DIR' not in os.environ")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True, timeout=60)
    assert os.listdir(tmp_path) == []

# -----------------------------------------------------------------------------
# the embedded default corpus

@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    return pdata.prepare("shakespeare", out_dir=str(tmp_path_factory.mktemp("data")))

def test_shakespeare_files_and_meta(shakespeare):
    assert os.path.basename(shakespeare) == "shakespeare"
    meta, toks = read_all(shakespeare)
    for s in pdata.SPLITS:
        assert toks[s].dtype == np.uint16 and len(toks[s]) > 0 and toks[s].max() < 50257
        assert meta["tokens"][s] == len(toks[s]) == os.path.getsize(os.path.join(shakespeare, f"{s}.bin")) // 2
        assert meta["documents"][s] == int((toks[s] == EOT).sum())  # one <|endoftext|> after each document
        assert np.array_equal(pdata.load_split(shakespeare, s), toks[s])
    assert meta["tokens"]["train"] >= 1_000_000
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257 and meta["eot_token"] == EOT
    assert meta["documents"]["train"] + meta["documents"]["val"] == 42  # plays and poems, no First Folio copies
    assert not any(f.endswith(".tmp") for f in os.listdir(shakespeare))

def test_shakespeare_split_is_by_whole_documents(shakespeare):
    _, toks = read_all(shakespeare)
    train, val = split_docs(toks["train"]), split_docs(toks["val"])
    assert all(len(d) > 1 for d in train + val)  # no empty documents
    assert not set(train) & set(val)
    enc = vocab.get_tokenizer()
    # every document decodes to exactly one source work, and every work is present once
    assert sorted(enc.decode(list(d[:-1])) for d in train + val) == sorted(corpora.shakespeare_docs())

def test_second_run_is_up_to_date(shakespeare, capsys):
    before = mtimes(shakespeare)
    prepare_data.main(["--source", "shakespeare", "--out_dir", os.path.dirname(shakespeare)])
    assert "up to date" in capsys.readouterr().out
    assert mtimes(shakespeare) == before

def test_kjv_one_document_per_book():
    docs = corpora.kjv_docs()
    assert len(docs) == 66  # a book is its verses joined by one space
    assert docs[0].startswith("In the beginning God created the heaven and the earth. And the earth was without form")

def test_english_is_every_embedded_text_together():
    english = corpora.EMBEDDED["english"]()
    assert english == corpora.shakespeare_docs() + corpora.kjv_docs() and len(english) > 100

def test_a_gutenberg_text_keeps_only_what_lies_between_its_start_and_first_end_marker():
    text = ("Header and licence\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\nThe play.\n"
            "*** END OF THE PROJECT GUTENBERG EBOOK X ***\nThe licence, quoting *** END OF THE LICENCE")
    assert corpora.strip_gutenberg(text) == "The play."
    assert corpora.strip_gutenberg("\n  No markers: the shipped texts.\n") == "No markers: the shipped texts."

def test_a_glob_is_named_after_its_folder_and_a_file_after_its_stem():
    assert corpora.default_name("corpus/part-[0-9].jsonl") == corpora.default_name("corpus/*.jsonl") == "corpus"
    assert corpora.default_name("My Notes.txt") == "my-notes"
    assert corpora.default_name("hf:HuggingFaceFW/fineweb-edu:sample-10BT") == "fineweb-edu-sample-10bt"
