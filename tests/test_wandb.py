"""tracking.py through train.py: an offline Weights & Biases run (history and config read back from its .wandb file),
the one-line error without the wandb package (and wandb never imported when wandb_log is off), an evaluation table,
and the local --compare figure of two runs. Tiny models on tiny random data, CPU only, no network."""
import glob
import json
import os
import sys

import numpy as np
import pytest

from conftest import random_ids_data
import train
from lib import tracking

VOCAB = 512  # as tests/test_train.py: random ids < VOCAB, a small head keeps every step fast
TINY = ["device=cpu", f"vocab_size={VOCAB}", "n_layer=2", "n_head=2", "n_embd=32", "ffn_hidden=64", "block_size=16",
        "batch_size=2", "gradient_accumulation_steps=1", "eval_iters=2", "log_interval=1", "warmup_iters=2",
        "learning_rate=1e-2"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return random_ids_data(tmp_path_factory, VOCAB)


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """wandb offline and quiet, its settings and caches in tmp_path: nothing leaves this machine or touches ~."""
    pytest.importorskip("wandb")
    for k, v in dict(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=tmp_path, WANDB_CONFIG_DIR=tmp_path / "cfg",
                     WANDB_CACHE_DIR=tmp_path / "cache", WANDB_DATA_DIR=tmp_path / "data").items():
        monkeypatch.setenv(k, str(v))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    yield
    tracking.finish()


def tiny_args(data_dir, out_dir, *extra):
    return [*TINY, f"data_dir={data_dir}", "dataset=rand", f"out_dir={out_dir}", *extra]


def error_of(argv):
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    msg = e.value.code
    assert isinstance(msg, str) and msg.startswith("error: ") and "\n" not in msg, msg
    return msg


def wandb_records(path):
    """The records of an offline run's .wandb file, read without wandb's reader (the Python one is gone since the
    Go core): LevelDB's log format after a 7-byte ":W&B" header, 32 KiB blocks of chunks (crc32, length: uint16 LE,
    type: 1 full, 2 first, 3 middle, 4 last), each record a wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2 as pb
    data, BLOCK, HEADER = open(path, "rb").read(), 32768, 7
    assert data[:4] == b":W&B", data[:7]
    pos, chunks, records = HEADER, b"", []
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if kind == 0:  # zero padding: the end of what was written
            break
        chunks += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def offline_run(root):
    """(history rows {key: value}, config {key: value}, run display name) of the one offline run under root/wandb."""
    import wandb
    wandb.teardown()  # the finished run's file is written by wandb's service after finish() returns: wait for it
    (path,) = glob.glob(os.path.join(root, "wandb", "offline-run-*", "run-*.wandb"))
    history, config, name = [], {}, None
    for r in wandb_records(path):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
        elif kind in ("run", "config"):
            items = r.run.config.update if kind == "run" else r.config.update
            config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
            name = r.run.display_name if kind == "run" else name
    return history, config, name


def test_offline_run_logs_steps_evals_and_scorer_parameters(data_dir, tmp_path, offline):
    out = tmp_path / "out-wb"
    train.main(tiny_args(data_dir, out, "max_iters=3", "eval_interval=2", "scorer=ssmax", "ssmax_bias=True",
                         "wandb_log=True"))
    history, config, name = offline_run(out)
    by_step = {}
    for row in history:
        by_step.setdefault(row["_step"], {}).update(row)
    assert sorted(by_step) == [0, 1, 2, 3]  # steps 0..2 and the final eval at max_iters
    for it in (0, 1, 2):
        row = by_step[it]
        assert {"loss", "lr", "tokens_per_s", "eta_s", "elapsed"} <= set(row), row
        for layer in (0, 1):
            for p in ("s", "b"):
                lo, mean, hi = (row[f"scorer/layer{layer}/{p}_{s}"] for s in ("min", "mean", "max"))
                assert lo <= mean <= hi
    assert all({"train_loss", "val_loss"} <= set(by_step[it]) for it in (0, 2, 3))
    logged = [json.loads(line) for line in open(out / "log.jsonl")]
    assert [by_step[r["iter"]]["loss"] for r in logged if "loss" in r] == pytest.approx(
        [r["loss"] for r in logged if "loss" in r])  # the same numbers as log.jsonl
    assert config["scorer"] == "ssmax" and config["wandb_log"] is True and "git_sha" in config["run_info"]
    assert name == "out-wb"  # wandb_run_name="": out_dir's name


def test_missing_wandb_is_one_error_line_and_off_never_imports_it(data_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError, as if not installed
    msg = error_of(tiny_args(data_dir, tmp_path / "on", "max_iters=1", "wandb_log=True"))
    assert "pip install wandb" in msg
    assert not os.path.exists(tmp_path / "on" / "log.jsonl")  # a rerun needs no overwrite=True
    train.main(tiny_args(data_dir, tmp_path / "off", "max_iters=1"))  # wandb_log=False: wandb is never imported
    assert os.path.isfile(tmp_path / "off" / "log.jsonl")


def test_wandb_init_failure_is_one_error_line(data_dir, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    def no_key(**kwargs):  # what an online run with no API key on a machine without a terminal raises
        raise wandb.errors.UsageError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])\nmore")
    monkeypatch.setattr(wandb, "init", no_key)
    msg = error_of(tiny_args(data_dir, tmp_path / "out", "max_iters=1", "wandb_log=True"))
    assert "api_key not configured" in msg and "WANDB_MODE=offline" in msg
    assert not os.path.exists(tmp_path / "out" / "log.jsonl")


def test_log_table_offline(tmp_path, offline):
    rows = [dict(model="out-ssmax", length=64, accuracy=np.float64(0.75), mse=""),
            dict(model="out-softmax", length=64, accuracy=0.5, mse="")]
    tracking.log_table("nanoscorer-test", "accuracy", rows, out_dir=str(tmp_path))
    history, _, name = offline_run(tmp_path)
    assert name == "accuracy" and any(row.get("accuracy/nrows") == 2 for row in history)
    (table,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files" / "media" / "table" / "accuracy_*.json"))
    assert json.load(open(table)) == {"columns": ["model", "length", "accuracy", "mse"],
                                      "data": [["out-ssmax", 64, 0.75, None], ["out-softmax", 64, 0.5, None]]}


def test_compare_figure_of_two_runs(data_dir, tmp_path):
    runs = []
    for scorer in ("softmax", "ssmax"):
        runs.append(str(tmp_path / f"out-{scorer}"))
        train.main(tiny_args(data_dir, runs[-1], "max_iters=4", "eval_interval=2", f"scorer={scorer}"))
    png = tmp_path / "compare.png"
    train.main(["--compare", *runs, "--out", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    assert [tracking.read_run(d)[0] for d in runs] == ["out-softmax (softmax)", "out-ssmax (ssmax)"]
    msg = error_of(["--compare", runs[0], str(tmp_path / "nothing")])
    assert "nothing" in msg and "no log.jsonl" in msg


def test_compare_out_that_is_no_image_name_or_in_no_folder_is_one_error_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.jsonl").write_text('{"iter": 0, "loss": 5.0}\n{"iter": 0, "val_loss": 5.5}\n')
    for out, words in (("x.txt", "is not an image name: end it in one of"), ("x", "avif, eps"),
                       (os.path.join("nowhere", "x.png"), "its folder does not exist")):
        msg = error_of(["--compare", str(run), "--out", str(tmp_path / out)])  # once a matplotlib traceback
        assert f"--out {str(tmp_path / out)!r}" in msg and words in msg, msg
    assert os.listdir(tmp_path) == ["run"]


def test_task_eval_with_wandb_logs_its_accuracy_table_offline(tmp_path, offline):
    import eval_tasks
    train.main(["device=cpu", "task=first", "pos=nope", "n_layer=1", "n_head=2", "n_embd=16", "ffn_hidden=32",
                "block_size=8", "batch_size=4", "max_iters=1", "eval_iters=1", f"out_dir={tmp_path / 'run'}"])
    eval_tasks.main([str(tmp_path / "run" / "ckpt.pt"), "--lengths", "8", "--n", "4", "--out_dir",
                str(tmp_path / "ev"), "--wandb", "--wandb_project", "nanoscorer-test"])
    tracking.finish()
    history, _, name = offline_run(tmp_path / "ev")
    assert name == "tasks ev" and any(row.get("tasks ev/nrows") == 1 for row in history)
