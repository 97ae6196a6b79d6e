"""Resuming a train.py run: resume=True after k iterations gives the losses and weights of an uninterrupted run, in
process and in a new process after a SIGKILL; a resume refuses to change the architecture or a kept scorer's options,
is costed on the iterations left and takes a checkpoint recording a config field this code dropped; a kill during an
evaluation (writing best.pt, or the final one) is finished by the resume. Tiny models on tiny random data, CPU only."""
import functools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import train
import test_train
from lib import config as config_lib, cost
from lib.checkpoint import read_checkpoint
from lib.config import TrainConfig, TrainError, model_config
from test_train import ENV, REPO, TRAIN, error_of, read_log, run_script, step_losses, tiny_args

data_dir = test_train.data_dir  # its fixture: random ids
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


def test_resume_after_k_iterations_gives_the_losses_and_weights_of_an_uninterrupted_run(data_dir, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    common = ["eval_interval=3", "dropout=0.1"]  # dropout: its masks must be the uninterrupted run's
    train.main(tiny_args(data_dir, whole, *common, "max_iters=7"))
    # resume=True: a relaunch of the same command; the first launch finds no checkpoint and starts from scratch
    train.main(tiny_args(data_dir, parts, *common, "max_iters=3", "resume=True"))
    assert torch.load(parts / "ckpt.pt", weights_only=True)["iter_num"] == 3
    train.main(tiny_args(data_dir, parts, *common, "max_iters=7", "resume=True"))
    want = step_losses(whole)
    assert list(want) == list(range(7)) and len(set(want.values())) == 7
    assert step_losses(parts) == want  # exact float equality, step by step
    assert list(step_losses(parts, since_last_start=True)) == [3, 4, 5, 6]  # the resumed run did only the rest
    a, b = (torch.load(d / "ckpt.pt", map_location="cpu", weights_only=True) for d in (whole, parts))
    assert a["iter_num"] == b["iter_num"] == 7
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())
    evals = {r["iter"]: r["val_loss"] for r in read_log(parts) if "val_loss" in r}
    assert evals == {r["iter"]: r["val_loss"] for r in read_log(whole) if "val_loss" in r}


def test_a_killed_run_resumed_in_a_new_process_continues_with_the_uninterrupted_losses(data_dir, tmp_path):
    out, ref = tmp_path / "killed", tmp_path / "ref"
    def args(out_dir, max_iters):
        return tiny_args(data_dir, out_dir, "eval_interval=4", "eval_iters=1", "log_interval=1000",
                         f"max_iters={max_iters}")
    p = run_script(*args(out, 100000))  # would run for a long time
    deadline, evals = time.time() + 120, []
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(out / "log.jsonl"):
            with open(out / "log.jsonl") as f:  # an eval line is written after its checkpoint
                evals = [r["iter"] for r in map(json.loads, f.read().splitlines()[:-1]) if "val_loss" in r]
            if evals and evals[-1] >= 4:
                break
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL and evals and evals[-1] >= 4, err  # killed mid-way, past a checkpoint
    k = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)["iter_num"]
    assert k >= 4 and k % 4 == 0
    n = k + 5
    before_kill = step_losses(out)
    r = subprocess.run([sys.executable, TRAIN, "init_from=resume", f"out_dir={out}", f"max_iters={n}"], cwd=REPO,
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    train.main(args(ref, n))  # the same run, never stopped
    want = step_losses(ref)
    resumed = step_losses(out, since_last_start=True)
    assert list(resumed) == list(range(k, n))
    assert resumed == {i: want[i] for i in range(k, n)}  # exactly
    assert all(want[i] == loss for i, loss in before_kill.items() if i < n)
    assert [r["iter"] for r in read_log(out) if "loss" in r] == list(range(n))  # each step once
    a, b = (torch.load(d / "ckpt.pt", map_location="cpu", weights_only=True)["model"] for d in (out, ref))
    assert all(torch.equal(v, b[key]) for key, v in a.items())


def test_steps_logged_after_the_checkpoint_are_listed_once_after_a_resume_runs_them_again(data_dir, tmp_path, capsys):
    # a kill between checkpoints left their lines, and the resume appended its own: log.jsonl (and reproduce.py's
    # train_log.csv.gz) listed those steps twice
    out, ref = tmp_path / "out", tmp_path / "ref"
    train.main(tiny_args(data_dir, out, "max_iters=4", "eval_interval=4", "eval_iters=1"))
    with open(out / "log.jsonl", "a") as f:  # what the killed run had logged past its checkpoint at iter 4
        f.writelines(json.dumps({"iter": i, "loss": 99.0, "lr": 0.0}) + "\n" for i in (4, 5))
    capsys.readouterr()
    train.main(tiny_args(data_dir, out, "init_from=resume", "max_iters=6", "eval_interval=4", "eval_iters=1"))
    assert "the 2 step(s) logged after the checkpoint's iter 4 are run again" in capsys.readouterr().out
    train.main(tiny_args(data_dir, ref, "max_iters=6", "eval_interval=4", "eval_iters=1"))
    assert [r["iter"] for r in read_log(out) if "loss" in r] == list(range(6))
    assert step_losses(out) == step_losses(ref)


def test_resume_refuses_to_change_the_architecture_or_the_options_of_a_kept_scorer(data_dir, tmp_path):
    out = tmp_path / "out"
    train.main(tiny_args(data_dir, out, "max_iters=1", "eval_interval=1", "scorer=ssmax"))
    assert "n_layer=2 differs from the checkpoint's 1" in error_of(tiny_args(data_dir, out, "init_from=resume",
                                                                              "n_layer=2"))
    # its s exists already: a new init would not apply (a scorer switch may set it: tests below)
    msg = error_of(tiny_args(data_dir, out, "init_from=resume", "scorer=ssmax", "ssmax_s_init=0.5"))
    assert "ssmax_s_init=0.5 differs from the checkpoint's 1.0: it cannot change when resuming with the same " \
           "scorer" in msg
    msg = error_of(tiny_args(data_dir, out, "init_from=resume", "scorer=softmax", "n_embd=64"))
    assert "n_embd=64 differs from the checkpoint's 32: it cannot change when resuming" in msg  # a switch too
    # each of these loads the same weights (or adds one) and would train another model unnoticed
    ckpt = read_checkpoint(str(out / "ckpt.pt"))
    for field, value, was in (("n_head", 4, 2), ("n_kv_head", 1, None), ("norm_eps", 1e-3, 1e-6),
                              ("qk_norm", True, False), ("ssmax_learn_s", False, True), ("ssmax_bias", True, False),
                              ("pos", "nope", "rope"), ("rope_scaling", {"rope_type": "linear", "factor": 2.0}, None)):
        with pytest.raises(TrainError, match=f"{field}={value!r} differs from the checkpoint's {was!r}: it cannot "
                                             f"change when resuming"):
            model_config(TrainConfig(**{**ckpt["model_args"], field: value}), {field: value}, ckpt, resuming=True)
    # pos and rope_scaling had been changed without a word (a model without RoPE, mid-run), on init_from too; so
    # would any field added to GPTConfig: every field is the architecture but what config.CHANGEABLE lists
    assert set(config_lib.CHANGEABLE) | set(config_lib.ARCH_FIELDS) == set(config_lib.MODEL_FIELDS)
    msg = error_of(tiny_args(data_dir, tmp_path / "new", f"init_from={out / 'ckpt.pt'}", "pos=nope"))
    assert "pos='nope' differs from the checkpoint's 'rope': it cannot change (a different architecture)" in msg
    ckpt["model_args"]["qk_clip"] = 30.0  # a checkpoint of another version or branch: one line, not a traceback
    torch.save(ckpt, out / "ckpt.pt")
    msg = error_of(tiny_args(data_dir, out, "init_from=resume", "max_iters=2"))
    assert "the checkpoint's model does not fit this model.py" in msg and "qk_clip" in msg


def test_a_resume_near_the_end_of_a_long_run_is_costed_on_the_iterations_left(data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(cost, "cpu_cost_check", functools.partial(cost.cpu_cost_check, rate=1e10))
    out, n = tmp_path / "out", 10 ** 8  # n iterations of the tiny model: ~20 hours at 1e10 FLOP/s
    assert "this run would take at least" in error_of(tiny_args(data_dir, tmp_path / "new", f"max_iters={n}"))
    train.main(tiny_args(data_dir, out, "max_iters=0"))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    torch.save({**ckpt, "iter_num": n - 1}, out / "ckpt.pt")  # as if it had run all but its last iteration
    train.main(tiny_args(data_dir, out, "init_from=resume", f"max_iters={n}"))  # one iteration left: it runs
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == n


def test_a_checkpoint_recording_a_config_field_this_code_no_longer_has_resumes(data_dir, tmp_path):
    out = tmp_path / "out"
    train.main(tiny_args(data_dir, out, "max_iters=1", "eval_interval=1"))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    torch.save({**ckpt, "config": {**ckpt["config"], "a_retired_field": 1}}, out / "ckpt.pt")  # an older code's
    train.main(tiny_args(data_dir, out, "init_from=resume", "max_iters=2"))
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 2


class _Killed(BaseException):
    """A SIGKILL in the middle of a checkpoint write, simulated in-process."""


def _kill_during_eval(monkeypatch, at_iter, file):
    """best.pt: killed while writing it; ckpt.pt: killed just after writing it, before best.pt and the log line."""
    real = train.save_checkpoint
    def save(state, path):
        if path.endswith(file) and state["iter_num"] == at_iter:
            if file == "best.pt":
                open(f"{path}.tmp", "wb").write(b"half a zip")  # what a kill mid-write leaves behind
            else:
                real(state, path)
            raise _Killed
        real(state, path)
    monkeypatch.setattr(train, "save_checkpoint", save)


@pytest.mark.parametrize("kill_at,file", [(0, "best.pt"), (4, "ckpt.pt")], ids=["writing-best", "final-eval"])
def test_a_kill_during_an_eval_is_finished_by_the_resume(data_dir, tmp_path, monkeypatch, capsys, kill_at, file):
    out, ref = tmp_path / "out", tmp_path / "ref"
    args = ["max_iters=4", "eval_interval=2", "resume=True"]
    train.main(tiny_args(data_dir, ref, *args))
    with monkeypatch.context() as m:
        _kill_during_eval(m, kill_at, file)
        with pytest.raises(_Killed):
            train.main(tiny_args(data_dir, out, *args))
    assert kill_at not in [r["iter"] for r in read_log(out) if "val_loss" in r]
    assert (out / "best.pt.tmp").exists() == (file == "best.pt")
    capsys.readouterr()
    train.main(tiny_args(data_dir, out, *args))
    printed = capsys.readouterr().out
    evals = {r["iter"]: r["val_loss"] for r in read_log(out) if "val_loss" in r}
    assert evals == {r["iter"]: r["val_loss"] for r in read_log(ref) if "val_loss" in r}  # the record is back
    assert "done: val loss" in printed and not list(out.glob("*.tmp"))
    best, want = (torch.load(d / "best.pt", weights_only=True) for d in (out, ref))
    assert best["iter_num"] == want["iter_num"] and "optimizer" not in best
    assert all(torch.equal(v, want["model"][k]) for k, v in best["model"].items())
    capsys.readouterr()
    log = read_log(out)
    train.main(tiny_args(data_dir, out, *args))  # relaunching a finished run says so and changes nothing
    assert "already done" in capsys.readouterr().out and read_log(out) == log


def test_a_resume_on_a_dataset_prepared_again_since_is_refused_in_one_line(tmp_path):
    # a checkpoint recorded the codec alone: a dataset made again with another seed resumed silently, training on
    # documents its val loss had held out and comparing best.pt across two val sets
    from lib import dataset
    with open(tmp_path / "c.jsonl", "w") as f:
        f.writelines(json.dumps({"text": f"Document {i}: " + "some words " * (i % 5 + 8)}) + "\n" for i in range(60))
    data = tmp_path / "data"
    dataset.prepare(str(tmp_path / "c.jsonl"), name="docs", out_dir=str(data), tokenizer="char", val_frac=0.2, seed=1)
    args = ["device=cpu", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=16", "batch_size=2",
            "gradient_accumulation_steps=1", "eval_iters=1", "eval_interval=2", f"data_dir={data}", "dataset=docs",
            f"out_dir={tmp_path / 'out'}"]
    train.main(args + ["max_iters=2"])
    sha = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["data_state"]["sha256"]
    assert sha == json.loads((data / "docs" / "meta.json").read_text())["sha256"]
    train.main(args + ["max_iters=4", "resume=True"])  # the same splits: it goes on
    dataset.prepare(str(tmp_path / "c.jsonl"), name="docs", out_dir=str(data), tokenizer="char", val_frac=0.2, seed=2)
    msg = error_of(args + ["max_iters=6", "resume=True"])
    assert "was prepared again since this run trained on it" in msg and "init_from=<its ckpt.pt>" in msg
    assert "would hold out val documents it trained on" in msg  # no clean way out


def test_a_new_run_from_a_checkpoint_on_its_dataset_prepared_again_keeps_the_earlier_splits_and_warns(
        tmp_path, capsys):
    # it recorded only the new splits' sha256: its val held documents the parent trained on, and the evaluations'
    # data_provenance saw no difference
    from lib import dataset
    from lib.provenance import data_provenance
    with open(tmp_path / "c.jsonl", "w") as f:
        f.writelines(json.dumps({"text": f"Document {i}: " + "some words " * (i % 5 + 8)}) + "\n" for i in range(60))
    data, docs = tmp_path / "data", str(tmp_path / "data" / "docs")
    def prepare(seed):
        dataset.prepare(str(tmp_path / "c.jsonl"), name="docs", out_dir=str(data), tokenizer="char", val_frac=0.2,
                        seed=seed)
        return json.loads((data / "docs" / "meta.json").read_text())["sha256"]
    args = ["device=cpu", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=16", "batch_size=2",
            "gradient_accumulation_steps=1", "eval_iters=1", "eval_interval=2", "max_iters=2", f"data_dir={data}",
            "dataset=docs"]
    first = prepare(1)
    train.main(args + [f"out_dir={tmp_path / 'a'}"])
    second = prepare(2)
    capsys.readouterr()
    train.main(args + [f"out_dir={tmp_path / 'b'}", f"init_from={tmp_path / 'a' / 'ckpt.pt'}"])
    warned = [l for l in capsys.readouterr().err.splitlines() if l.startswith("warning:")]
    assert len(warned) == 1 and "this new run's val may hold documents its weights trained on" in warned[0]
    for f in ("ckpt.pt", "best.pt"):
        state = torch.load(tmp_path / "b" / f, weights_only=True)["data_state"]
        assert state["sha256"] == second and state["earlier_sha256"] == [first]
    best = torch.load(tmp_path / "b" / "best.pt", weights_only=True)
    assert data_provenance("b", best, docs)["data_prepared_again"]  # its own folder: the parent's splits differ
    capsys.readouterr()
    train.main(args + [f"out_dir={tmp_path / 'c'}", f"init_from={tmp_path / 'b' / 'ckpt.pt'}"])  # along the chain
    state = torch.load(tmp_path / "c" / "ckpt.pt", weights_only=True)["data_state"]
    assert state["earlier_sha256"] == [first] and "warning: " in capsys.readouterr().err
    train.main(args + ["max_iters=4", f"out_dir={tmp_path / 'c'}", "init_from=resume"])  # a resume keeps them
    assert torch.load(tmp_path / "c" / "ckpt.pt", weights_only=True)["data_state"]["earlier_sha256"] == [first]


def test_a_resume_naming_another_dataset_than_its_checkpoints_says_so(tmp_path):
    # it read "other was prepared again since this run trained on it": the folder was never the run's
    from lib import dataset
    with open(tmp_path / "c.jsonl", "w") as f:
        f.writelines(json.dumps({"text": f"Document {i}: " + "some words " * (i % 5 + 8)}) + "\n" for i in range(60))
    data = tmp_path / "data"
    for name, seed in (("docs", 1), ("other", 2)):
        dataset.prepare(str(tmp_path / "c.jsonl"), name=name, out_dir=str(data), tokenizer="char", val_frac=0.2,
                        seed=seed)
    args = ["device=cpu", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=16", "batch_size=2",
            "gradient_accumulation_steps=1", "eval_iters=1", "eval_interval=2", f"data_dir={data}",
            f"out_dir={tmp_path / 'out'}"]
    train.main(args + ["dataset=docs", "max_iters=2"])
    msg = error_of(args + ["dataset=other", "max_iters=4", "init_from=resume"])
    assert msg.startswith(f"error: this resume names the dataset {data / 'other'}, but its checkpoint trained on "
                          f"{data / 'docs'}") and "prepared again" not in msg
