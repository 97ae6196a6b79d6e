"""prepare's rules on tiny corpora: an embedded corpus sends round(val_frac x documents) whole documents to val, a
streamed one defaults to val_frac 0.005, a token budget that ends on a document's end keeps exactly those documents,
only an embedded NAME_char means characters; a .bin grown or edited since meta.json is refused or rebuilt, never
trusted."""
import json
import os

import pytest

from lib import corpora
from lib import dataset as pdata
from lib import vocab
from lib.dataset import DataError
from test_prepare_data import EOT, read_all, split_docs

DOCS = [f"Document {i}: " + "words " * (i % 5 + 2) for i in range(17)]


@pytest.fixture
def tiny(monkeypatch):
    """"tiny": an embedded corpus of 17 short documents (prepare's embedded path, without Shakespeare's 1.4M)."""
    monkeypatch.setitem(corpora.EMBEDDED, "tiny", lambda: list(DOCS))
    return "tiny"


def test_an_embedded_corpus_sends_val_frac_of_its_documents_rounded_to_val(tiny, tmp_path):
    meta, toks = read_all(pdata.prepare(tiny, out_dir=str(tmp_path)))
    assert meta["val_frac"] == 0.1 and meta["documents"] == {"train": 15, "val": 2}  # round(1.7), not int(1.7)
    enc = vocab.get_tokenizer()
    assert sorted(enc.decode(list(d[:-1])) for s in pdata.SPLITS for d in split_docs(toks[s])) == sorted(DOCS)


def test_a_streamed_corpus_holds_out_0_005_of_its_documents_by_default(tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    meta, _ = read_all(pdata.prepare(str(tmp_path / "c.jsonl"), out_dir=str(tmp_path / "out")))
    assert meta["val_frac"] == 0.005 and meta["args"]["val_frac"] == 0.005


def test_a_token_budget_ending_on_a_documents_end_keeps_exactly_those_documents(tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    enc = vocab.get_tokenizer()
    budget = sum(len(enc.encode_ordinary(d)) + 1 for d in DOCS[:5])  # + 1: each one's <|endoftext|>
    meta, toks = read_all(pdata.prepare(str(tmp_path / "c.jsonl"), out_dir=str(tmp_path), max_tokens=budget,
                                        val_frac=0.3))
    assert sum(meta["tokens"].values()) == budget == sum(len(t) for t in toks.values())
    docs = [enc.decode(list(d[:-1])) for s in pdata.SPLITS for d in split_docs(toks[s])]
    assert sorted(docs) == sorted(DOCS[:5]) and toks["val"][-1] == toks["train"][-1] == EOT


def test_a_hub_dataset_whose_name_ends_in_char_is_read_with_gpt2s_bpe(tmp_path, monkeypatch):
    monkeypatch.setattr(pdata, "stream_docs", lambda *args: (iter(DOCS), "text"))  # the hub, offline
    meta, _ = read_all(pdata.prepare("hf:someone/notes_char", out_dir=str(tmp_path)))
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == vocab.VOCAB_SIZE


def test_a_bin_longer_than_meta_json_says_is_refused_and_one_edited_in_place_is_rebuilt(tiny, tmp_path, capsys):
    d = pdata.prepare(tiny, out_dir=str(tmp_path))
    path, n = os.path.join(d, "train.bin"), read_all(d)[0]["tokens"]["train"]
    original = open(path, "rb").read()
    with open(path, "ab") as f:
        f.write(b"\0\0")  # one token more: a file another tool appended to
    with pytest.raises(DataError, match=f"train.bin is too long: {n + 1:,} tokens on disk vs {n:,} in meta.json"):
        pdata.check_prepared(d)
    with open(path, "wb") as f:
        f.write(original[:-2] + b"\0\0")  # the same size, its last token changed: only the sha256 can tell
    capsys.readouterr()
    pdata.prepare(tiny, out_dir=str(tmp_path))
    assert "up to date" not in capsys.readouterr().out and open(path, "rb").read() == original


def test_an_embedded_corpus_edited_or_a_folder_of_another_source_under_its_name_is_made_again(tmp_path, monkeypatch,
                                                                                               capsys):
    # meta.json's args named the corpus alone: an edited text (or another package version) kept its old dataset, and
    # train.py's fetch of an embedded name took whatever folder bore it
    text = tmp_path / "tales.txt"
    text.write_text("Once upon a time. " * 50 + "\n\n\n" + "The end came soon. " * 50)
    monkeypatch.setitem(corpora.EMBEDDED, "tales", lambda: text.read_text().split("\n\n\n"))
    out = str(tmp_path / "data")
    first = read_all(pdata.prepare("tales", out_dir=out))
    assert pdata.fetch("tales", out) == os.path.join(out, "tales") and "is up to date" in capsys.readouterr().out
    text.write_text(text.read_text().upper())
    pdata.fetch("tales", out)  # what train.py asks: made again from the text as it is now
    assert "made again" in capsys.readouterr().out and read_all(os.path.join(out, "tales"))[1]["train"].tolist() != \
        first[1]["train"].tolist()
    (tmp_path / "other.txt").write_text("Another corpus altogether. " * 80)
    pdata.prepare(str(tmp_path / "other.txt"), name="tales", out_dir=out)  # a folder named like the corpus
    pdata.fetch("tales", out)
    assert "made again" in capsys.readouterr().out
    assert read_all(os.path.join(out, "tales"))[0]["args"]["source"] == "tales"
