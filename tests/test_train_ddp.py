"""DDP on CPU: torchrun with two gloo processes gives the losses and weights of one process, dropout included, and
only rank 0 writes (the usual files, each log line once, nothing in the working directory). Tiny models on tiny random
data."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import train
import test_train
from test_train import ENV, TRAIN, read_log, step_losses, tiny_args

data_dir = test_train.data_dir  # its fixture: random ids
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


def test_torchrun_two_cpu_processes_equal_one_process_and_only_rank0_writes(data_dir, tmp_path):
    ddp_out, one_out = tmp_path / "ddp", tmp_path / "one"
    # gradient_accumulation_steps is global: 2 micro-steps on each of 2 processes = 4 on one; dropout: rank 1 drew
    # rank 0's masks (0.0054 off in the loss)
    common = ["gradient_accumulation_steps=4", "max_iters=4", "eval_interval=2", "dropout=0.2"]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", TRAIN,
                        *tiny_args(data_dir, ddp_out, *common)], cwd=cwd, env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("config: ") == 1 and "2 process(es)" in r.stdout
    train.main(tiny_args(data_dir, one_out, *common))
    ddp, one = step_losses(ddp_out), step_losses(one_out)
    assert list(ddp) == list(one) == [0, 1, 2, 3]
    np.testing.assert_allclose(list(ddp.values()), list(one.values()), rtol=1e-5, atol=0)
    assert len(set(ddp.values())) == 4  # it trained
    # only rank 0 wrote: the usual files, each log line once, nothing in the working directory
    assert sorted(os.listdir(ddp_out)) == ["best.pt", "ckpt.pt", "log.jsonl", "loss.png"]
    rows = read_log(ddp_out)
    assert sum("config" in r for r in rows) == 1 and len(rows) == 1 + 4 + 3  # config, 4 steps, evals at 0, 2, 4
    assert os.listdir(cwd) == []
    a, b = (torch.load(d / "ckpt.pt", map_location="cpu", weights_only=True) for d in (ddp_out, one_out))
    assert a["iter_num"] == 4 and a["config"]["gradient_accumulation_steps"] == 4
    for k, v in a["model"].items():
        torch.testing.assert_close(v, b["model"][k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("accum,world", [(3, 2), (1, 2), (6, 4)])
def test_gradient_accumulation_that_does_not_split_among_the_processes_is_one_line_naming_only_that(accum, world):
    # it read "need lr_schedule in ('constant', 'cosine') and gradient_accumulation_steps (global) divisible by 2
    # processes; got 'cosine', 3": a valid lr_schedule named as a cause. Under torchrun rank 0 prints the line
    # (manual check: python -m torch.distributed.run --standalone --nproc_per_node=2 train.py configs/cpu_quick.py
    # device=cpu gradient_accumulation_steps=3 out_dir=/tmp/x -> that line, then torchrun's ChildFailedError report)
    from lib.config import TrainConfig, TrainError, resolve
    args = {"gradient_accumulation_steps": accum, "lr_schedule": "cosine"}
    with pytest.raises(TrainError) as e:
        resolve(TrainConfig(**args), args, None, False, world)
    assert str(e.value) == (f"gradient_accumulation_steps={accum} (global) does not split evenly among {world} "
                            f"processes: set a multiple of {world} (or use fewer processes)")
    assert resolve(TrainConfig(gradient_accumulation_steps=accum * world), {}, None, False, world)


def test_under_torchrun_a_settings_error_is_printed_by_rank_0_alone(monkeypatch, capsys):
    # every rank printed the same line ("already holds a run", a bad value), then torchrun its report
    for rank, said in (("1", ""), ("0", "error: batch_size=0 is out of range")):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit) as e:
            train.main(["batch_size=0"])  # refused before any process group starts
        assert (e.value.code == 1) if rank == "1" else str(e.value.code).startswith(said)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("error", ["DataError", "TaskError"])
def test_under_torchrun_a_data_or_task_error_is_printed_by_rank_0_alone(error, monkeypatch, capsys):
    # every rank reads the same data and task (a resume on a dataset prepared again, a changed SFT file, meta.json):
    # each printed the same line
    import tasks
    from lib import dataset
    kind = {"DataError": dataset.DataError, "TaskError": tasks.TaskError}[error]
    def refused(explicit):
        raise kind("data/docs was prepared again since this run trained on it")
    monkeypatch.setattr(train, "train", refused)
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit) as e:
            train.main(["device=cpu"])
        assert (e.value.code == 1) if rank == "1" else e.value.code.startswith("error: data/docs was prepared")
    assert capsys.readouterr().err == ""


def test_an_unknown_lr_schedule_is_one_line_naming_the_schedules(data_dir, tmp_path):
    msg = test_train.error_of(tiny_args(data_dir, tmp_path / "out", "lr_schedule=linear"))
    assert msg == "error: lr_schedule='linear' is out of range: lr_schedule must be one of ('constant', 'cosine')"
