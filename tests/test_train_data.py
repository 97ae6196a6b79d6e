"""train.py's datasets: a missing embedded dataset is prepared on demand; a truncated or missing split is one error
line, or, for an embedded corpus, prepared again; a split prepared anew during a run stops it. Tiny models, CPU
only."""
import json
import os
import shutil

import pytest
import torch

import train
import test_train
from test_train import TINY, error_of

data_dir = test_train.data_dir  # its fixture: random ids
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest's: tiny models, one thread


def test_missing_embedded_dataset_is_prepared_automatically(tmp_path, capsys):
    out = tmp_path / "out"
    train.main(["device=cpu", f"data_dir={tmp_path / 'data'}", f"out_dir={out}", "n_layer=1", "n_head=2",
                "n_embd=32", "ffn_hidden=64", "block_size=16", "batch_size=2", "gradient_accumulation_steps=1",
                "max_iters=1", "eval_interval=1", "eval_iters=1"])  # dataset: the default, shakespeare
    printed = capsys.readouterr().out
    d = tmp_path / "data" / "shakespeare"
    with open(d / "meta.json") as f:
        meta = json.load(f)
    assert meta["source"] == "shakespeare" and meta["tokens"]["train"] > 1_000_000
    assert os.path.getsize(d / "train.bin") == 2 * meta["tokens"]["train"]
    assert "unigram entropy of train" in printed and "\nsample:\n" in printed  # GPT-2 vocabulary: a sample
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
    assert ckpt["config"]["dataset"] == "shakespeare" and ckpt["iter_num"] == 1


def test_a_truncated_or_missing_split_is_one_error_line_or_an_embedded_corpus_is_prepared_again(data_dir, tmp_path,
                                                                                                capsys):
    d = tmp_path / "data" / "mine"
    os.makedirs(d)
    for split in ("train", "val"):
        (d / f"{split}.bin").write_bytes(open(os.path.join(data_dir, "rand", f"{split}.bin"), "rb").read())
    (d / "meta.json").write_text(json.dumps({"tokens": {"train": 4096, "val": 1024}}))
    with open(d / "train.bin", "r+b") as f:
        f.truncate(1000)  # a preparation killed mid-write
    args = [*TINY, f"data_dir={tmp_path / 'data'}", "dataset=mine", f"out_dir={tmp_path / 'out'}", "max_iters=1"]
    assert "train.bin is truncated: 500 tokens on disk vs 4,096 in meta.json" in error_of(args)
    os.remove(d / "train.bin")
    assert "train.bin is missing" in error_of(args) and not (tmp_path / "out").exists()
    e = tmp_path / "emb" / "kjv"
    os.makedirs(e)
    (e / "val.bin").write_bytes(b"\0\0" * 10)  # an embedded corpus whose train.bin is missing: prepared again
    train.main([*TINY, f"data_dir={tmp_path / 'emb'}", "dataset=kjv", f"out_dir={tmp_path / 'out2'}", "max_iters=0",
                "vocab_size=50257"])
    assert os.path.getsize(e / "train.bin") == 2 * json.load(open(e / "meta.json"))["tokens"]["train"]


def test_a_split_prepared_anew_during_a_run_stops_it_instead_of_mixing_two_datasets(data_dir, tmp_path, monkeypatch):
    d = tmp_path / "data" / "rand"
    shutil.copytree(os.path.join(data_dir, "rand"), d)
    real, calls = train.get_batch, []

    def get_batch(cfg, data, split, ix, device):
        calls.append(split)
        if len(calls) == 3:  # prepare_data.py --force meanwhile: new files renamed over the old ones
            (d / "new.bin").write_bytes((d / "train.bin").read_bytes()[2:] + b"\0\0")
            os.replace(d / "new.bin", d / "train.bin")
        return real(cfg, data, split, ix, device)
    monkeypatch.setattr(train, "get_batch", get_batch)
    msg = error_of([*TINY, f"data_dir={tmp_path / 'data'}", "dataset=rand", f"out_dir={tmp_path / 'out'}",
                    "max_iters=5", "eval_interval=100"])
    assert "train.bin was prepared anew while this run read it" in msg  # at its first read after
