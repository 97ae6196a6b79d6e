"""prepare_data.py: the offline GPT-2 tokenizer, the embedded corpus, the streaming loader, idempotence, errors."""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
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
    assert len(docs) == 66 and docs[0].startswith("In the beginning God created the heaven and the earth.")

# -----------------------------------------------------------------------------
# the streaming loader on local files

def write_jsonl(path, n=60):
    with open(path, "w") as f:
        for i in range(n):  # "url" is the first string column; "content" must still be chosen
            row = {"url": f"https://example.org/{i}", "id": i, "content": f"Document {i}: " + "words " * (i % 7 + 3)}
            f.write(json.dumps(row) + "\n")

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
    pdata.prepare(str(src), out_dir=str(tmp_path), seed=7)  # other args: rebuilt
    assert "up to date" not in capsys.readouterr().out
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

# -----------------------------------------------------------------------------
# check_prepared: what train.py asks before training

@pytest.fixture
def prepared(tmp_path):
    write_jsonl(tmp_path / "c.jsonl", n=20)
    return pdata.prepare(str(tmp_path / "c.jsonl"), out_dir=str(tmp_path / "data"), val_frac=0.2)

def test_check_prepared_accepts_a_good_dataset(prepared):
    assert pdata.check_prepared(prepared) is None
    assert "shakespeare" in corpora.EMBEDDED and "c" not in corpora.EMBEDDED  # train.py re-prepares only EMBEDDED ones

def test_check_prepared_names_a_truncated_train_bin_and_prepare_repairs_it(prepared, tmp_path):
    meta, toks = read_all(prepared)
    n = meta["tokens"]["train"]
    with open(os.path.join(prepared, "train.bin"), "r+b") as f:
        f.truncate(2 * (n - 5) + 1)  # an interrupted write: 5 tokens short, the last one half written
    with pytest.raises(pdata.DataError) as e:
        pdata.check_prepared(prepared)
    msg = str(e.value)
    assert "\n" not in msg and os.path.join(prepared, "train.bin") in msg
    assert f"truncated: {n - 5:,} tokens on disk vs {n:,} in meta.json" in msg
    assert f"python prepare_data.py {tmp_path / 'c.jsonl'} --name c --out_dir {tmp_path / 'data'}" in msg
    pdata.prepare(str(tmp_path / "c.jsonl"), out_dir=str(tmp_path / "data"), val_frac=0.2)  # what train.py runs
    assert pdata.check_prepared(prepared) is None
    assert read_all(prepared)[0]["sha256"] == meta["sha256"]  # the same bytes as before, rewritten whole
    assert not any(f.endswith(".tmp") for f in os.listdir(prepared))

def test_check_prepared_names_a_missing_train_bin_beside_val_bin(prepared):
    os.remove(os.path.join(prepared, "train.bin"))
    with pytest.raises(pdata.DataError, match="train.bin is missing; re-prepare it with `python prepare_data.py "):
        pdata.check_prepared(prepared)
    os.rename(os.path.join(prepared, "val.bin"), os.path.join(prepared, "train.bin"))
    with pytest.raises(pdata.DataError, match="val.bin is missing"):
        pdata.check_prepared(prepared)

# -----------------------------------------------------------------------------
# errors: one line, exit status 2

@pytest.mark.parametrize("args, words", [
    (["no_such_source"], ["unknown source 'no_such_source'",
                          "shakespeare, kjv, english, shakespeare_char, kjv_char, english_char, hf:"]),
    (["{tmp}/nothing/*.jsonl"], ["no files match"]),
    (["{tmp}/empty.jsonl"], ["empty.jsonl", "no rows"]),
    (["{tmp}/c.jsonl", "--text_field", "body"], ["text field 'body' not found", "'content'"]),
    (["{tmp}/blank.txt"], ["0 non-empty documents"]),
    (["{tmp}/short.txt"], ["short.txt' is one document of 2 tokens, too short to split by tokens"]),
    (["hf:nobody/no-such-dataset"], ["cannot load 'hf:nobody/no-such-dataset'"]),  # offline in tests: fails fast
    (["kjv", "--val_frac", "1.5"], ["val_frac=1.5"]),
])
def test_errors_are_one_line(tmp_path, capsys, args, words):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.txt").write_text("  \n")
    (tmp_path / "short.txt").write_text("Hi.")
    write_jsonl(tmp_path / "c.jsonl", n=3)
    with pytest.raises(SystemExit) as e:
        prepare_data.main([a.format(tmp=tmp_path) for a in args] + ["--out_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert all(w in err for w in words), err

def test_cli_bad_glob_subprocess(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(REPO_DIR, "prepare_data.py"), str(tmp_path / "*.parquet")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"error: no files match {str(tmp_path / '*.parquet')!r}"


def test_english_is_every_embedded_text_together():
    english = corpora.EMBEDDED["english"]()
    assert english == corpora.shakespeare_docs() + corpora.kjv_docs() and len(english) > 100

def test_a_rebuild_cut_short_keeps_the_old_dataset_or_is_refused_never_read_as_gpt2(tmp_path, monkeypatch):
    # meta.json was removed and the .bin files renamed before hashing: a full disk there left .bin files without
    # meta.json, which fetch took for another tool's GPT-2 files (a character dataset decoded as BPE)
    for k in range(4):
        (tmp_path / f"d{k}.txt").write_text("To be, or not to be, that is the question. " * 5 + str(k))
    src, out = str(tmp_path / "*.txt"), str(tmp_path / "data")
    d = pdata.prepare(src, name="chars", out_dir=out, tokenizer="char", val_frac=0.3)
    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(pdata.json, "dump", full)  # the disk fills while meta.json is written
    with pytest.raises(corpora.DataError, match="No space left"):
        pdata.prepare(src, name="chars", out_dir=out, tokenizer="char", val_frac=0.3, force=True)
    monkeypatch.undo()
    assert pdata.fetch("chars", out) == d and vocab.data_record(d)["kind"] == "char"  # the old one, whole
    replace = os.replace
    def killed(a, b):  # the build stops after the .bin renames, before meta.json's
        if b.endswith("meta.json"):
            raise KeyboardInterrupt
        replace(a, b)
    monkeypatch.setattr(pdata.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        pdata.prepare(src, name="chars", out_dir=out, tokenizer="char", val_frac=0.3, force=True)
    monkeypatch.undo()
    with pytest.raises(corpora.DataError, match="meta.json is missing"):
        pdata.fetch("chars", out)

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
