"""Nothing lost, mixed or misreported (issue #44), one test per cause: two processes on one folder (a lock per run,
per evaluation, per suite), resume=True over results without their ckpt.pt, a rerun whose settings changed, a
character vocabulary of the same size and other characters, two checkpoints of one run told apart, a cut log line,
a full disk, ids past the vocabulary, a padded vocabulary, a checkpoint without optimizer state, and the remaining
bad values. Tiny models on tiny data, CPU only."""
import csv
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

import eval_copy
import eval_long
import eval_tasks
import sample
import train
from conftest import one_line_error
from lib import dataset, folders, runs, vocab
from lib.checkpoint import run_info, save_checkpoint
from model import GPT, GPTConfig

VOCAB = 256
TINY = ["device=cpu", f"vocab_size={VOCAB}", "n_layer=1", "n_head=2", "n_embd=16", "ffn_hidden=32", "block_size=16",
        "batch_size=2", "gradient_accumulation_steps=1", "eval_iters=1", "log_interval=1", "warmup_iters=1",
        "dataset=rand"]
TEXT = "To be, or not to be: that is the question.\nWhether 'tis nobler in the mind to suffer\n" * 30
CHAR = ["device=cpu", "n_layer=1", "n_head=2", "n_embd=16", "ffn_hidden=32", "block_size=32", "batch_size=2",
        "gradient_accumulation_steps=1", "eval_iters=1", "log_interval=1", "warmup_iters=1", "max_iters=1",
        "eval_interval=1"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    os.makedirs(d / "rand")
    rng = np.random.default_rng(0)
    for split, n in (("train", 2048), ("val", 512)):
        rng.integers(0, VOCAB, n).astype(np.uint16).tofile(d / "rand" / f"{split}.bin")
    return str(d)


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
        "with folders.held(sys.argv[2]):\n    print('held', flush=True); sys.stdin.read()\n")


@pytest.fixture
def other_process():
    """hold(folder): another process holds folder's lock until the test ends (or it is killed); returns its pid."""
    procs = []

    def hold(folder):
        p = subprocess.Popen([sys.executable, "-c", HOLD, os.path.dirname(os.path.dirname(__file__)), str(folder)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
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
    p = other_process(tmp_path / "out-synthetic-quick")  # the same suite started twice
    msg = one_line_error(reproduce.main, ["--suite", "synthetic", "--quick"])
    assert f"a synthetic suite's runs is being written by process {p.pid}" in msg
    monkeypatch.chdir(tmp_path)
    p = other_process(tmp_path / "out-repro-cpu_char")
    msg = one_line_error(reproduce.main, ["--scale", "cpu_char", "--seeds", "1"])
    assert f"a reproduction's runs is being written by process {p.pid}" in msg


# ----------------------------------------------------------------------------------------------------------------
# 3: a rerun reuses a step only when its settings are the ones asked for

def test_a_step_done_with_other_settings_refuses_or_with_redo_runs_again(tmp_path, capsys):
    script = tmp_path / "mark.py"  # a step: writes its output
    script.write_text("import sys; open(sys.argv[1], 'w').write(sys.argv[2])\n")
    out = tmp_path / "res" / "out.txt"
    out.parent.mkdir()
    run = lambda steps, max_iters: steps.run("train x", [str(script), str(out), str(max_iters)], str(out),
                                             settings={"train": {"max_iters": max_iters}})
    run(runs.Steps(str(out.parent)), 20)
    run(runs.Steps(str(out.parent)), 20)  # the same settings: reused
    assert out.read_text() == "20" and "[skip] train x" in capsys.readouterr().out
    with pytest.raises(runs.StepError, match=r"step 'train x' in .* was made with other settings than asked now "
                                             r"\(train.max_iters 20 -> 40\): --redo runs it again"):
        run(runs.Steps(str(out.parent)), 40)
    assert out.read_text() == "20"
    steps = runs.Steps(str(out.parent), redo=True)
    run(steps, 40)
    assert out.read_text() == "40" and steps.ran("train") == {"max_iters": 40}  # what summary.json reports
    lines = [json.loads(line) for line in open(out.parent / "steps.jsonl")]
    assert [r["settings"]["train"]["max_iters"] for r in lines] == [20, 40]
    (out.parent / "steps.jsonl").write_text(json.dumps({"step": "train x", "command": "old", "wall_s": 1}) + "\n")
    run(runs.Steps(str(out.parent)), 80)  # recorded before settings were: taken as it is, with a warning
    assert out.read_text() == "40" and "made before settings were recorded" in capsys.readouterr().out
    assert json.load(open(out.parent / "wall.json"))["wall_s"] >= 0  # every call's time, kept after each step


def test_a_seeds_runs_hold_one_training_and_may_gain_variants(tmp_path):
    root = str(tmp_path / "s1")
    want = lambda it, **v: {"train": {"max_iters": it}, "variants": v}
    runs.check_runs(root, want(20, softmax={"scorer": "softmax"}), redo=False)
    (tmp_path / "s1" / "softmax").mkdir()
    runs.check_runs(root, want(20, softmax={"scorer": "softmax"}, ssa={"scorer": "ssa"}), redo=False)  # added
    assert set(json.load(open(tmp_path / "s1" / "settings.json"))["variants"]) == {"softmax", "ssa"}
    with pytest.raises(runs.StepError, match=r"train.max_iters 20 -> 40"):
        runs.check_runs(root, want(40, softmax={"scorer": "softmax"}), redo=False)
    with pytest.raises(runs.StepError, match=r"variants.ssa.scorer"):
        runs.check_runs(root, want(20, ssa={"scorer": "ssmax"}), redo=False)
    runs.check_runs(root, want(40, softmax={"scorer": "softmax"}), redo=True)  # scratch: trained again
    assert not (tmp_path / "s1" / "softmax").exists()


def test_the_lm_suite_refuses_a_rerun_with_other_iterations_before_it_trains(tmp_path, monkeypatch):
    import reproduce
    monkeypatch.chdir(tmp_path)
    res = tmp_path / "out-results" / "cpu_char"
    (res / "s1" / "gate").mkdir(parents=True)
    labels = [{"label": v} for v in reproduce.SCALES["cpu_char"]["variants"]]
    (res / "s1" / "gate" / "summary.json").write_text(json.dumps({"models": labels}))
    S = reproduce.SCALES["cpu_char"]
    cmd_settings = runs.plain(dict(train=dict(model=S["model"], train={**S["train"], "max_iters": 20}, dataset=S[
        "dataset"], switch_at=reproduce.SWITCH_AT)))
    (res / "steps.jsonl").write_text(json.dumps(dict(step="gate (seed 1)", command="", wall_s=1,
                                                     settings=cmd_settings)) + "\n")
    msg = one_line_error(reproduce.main, ["--scale", "cpu_char", "--seeds", "1", "--max_iters", "40",
                                          "--skip", "eval_long", "needle", "score", "passkey"])
    assert "step 'gate (seed 1)'" in msg and "train.train.max_iters 20 -> 40" in msg and "--redo" in msg
    assert not (tmp_path / "out-repro-cpu_char" / "s1").exists()  # nothing trained
    msg = one_line_error(reproduce.main, ["--scale", "cpu_char", "--seeds", "1", "--max_iters", "20", "--variants",
                                          "softmax", "--skip", "eval_long", "needle", "score", "passkey"])
    assert "step 'gate (seed 1)'" in msg and "variants" in msg  # a variant set other than its evaluation's


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


def test_a_padded_vocabulary_samples_only_ids_the_tokenizer_knows(tmp_path, capsys):
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


def test_a_resume_from_a_checkpoint_without_optimizer_state_is_one_line(data_dir, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    shutil.copy(out / "best.pt", out / "ckpt.pt")  # best.pt copied over it
    msg = one_line_error(train.main, args(data_dir, out, "max_iters=3", "resume=True"))
    assert "holds no optimizer or rng or data_state state, which a resume needs" in msg and "init_from=" in msg


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
