"""Nothing lost, mixed or misreported (issue #44), one test per cause: two processes on one folder (a lock per run,
per evaluation, per suite), resume=True over results without their ckpt.pt, a cut log line or newline, a full disk,
ids past the vocabulary, a padded vocabulary, a checkpoint without optimizer state, and the remaining bad values;
reruns with other settings are in test_no_mixed_settings.py, vocabularies and checkpoints told apart in
test_no_mixed_models.py, how a lock changes hands in test_folder_locks.py. Tiny models on tiny data, CPU only."""
import gc
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch

import eval_long
import sample
import train
from conftest import one_line_error, random_ids_data
from lib import folders, vocab
from lib.checkpoint import run_info, save_checkpoint
from model import GPT, GPTConfig

VOCAB = 256
TINY = ["device=cpu", f"vocab_size={VOCAB}", "n_layer=1", "n_head=2", "n_embd=16", "ffn_hidden=32", "block_size=16",
        "batch_size=2", "gradient_accumulation_steps=1", "eval_iters=1", "log_interval=1", "warmup_iters=1",
        "dataset=rand"]
TEXT = "To be, or not to be: that is the question.\nWhether 'tis nobler in the mind to suffer\n" * 30


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return random_ids_data(tmp_path_factory, VOCAB, 2048, 512)


def args(data_dir, out, *extra):
    return [*TINY, f"data_dir={data_dir}", f"out_dir={out}", *extra]


@pytest.fixture(scope="module")
def finished(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    train.main(args(data_dir, out, "max_iters=2", "eval_interval=1"))
    return out


def snapshot(folder):
    return {f: (folder / f).read_bytes() for f in sorted(os.listdir(folder))}


HOLD = ("import sys; sys.path.insert(0, sys.argv[1]); from lib import folders\n"
        "with folders.held(*sys.argv[2:]):\n    print('held', flush=True); sys.stdin.read()\n")


@pytest.fixture
def other_process():
    """hold(folder, what): another process holds folder's lock (writing `what`) until the test ends (or it is
    killed); returns its pid."""
    procs = []

    def hold(folder, *what):
        root = os.path.dirname(os.path.dirname(__file__))
        p = subprocess.Popen([sys.executable, "-c", HOLD, root, str(folder), *what], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "held"
        procs.append(p)
        return p
    yield hold
    for p in procs:
        p.kill()
        p.wait()


# ----------------------------------------------------------------------------------------------------------------
# 1, 2: resume=True over results without their ckpt.pt; one writer per folder

def test_resume_over_a_finished_run_without_its_ckpt_refuses_and_deletes_nothing(data_dir, finished, tmp_path):
    out = tmp_path / "moved"
    shutil.copytree(finished, out)
    os.remove(out / "ckpt.pt")  # moved away: best.pt and the log's evals remain
    before = snapshot(out)
    msg = one_line_error(train.main, args(data_dir, out, "max_iters=2", "resume=True"))
    assert "holds a run's results (best.pt, log.jsonl with 3 evaluation(s))" in msg and "overwrite=True" in msg
    assert snapshot(out) == before
    train.main(args(data_dir, out, "max_iters=1", "resume=True", "overwrite=True"))  # asked to replace it: a new run
    log = [json.loads(line) for line in open(out / "log.jsonl")]
    assert sum("config" in r for r in log) == 1 and torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 1
    killed = tmp_path / "killed"  # killed before its first checkpoint: only its log's header
    killed.mkdir()
    (killed / "log.jsonl").write_text(json.dumps({"config": {}}) + "\n")
    train.main(args(data_dir, killed, "max_iters=1", "resume=True"))  # relaunch-safe: starts afresh
    assert torch.load(killed / "ckpt.pt", weights_only=True)["iter_num"] == 1


def test_a_second_writer_of_a_run_stops_with_the_holders_pid_and_the_lock_goes_with_its_holder(
        data_dir, tmp_path, other_process):
    out = tmp_path / "run"
    p = other_process(out)  # e.g. the same command started twice, or a resume while it still trains
    msg = one_line_error(train.main, args(data_dir, out, "max_iters=1", "resume=True"))
    assert f"is in use: a training run is being written by process {p.pid}" in msg or \
        f"being written by process {p.pid}" in msg, msg
    assert not out.exists()
    p.kill()
    p.wait()  # the OS releases a dead holder's lock
    train.main(args(data_dir, out, "max_iters=1", "resume=True"))
    train.main(args(data_dir, out, "max_iters=2", "resume=True"))  # an in-process run released it on return
    assert not os.path.exists(folders.path_of(out))  # no lock file left beside the folder
    with folders.held(out):  # the same process: flock excludes a second open too (the suite's in-process runs)
        assert "being written by process" in one_line_error(train.main, args(data_dir, out, "max_iters=3",
                                                                             "resume=True"))


def test_a_second_writer_through_a_symlink_to_the_run_stops_too(data_dir, tmp_path):
    # out_dir=<a link to the run> (or under a linked folder) took <link>.lock, not <run>.lock: a run with
    # overwrite=True there deleted the running run's files and the two wrote one log.jsonl (its config, their steps)
    out = tmp_path / "run"
    out.mkdir()
    (tmp_path / "link").symlink_to(out)
    (tmp_path / "parent").symlink_to(tmp_path)
    with folders.held(out):  # flock excludes a second open in this process as it does another process
        for other in (tmp_path / "link", tmp_path / "parent" / "run"):
            msg = one_line_error(train.main, args(data_dir, other, "max_iters=1", "overwrite=True"))
            assert f"being written by process {os.getpid()}" in msg, msg
    assert os.listdir(out) == []


def test_a_second_evaluation_into_one_folder_and_a_second_suite_stop_in_one_line(finished, tmp_path, other_process,
                                                                                  monkeypatch):
    ev = tmp_path / "ev"
    p = other_process(ev)
    msg = one_line_error(eval_long.main, [str(finished / "ckpt.pt"), "--data", os.path.join(
        os.path.dirname(os.path.dirname(finished)), "nowhere"), "--out_dir", str(ev)])
    assert f"process {p.pid}" in msg and not ev.exists()
    import reproduce
    from lib import synthetic
    monkeypatch.setattr(synthetic, "REPO_OUT", str(tmp_path))
    p = other_process(tmp_path / "out-synthetic-quick", "a synthetic suite's runs")  # the same suite started twice
    msg = one_line_error(reproduce.main, ["--suite", "synthetic", "--quick"])
    assert f"a synthetic suite's runs is being written by process {p.pid}" in msg
    monkeypatch.chdir(tmp_path)
    p = other_process(tmp_path / "out-repro-cpu_char", "a reproduction's runs")
    msg = one_line_error(reproduce.main, ["--scale", "cpu_char", "--seeds", "1"])
    assert f"a reproduction's runs is being written by process {p.pid}" in msg


def test_the_refusal_names_what_the_holder_writes_not_what_the_caller_would(tmp_path):
    # a synthetic suite was told that "a synthetic suite's results" held the folder an lm reproduction wrote
    with folders.held(str(tmp_path / "res"), "a reproduction's results"):
        with pytest.raises(folders.FolderError, match=f"in use: a reproduction's results is being written by process "
                                                      f"{os.getpid()} "):
            with folders.held(str(tmp_path / "res"), "a synthetic suite's results"):
                pass


# ----------------------------------------------------------------------------------------------------------------
# 7, 8: one error line, never a traceback; nothing half-written

def test_a_cut_or_junk_log_line_neither_blocks_a_resume_nor_compare(data_dir, finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    n = len((out / "log.jsonl").read_text().splitlines())
    with open(out / "log.jsonl", "a") as f:
        f.write("\n{junk\n" + '{"iter": 2, "lo')  # a blank line, junk, a write cut by a kill
    train.main(["--compare", str(out), "--out", str(tmp_path / "c.png")])
    assert f"line(s) {n + 2}, {n + 3} are not JSON records" in capsys.readouterr().err
    train.main(args(data_dir, out, "max_iters=3", "resume=True"))
    lines = (out / "log.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines) and json.loads(lines[-1])["iter"] == 3


def test_a_log_whose_last_record_lost_its_newline_gets_it_back_before_a_resume_appends(tmp_path):
    from lib import tracking
    path = tmp_path / "log.jsonl"
    path.write_text('{"iter": 0}\n{"iter": 1}')  # whole, but the write of its newline was cut
    tracking.repair_log(str(path))
    assert path.read_text() == '{"iter": 0}\n{"iter": 1}\n'  # else the next record would join this line


def test_a_failed_checkpoint_write_is_one_line_and_leaves_no_temp_file(data_dir, tmp_path, monkeypatch):
    def full_disk(obj, path):  # what torch.save raises on a full disk
        open(path, "wb").write(b"half")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")
    monkeypatch.setattr(torch, "save", full_disk)
    msg = one_line_error(train.main, args(data_dir, tmp_path / "out", "max_iters=1"))
    assert "cannot write" in msg and "ckpt.pt" in msg and "no checkpoint was written yet" in msg
    assert sorted(os.listdir(tmp_path / "out")) == ["log.jsonl"]


@pytest.fixture
def full_disk(tmp_path):
    """A 256 KiB tmpfs (needs mount rights: skipped elsewhere)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


def fill(mnt, leave):
    """mnt full but `leave` bytes."""
    st = os.statvfs(mnt)
    (mnt / "filler").write_bytes(b"x" * max(0, st.f_bavail * st.f_frsize - leave))


def test_a_real_full_disk_is_one_error_line_in_train_the_evaluations_and_prepare(data_dir, finished, full_disk):
    big = ["n_embd=256", "ffn_hidden=512"]  # a checkpoint of ~5 MB: more than the disk holds
    msg = one_line_error(train.main, args(data_dir, full_disk / "run", "max_iters=1", *big))
    assert "No space left on device" in msg or "cannot write" in msg, msg
    assert not [f for f in os.listdir(full_disk / "run") if ".tmp" in f]
    gc.collect()  # the failed writer's unlinked file is freed when it is closed (at exit in a real run)
    fill(full_disk, 0)
    msg = one_line_error(eval_long.main, [str(finished / "ckpt.pt"), "--data", os.path.join(data_dir, "rand"),
                                          "--length", "32", "--num_seqs", "2", "--out_dir", str(full_disk / "ev")])
    assert "No space left on device" in msg, msg
    assert not [f for f in os.listdir(full_disk) if f.startswith("ev")]
    os.remove(full_disk / "filler")
    (full_disk / "t.txt").write_text(TEXT * 20)  # 52 KB of text: ~104 KB of ids
    fill(full_disk, 64 * 1024)
    import prepare_data
    with pytest.raises(SystemExit) as e:
        prepare_data.main([str(full_disk / "t.txt"), "--out_dir", str(full_disk / "data"), "--tokenizer", "char"])
    assert e.value.code == 2
    assert not [f for root, _, files in os.walk(full_disk / "data") for f in files if f.endswith(".tmp")]


def test_ids_past_the_vocabulary_are_one_line_in_training_and_evaluation(data_dir, finished, tmp_path):
    d = tmp_path / "rand"
    shutil.copytree(os.path.join(data_dir, "rand"), d)
    ids = np.fromfile(d / "val.bin", np.uint16)
    ids[100] = VOCAB + 5  # a damaged file
    ids.tofile(d / "val.bin")
    msg = one_line_error(train.main, args(str(tmp_path), tmp_path / "out", "max_iters=1"))
    assert f"val.bin holds id {VOCAB + 5} at token 100, not below the model's vocabulary of {VOCAB}" in msg
    msg = one_line_error(eval_long.main, [str(finished / "ckpt.pt"), "--data", str(d), "--length", "32",
                                          "--num_seqs", "2", "--out_dir", str(tmp_path / "ev")])
    assert "holds id 261 at token 100" in msg


def test_a_padded_vocabulary_samples_only_ids_the_tokenizer_knows(tmp_path, capsys, monkeypatch):
    drawn, generate = [], GPT.generate
    monkeypatch.setattr(GPT, "generate", lambda self, *a, **kw: drawn.append(generate(self, *a, **kw)) or drawn[-1])
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50304, block_size=16, n_layer=1, n_head=2, n_embd=32, ffn_hidden=64))
    with torch.no_grad():
        model.lm_head.weight[vocab.VOCAB_SIZE:] *= 1000  # the padding ids would win almost every draw
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 0,
                     "run_info": run_info(0), "codec": vocab.record(None)}, str(path))
    for seed in range(4):
        sample.main(["--ckpt", str(path), "--max_new_tokens", "8", "--num_samples", "1", "--seed", str(seed)])
    assert capsys.readouterr().out.count("-" * 15) == 4
    assert len(drawn) == 4 and all(int(y.max()) < vocab.VOCAB_SIZE for y in drawn)  # not only what decode accepts


def test_a_resume_from_a_checkpoint_without_optimizer_state_is_one_line(data_dir, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    shutil.copy(out / "best.pt", out / "ckpt.pt")  # best.pt copied over it
    msg = one_line_error(train.main, args(data_dir, out, "max_iters=3", "resume=True"))
    assert "holds no optimizer or rng state, which a resume needs" in msg and "init_from=" in msg


@pytest.mark.parametrize("arg,words", [("seed=-1", "seed must be in [0, 2**63)"),
                                       (f"seed={2 ** 64}", "seed must be in [0, 2**63)"),
                                       ("learning_rate=1e308", "learning_rate must be >= 0 and <= 1e30"),
                                       ("out_dir=", "out_dir must be a folder name, not empty")])
def test_impossible_values_are_one_error_line(data_dir, arg, words, tmp_path):
    assert words in one_line_error(train.main, [*args(data_dir, tmp_path / "o", "max_iters=1"), arg])


def test_qwens_rescaling_of_a_model_trained_at_one_token_is_one_error(tmp_path):
    from lib import rescale  # eval_tasks.py and eval_copy.py print it as one line
    model = GPT(GPTConfig(vocab_size=8, block_size=1, n_layer=1, n_head=2, n_embd=16, ffn_hidden=32))
    with pytest.raises(ValueError, match="it needs a model trained at N >= 2, this one at 1"):
        rescale.apply(model, "qwen", 4)  # log n / log N: it wrote NaN and exited 0
