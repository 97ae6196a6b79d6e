"""A rename alone survives a kill, not a power loss or an OS crash: unsynced, the new name can reach the disk before
the data, an empty or cut file where the last good one was. Every file a rename shows finished (a checkpoint, a JSON
record, a repaired log, a kept training log, a prepared dataset with the meta.json that vouches for it, an
evaluation's results) is synced before its rename, and its folder after. CPU only, tiny files."""
import json
import math
import os

import pytest
import torch

from lib import dataset as pdata
from lib import folders, tracking
from lib.checkpoint import save_checkpoint


def _record(monkeypatch):
    """[("fsync" | "replace", real path)] in the order they happen."""
    calls, fsync, replace = [], os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
                        or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: calls.append(("replace", os.path.realpath(a))) or replace(a, b))
    return calls


def test_a_checkpoint_is_on_disk_before_it_replaces_the_last_one(tmp_path, monkeypatch):
    calls = _record(monkeypatch)
    path = os.path.join(os.path.realpath(tmp_path), "ckpt.pt")
    save_checkpoint({"x": torch.ones(2)}, path)
    tmp = f"{path}.tmp-{os.getpid()}"
    assert calls == [("fsync", tmp), ("replace", tmp), ("fsync", os.path.dirname(path))]  # data, rename, the rename
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.ones(2)) and os.listdir(tmp_path) == ["ckpt.pt"]


def test_a_json_record_is_on_disk_before_it_replaces_the_last_one(tmp_path, monkeypatch):
    calls = _record(monkeypatch)
    path = os.path.join(os.path.realpath(tmp_path), "started.json")
    folders.write_json(path, {"iter": 3})
    assert calls == [("fsync", path + ".tmp"), ("replace", path + ".tmp"), ("fsync", os.path.dirname(path))]


def test_a_json_record_writes_nan_and_inf_as_null_strict_json(tmp_path):
    # a one-seed suite's summary.json held bare NaN (its sd and interval), which jq and JSON.parse refuse
    path = str(tmp_path / "summary.json")
    folders.write_json(path, {"sd": math.nan, "ci": (1.0, math.inf, -math.inf), "n": 1, "rows": [{"p": math.nan}]})
    refuse = lambda name: pytest.fail(f"{name} in {path}")
    assert json.loads(open(path).read(), parse_constant=refuse) == {"sd": None, "ci": [1.0, None, None], "n": 1,
                                                                    "rows": [{"p": None}]}


def test_a_repaired_log_is_on_disk_before_it_replaces_the_runs_log(tmp_path, monkeypatch):
    path = os.path.join(os.path.realpath(tmp_path), "log.jsonl")
    with open(path, "w") as f:
        f.write('{"iter": 0}\n{"iter": 1, "lo')  # a write cut by a kill: a resume rewrites the whole log
    calls = _record(monkeypatch)
    tracking.repair_log(path)
    assert calls == [("fsync", path + ".tmp"), ("replace", path + ".tmp"), ("fsync", os.path.dirname(path))]
    assert open(path).read() == '{"iter": 0}\n'


def test_a_kept_training_log_is_on_disk_before_it_replaces_the_last_one(tmp_path, monkeypatch):
    from lib import runs  # what outlives a reproduction's scratch runs folder
    os.makedirs(tmp_path / "runs" / "softmax")
    (tmp_path / "runs" / "softmax" / "log.jsonl").write_text('{"iter": 0, "loss": 5.0}\n')
    path = os.path.join(os.path.realpath(tmp_path), "s1", "train_log.csv.gz")
    calls = _record(monkeypatch)
    runs.keep_train_log(str(tmp_path / "runs"), ["softmax"], path)
    assert calls == [("fsync", path + ".tmp"), ("replace", path + ".tmp"), ("fsync", os.path.dirname(path))]
    assert runs.read_train_logs(str(tmp_path), [1]) == {1: {"softmax": [{"iter": 0, "loss": 5.0}]}}


def test_a_prepared_dataset_is_on_disk_before_its_meta_json_vouches_for_it(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("To be, or not to be, that is the question. " * 40)
    calls = _record(monkeypatch)
    d = os.path.realpath(pdata.prepare(str(tmp_path / "a.txt"), out_dir=str(tmp_path / "out"), tokenizer="char"))
    names = [os.path.join(d, n) for n in ("train.bin", "val.bin", "meta.json")]
    synced = [p for op, p in calls if op == "fsync"]
    renames = [i for i, (op, _) in enumerate(calls) if op == "replace"]
    assert [p for op, p in calls if op == "replace"] == [n + ".tmp" for n in names]  # meta.json last
    assert all(calls.index(("fsync", n + ".tmp")) < renames[0] for n in names)  # every file before the first rename
    assert synced[-1] == d and calls.index(("fsync", d)) > renames[-1]  # the renames themselves after


def test_evaluation_results_are_on_disk_before_the_rename_that_shows_them_finished(tmp_path, monkeypatch):
    calls = _record(monkeypatch)
    out = os.path.join(os.path.realpath(tmp_path), "res")
    with folders.results_dir(out, ["a.csv", "done.json"]) as folder:
        os.makedirs(os.path.join(folder, "sub"))
        for name in ("a.csv", "done.json", "sub/b.png"):
            with open(os.path.join(folder, name), "w") as f:
                f.write(name)
    tmp = f"{out}.tmp-{os.getpid()}"
    rename = calls.index(("replace", tmp))
    assert {p for op, p in calls[:rename] if op == "fsync"} >= {os.path.join(tmp, n) for n in
                                                                ("a.csv", "done.json", "sub/b.png")}
    assert calls[rename + 1:] == [("fsync", os.path.realpath(tmp_path))]
    assert sorted(os.listdir(out)) == ["a.csv", "done.json", "sub"]


def test_a_checkpoint_copy_cut_short_leaves_no_destination_and_a_whole_one_is_synced_first(tmp_path, monkeypatch):
    # the lm suite's copies of softmax at the switch: a kill mid-copy left a cut ckpt.pt that every rerun took as made
    src, dst = tmp_path / "ckpt.pt", tmp_path / "f" / "ckpt.pt"
    src.write_bytes(os.urandom(4096))
    def cut(a, b):
        open(b, "wb").write(b"half")
        raise KeyboardInterrupt
    monkeypatch.setattr(folders.shutil, "copyfile", cut)
    with pytest.raises(KeyboardInterrupt):
        folders.copy_whole(str(src), str(dst))
    assert os.listdir(dst.parent) == []  # neither dst nor its temporary
    monkeypatch.undo()
    calls = _record(monkeypatch)
    folders.copy_whole(str(src), str(dst))
    assert dst.read_bytes() == src.read_bytes() and calls.index(("fsync", str(dst) + f".tmp-{os.getpid()}")) < \
        calls.index(("replace", str(dst) + f".tmp-{os.getpid()}"))
