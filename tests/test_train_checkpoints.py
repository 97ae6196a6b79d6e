"""What train.py keeps on disk: an out_dir holding a run is never overwritten unless resume=True or overwrite=True,
best.pt holds what evaluation needs and is smaller than ckpt.pt, a full disk while checkpointing is one error line and
leaves no partial file, a diverging run (NaN loss) stops with one line and keeps the last good checkpoint, and a
checkpoint carrying code is refused before the code runs. Tiny models on tiny random data, CPU only."""
import json
import math
import os
import re
import shutil

import numpy as np
import pytest
import torch

import train
from conftest import code_carrying_copy
from lib.checkpoint import BEST_KEYS, load_checkpoint
import test_train
from test_train import VOCAB, error_of, read_log, tiny_args

data_dir = test_train.data_dir  # its fixture: random ids
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


def test_a_new_run_refuses_an_out_dir_holding_a_run_unless_resume_or_overwrite(data_dir, tmp_path):
    out = tmp_path / "out"
    train.main(tiny_args(data_dir, out, "max_iters=2", "eval_interval=2"))
    before = {f: (out / f).read_bytes() for f in ("ckpt.pt", "best.pt", "log.jsonl")}
    msg = error_of(tiny_args(data_dir, out, "max_iters=3", "eval_interval=3"))
    assert "already holds a run" in msg and "resume=True" in msg and "overwrite=True" in msg and "out_dir" in msg
    assert {f: (out / f).read_bytes() for f in before} == before  # nothing was touched
    train.main(tiny_args(data_dir, out, "max_iters=3", "eval_interval=3", "overwrite=True"))
    log = read_log(out)
    assert log[0]["start_iter"] == 0 and sum("config" in r for r in log) == 1  # a new log, not appended
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 3
    (tmp_path / "file").write_text("x")
    assert "is a file" in error_of(tiny_args(data_dir, tmp_path / "file", "max_iters=1"))


def test_resume_true_on_an_out_dir_without_a_checkpoint_says_that_a_new_run_starts(data_dir, tmp_path, capsys):
    # a mistyped out_dir with resume=True trained from iteration 0 without a word
    train.main(tiny_args(data_dir, tmp_path / "typo", "max_iters=1", "resume=True"))
    assert f"resume=True: out_dir={str(tmp_path / 'typo')!r} holds no ckpt.pt yet, so a new run starts there" in (
        capsys.readouterr().out)
    train.main(tiny_args(data_dir, tmp_path / "typo", "max_iters=2", "resume=True"))  # now it resumes: no such line
    assert "holds no ckpt.pt yet" not in capsys.readouterr().out


def test_best_pt_holds_what_evaluation_needs_and_is_smaller_than_ckpt_pt(data_dir, tmp_path):
    out, data = tmp_path / "out", tmp_path / "data"
    shutil.copytree(data_dir, data)
    tokens = {s: os.path.getsize(data / "rand" / f"{s}.bin") // 2 for s in ("train", "val")}  # uint16
    sha = {"train": "0" * 64, "val": "1" * 64}  # what meta.json says of its splits
    (data / "rand" / "meta.json").write_text(json.dumps({"tokens": tokens, "sha256": sha}))
    train.main(tiny_args(data, out, "max_iters=0"))  # one eval: the best
    best, ckpt = (torch.load(out / f, weights_only=True) for f in ("best.pt", "ckpt.pt"))
    assert set(best) == {*BEST_KEYS, "data_state"} and {"optimizer", "rng", "data_state"} <= set(ckpt)
    # not a resume's data order, but the splits' sha256 an evaluation of best.pt compares with its data
    assert best["data_state"] == {"sha256": sha} == {"sha256": ckpt["data_state"]["sha256"]}
    assert os.path.getsize(out / "best.pt") < os.path.getsize(out / "ckpt.pt")
    a, _ = load_checkpoint(str(out / "best.pt"))
    b, _ = load_checkpoint(str(out / "ckpt.pt"))
    x = torch.randint(0, VOCAB, (2, 16))
    assert torch.equal(a(x, x)[1], b(x, x)[1])  # both evaluate identically


def test_a_full_disk_while_checkpointing_is_one_error_line_and_leaves_no_partial_file(data_dir, tmp_path,
                                                                                     monkeypatch):
    def full(obj, f):
        open(f, "wb").write(b"partial")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(torch, "save", full)
    msg = error_of(tiny_args(data_dir, tmp_path / "out", "max_iters=1"))
    assert "No space left on device" in msg and "no checkpoint was written yet" in msg
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_nan_loss_stops_with_one_line_and_keeps_the_last_good_checkpoint(data_dir, tmp_path):
    out = tmp_path / "out"
    msg = error_of(tiny_args(data_dir, out, "learning_rate=1e6", "grad_clip=0", "warmup_iters=0", "max_iters=100",
                             "eval_interval=2", "eval_iters=1"))
    m = re.match(r"error: (eval )?loss (is nan|is inf|.*) at iter (\d+).*the run diverged and stops; the last good "
                 r"checkpoint (\S+) is kept$", msg)
    assert m and m.group(4) == str(out / "ckpt.pt"), msg
    failed_at = int(m.group(3))
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
    assert 0 < ckpt["iter_num"] <= failed_at < 100 and failed_at - ckpt["iter_num"] <= 2
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    model, _ = load_checkpoint(str(out / "ckpt.pt"))  # it still loads, and computes a finite loss
    x = torch.from_numpy(np.fromfile(os.path.join(data_dir, "rand", "val.bin"), dtype=np.uint16)[:17].astype(np.int64))
    _, loss = model(x[None, :-1], x[None, 1:])
    assert math.isfinite(loss.item())
    logged = [r for r in read_log(out) if "loss" in r or "val_loss" in r]
    assert all(math.isfinite(v) for r in logged for k, v in r.items() if "loss" in k)  # no NaN was logged
    assert max(r["iter"] for r in logged) < failed_at or "eval" in msg


def test_init_from_or_resume_of_a_checkpoint_carrying_code_is_refused_and_the_code_never_runs(data_dir, tmp_path):
    src = tmp_path / "src"
    train.main(tiny_args(data_dir, src, "max_iters=0"))
    evil = code_carrying_copy(src / "ckpt.pt", tmp_path / "evil.pt", tmp_path / "pwned")
    msg = error_of(tiny_args(data_dir, tmp_path / "out", f"init_from={evil}", "max_iters=0"))  # loaded: no hang
    assert "cannot be loaded safely" in msg and "evil.pt" in msg
    code_carrying_copy(src / "ckpt.pt", src / "ckpt.pt", tmp_path / "pwned")
    assert "cannot be loaded safely" in error_of(tiny_args(data_dir, src, "resume=True"))
    assert not (tmp_path / "pwned").exists()
