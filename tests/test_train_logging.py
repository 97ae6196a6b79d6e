"""What train.py prints and records: the resolved config printed with every field whole and stored in the
checkpoint and log.jsonl, a progress line per log step, a log.jsonl line per step and per evaluation, loss.png at the
last evaluation and while it trains, and run_info's git SHA and dirty flag (uncommitted code, not untracked files or
results). Tiny models on tiny random data, CPU only."""
import math
import os
import re
import subprocess

import pytest
import torch

import train
from lib import config, tracking
from lib.checkpoint import run_info
import test_train
from test_train import read_log, tiny_args

data_dir = test_train.data_dir  # its fixture: random ids
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


def test_resolved_config_is_printed_with_every_field_whole_and_stored_in_the_checkpoint(data_dir, tmp_path, capsys):
    out = tmp_path / ("out-" + "-".join(["hyphenated"] * 12))  # a long path with hyphens is not split across lines
    train.main(tiny_args(data_dir, out, "max_iters=2", "eval_interval=2", "scorer=ssmax", "ssmax_s_init=0.5"))
    printed = capsys.readouterr().out
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
    cfg = ckpt["config"]
    want = {**vars(train.TrainConfig()), **train.parse_args(tiny_args(data_dir, out, "max_iters=2", "eval_interval=2",
                                                                     "scorer=ssmax", "ssmax_s_init=0.5"))}
    assert cfg == want  # every field: the defaults, then what the command set
    assert cfg["max_iters"] == 2 and cfg["scorer"] == "ssmax" and cfg["ssmax_s_init"] == 0.5 and cfg["n_embd"] == 32
    assert ckpt["model_args"] == {k: cfg[k] for k in config.MODEL_FIELDS} and ckpt["iter_num"] == 2
    assert printed.startswith("config: ")
    config_text = printed[:printed.index("M parameters")]  # the config lines, up to the parameter count
    for k, v in cfg.items():
        assert f"{k}={v!r}" in config_text
    assert read_log(out)[0]["config"] == cfg


def test_progress_line_per_log_step_jsonl_line_per_step_and_loss_png_at_eval(data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    train.main(tiny_args(data_dir, out, "max_iters=5", "eval_interval=2", "log_interval=2"))
    printed = capsys.readouterr().out
    progress = re.findall(r"^iter (\d+): loss (\d+\.\d{4}), lr (\S+), ([\d,]+) tok/s, mfu n/a, eta (\d+:\d\d:\d\d)$",
                          printed, re.M)
    assert [int(p[0]) for p in progress] == [0, 2, 4]  # every log_interval-th step
    rows = read_log(out)
    assert rows[0]["start_iter"] == 0 and "config" in rows[0] and "run_info" in rows[0]
    steps = [r for r in rows if "loss" in r]
    assert [r["iter"] for r in steps] == [0, 1, 2, 3, 4]  # one line per step
    for r in steps:
        assert {"iter", "loss", "lr", "tokens_per_s", "mfu", "eta_s", "elapsed"} <= set(r)
        assert math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 and r["mfu"] is None and r["eta_s"] >= 0
    assert [r["lr"] for r in steps] == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2, 1e-2, 1e-2])  # warmup, constant
    for it, loss, lr, _, _ in progress:
        assert loss == f"{steps[int(it)]['loss']:.4f}" and lr == f"{steps[int(it)]['lr']:.2e}"
    evals = [r for r in rows if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 2, 4, 5]  # every eval_interval and at the end
    assert all(math.isfinite(r["train_loss"]) and math.isfinite(r["val_loss"]) for r in evals)
    assert re.search(r"^iter 4: train loss \d+\.\d{4}, val loss \d+\.\d{4}", printed, re.M)
    with open(out / "loss.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert {"ckpt.pt", "best.pt", "log.jsonl", "loss.png"} <= set(os.listdir(out))


@pytest.mark.parametrize("every, drawn", [(0, [0, 2, 4, 5]), (1e9, [5])], ids=["long-run", "short-run"])
def test_loss_png_is_drawn_at_the_last_eval_and_at_evals_plot_every_s_apart(data_dir, tmp_path, monkeypatch, every,
                                                                            drawn):
    # a long run's evals come PLOT_EVERY_S apart (0 here): loss.png at each; a run of seconds draws it once, at its end
    out, seen = tmp_path / "out", []
    monkeypatch.setattr(tracking, "PLOT_EVERY_S", every)
    plot = tracking.plot_losses
    monkeypatch.setattr(tracking, "plot_losses", lambda *a: (seen.append(read_log(out)[-1]["iter"]), plot(*a)))
    train.main(tiny_args(data_dir, out, "max_iters=5", "eval_interval=2"))
    assert seen == drawn and (out / "loss.png").stat().st_size > 0


def test_run_info_flags_a_tree_with_uncommitted_code_but_not_untracked_files_or_results(tmp_path):
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=tmp_path,
                                    check=True, capture_output=True)
    (tmp_path / "results").mkdir()
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results" / "summary.json").write_text("{}\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "c")
    clean = run_info(0, repo=tmp_path)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert clean["git_sha"] == sha and clean["git_dirty"] is False and clean["git_diff_sha256"] is None
    (tmp_path / "out").mkdir()  # an untracked out_dir, and results a run rewrote: the code is still the commit's
    (tmp_path / "out" / "ckpt.pt").write_text("w")
    (tmp_path / "results" / "summary.json").write_text('{"loss": 1}\n')
    assert run_info(0, repo=tmp_path)["git_dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")  # uncommitted code: flagged, with a hash naming the diff
    one = run_info(0, repo=tmp_path)
    (tmp_path / "code.py").write_text("x = 3\n")
    two = run_info(0, repo=tmp_path)
    assert one["git_dirty"] is two["git_dirty"] is True and len(one["git_diff_sha256"]) == 16
    assert one["git_diff_sha256"] != two["git_diff_sha256"]
    inside = run_info(0, repo=tmp_path / "out")  # a folder inside the tree reports the whole tree
    assert inside["git_sha"] == sha and inside["git_diff_sha256"] == two["git_diff_sha256"]
    not_a_repo = tmp_path.parent / f"{tmp_path.name}-plain"
    not_a_repo.mkdir()
    assert run_info(0, repo=not_a_repo)["git_sha"] is None and run_info(0, repo=not_a_repo)["git_dirty"] is None


def test_the_eta_leaves_out_the_compile_step(data_dir, tmp_path, monkeypatch):
    # torch.compile's first step (~28 s for the 162M model on an H100, against 0.67 s a step) seeded the ETA's
    # average: 10.7 hours printed at iter 10 of a 42-minute run. A stand-in compile: the first training call sleeps
    import time

    class SlowFirstStep(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model, self.compiled = model, False

        def forward(self, *args, **kwargs):
            if self.training and not self.compiled:
                self.compiled = True
                time.sleep(1.0)
            return self.model(*args, **kwargs)

    monkeypatch.setattr(train.torch, "compile", SlowFirstStep)
    out = tmp_path / "out"
    train.main(tiny_args(data_dir, out, "max_iters=8", "eval_interval=100", "compile=True"))
    steps = [r for r in read_log(out) if "eta_s" in r]
    assert steps[0]["tokens_per_s"] < steps[1]["tokens_per_s"]  # the compile step's own rate is reported as it was
    assert all(r["eta_s"] < 0.5 for r in steps[1:]), [round(r["eta_s"], 2) for r in steps]
