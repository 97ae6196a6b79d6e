"""prepare_data.py's streaming loader on local files (.jsonl, .parquet, .txt): the text field picked by name (a
string column) or by length and printed, the token budget held exactly, determinism, rebuilds when args or files
change, one document per .txt file or one file split by tokens, a document the tokenizer drops whole is skipped, a
corpus with no text column or no documents is one error line; a written <|endoftext|> is text under an imported
tokenizer too, a .txt's byte-order mark is no text, and a token budget's split is recorded as made."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import prepare_data
from lib import dataset as pdata
from lib import vocab
from test_prepare_data import EOT, mtimes, read_all, split_docs, write_jsonl

def test_jsonl_auto_field_budget_and_determinism(tmp_path):
    src = tmp_path / "corpus.jsonl"
    write_jsonl(src)
    d = pdata.prepare(str(src), out_dir=str(tmp_path / "a"), max_tokens=300)
    meta, toks = read_all(d)
    assert os.path.basename(d) == "corpus" and meta["text_field"] == "content"
    assert len(toks["train"]) + len(toks["val"]) == 300  # the budget holds exactly: the last document is cut
    assert len(toks["val"]) > 0 and toks["val"][-1] == EOT and toks["train"][-1] == EOT
    enc = vocab.get_tokenizer()
    assert enc.decode(list(split_docs(toks["train"])[0][:-1])).startswith("Document 0: words")
    # the same args in another folder give the same bytes
    d2 = pdata.prepare(str(src), out_dir=str(tmp_path / "b"), max_tokens=300)
    assert read_all(d2)[0]["sha256"] == meta["sha256"]
    # without a budget every document is there, split between train and val
    full = pdata.prepare(str(src), out_dir=str(tmp_path / "c"), val_frac=0.2)
    meta, toks = read_all(full)
    assert meta["documents"]["train"] + meta["documents"]["val"] == 60 and meta["documents"]["val"] > 0
    assert not set(split_docs(toks["train"])) & set(split_docs(toks["val"]))

def test_rebuilds_when_args_or_files_change(tmp_path, capsys):
    src = tmp_path / "corpus.jsonl"
    write_jsonl(src)
    d = pdata.prepare(str(src), out_dir=str(tmp_path))
    before = mtimes(d)
    pdata.prepare(str(src), out_dir=str(tmp_path))
    assert "up to date" in capsys.readouterr().out and mtimes(d) == before
    pdata.prepare(str(src), out_dir=str(tmp_path), seed=7)  # other args: rebuilt, and said (a char dataset became BPE)
    assert f"{d} holds a dataset made from other files or settings (meta.json's args): made again" in (
        capsys.readouterr().out)
    with open(os.path.join(d, "val.bin"), "ab") as f:  # a damaged .bin no longer matches meta.json: rebuilt
        f.write(b"\0\0")
    pdata.prepare(str(src), out_dir=str(tmp_path), seed=7)
    assert "up to date" not in capsys.readouterr().out
    meta, toks = read_all(d)
    assert meta["tokens"]["val"] == len(toks["val"]) and meta["seed"] == 7

def test_parquet_named_field(tmp_path):
    bodies = [f"Body number {i}, with some text." for i in range(20)]
    pq.write_table(pa.table({"title": [f"t{i}" for i in range(20)], "body": bodies}), tmp_path / "part-0.parquet")
    d = pdata.prepare(str(tmp_path / "*.parquet"), name="pq", out_dir=str(tmp_path / "out"), text_field="body")
    meta, toks = read_all(d)
    assert meta["text_field"] == "body" and meta["documents"]["val"] >= 1
    enc = vocab.get_tokenizer()
    got = [enc.decode(list(doc[:-1])) for s in pdata.SPLITS for doc in split_docs(toks[s])]
    assert sorted(got) == sorted(bodies)
    # auto-detection finds "body" by its name, after "title"; a budget cuts the corpus short
    d = pdata.prepare(str(tmp_path / "*.parquet"), name="pq2", out_dir=str(tmp_path / "out"), max_tokens=50)
    meta, toks = read_all(d)
    assert meta["text_field"] == "body" and len(toks["train"]) + len(toks["val"]) <= 50

def test_jsonl_id_before_body_picks_body_and_prints_it(tmp_path, capsys):
    bodies = [f"The body of document {i}, longer than its id." for i in range(12)]
    with open(tmp_path / "posts.jsonl", "w") as f:
        for i, body in enumerate(bodies):  # "id" is a string column, and the first one
            f.write(json.dumps({"id": f"post-{i}", "body": body}) + "\n")
    d = pdata.prepare(str(tmp_path / "posts.jsonl"), out_dir=str(tmp_path / "out"), val_frac=0.2)
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("text field:")] == [
        "text field: 'body' (a known text column name; columns ['id', 'body'])"]
    meta, toks = read_all(d)
    assert meta["text_field"] == "body"
    enc = vocab.get_tokenizer()
    assert sorted(enc.decode(list(doc[:-1])) for s in pdata.SPLITS for doc in split_docs(toks[s])) == sorted(bodies)

def test_a_known_column_name_holding_no_strings_is_passed_over_for_the_next_known_one(tmp_path, capsys):
    with open(tmp_path / "rows.jsonl", "w") as f:
        for i in range(12):  # "text" holds numbers here: "content" is the text
            f.write(json.dumps({"text": i, "content": f"The content of row {i}, in words."}) + "\n")
    d = pdata.prepare(str(tmp_path / "rows.jsonl"), out_dir=str(tmp_path / "out"), val_frac=0.2)
    assert "text field: 'content' (a known text column name" in capsys.readouterr().out
    assert read_all(d)[0]["text_field"] == "content"

def test_unknown_column_names_fall_back_to_the_longest_strings(tmp_path, capsys):
    notes = [f"Note {i}: " + "a rather long sentence of plain words. " * 3 for i in range(12)]
    with open(tmp_path / "notes.jsonl", "w") as f:
        for i, note in enumerate(notes):  # no known name: "ref" and "kind" are shorter strings than "note"
            f.write(json.dumps({"ref": f"r{i}", "kind": "memo", "note": note, "n": i}) + "\n")
    d = pdata.prepare(str(tmp_path / "notes.jsonl"), out_dir=str(tmp_path / "out"), val_frac=0.2)
    assert "text field: 'note' (the longest strings in the first 12 rows" in capsys.readouterr().out
    assert read_all(d)[0]["text_field"] == "note"

def test_a_jsonl_without_a_text_like_column_is_one_error_line_not_its_titles(tmp_path, capsys):
    with open(tmp_path / "posts.jsonl", "w") as f:
        for i in range(12):
            f.write(json.dumps({"title": f"Title number {i}", "id": i}) + "\n")
    with pytest.raises(SystemExit) as e:  # it once trained on the titles, exit status 0
        prepare_data.main([str(tmp_path / "posts.jsonl"), "--out_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "no text column in" in err
    assert "its longest strings, 'title', average 14 characters (under 100" in err and "--text_field" in err
    assert not (tmp_path / "out").exists()
    d = pdata.prepare(str(tmp_path / "posts.jsonl"), out_dir=str(tmp_path / "out"), text_field="title")
    assert read_all(d)[0]["text_field"] == "title"  # named: taken as asked

def test_an_empty_txt_is_one_error_line_and_leaves_no_dataset_folder(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "data").mkdir()
    for out in ("data", os.path.join("new", "data")):  # a folder that was there stays, the ones made go
        with pytest.raises(SystemExit) as e:
            prepare_data.main([str(tmp_path / "empty.txt"), "--out_dir", str(tmp_path / out)])
        assert e.value.code == 2 and "empty.txt' gave 0 non-empty documents" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["data", "empty.txt"] and os.listdir(tmp_path / "data") == []

def test_txt_files_are_one_document_each(tmp_path):
    (tmp_path / "a.txt").write_text("First file.\nSecond line.\n")
    (tmp_path / "b.txt").write_text("Another file,\n\nwith a paragraph.\n")
    d = pdata.prepare(str(tmp_path / "*.txt"), out_dir=str(tmp_path / "out"))
    meta, toks = read_all(d)
    assert meta["documents"] == {"train": 1, "val": 1}

def test_single_txt_file_is_split_by_tokens(tmp_path):
    text = "".join(f"Line {i} of one long story, told in a single text file.\n" for i in range(40))
    (tmp_path / "story.txt").write_text(text)
    d = pdata.prepare(str(tmp_path / "story.txt"), out_dir=str(tmp_path / "out"))
    meta, toks = read_all(d)
    ids = vocab.get_tokenizer().encode_ordinary(text)
    n_val = round(0.1 * len(ids))  # the default val_frac of one .txt file: its last tenth of tokens
    assert toks["train"].tolist() == ids[:-n_val] + [EOT] and toks["val"].tolist() == ids[-n_val:] + [EOT]
    assert meta["val_frac"] == 0.1 and "split by tokens" in meta["split_rule"]
    assert meta["tokens"] == {"train": len(ids) - n_val + 1, "val": n_val + 1}

def test_a_one_document_split_keeps_the_token_budget_exactly(tmp_path):
    (tmp_path / "one.txt").write_text("To be, or not to be, that is the question. " * 200)
    for budget in (100, 1000):
        d = pdata.prepare(str(tmp_path / "one.txt"), name=f"one{budget}", out_dir=str(tmp_path / "out"),
                          max_tokens=budget)
        meta, toks = read_all(d)
        assert sum(meta["tokens"].values()) == budget == sum(len(t) for t in toks.values())

def test_a_document_the_tokenizer_drops_whole_is_skipped_not_the_end_of_the_corpus(tmp_path):
    tk = pytest.importorskip("tokenizers")
    words = "the cat sat on mat and dog ran".split()
    tok = tk.Tokenizer(tk.models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words, "</s>"])}, unk_token="[UNK]"))
    tok.normalizer = tk.normalizers.BertNormalizer(clean_text=True, lowercase=True)  # drops control characters
    tok.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": len(words) + 1}))
    rows = [{"text": "the cat sat on the mat"}] * 10 + [{"text": "\x07"}] + [{"text": "the dog ran"}] * 30
    with open(tmp_path / "c.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    d = pdata.prepare(str(tmp_path / "c.jsonl"), out_dir=str(tmp_path / "out"), tokenizer=str(tmp_path), val_frac=0.2)
    with open(os.path.join(d, "meta.json")) as f:
        assert sum(json.load(f)["documents"].values()) == 40


def test_a_written_endoftext_is_text_with_an_imported_tokenizer_as_with_gpt2(tmp_path):
    tk = pytest.importorskip("tokenizers")
    words = "doc one two three < | endoftext > inside".split()
    tok = tk.Tokenizer(tk.models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    tok.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": eot}))
    rows = [{"text": f"doc {w} inside <|endoftext|> doc {w}"} for w in ("one", "two", "three")] * 10
    with open(tmp_path / "c.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    d = pdata.prepare(str(tmp_path / "c.jsonl"), out_dir=str(tmp_path / "out"), tokenizer=str(tmp_path), val_frac=0.2)
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    toks = {s: np.fromfile(os.path.join(d, f"{s}.bin"), dtype=meta["dtype"]) for s in pdata.SPLITS}
    for s in pdata.SPLITS:  # one <|endoftext|> per document: the written one is no separator
        assert int((toks[s] == eot).sum()) == meta["documents"][s]
    assert vocab.hf_codec(str(tmp_path)).encode("a <|endoftext|>")[-1] == eot  # prompts still name it (sample.py)


def test_a_txt_files_byte_order_mark_is_no_text(tmp_path):
    (tmp_path / "a.txt").write_bytes("\ufeffFirst file.\r\nSecond line.\r\n".encode("utf-8"))
    (tmp_path / "b.txt").write_text("Another file.\n")
    d = pdata.prepare(str(tmp_path / "*.txt"), out_dir=str(tmp_path / "out"), val_frac=0.5)
    meta, toks = read_all(d)
    text = vocab.get_tokenizer().decode([t for s in pdata.SPLITS for t in toks[s].tolist()])
    assert "\ufeff" not in text and "First file.\nSecond line.\n" in text


def test_a_token_budget_on_an_embedded_corpus_records_the_split_it_made(tmp_path):
    d = pdata.prepare("english", out_dir=str(tmp_path), max_tokens=400_000)
    meta, _ = read_all(d)
    n = sum(meta["documents"].values())
    assert meta["split_rule"] == f"seeded shuffle of documents, {meta['documents']['val']} of {n} to val"
