"""Which model made what (issue #44, causes 4, 5): a character vocabulary of the same size with other characters is
refused everywhere (vocabularies matched by content, the checkpoint decodes alone), nanoGPT's pickled vocabulary is
refused, not unpickled, and two checkpoints of one run are told apart in every row. Tiny models on tiny data, CPU
only."""
import csv
import os
import shutil

import pytest
import torch

import eval_copy
import eval_tasks
import sample
import train
from conftest import one_line_error
from lib import dataset, vocab
import test_no_mixed_runs
from test_no_mixed_runs import TEXT, args

data_dir = test_no_mixed_runs.data_dir  # its fixture: random ids


CHAR = ["device=cpu", "n_layer=1", "n_head=2", "n_embd=16", "ffn_hidden=32", "block_size=32", "batch_size=2",
        "gradient_accumulation_steps=1", "eval_iters=1", "log_interval=1", "warmup_iters=1", "max_iters=1",
        "eval_interval=1"]


# ----------------------------------------------------------------------------------------------------------------
# 4: vocabularies matched by content

@pytest.fixture(scope="module")
def char_runs(tmp_path_factory):
    """A character model of TEXT, and a dataset of the same size whose characters differ (one swapped)."""
    d = tmp_path_factory.mktemp("chars")
    (d / "a.txt").write_text(TEXT)
    (d / "b.txt").write_text(TEXT.replace("q", "Q"))  # as many characters, other ids
    for name in ("a", "b"):
        dataset.prepare(str(d / f"{name}.txt"), out_dir=str(d), tokenizer="char")
    train.main([*CHAR, f"data_dir={d}", "dataset=a", f"out_dir={d / 'run'}"])
    return d


def test_a_character_vocabulary_of_the_same_size_with_other_characters_is_refused_everywhere(char_runs, capsys):
    d, ckpt = char_runs, str(char_runs / "run" / "ckpt.pt")
    assert vocab.vocab_size(str(d / "a")) == vocab.vocab_size(str(d / "b"))
    stored = torch.load(ckpt, weights_only=True)["codec"]
    assert stored["kind"] == "char" and stored["itos"] == vocab.codec(str(d / "a")).itos
    assert torch.load(d / "run" / "best.pt", weights_only=True)["codec"] == stored
    for main, argv in ((sample.main, ["--ckpt", ckpt, "--data", str(d / "b"), "--max_new_tokens", "2"]),
                       (eval_copy.main, [ckpt, "--data", str(d / "b"), "--span", "4", "--out_dir", str(d / "c")]),
                       (train.main, [*CHAR, f"data_dir={d}", "dataset=b", f"out_dir={d / 'run'}", "resume=True",
                                     "max_iters=2"])):
        msg = one_line_error(main, argv)
        assert "another vocabulary" in msg and "sha256" in msg, msg
    assert not (d / "c").exists() and torch.load(ckpt, weights_only=True)["iter_num"] == 1
    os.rename(d / "a", d / "a-moved")  # its dataset gone: the checkpoint alone decodes
    try:
        sample.main(["--ckpt", ckpt, "--start", "To be", "--max_new_tokens", "3", "--num_samples", "1"])
    finally:
        os.rename(d / "a-moved", d / "a")
    assert capsys.readouterr().out.startswith("To be")
    old = {k: v for k, v in torch.load(ckpt, weights_only=True).items() if k != "codec"}  # before codecs
    torch.save(old, d / "old.pt")
    capsys.readouterr()
    sample.main(["--ckpt", str(d / "old.pt"), "--data", str(d / "a"), "--max_new_tokens", "2", "--num_samples", "1"])
    eval_copy.main([str(d / "old.pt"), "--data", str(d / "b"), "--span", "4", "--num_seqs", "2", "--distances", "0.5",
                    "--out_dir", str(d / "c-old")])  # no codec: matched by size, with a warning
    assert "stores no vocabulary (an older checkpoint)" in capsys.readouterr().err


def test_nanogpts_pickled_character_vocabulary_is_refused_not_unpickled(data_dir, tmp_path):
    d = tmp_path / "rand"
    shutil.copytree(os.path.join(data_dir, "rand"), d)
    (d / "meta.pkl").write_bytes(b"not read")
    msg = one_line_error(train.main, args(str(tmp_path), tmp_path / "out", "max_iters=1"))
    assert "meta.pkl" in msg and "never unpickles" in msg


# ----------------------------------------------------------------------------------------------------------------
# 5: every row says which model made it

def test_two_checkpoints_of_one_run_are_told_apart_in_every_row(char_runs, tmp_path, monkeypatch):
    d = char_runs
    ckpts = [str(d / "run" / "ckpt.pt"), str(d / "run" / "best.pt")]
    eval_copy.main([*ckpts, "--data", str(d / "a"), "--span", "4", "--num_seqs", "2", "--distances", "0.5",
                    "--labels", "x", "x", "--out_dir", str(tmp_path / "copy")])
    rows = list(csv.DictReader(open(tmp_path / "copy" / "per_sequence.csv")))
    assert {(r["model"], r["checkpoint"], r["iter"]) for r in rows} == {
        ("x", os.path.abspath(ckpts[0]), "1"), ("x #2 (run/best.pt)", os.path.abspath(ckpts[1]), "1")}
    train.main(["device=cpu", "task=first", "pos=nope", "block_size=8", "n_layer=1", "n_head=2", "n_embd=16",
                "ffn_hidden=32", "batch_size=4", "eval_iters=1", "max_iters=1", "eval_interval=1",
                f"out_dir={tmp_path / 'task'}"])
    task = [str(tmp_path / "task" / f) for f in ("ckpt.pt", "best.pt")]
    eval_tasks.main([*task, "--lengths", "8", "--n", "2", "--out_dir", str(tmp_path / "tev")])
    for name in ("accuracy.csv", "per_prompt.csv"):
        rows = list(csv.DictReader(open(tmp_path / "tev" / name)))
        label = "model" if name == "accuracy.csv" else "run"
        assert {(r[label], r["checkpoint"]) for r in rows} == {("task", os.path.abspath(task[0])), (
            "task #2 (task/best.pt)", os.path.abspath(task[1]))}
