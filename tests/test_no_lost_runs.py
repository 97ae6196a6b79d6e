"""No finished run is lost (issue #28): a scorer switch on a finished run, a config file's overwrite=True pointed at
another out_dir, and a wandb start that fails after overwrite=True each stop with one error line and leave every
file of the old run byte for byte; a run resumed from a copy of its checkpoint never writes in its first folder.
Tiny models on tiny random data, CPU only."""
import os
import shutil
import sys

import pytest
import torch

from conftest import random_ids_data
import train

VOCAB = 256
TINY = ["device=cpu", f"vocab_size={VOCAB}", "n_layer=1", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=16",
        "batch_size=2", "gradient_accumulation_steps=1", "eval_iters=1", "log_interval=1", "warmup_iters=1"]
RUN_FILES = ("ckpt.pt", "best.pt", "log.jsonl", "loss.png")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return random_ids_data(tmp_path_factory, VOCAB, 2048, 512)


@pytest.fixture(scope="module")
def finished(data_dir, tmp_path_factory):
    """A finished softmax run (max_iters=2) and its files' bytes."""
    out = tmp_path_factory.mktemp("runs") / "softmax"
    train.main(args(data_dir, out, "scorer=softmax", "max_iters=2", "eval_interval=2"))
    return out, snapshot(out)


def args(data_dir, out_dir, *extra):
    return [*TINY, f"data_dir={data_dir}", "dataset=rand", f"out_dir={out_dir}", *extra]


def snapshot(out):
    return {f: (out / f).read_bytes() for f in RUN_FILES}


def error_of(argv):
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    msg = e.value.code
    assert isinstance(msg, str) and msg.startswith("error: ") and "\n" not in msg, msg
    return msg


def test_a_scorer_switch_on_resume_of_a_finished_run_is_refused_and_keeps_its_files(data_dir, finished):
    out, before = finished
    for how in (["resume=True"], ["init_from=resume"], ["resume=True", "max_iters=4"]):
        msg = error_of(args(data_dir, out, *how, "scorer=ssmax"))
        assert "finished softmax run" in msg and "init_from=" in msg and "overwrite=True" in msg, msg
        assert snapshot(out) == before


def test_a_scorer_switch_of_a_finished_run_runs_when_asked_with_overwrite_on_the_command_line(data_dir, finished,
                                                                                             tmp_path):
    out = tmp_path / "copy"
    os.makedirs(out)
    (out / "ckpt.pt").write_bytes(finished[1]["ckpt.pt"])
    train.main(args(data_dir, out, "resume=True", "scorer=ssmax", "max_iters=3", "overwrite=True"))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 3 and ckpt["model_args"]["scorer"] == "ssmax"
    whole = tmp_path / "whole"  # the whole run, its final eval logged: the switched model is evaluated, not "done"
    shutil.copytree(finished[0], whole)
    train.main(args(data_dir, whole, "resume=True", "scorer=ssmax", "overwrite=True"))
    ckpt = torch.load(whole / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 2 and ckpt["model_args"]["scorer"] == "ssmax" and ckpt["eval"]["iter"] == 2


def test_a_run_resumed_from_a_copy_of_its_checkpoint_writes_where_it_resumes_not_where_it_began(
        data_dir, finished, tmp_path, monkeypatch):
    out, before = finished
    monkeypatch.chdir(tmp_path)  # out_dir not given: the default, ./out, where the copy is
    os.makedirs("out")
    (tmp_path / "out" / "ckpt.pt").write_bytes(before["ckpt.pt"])  # its config records out_dir=<the first folder>
    train.main([*TINY, f"data_dir={data_dir}", "dataset=rand", "init_from=resume", "max_iters=3"])
    assert torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["iter_num"] == 3
    assert snapshot(out) == before  # the first run's folder is never written


def test_a_config_files_overwrite_applies_only_to_its_own_out_dir(data_dir, finished, tmp_path):
    out, before = finished
    cfg = tmp_path / "quick.py"
    cfg.write_text(f"out_dir = {str(tmp_path / 'own')!r}\noverwrite = True\n")
    assert train.parse_args([str(cfg)])["overwrite"] is True
    assert "overwrite" not in train.parse_args([str(cfg), f"out_dir={out}"])
    assert train.parse_args([str(cfg), f"out_dir={out}", "overwrite=True"])["overwrite"] is True
    assert train.parse_args([str(cfg), "overwrite=True", f"out_dir={out}"])["overwrite"] is True
    quick = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "cpu_quick.py")
    assert train.parse_args([quick])["overwrite"] and "overwrite" not in train.parse_args([quick, "out_dir=elsewhere"])
    # the folder decides, not its spelling: "./out-quick" was refused where "out-quick" was replaced
    assert train.parse_args([quick, "out_dir=./out-quick"])["overwrite"]
    assert train.parse_args([str(cfg), f"out_dir={tmp_path / 'x' / '..' / 'own'}"])["overwrite"] is True
    msg = error_of([str(cfg), *args(data_dir, out, "scorer=ssmax", "max_iters=1")])
    assert "already holds a run" in msg and "overwrite=True" in msg
    assert snapshot(out) == before
    train.main([str(cfg), *args(data_dir, tmp_path / "own", "max_iters=1")])  # its own out_dir: replaced, as asked
    train.main([str(cfg), *args(data_dir, tmp_path / "own", "max_iters=1")])


def test_a_failing_wandb_start_with_overwrite_keeps_every_file_of_the_old_run(data_dir, finished, monkeypatch):
    out, before = finished
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails, as without the package or a login
    msg = error_of(args(data_dir, out, "max_iters=1", "overwrite=True", "wandb_log=True"))
    assert "wandb" in msg
    assert snapshot(out) == before and sorted(os.listdir(out)) == sorted(RUN_FILES)
