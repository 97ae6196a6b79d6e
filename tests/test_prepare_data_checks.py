"""prepare_data.py on a damaged dataset or bad input: check_prepared (what train.py asks before training) names a
truncated or missing .bin and prepare repairs it, a rebuild cut short keeps the old dataset or is refused (never read as
GPT-2), and every error is one line with exit status 2."""
import os
import subprocess
import sys

import pytest

import prepare_data
from lib import corpora
from lib import dataset as pdata
from lib import vocab
from test_prepare_data import REPO_DIR, read_all, write_jsonl

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

def test_ctrl_c_while_tokenizing_leaves_no_temp_file(tmp_path, monkeypatch):
    # train.bin.tmp and val.bin.tmp stayed behind (for a large corpus, gigabytes)
    write_jsonl(tmp_path / "c.jsonl", n=20)
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(pdata, "replace_synced", interrupted)  # every .tmp written, none renamed yet
    with pytest.raises(KeyboardInterrupt):
        pdata.prepare(str(tmp_path / "c.jsonl"), out_dir=str(tmp_path / "data"), val_frac=0.2)
    assert not [f for _, _, files in os.walk(tmp_path / "data") for f in files if f.endswith(".bin.tmp")]


def test_check_prepared_names_a_missing_train_bin_beside_val_bin(prepared):
    os.remove(os.path.join(prepared, "train.bin"))
    with pytest.raises(pdata.DataError, match="train.bin is missing; re-prepare it with `python prepare_data.py "):
        pdata.check_prepared(prepared)
    os.rename(os.path.join(prepared, "val.bin"), os.path.join(prepared, "train.bin"))
    with pytest.raises(pdata.DataError, match="val.bin is missing"):
        pdata.check_prepared(prepared)

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
    # an audit's: tracebacks (int(nan); a damaged --tokenizer checkpoint) and argparse's usage dump
    (["kjv", "--max_tokens", "nan"], ["--max_tokens nan must be a finite count"]),
    (["kjv", "--tokenizer", "{tmp}/short.txt.pt"], ["short.txt.pt' is not a checkpoint"]),
    (["kjv", "--val_frac", "half"], ["argument --val_frac: invalid float value"]),
    (["kjv", "--name", "../escape"], ["--name '../escape': a folder name (no '/')"]),  # else outside --out_dir
    (["kjv", "--seed", "-1"], ["--seed -1 must be >= 0"]),  # was taken: random.Random(-1) is Random(1), seed 1's split
    # options the source does not read: meta.json recorded them as if applied (and a plain rerun rebuilt the same data)
    (["shakespeare", "--text_field", "body"], ["--text_field body: not read (its text is plain"]),
    (["{tmp}/short.txt", "--text_field", "body"], ["--text_field body: not read (its text is plain"]),
    (["{tmp}/c.jsonl", "--hf_split", "validation"], ["--hf_split validation: not read", "not a Hugging Face dataset"]),
    (["{tmp}/short.txt", "--seed", "2"], ["--seed 2: not read (one .txt file is split by tokens"]),
    # a one-row .jsonl is one document too, split by tokens once read: the seed drew nothing (meta.json recorded it)
    (["{tmp}/one.jsonl", "--seed", "2"], ["--seed 2: not read ('", "one.jsonl' is one document, split by tokens"]),
])
def test_errors_are_one_line(tmp_path, capsys, args, words):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.txt").write_text("  \n")
    (tmp_path / "short.txt").write_text("Hi.")
    (tmp_path / "short.txt.pt").write_text("Hi.")
    write_jsonl(tmp_path / "c.jsonl", n=3)
    (tmp_path / "one.jsonl").write_text('{"text": "%s"}\n' % ("One long play. " * 100))
    with pytest.raises(SystemExit) as e:
        prepare_data.main([a.format(tmp=tmp_path) for a in args] + ["--out_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert all(w in err for w in words), err

def test_options_a_source_reads_are_taken_and_the_defaults_record_as_before(tmp_path):
    write_jsonl(tmp_path / "c.jsonl", n=20)
    (tmp_path / "a.txt").write_text("One play. " * 200)
    (tmp_path / "b.txt").write_text("Another play. " * 200)
    out = str(tmp_path / "out")
    prepare_data.main([str(tmp_path / "c.jsonl"), "--text_field", "content", "--seed", "3", "--out_dir", out])
    prepare_data.main([str(tmp_path / "*.txt"), "--seed", "3", "--name", "two", "--out_dir", out])  # shuffled documents
    prepare_data.main([str(tmp_path / "a.txt"), "--out_dir", out])
    (tmp_path / "one.jsonl").write_text('{"text": "%s"}\n' % ("One long play. " * 100))
    prepare_data.main([str(tmp_path / "one.jsonl"), "--out_dir", out])  # one document, no --seed: the default, taken
    assert read_all(os.path.join(out, "one"))[0]["args"]["seed"] == 1337
    assert read_all(os.path.join(out, "a"))[0]["args"]["seed"] == 1337  # as before: older datasets stay up to date
    assert read_all(os.path.join(out, "a"))[0]["args"]["hf_split"] == "train"
    assert read_all(os.path.join(out, "two"))[0]["args"]["seed"] == 3

def test_cli_bad_glob_subprocess(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(REPO_DIR, "prepare_data.py"), str(tmp_path / "*.parquet")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"error: no files match {str(tmp_path / '*.parquet')!r}"

@pytest.mark.parametrize("source,row", [("bad.jsonl", 1), ("corpus/*.jsonl", 0)])
def test_a_malformed_jsonl_is_one_error_line_not_the_readers_log_or_a_traceback(tmp_path, source, row):
    """bad.jsonl fails on the first read (datasets logged its own line first); corpus/b.jsonl after a.jsonl's rows,
    mid-stream (a traceback, and train.bin.tmp left behind)."""
    write_jsonl(tmp_path / "bad.jsonl", n=1)
    with open(tmp_path / "bad.jsonl", "a") as f:
        f.write('{"content": broken\n')
    (tmp_path / "corpus").mkdir()
    write_jsonl(tmp_path / "corpus" / "a.jsonl", n=20)
    (tmp_path / "corpus" / "b.jsonl").write_text("{broken\n")
    r = subprocess.run([sys.executable, os.path.join(REPO_DIR, "prepare_data.py"), str(tmp_path / source),
                        "--out_dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: cannot load {str(tmp_path / source)!r}: JSON parse error") and \
        f"in row {row}" in r.stderr, r.stderr
    assert not [f for _, _, files in os.walk(tmp_path / "out") for f in files]  # no .tmp left behind


def test_the_evaluations_split_loaders_refuse_a_split_cut_short_of_meta_json(prepared):
    # eval_long and eval_rows read a truncated val.bin in part, without a word (only train.py checked)
    n = read_all(prepared)[0]["tokens"]["val"]
    os.truncate(os.path.join(prepared, "val.bin"), 2 * (n - 3))
    says = f"val.bin is truncated: {n - 3:,} tokens on disk vs {n:,} in meta.json; re-prepare it with `python "
    for read in (lambda: pdata.load_split(prepared, "val"), lambda: pdata.load_tokens(prepared, "val", 4, 50257)):
        with pytest.raises(pdata.DataError, match=says):
            read()
    assert len(pdata.load_split(prepared, "train")) == read_all(prepared)[0]["tokens"]["train"]


@pytest.mark.parametrize("size, says", [(5, "is 5 bytes, not a whole number of 2-byte ids"), (0, "is empty")])
def test_a_split_of_a_cut_id_or_none_is_one_line_naming_it_without_a_meta_json(tmp_path, size, says):
    # numpy's ValueError, naming no file ("Size of available data is not a multiple...", "cannot mmap an empty file")
    (tmp_path / "val.bin").write_bytes(bytes(size))
    with pytest.raises(pdata.DataError, match=f"val.bin {says}; re-prepare it with"):
        pdata.load_split(str(tmp_path), "val")


def test_an_out_dir_that_cannot_be_written_is_one_error_line(tmp_path, monkeypatch, capsys):
    """A read-only --out_dir (chmod does not stop root: os.open refused as a read-only disk would) was a traceback."""
    import errno
    ro, real_open = str(tmp_path / "ro"), os.open

    def refused(path, *a, **k):
        if str(path).startswith(ro):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *a, **k)
    monkeypatch.setattr(os, "open", refused)
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["shakespeare", "--out_dir", ro])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == f"error: [Errno 30] Read-only file system: '{ro}/shakespeare.lock'\n"
